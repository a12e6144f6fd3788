//! A `close` that arrives while an `ensure` of the same key is in flight waits for it and closes
//! what it started: the ensure answers `closed` (never `spawn_failed`, never `running` for a
//! session the close then missed), and once the close has answered nothing of the session is
//! alive. Swept over delays between the two requests, live, with an adapter that ignores SIGTERM
//! (so the close needs its grace and SIGKILL).
mod common;
mod daemon_support;
use common::*;
use daemon_support::*;
use serde_json::{json, Value};
use std::path::Path;
use std::time::Duration;

/// The session's newest lease row (from the `leases` op).
fn newest_lease(c: &mut Conn, key: &str) -> Option<Value> {
    let rows = c.call("leases", json!({}));
    rows.as_array()
        .unwrap()
        .iter()
        .filter(|l| l["sessionKey"] == key)
        .max_by_key(|l| l["startedAt"].as_i64().unwrap_or(0))
        .cloned()
}

/// Whether the process a lease row names (`pid`, `start`) is alive as that instance.
fn alive(pid: &Value, start: &Value) -> bool {
    match (pid.as_i64(), start.as_u64()) {
        (Some(p), Some(s)) => Pid {
            pid: p as i32,
            start: s,
        }
        .alive(),
        _ => false,
    }
}

/// The adapter's pid as it wrote it (it may have been killed before it could).
fn pid_file(path: &Path) -> Option<i32> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

#[test]
fn a_close_during_an_ensure_closes_what_it_started_at_every_delay() {
    let tmp = TempDir::new("d-close-race");
    let daemon = Daemon::start(&tmp.join("state"), &[]);
    let mut ensurer = daemon.connect();
    let mut closer = daemon.connect();
    let mut watcher = daemon.connect();
    let mut closed_in_flight = 0;
    let mut answers = Vec::new();
    for (i, delay_ms) in [0u64, 0, 1, 2, 3, 5, 8, 10, 15, 20, 30, 40, 50, 75]
        .into_iter()
        .enumerate()
    {
        let key = format!("race-{i}");
        let pid_path = tmp.join(&format!("{key}.pid"));
        // Ignores SIGTERM (inherited across exec), writes its pid, says nothing.
        let script = format!(
            "trap '' TERM; echo $$ > '{}'; exec sleep 1000",
            pid_path.display()
        );
        let ensure_id = json!(format!("ensure-{i}"));
        let mut line = serde_json::to_vec(&json!({
            "id": ensure_id, "op": "ensure", "session": key,
            "argv": ["sh", "-c", script], "graceMs": 200,
        }))
        .unwrap();
        line.push(b'\n');
        ensurer.send_raw(&line);
        // The delay is the swept parameter, not a synchronisation.
        std::thread::sleep(Duration::from_millis(delay_ms));
        let closed = closer.request("close", json!({"session": key}));
        // The close has answered: whatever it closed is gone now.
        let row = newest_lease(&mut watcher, &key);
        let ensured = ensurer.reply_to(&ensure_id);
        let code = ensured["error"]["code"].as_str().unwrap_or("").to_string();
        assert!(
            !matches!(code.as_str(), "spawn_failed" | "start_failed" | "internal"),
            "delay {delay_ms} ms: the ensure failed instead of answering the close: {ensured}\nclose: {closed}"
        );
        if closed["ok"] == true {
            let outcome = &closed["result"][0];
            assert!(
                matches!(outcome["result"].as_str(), Some("closed" | "lost")),
                "delay {delay_ms} ms: {closed}"
            );
            let row = row.expect("a closed session has a lease");
            assert_eq!(outcome["leaseId"], row["leaseId"], "{closed} {row}");
            assert!(
                !alive(&row["rootPid"], &row["rootStartTime"]),
                "delay {delay_ms} ms: the wrapper outlived the close: {row}"
            );
            assert!(
                !alive(&row["adapterPid"], &row["adapterStartTime"]),
                "delay {delay_ms} ms: the adapter outlived the close: {row}"
            );
            if let (Some(p), Some(s)) = (pid_file(&pid_path), row["adapterStartTime"].as_u64()) {
                assert!(
                    !(Pid { pid: p, start: s }).alive(),
                    "delay {delay_ms} ms: the adapter outlived the close"
                );
            }
            // A successful close never leaves a running session behind.
            let st = session_status(&mut watcher, &key).expect("the daemon knows the session");
            assert_ne!(st["phase"], "running", "delay {delay_ms} ms: {st}");
            assert_ne!(st["phase"], "starting", "delay {delay_ms} ms: {st}");
            if ensured["ok"] == true {
                // The ensure had answered before the close arrived: an ordinary close after it.
                assert_eq!(ensured["result"]["phase"], "running", "{ensured}");
            } else {
                assert_eq!(code, "closed", "delay {delay_ms} ms: {ensured}");
                assert_eq!(ensured["error"]["leaseId"], row["leaseId"], "{ensured}");
                closed_in_flight += 1;
            }
        } else {
            // The close came before the ensure was admitted: nothing to close yet, and the
            // ensure then started its session as it would alone.
            assert_eq!(closed["error"]["code"], "not_found", "{closed}");
            assert_eq!(ensured["ok"], true, "delay {delay_ms} ms: {ensured}");
            assert_eq!(ensured["result"]["phase"], "running", "{ensured}");
            let out = closer.call("close", json!({"session": key}));
            assert_eq!(out[0]["result"], "closed", "{out}");
        }
        answers.push(format!(
            "{delay_ms}ms: ensure {code} / close ok={}",
            closed["ok"]
        ));
    }
    // The sweep met ensures in flight (it is the race the test is about).
    assert!(
        closed_in_flight > 0,
        "no close arrived while an ensure was in flight: {answers:?}"
    );
    eprintln!("{answers:#?}");
}
