//! On SIGTERM the daemon records which sessions were busy, closes every session through the normal
//! close path (adapters gone, leases closed), removes its socket and exits 0; the next daemon
//! reports the busy ones — in `status` and as a `resumable` event — so the gateway can resume them,
//! and forgets one once it is ensured again.
mod common;
mod daemon_support;
use common::*;
use daemon_support::*;
use serde_json::json;

#[test]
fn busy_sessions_are_reported_after_a_sigterm_restart() {
    let tmp = TempDir::new("d-restart");
    let state = tmp.join("state");
    let recorder = recorder_script(tmp.path());
    let mut guard = Guard::new();
    let mut daemon = Daemon::start(&state, &[]);
    let mut c = daemon.connect();
    let mut adapters = Vec::new();
    let mut leases = Vec::new();
    for name in ["turning", "waiting"] {
        let log = tmp.join(&format!("{name}.log"));
        let r = ensure(
            &mut c,
            name,
            &[recorder.to_str().unwrap(), log.to_str().unwrap()],
        );
        leases.push(r["leaseId"].as_str().unwrap().to_string());
        let a = read_pid_file(&tmp.join(&format!("{name}.log.pid")));
        guard.add(a);
        adapters.push(a);
    }
    // "turning" is mid-turn; "waiting" answered its prompt already.
    c.call(
        "send",
        json!({"session": "turning", "line": prompt("acp-t")}),
    );
    c.call(
        "send",
        json!({"session": "waiting", "line": prompt("acp-w")}),
    );
    c.call(
        "send",
        json!({"session": "waiting", "line": "{\"respond\":true}"}),
    );
    assert!(wait_daemon(&mut c, |c| session_status(c, "waiting")
        .unwrap()["busy"]
        == false));
    assert_eq!(session_status(&mut c, "turning").unwrap()["busy"], true);
    drop(c);

    let status = daemon.terminate();
    assert_eq!(status.code(), Some(0), "{}", daemon.log_text());
    assert!(!daemon.socket.exists(), "socket left after SIGTERM");
    for a in &adapters {
        assert!(
            !a.alive(),
            "adapter {} outlived the daemon's shutdown",
            a.pid
        );
    }

    let next = Daemon::start(&state, &[]);
    let mut c = next.connect();
    for id in &leases {
        assert_eq!(
            lease_row(&mut c, id)["state"],
            "closed",
            "closed through the close path"
        );
    }
    let st = c.call("status", json!({}));
    let resumable = st["daemon"]["resumable"].as_array().unwrap().clone();
    assert_eq!(resumable.len(), 1, "{st}");
    let r = &resumable[0];
    assert_eq!(r["sessionKey"], "turning");
    assert_eq!(r["leaseId"], leases[0].as_str());
    assert_eq!(r["pendingPrompts"][0]["id"], 1, "{r}");
    assert_eq!(r["pendingPrompts"][0]["acpSessionId"], "acp-t", "{r}");
    let kinds = event_kinds(&mut c, "turning");
    let interrupted = kinds
        .iter()
        .position(|k| k == "interrupted")
        .expect("interrupted event");
    let resumed = kinds
        .iter()
        .position(|k| k == "resumable")
        .expect("resumable event");
    assert!(interrupted < resumed, "{kinds:?}");
    assert!(!event_kinds(&mut c, "waiting").contains(&"resumable".to_string()));

    // Ensuring it again is the resumption: it is no longer reported.
    let log = tmp.join("turning2.log");
    ensure(
        &mut c,
        "turning",
        &[recorder.to_str().unwrap(), log.to_str().unwrap()],
    );
    guard.add(read_pid_file(&tmp.join("turning2.log.pid")));
    let st = c.call("status", json!({}));
    assert_eq!(st["daemon"]["resumable"], json!([]), "{st}");

    // Reported once: a further restart without busy sessions reports none.
    drop(c);
    let mut next = next;
    assert_eq!(next.terminate().code(), Some(0));
    let last = Daemon::start(&state, &[]);
    let st = last.connect().call("status", json!({}));
    assert_eq!(st["daemon"]["resumable"], json!([]), "{st}");
}
