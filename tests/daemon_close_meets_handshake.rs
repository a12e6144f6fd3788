//! Every close of the daemon meets an `ensure` in flight the way the `close` op does: an idle
//! close or a shutdown close that lands while the ensure waits for the adapter's `initialize`
//! response makes the ensure answer `closed` (with the lease the close ended), never success
//! without an `initialize` response, and nothing of the session is left running.
mod common;
mod daemon_support;
use common::*;
use daemon_support::*;
use serde_json::{json, Value};
use std::time::Duration;

fn init_params() -> Value {
    json!({"protocolVersion": 1, "clientCapabilities": {"fs": {"readTextFile": false, "writeTextFile": false}, "terminal": false}})
}

/// An adapter that never answers and records its pid (to check that it is gone).
fn silent(dir: &std::path::Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let pid = dir.join("adapter.pid");
    let p = script(
        dir,
        "silent.sh",
        &format!("echo $$ > '{}'\nexec sleep 1000\n", pid.display()),
    );
    (p, pid)
}

/// Sends the ensure with `initialize` from a thread of its own (it answers once a close took
/// the session).
fn ensure_in_flight(daemon: &Daemon, adapter: &std::path::Path) -> std::thread::JoinHandle<Value> {
    let (socket, adapter) = (daemon.socket.clone(), adapter.to_path_buf());
    std::thread::spawn(move || {
        let mut c = Conn::open(&socket);
        c.stream
            .set_read_timeout(Some(Duration::from_secs(90)))
            .unwrap();
        c.request(
            "ensure",
            json!({"session": "s", "argv": [adapter], "graceMs": 200,
                   "initialize": init_params(), "handshakeTimeoutMs": 60_000}),
        )
    })
}

fn assert_closed(r: &Value, adapter: Pid) {
    assert_eq!(
        r["ok"], false,
        "an ensure answered for a session a close took: {r}"
    );
    assert_eq!(r["error"]["code"], "closed", "{r}");
    assert!(r["error"]["leaseId"].is_string(), "{r}");
    assert!(wait_for(|| !adapter.alive()), "the adapter still runs");
}

#[test]
fn an_idle_close_during_the_handshake_answers_the_ensure_closed() {
    let tmp = TempDir::new("d-idle-hs");
    let state = tmp.join("state");
    let (adapter, pid) = silent(tmp.path());
    let daemon = Daemon::start(&state, &["--idle-close", "1s"]);
    let mut guard = Guard::new();
    let ensure = ensure_in_flight(&daemon, &adapter);
    let adapter = read_pid_file(&pid);
    guard.add(adapter);
    let r = ensure.join().unwrap();
    assert_closed(&r, adapter);
    assert!(
        daemon.log_text().contains("closing idle session"),
        "{}",
        daemon.log_text()
    );
}

#[test]
fn a_shutdown_close_during_the_handshake_answers_the_ensure_closed() {
    let tmp = TempDir::new("d-shutdown-hs");
    let state = tmp.join("state");
    let (adapter, pid) = silent(tmp.path());
    let mut daemon = Daemon::start(&state, &[]);
    let mut guard = Guard::new();
    let ensure = ensure_in_flight(&daemon, &adapter);
    let adapter = read_pid_file(&pid);
    guard.add(adapter);
    // The adapter runs and the daemon waits for its response: then the daemon is stopped.
    let mut c = daemon.connect();
    assert!(wait_daemon(&mut c, |c| {
        session_status(c, "s").is_some_and(|s| s["phase"] == "running")
    }));
    drop(c);
    daemon.terminate();
    let r = ensure.join().unwrap();
    assert_closed(&r, adapter);
}
