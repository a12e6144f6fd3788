//! A daemon whose state directory is deleted under it (`rm -rf $LEASH_STATE_DIR`) would run its
//! sessions headless — no socket reaches them — while a second `leash serve` could start on the
//! path with a new database and gateway id. It notices within a housekeeping round, says so at
//! error level, closes its sessions as on SIGTERM and exits non-zero; it recreates nothing there.
mod common;
mod daemon_support;
use common::*;
use daemon_support::*;
use serde_json::json;
use std::time::{Duration, Instant};

#[test]
fn a_deleted_state_directory_stops_the_daemon_and_its_sessions() {
    let tmp = TempDir::new("d-root-gone");
    let state = tmp.join("state");
    let mut daemon = Daemon::start(&state, &[]);
    let mut c = daemon.connect();
    let mut guard = Guard::new();
    let pid_path = tmp.join("stubborn.pid");
    let script = format!(
        "trap '' TERM; echo $$ > '{}'; exec sleep 1000",
        pid_path.display()
    );
    let stubborn = c.call(
        "ensure",
        json!({"session": "stubborn", "argv": ["sh", "-c", script], "graceMs": 300}),
    );
    let adapter = read_pid_file(&pid_path);
    guard.add(adapter);
    let plain = c.call("ensure", json!({"session": "plain", "argv": ["cat"]}));
    let wrappers: Vec<Pid> = [&stubborn, &plain]
        .iter()
        .map(|r| Pid::of(r["rootPid"].as_i64().unwrap() as i32).unwrap())
        .collect();
    let cat = adapter_of(wrappers[1]);
    guard.add(cat);
    drop(c);

    std::fs::remove_dir_all(&state).unwrap();
    let removed = Instant::now();
    let status = daemon.wait();
    let took = removed.elapsed();
    assert!(
        took < Duration::from_secs(20),
        "the daemon took {took:?} to stop"
    );
    assert_eq!(
        status.code(),
        Some(1),
        "a daemon that lost its root exits 1: {status}"
    );
    let log = daemon.log_text();
    assert!(
        log.lines().any(|l| l.contains("ERROR")
            && l.contains("was removed")
            && l.contains("closing every session")),
        "{log}"
    );
    for p in [adapter, cat].iter().chain(&wrappers) {
        assert!(
            wait_for_within(Duration::from_secs(5), || !p.alive()),
            "{p:?} outlived its daemon"
        );
    }
    assert!(
        !state.exists(),
        "the daemon recreated part of the state root: {:?}",
        std::fs::read_dir(&state).map(|d| d.flatten().map(|e| e.path()).collect::<Vec<_>>())
    );
}
