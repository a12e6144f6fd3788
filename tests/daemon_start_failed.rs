//! An adapter that exits before its first line of output failed to start, and that is reported
//! the same way whenever the exit comes: `ensure` answers `running` once the adapter started (it
//! does not race a watch against the exit), and the session's stream ends `start_failed` with the
//! exit status and the last stderr lines (a `start_failed` event precedes the `exit`). With
//! `waitMs`, an ensure waits for the first line and answers `start_failed` itself. An adapter that
//! spoke first, or one a close ended, just ends.
mod common;
mod daemon_support;
use common::*;
use daemon_support::*;
use serde_json::{json, Value};

/// An adapter that crashes after `ms` milliseconds without a line on stdout.
fn crasher(ms: u64) -> Value {
    let nap = if ms == 0 {
        String::new()
    } else {
        format!("sleep {}; ", ms as f64 / 1000.0)
    };
    json!([
        "sh",
        "-c",
        format!("{nap}echo 'bad config: no model ({ms} ms)' >&2; exit 2")
    ])
}

/// Attaches from the start and returns the stream's `end` item and the event kinds before it.
fn end_of(c: &mut Conn, key: &str) -> (Value, Vec<String>) {
    let (id, reply) = c.attach(key, 0);
    assert_eq!(reply["ok"], true, "{reply}");
    let mut kinds = Vec::new();
    loop {
        let item = c.next_item(&id);
        match item["type"].as_str() {
            Some("end") => return (item, kinds),
            Some("event") => kinds.push(item["kind"].as_str().unwrap().to_string()),
            _ => {}
        }
    }
}

#[test]
fn an_exit_before_the_first_line_is_start_failed_whenever_it_comes() {
    let tmp = TempDir::new("d-start-failed");
    let daemon = Daemon::start(&tmp.join("state"), &[]);
    let mut c = daemon.connect();
    for round in 0..2 {
        for ms in [0u64, 100, 250, 600] {
            let key = format!("crash-{ms}-{round}");
            let r = c.request("ensure", json!({"session": key, "argv": crasher(ms)}));
            // The same answer every time: the adapter was started.
            assert_eq!(r["ok"], true, "{ms} ms: {r}");
            assert_eq!(r["result"]["created"], true, "{ms} ms: {r}");
            assert_eq!(r["result"]["phase"], "running", "{ms} ms: {r}");
            let (end, kinds) = end_of(&mut c, &key);
            assert_eq!(end["reason"], "start_failed", "{ms} ms: {end}");
            let e = &end["error"];
            assert_eq!(e["code"], "start_failed", "{ms} ms: {end}");
            assert_eq!(e["exitStatus"], 2, "{ms} ms: {end}");
            let line = format!("bad config: no model ({ms} ms)");
            assert!(
                e["stderr"].as_array().unwrap().contains(&json!(line)),
                "{ms} ms: {end}"
            );
            assert!(e["message"].as_str().unwrap().contains(&line), "{end}");
            let at = kinds.iter().position(|k| k == "start_failed");
            let exit = kinds.iter().position(|k| k == "exit");
            assert!(
                at.is_some() && at < exit,
                "{ms} ms: start_failed before exit: {kinds:?}"
            );
            assert!(event_kinds(&mut c, &key).contains(&"start_failed".to_string()));
        }
    }
    // With a wait, the ensure waits for the first line: every crash is its own `start_failed`.
    for ms in [0u64, 100, 250, 600] {
        let key = format!("waited-{ms}");
        let r = c.request(
            "ensure",
            json!({"session": key, "argv": crasher(ms), "waitMs": 10_000}),
        );
        assert_eq!(r["ok"], false, "{ms} ms: {r}");
        assert_eq!(r["error"]["code"], "start_failed", "{ms} ms: {r}");
        assert_eq!(r["error"]["exitStatus"], 2, "{ms} ms: {r}");
        let line = format!("bad config: no model ({ms} ms)");
        assert!(
            r["error"]["stderr"]
                .as_array()
                .unwrap()
                .contains(&json!(line)),
            "{ms} ms: {r}"
        );
    }
}

#[test]
fn an_adapter_that_spoke_or_was_closed_just_ends() {
    let tmp = TempDir::new("d-start-ok");
    let daemon = Daemon::start(&tmp.join("state"), &[]);
    let mut c = daemon.connect();
    c.call(
        "ensure",
        json!({"session": "talker", "argv": ["sh", "-c", "echo hello; sleep 0.2; exit 3"]}),
    );
    let (end, kinds) = end_of(&mut c, "talker");
    assert_eq!(end["reason"], "ended", "{end}");
    assert!(end.get("error").is_none(), "{end}");
    assert!(!kinds.contains(&"start_failed".to_string()), "{kinds:?}");
    // Silent until closed: the close ended it, not a failed start.
    c.call(
        "ensure",
        json!({"session": "silent", "argv": ["sleep", "1000"], "graceMs": 200}),
    );
    let out = c.call("close", json!({"session": "silent"}));
    assert_eq!(out[0]["result"], "closed", "{out}");
    let (end, kinds) = end_of(&mut c, "silent");
    assert_eq!(end["reason"], "ended", "{end}");
    assert!(!kinds.contains(&"start_failed".to_string()), "{kinds:?}");
    // A command that cannot run at all did not start: spawn_failed, as before.
    let r = c.request(
        "ensure",
        json!({"session": "missing", "argv": ["/nonexistent/adapter"]}),
    );
    assert_eq!(r["error"]["code"], "spawn_failed", "{r}");
}
