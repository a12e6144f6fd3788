//! `--idle-close` closes a session without traffic, but never one that is busy (a `session/prompt`
//! request on its stdin without a response on its stdout yet), however long it has been quiet; once
//! the response arrives, the session is idle-closed like any other.
mod common;
mod daemon_support;
use common::*;
use daemon_support::*;
use serde_json::json;

#[test]
fn a_busy_session_is_not_idle_closed() {
    let tmp = TempDir::new("d-idle");
    let state = tmp.join("state");
    let recorder = recorder_script(tmp.path());
    let daemon = Daemon::start(&state, &["--idle-close", "1s"]);
    let mut guard = Guard::new();
    let mut c = daemon.connect();

    // The busy session goes quiet first, so it is always the one that has been quiet longer.
    let busy_log = tmp.join("busy.log");
    let busy = ensure(
        &mut c,
        "busy",
        &[recorder.to_str().unwrap(), busy_log.to_str().unwrap()],
    );
    let busy_adapter = read_pid_file(&tmp.join("busy.log.pid"));
    guard.add(busy_adapter);
    let sent = c.call("send", json!({"session": "busy", "line": prompt("acp-b")}));
    assert_eq!(sent["busy"], true);

    let idle_log = tmp.join("idle.log");
    let idle = ensure(
        &mut c,
        "idle",
        &[recorder.to_str().unwrap(), idle_log.to_str().unwrap()],
    );
    let idle_adapter = read_pid_file(&tmp.join("idle.log.pid"));
    guard.add(idle_adapter);
    let idle_lease = idle["leaseId"].as_str().unwrap().to_string();
    let busy_lease = busy["leaseId"].as_str().unwrap().to_string();

    // The idle session is closed after its second of silence...
    assert!(
        wait_daemon(&mut c, |c| lease_row(c, &idle_lease)["state"] == "closed"),
        "the idle session was never idle-closed"
    );
    assert!(wait_for(|| !idle_adapter.alive()));
    // ...and every sweep that found it idle found the busy one quieter still: it must be up.
    let st = session_status(&mut c, "busy").unwrap();
    assert_eq!(st["phase"], "running", "{st}");
    assert_eq!(st["busy"], true, "{st}");
    assert!(st["idleMs"].as_u64().unwrap() >= 1000, "{st}");
    assert_eq!(lease_row(&mut c, &busy_lease)["state"], "open");
    assert!(busy_adapter.alive());
    let kinds = event_kinds(&mut c, "idle");
    assert!(kinds.contains(&"idle".to_string()), "{kinds:?}");
    assert!(!event_kinds(&mut c, "busy").contains(&"idle".to_string()));

    // The response ends the turn; then the silence counts.
    c.call(
        "send",
        json!({"session": "busy", "line": "{\"respond\":true}"}),
    );
    assert!(
        wait_daemon(&mut c, |c| lease_row(c, &busy_lease)["state"] == "closed"),
        "the session was never idle-closed after its turn ended"
    );
    assert!(wait_for(|| !busy_adapter.alive()));
    let kinds = event_kinds(&mut c, "busy");
    let idle_at = kinds.iter().position(|k| k == "idle").expect("idle event");
    assert!(
        kinds[idle_at..].contains(&"closed".to_string()),
        "{kinds:?}"
    );
}
