//! An output item is bounded by its *encoded* size. A line of 1 MiB of control bytes is 6 MiB once
//! JSON-escaped; under `--replay-bytes 65536` the item the client receives (and the buffer holds)
//! stays within 64 KiB, marked `truncated`, and holds a true prefix of the line.
mod common;
mod daemon_support;
use common::*;
use daemon_support::*;
use serde_json::{json, Value};
use std::io::BufRead;

#[test]
fn escaping_does_not_grow_an_item_past_the_replay_bytes() {
    let tmp = TempDir::new("d-itembound");
    let state = tmp.join("state");
    let daemon = Daemon::start(&state, &["--replay-bytes", "65536"]);
    let mut c = daemon.connect();
    let noisy = script(
        tmp.path(),
        "controls.sh",
        r#"head -c 1048576 /dev/zero | tr '\0' '\1'; echo; echo done; exec cat"#,
    );
    c.call(
        "ensure",
        json!({"session": "s", "argv": [noisy.to_str().unwrap()], "graceMs": 200}),
    );
    assert!(wait_daemon(&mut c, |c| {
        session_status(c, "s").is_some_and(|s| s["outputLines"] == 2)
    }));
    let st = session_status(&mut c, "s").unwrap();
    assert!(st["bufferedBytes"].as_u64().unwrap() <= 65536, "{st}");

    // Read the raw stream lines: their size is what a client must be ready for.
    let mut a = daemon.connect();
    let mut raw = std::io::BufReader::new(a.stream.try_clone().unwrap());
    let since = st["oldestSeq"].as_i64().unwrap() - 1;
    a.send_raw(
        format!("{{\"id\":\"a\",\"op\":\"attach\",\"session\":\"s\",\"since\":{since}}}\n")
            .as_bytes(),
    );
    let mut big: Option<String> = None;
    for _ in 0..20 {
        let mut line = String::new();
        raw.read_line(&mut line).unwrap();
        let v: Value = serde_json::from_str(&line).unwrap();
        if v["type"] == "output" && v["line"] != "done" {
            big = Some(line);
            break;
        }
    }
    let line = big.expect("the long line's item never came");
    assert!(line.len() <= 65536, "the item is {} bytes", line.len());
    let v: Value = serde_json::from_str(&line).unwrap();
    assert_eq!(v["truncated"], true, "{}", &line[..200]);
    let text = v["line"].as_str().unwrap();
    assert!(
        text.len() > 4096 && text.chars().all(|ch| ch == '\u{1}'),
        "not a prefix"
    );
    c.call("close", json!({"session": "s"}));
}
