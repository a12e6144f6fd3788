//! The adapter's stderr reaches clients. Attaches that ask for it (`stderr: true`) get `stderr`
//! items in the session's seq space (older clients, which do not ask, see no new item type), the
//! lines stay in the daemon's log, and an adapter that dies at once — bad config — fails an
//! `ensure` that waits for it (`waitMs`) with `start_failed`, its exit status and its last stderr
//! lines instead of reporting `running` and then vanishing (without a wait the stream's end says
//! the same: `tests/daemon_start_failed.rs`).
mod common;
mod daemon_support;
use common::*;
use daemon_support::*;
use serde_json::json;

#[test]
fn stderr_lines_are_streamed_to_attaches_that_ask_and_logged() {
    let tmp = TempDir::new("d-stderr");
    let daemon = Daemon::start(&tmp.join("state"), &[]);
    let mut c = daemon.connect();
    let script = "while IFS= read -r l; do echo \"warn: $l\" >&2; echo \"out: $l\"; done";
    c.call(
        "ensure",
        json!({"session": "e", "argv": ["sh", "-c", script], "waitMs": 0}),
    );
    c.call("send", json!({"session": "e", "line": "one"}));
    let with = c.request(
        "attach",
        json!({"session": "e", "since": 0, "stderr": true}),
    );
    assert_eq!(with["ok"], true, "{with}");
    let with_id = with["id"].clone();
    let mut seen = Vec::new();
    while seen.len() < 2 {
        let item = c.next_item(&with_id);
        if item["type"] == "output" || item["type"] == "stderr" {
            seen.push(item);
        }
    }
    let mut kinds: Vec<String> = seen
        .iter()
        .map(|i| {
            format!(
                "{}:{}",
                i["type"].as_str().unwrap(),
                i["line"].as_str().unwrap()
            )
        })
        .collect();
    kinds.sort();
    assert_eq!(kinds, vec!["output:out: one", "stderr:warn: one"]);
    assert_ne!(seen[0]["seq"], seen[1]["seq"]);

    // Without stderr: only output (and events), the seqs skip the stderr items.
    let (without, _) = c.attach("e", 0);
    c.call("send", json!({"session": "e", "line": "two"}));
    let mut outputs = 0;
    while outputs < 2 {
        let item = c.next_item(&without);
        assert_ne!(item["type"], "stderr", "{item}");
        if item["type"] == "output" {
            outputs += 1;
        }
    }
    assert!(wait_for(|| daemon.log_text().contains("warn: two")));
}

#[test]
fn an_adapter_that_dies_at_once_fails_the_ensure_with_its_status_and_stderr() {
    let tmp = TempDir::new("d-early-exit");
    let daemon = Daemon::start(&tmp.join("state"), &[]);
    let mut c = daemon.connect();
    let r = c.request(
        "ensure",
        json!({"session": "bad", "argv": ["sh", "-c", "echo 'bad config: no model' >&2; exit 2"], "waitMs": 10_000}),
    );
    assert_eq!(r["ok"], false, "{r}");
    let e = &r["error"];
    assert_eq!(e["code"], "start_failed", "{r}");
    assert_eq!(e["exitStatus"], 2, "{r}");
    assert!(
        e["stderr"]
            .as_array()
            .unwrap()
            .contains(&json!("bad config: no model")),
        "{r}"
    );
    assert!(e["message"].as_str().unwrap().contains("bad config"), "{r}");
    // Its lease is settled, nothing is left running.
    let st = session_status(&mut c, "bad").unwrap();
    assert_eq!(st["phase"], "ended", "{st}");

    // The death can be seen three ways (the wrapper's report before the adapter's pid, the
    // child's exit, the watch after the start); each must carry the status and the last words.
    // Adapters that die at once, over and over, land on all of them.
    for i in 0..12 {
        let key = format!("bad-{i}");
        let r = c.request(
            "ensure",
            json!({"session": key, "argv": ["sh", "-c", format!("echo 'died {i}' >&2; exit 3")], "waitMs": 10_000}),
        );
        assert_eq!(r["error"]["code"], "start_failed", "{r}");
        assert_eq!(r["error"]["exitStatus"], 3, "{r}");
        assert!(
            r["error"]["stderr"]
                .as_array()
                .unwrap()
                .contains(&json!(format!("died {i}"))),
            "{r}"
        );
    }

    // An adapter that talks first is running, even if it exits soon after.
    let r = c.call(
        "ensure",
        json!({"session": "talker", "argv": ["sh", "-c", "echo hello; exec cat"], "waitMs": 10_000}),
    );
    assert_eq!(r["phase"], "running", "{r}");
    // waitMs: 0 (the default) skips the watch: the adapter was started; its stream ends
    // `start_failed`.
    let r = c.call(
        "ensure",
        json!({"session": "quick", "argv": ["sh", "-c", "sleep 0.3; exit 4"], "waitMs": 0}),
    );
    assert_eq!(r["created"], true, "{r}");
}
