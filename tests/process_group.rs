//! The wrapper keeps the pid that ran `leash exec`, runs from this gateway's wrapper root, and
//! starts the adapter in a process group of its own.
mod common;
use common::*;

#[test]
fn adapter_leads_its_own_group_and_wrapper_keeps_the_exec_pid() {
    let tmp = TempDir::new("pgid");
    let state = tmp.join("state");
    let mut guard = Guard::new();
    let child = guard.child(
        leash(&state)
            .args(["exec", "--session", "pg", "--", "sleep", "1000"])
            .spawn()
            .unwrap(),
    );
    let wrapper = child.id() as i32;
    let mut adapter = 0;
    assert!(
        wait_for(|| {
            adapter = children(wrapper).first().copied().unwrap_or(0);
            adapter > 0
                && std::fs::read_link(format!("/proc/{adapter}/exe"))
                    .is_ok_and(|e| e.ends_with("sleep"))
        }),
        "adapter never started"
    );
    let root = std::fs::canonicalize(&state).unwrap().join("wrappers");
    let exe = std::fs::read_link(format!("/proc/{wrapper}/exe")).unwrap();
    assert!(
        exe.starts_with(&root),
        "{} not under {}",
        exe.display(),
        root.display()
    );
    assert_eq!(pgid(adapter), Some(adapter), "adapter leads its group");
    assert_ne!(
        pgid(adapter),
        pgid(wrapper),
        "wrapper stays outside the adapter's group"
    );
    assert_eq!(ppid(wrapper), Some(std::process::id() as i32));

    // The adapter carries the lease markers in its environment. Between exec's switch to the new
    // program (exe already `sleep`) and the setup of its stack, the kernel shows an empty
    // environ: wait for it to be filled in.
    let mut env = String::new();
    assert!(wait_for(|| {
        env = String::from_utf8_lossy(
            &std::fs::read(format!("/proc/{adapter}/environ")).unwrap_or_default(),
        )
        .into_owned();
        !env.is_empty()
    }));
    let leases = run_json(&state, &["leases", "--json"]);
    let lease_id = leases[0]["leaseId"].as_str().unwrap().to_string();
    assert!(
        env.contains(&format!("OPENCLAW_ACPX_LEASE_ID={lease_id}")),
        "adapter {adapter} environ: {env:?}; leases: {leases}"
    );
    let gw = run_json(&state, &["status", "--json"])["gatewayInstanceId"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(env.contains(&format!("OPENCLAW_GATEWAY_INSTANCE_ID={gw}")));

    // The wrapper's report ends up in the lease.
    assert!(wait_for(|| run_json(&state, &["leases", "--json"])[0]
        ["adapterPid"]
        == adapter));
    let l = &run_json(&state, &["leases", "--json"])[0];
    assert_eq!(l["processGroupId"], adapter);
    assert_eq!(l["adapterStartTime"], start_time(adapter).unwrap());
}
