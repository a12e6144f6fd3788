//! An adapter that never reads its stdin. Once its pipe is full a `send` fails with `send_timeout`
//! after its `timeoutMs` (default 10 s) instead of blocking forever, and a `cancel` on another
//! connection answers at once — recorded, `notified: false`, with the reason — instead of queueing
//! behind the blocked send. What a timed-out send wrote in part is owed and goes out before any
//! later line (never two lines spliced together).
mod common;
mod daemon_support;
use common::*;
use daemon_support::*;
use serde_json::json;
use std::time::{Duration, Instant};

#[test]
fn a_blocked_send_times_out_and_does_not_hold_up_cancel() {
    let tmp = TempDir::new("d-sendtimeout");
    let state = tmp.join("state");
    let daemon = Daemon::start(&state, &[]);
    let mut c = daemon.connect();
    let pidfile = tmp.join("deaf.pid");
    let deaf = script(tmp.path(), "deaf.sh", r#"echo $$ > "$1"; exec sleep 1000"#);
    c.call(
        "ensure",
        json!({"session": "s", "argv": [deaf.to_str().unwrap(), pidfile.to_str().unwrap()], "graceMs": 200}),
    );
    let _adapter = read_pid_file(&pidfile);

    // Fill the pipe (64 KiB on Linux) with lines the adapter never reads, until one times out.
    let chunk = "x".repeat(16 * 1024 - 1);
    let mut timed_out = None;
    for _ in 0..64 {
        let r = c.request(
            "send",
            json!({"session": "s", "line": chunk, "timeoutMs": 300}),
        );
        if r["ok"] == false {
            timed_out = Some(r);
            break;
        }
    }
    let r = timed_out.expect("the pipe never filled");
    assert_eq!(r["error"]["code"], "send_timeout", "{r}");
    assert!(r["error"]["bytes"].as_u64().unwrap() == 16 * 1024, "{r}");

    // A send that blocks for a long time on one connection…
    let blocked = {
        let mut b = daemon.connect();
        std::thread::spawn(move || {
            let t = Instant::now();
            let r = b.request(
                "send",
                json!({"session": "s", "line": "{}", "timeoutMs": 4000}),
            );
            (r, t.elapsed())
        })
    };
    // …does not hold up a cancel on another.
    let t = Instant::now();
    let r = c.request("cancel", json!({"session": "s", "acpSessionId": "a1"}));
    let cancel_took = t.elapsed();
    assert_eq!(r["ok"], true, "{r}");
    assert_eq!(r["result"]["notified"], false, "{r}");
    assert!(
        r["result"]["reason"]
            .as_str()
            .unwrap()
            .contains("not written"),
        "{r}"
    );
    assert!(
        !blocked.is_finished(),
        "the cancel waited for the blocked send ({cancel_took:?})"
    );
    let kinds = event_kinds(&mut c, "s");
    assert!(kinds.contains(&"cancel".to_string()), "{kinds:?}");

    let (r, took) = blocked.join().unwrap();
    assert_eq!(r["error"]["code"], "send_timeout", "{r}");
    assert!(
        took >= Duration::from_millis(3500),
        "timed out early: {took:?}"
    );
    // The session is still running: a timeout is not a failure of the adapter.
    assert_eq!(session_status(&mut c, "s").unwrap()["phase"], "running");
    c.call("close", json!({"session": "s"}));
}
