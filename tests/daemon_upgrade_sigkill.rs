//! The handoff is an upgrade, not a way to outlive the supervisor: after an upgrade, a SIGKILL
//! of the daemon still ends its sessions (each wrapper sees its owner die and takes its adapter
//! down), as it does for a daemon that was never upgraded.
mod common;
mod daemon_support;
mod upgrade_support;
use common::*;
use daemon_support::*;
use serde_json::json;
use upgrade_support::*;

#[test]
fn a_sigkilled_daemon_ends_its_sessions_after_an_upgrade() {
    let tmp = TempDir::new("upgrade-sigkill");
    let state = tmp.join("state");
    let v2 = build_copy(&tmp.join("build-v2"), "v2");
    let mut daemon = Daemon::start(&state, &["--upgrade-program", v2.to_str().unwrap()]);
    let mut c = daemon.connect();
    let mut procs = Vec::new();
    for key in ["a", "b"] {
        let r = ensure_counter(&mut c, key, &tmp.join("signals"));
        let row = lease_row(&mut c, r["leaseId"].as_str().unwrap());
        let wrapper = Pid::of(r["rootPid"].as_i64().unwrap() as i32).expect("wrapper runs");
        let adapter = Pid::of(row["adapterPid"].as_i64().unwrap() as i32).expect("adapter runs");
        procs.push((wrapper, adapter));
    }
    let r = daemon.connect().call("upgrade", json!({}));
    assert_eq!(r["to"], version(Some("v2")), "{r}");
    for (wrapper, adapter) in &procs {
        assert!(wrapper.alive() && adapter.alive(), "kept by the upgrade");
    }
    daemon.kill9();
    for (wrapper, adapter) in &procs {
        assert!(
            wait_for(|| !wrapper.alive() && !adapter.alive()),
            "wrapper {} or adapter {} outlived the SIGKILLed daemon",
            wrapper.pid,
            adapter.pid
        );
    }
}
