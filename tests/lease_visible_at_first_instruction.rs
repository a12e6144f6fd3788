//! The lease row (right pid, start time, owner) is in the database before the wrapper's first
//! instruction, so the adapter itself can read it when it starts.
mod common;
use common::*;

#[test]
fn adapter_reads_its_own_lease_at_start() {
    let tmp = TempDir::new("visible");
    let state = tmp.join("state");
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
