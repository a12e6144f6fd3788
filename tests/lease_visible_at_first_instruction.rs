//! The lease row (right pid, start time, owner) is in the database before the wrapper's first
//! instruction, so the adapter itself can read it when it starts: committed by `leash exec`
//! itself, and by the daemon serving the state root (the `exec` op).
mod common;
mod daemon_support;
use common::*;
use daemon_support::Daemon;

#[test]
fn adapter_reads_its_own_lease_at_start() {
    let tmp = TempDir::new("visible");
    check_visible_at_start(&tmp, &tmp.join("state"));
}

/// The same with a `leash serve` of the state root running: the daemon commits the lease (its
/// log says so), rooted at the `leash exec` process, before the wrapper's first instruction.
#[test]
fn adapter_reads_its_own_lease_at_start_when_the_daemon_commits_it() {
    let tmp = TempDir::new("visible-daemon");
    let state = tmp.join("state");
    let mut daemon = Daemon::start_logging(&state, &[], "debug");
    check_visible_at_start(&tmp, &state);
    let log = daemon.log_text();
    assert!(
        log.contains("exec: lease committed for the peer"),
        "the daemon did not commit the lease:\n{log}"
    );
    assert!(daemon.terminate().success());
}

fn check_visible_at_start(tmp: &TempDir, state: &std::path::Path) {
    let state = state.to_path_buf();
    let out = tmp.join("leases.json");
    let ppid_file = tmp.join("ppid");
    // The adapter's first act is to ask leash for its lease.
    let adapter = script(
        tmp.path(),
        "adapter.sh",
        &format!(
            "echo $PPID > '{}'\n'{}' --state-dir '{}' leases --json --state open > '{}'",
            ppid_file.display(),
            leash_bin().display(),
            state.display(),
            out.display()
        ),
    );
    let mut guard = Guard::new();
    let child = guard.child(
        leash(&state)
            .args(["exec", "--session", "visible", "--"])
            .arg(&adapter)
            .spawn()
            .unwrap(),
    );
    let wrapper_pid = child.id() as i32;
    let wrapper_start = start_time(wrapper_pid).expect("wrapper alive or zombie");
    let status = child.wait().unwrap();
    assert!(status.success(), "{status:?}");

    let wrapper_seen_by_adapter: i32 = std::fs::read_to_string(&ppid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert_eq!(
        wrapper_seen_by_adapter, wrapper_pid,
        "the adapter's parent is the wrapper, which kept leash exec's pid"
    );
    let leases: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    let list = leases.as_array().unwrap();
    assert_eq!(list.len(), 1, "{leases}");
    let l = &list[0];
    assert_eq!(l["sessionKey"], "visible");
    assert_eq!(l["state"], "open");
    assert_eq!(l["rootPid"], wrapper_pid);
    assert_eq!(l["rootStartTime"], wrapper_start);
    assert_eq!(l["ownerPid"], std::process::id());
    assert_eq!(
        l["ownerStartTime"],
        start_time(std::process::id() as i32).unwrap()
    );
    assert!(l["gatewayInstanceId"].as_str().unwrap().len() == 36);
    assert!(l["wrapperPath"]
        .as_str()
        .unwrap()
        .starts_with(l["wrapperRoot"].as_str().unwrap()));
    assert_eq!(
        l["command"],
        serde_json::json!([adapter.display().to_string()])
    );
}
