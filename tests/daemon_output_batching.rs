//! The daemon reads an adapter's stdout a chunk at a time and numbers all complete lines of a
//! chunk under one lock (relay). What that could break, checked on a live daemon:
//! many lines in one read keep their order and consecutive seqs (skipping only where a seq block
//! ends), a burst longer than a seq block crosses blocks without a repeat, a line cut across two
//! writes arrives whole (its `\r\n` ending stripped), a line longer than the item bound is cut
//! and marked `truncated`, and a replay from the middle of a burst gives the same items.
mod common;
mod daemon_support;
use common::*;
use daemon_support::*;
use serde_json::{json, Value};

/// Lines of the burst: more than one seq block (1,024) in a few reads.
const BURST: usize = 3000;

#[test]
fn lines_of_one_read_keep_their_order_seqs_and_replay() {
    let tmp = TempDir::new("d-batching");
    let state = tmp.join("state");
    let daemon = Daemon::start(&state, &["--replay-bytes", "1048576"]);
    let mut c = daemon.connect();
    let adapter = script(
        tmp.path(),
        "burst.sh",
        &format!(
            r#"seq 1 {BURST}
printf 'part-'; sleep 0.2; printf 'two\r\n'
read go
head -c 2097152 /dev/zero | tr '\0' y; echo
exec cat"#
        ),
    );
    c.call(
        "ensure",
        json!({"session": "s", "argv": [adapter.to_str().unwrap()], "graceMs": 200}),
    );
    // The long line comes once the burst was read (it evicts everything before it).
    let total = BURST + 1;
    assert!(
        wait_daemon(&mut c, |c| {
            session_status(c, "s").is_some_and(|s| s["outputLines"] == total as u64)
        }),
        "the adapter's {total} lines never all arrived: {:?}",
        session_status(&mut c, "s")
    );

    let (id, reply) = c.attach("s", 0);
    assert_eq!(reply["ok"], true, "{reply}");
    let mut items: Vec<Value> = Vec::new();
    while items.len() < total {
        let v = c.next_item(&id);
        if v["type"] == "output" {
            items.push(v);
        }
    }
    for (i, it) in items[..BURST].iter().enumerate() {
        assert_eq!(it["line"], (i + 1).to_string(), "item {i}: {it}");
        assert!(it.get("truncated").is_none(), "{it}");
    }
    let seqs: Vec<i64> = items.iter().map(|v| v["seq"].as_i64().unwrap()).collect();
    assert!(
        seqs.windows(2).all(|w| w[1] > w[0]),
        "seqs went back or repeated"
    );
    // Seqs skip only at the end of a reserved block (an event took the next one).
    let gaps = seqs[..BURST]
        .windows(2)
        .filter(|w| w[1] != w[0] + 1)
        .count();
    assert!(
        gaps <= BURST / 1024 + 1,
        "{gaps} gaps in {BURST} lines of a burst"
    );
    assert_eq!(items[BURST]["line"], "part-two", "{}", items[BURST]);

    // Replay from the middle of the burst: the same items, from the next seq on.
    let from = seqs[1499];
    let (id2, reply) = c.attach("s", from);
    assert_eq!(reply["ok"], true, "{reply}");
    let mut again = Vec::new();
    while again.len() < 200 {
        let v = c.next_item(&id2);
        if v["type"] == "output" {
            again.push(v);
        }
    }
    for (a, b) in again.iter().zip(&items[1500..1700]) {
        let strip = |v: &Value| {
            let mut v = v.clone();
            v.as_object_mut().unwrap().remove("id");
            v
        };
        assert_eq!(strip(a), strip(b));
    }

    // A line longer than the item bound, on the first stream: cut, marked, a true prefix.
    c.call("send", json!({"session": "s", "line": "go"}));
    let long = loop {
        let v = c.next_item(&id);
        if v["type"] == "output" {
            break v;
        }
    };
    assert_eq!(long["truncated"], true);
    assert!(long["seq"].as_i64().unwrap() > seqs[BURST]);
    let text = long["line"].as_str().unwrap();
    assert!(
        text.len() > 100_000 && text.len() < 1_048_576 && text.bytes().all(|b| b == b'y'),
        "the long line is not a bounded prefix: {} bytes",
        text.len()
    );
    c.call("close", json!({"session": "s"}));
}
