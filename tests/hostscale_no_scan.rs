//! The cost of `leash exec` and `close` follows the session, not the host. A counting
//! `ProcessTable` (every `/proc` entry read through the trait, and every host-wide pass) shows
//! that deciding a reused key's previous lease is over reads its root's `stat` and nothing of
//! any other process, that closing one session reads that session's tree only, and that the
//! escapee they both leave behind — a `setsid` child carrying the lease's markers, whose wrapper
//! was SIGKILLed — is found and terminated by `reap`'s one host-wide pass. Live processes, a
//! real store; a decoy started by the test survives.
mod common;
use common::counting::Counting;
use common::*;
use leash::controller::{CloseResult, Controller, LeaseRef};
use leash::state::StateRoot;
use leash::store::Store;
use leash_core::plan::ReapOptions;
use leash_core::verify::Expect;
use std::process::Command;

#[test]
fn a_marker_carrying_escapee_is_reaped_while_exec_and_close_scan_nothing() {
    let tmp = TempDir::new("hostscale");
    let state = tmp.join("state");
    let mut guard = Guard::new();
    let decoy = Pid::of(
        guard
            .child(Command::new("sleep").arg("1000").spawn().unwrap())
            .id() as i32,
    )
    .unwrap();

    // Session k: its adapter starts a `setsid` child (out of the group, markers kept) and runs.
    let esc_file = tmp.join("escapee.pid");
    let adapter_sh = script(
        tmp.path(),
        "adapter.sh",
        &format!(
            "setsid sleep 1000 & echo $! > '{}'\nexec sleep 1000",
            esc_file.display()
        ),
    );
    let mut first = leash(&state)
        .args(["exec", "--containment", "off", "--session", "k", "--"])
        .arg(&adapter_sh)
        .spawn()
        .unwrap();
    let wrapper = Pid::of(first.id() as i32).unwrap();
    guard.add(wrapper);
    let adapter = adapter_of(wrapper);
    guard.add(adapter);
    let escapee = read_pid_file(&esc_file);
    guard.add(escapee);
    assert!(
        wait_for(|| pgid(escapee.pid) == Some(escapee.pid)),
        "the escapee left the group"
    );

    // The wrapper is SIGKILLed: the adapter dies with it, the escapee lives on.
    signal(wrapper, libc::SIGKILL);
    first.wait().unwrap();
    assert!(wait_for(|| !adapter.exists()), "the adapter is gone");
    assert!(escapee.alive());

    // A reused key: the previous lease's fate comes from its root's stat, no host scan.
    let root = StateRoot::open(&state).unwrap();
    let store = Store::open(&root.db_path()).unwrap();
    let old = store.active_lease_for_session("k").unwrap().unwrap();
    let gateway = store.gateway_instance_id().to_string();
    drop(store);
    let wrapper_root = root.wrapper_root();
    let expect = Expect {
        gateway_instance_id: &gateway,
        wrapper_root: &wrapper_root,
        cgroup_root: None,
    };
    let t = Counting::default();
    let reason = leash::controller::exec::supersede_reason(&old, &expect, &t, &root, "next");
    assert!(reason.is_some(), "the old lease is over");
    assert_eq!(t.scans(), 0, "exec's decision read no host-wide table");
    assert!(t.entries() <= 2, "exec read {} entries", t.entries());

    // The real `leash exec` of the same key goes ahead (it makes the same decision).
    let mut second = leash(&state)
        .args(["exec", "--containment", "off", "--session", "k", "--"])
        .args(["sleep", "1000"])
        .spawn()
        .unwrap();
    let wrapper2 = Pid::of(second.id() as i32).unwrap();
    guard.add(wrapper2);
    guard.add(adapter_of(wrapper2));
    let old_now = leases(&state)
        .into_iter()
        .find(|l| l["leaseId"] == old.lease_id.as_str())
        .unwrap();
    assert_eq!(old_now["state"], "lost", "{old_now}");

    // Closing the new session reads its tree only, and leaves the old lease's escapee alone.
    let t = Counting::default();
    let c = Controller::open(StateRoot::open(&state).unwrap(), &t)
        .unwrap()
        .with_containment(&leash::cgroup::Settings::default_off());
    let out = c
        .close(&[LeaseRef::Session("k".into())], Some(5_000))
        .unwrap();
    assert_eq!(out[0].result, CloseResult::Closed, "{:?}", out[0]);
    assert_eq!(t.scans(), 0, "close read no host-wide table");
    assert!(t.entries() < 40, "close read {} entries", t.entries());
    second.wait().unwrap();
    assert!(escapee.alive(), "not close's to find");
    drop(c);

    // Reap: one pass over the host finds it by its markers and terminates it.
    let t = Counting::default();
    let c = Controller::open(StateRoot::open(&state).unwrap(), &t)
        .unwrap()
        .with_containment(&leash::cgroup::Settings::default_off());
    let report = c
        .reap(&ReapOptions {
            include_live: false,
            retention_ms: 3_600_000,
            now_ms: leash::lease::now_ms(),
            grace_ms: Some(2_000),
        })
        .unwrap();
    assert_eq!(t.scans(), 1, "reap takes one host-wide pass");
    let found = report
        .escapees
        .iter()
        .find(|o| o.lease_id == old.lease_id)
        .unwrap_or_else(|| panic!("reap found no escapee: {report:?}"));
    assert!(found.signals.iter().any(|s| s.pid == escapee.pid));
    assert!(wait_for(|| !escapee.alive()), "the escapee is gone");
    assert!(decoy.alive(), "the decoy was not touched");
}
