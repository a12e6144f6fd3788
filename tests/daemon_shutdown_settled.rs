//! Shutdown closes the sessions that still run, and leaves alone a session whose lease settled
//! already (its adapter exited and its report ended the lease, while the session still drains
//! its output): no close is attempted on it, so none is logged as begun or refused.
mod common;
mod daemon_support;
use common::*;
use daemon_support::*;
use serde_json::json;

#[test]
fn shutdown_does_not_close_a_session_whose_lease_settled() {
    let tmp = TempDir::new("d-shutdown-settled");
    let state = tmp.join("state");
    let pid_file = tmp.join("adapter.pid");
    let adapter = script(
        tmp.path(),
        "exits.sh",
        &format!("echo $$ > '{}'\nread line\nexit 3\n", pid_file.display()),
    );
    let mut daemon = Daemon::start(&state, &[]);
    let mut guard = Guard::new();
    let mut c = daemon.connect();
    let r = c.call(
        "ensure",
        json!({"session": "s", "argv": [adapter], "graceMs": 200}),
    );
    let lease = r["leaseId"].as_str().unwrap().to_string();
    let pid = read_pid_file(&pid_file);
    guard.add(pid);
    // A writer of the session's stdout pipe outside its tree: the daemon's reader sees no end
    // of it, so the session drains (not ended) after its adapter exited and its lease settled.
    let holder = std::fs::OpenOptions::new()
        .write(true)
        .open(format!("/proc/{}/fd/1", pid.pid))
        .expect("open the adapter's stdout pipe");
    c.call("send", json!({"session": "s", "line": "bye"}));
    assert!(wait_daemon(&mut c, |c| lease_row(c, &lease)["state"] == "ended"));
    let phase = session_status(&mut c, "s").map(|s| s["phase"].clone());
    assert_eq!(
        phase,
        Some(json!("running")),
        "the session still drains its output"
    );
    drop(c);
    daemon.terminate();
    drop(holder);
    let log = daemon.log_text();
    assert!(!log.contains("closing session"), "{log}");
    assert!(
        !log.contains("already settled when shutdown reached it"),
        "{log}"
    );
    assert!(!log.contains("closed at shutdown"), "{log}");
    assert!(log.contains("leash serve stopped"), "{log}");
}
