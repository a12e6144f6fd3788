//! Fuzz target: the close/reap planner on arbitrary process tables. Verification and planning
//! are pure (`leash_core::plan::plan_lease` over a `Snapshot`), so any table can be fed to them: pids
//! drawn from a small range so that they collide with pid 1, with the caller's pid and group, with
//! the lease's root, adapter and group; processes of another uid, zombies, unreadable exe and
//! environment, other leases' and other gateways' markers. Whatever the table, no planned signal
//! may break a hard rule: never pid ≤ 1, the caller or its group leader, another uid, a zombie, a
//! process that is not in the table as planned (pid and start time), that started before the
//! lease's root, or that carries another lease's or another gateway's marker.
#![no_main]

use arbitrary::Arbitrary;
use leash_core::guard::Caller;
use leash_core::model::{Lease, LeaseState};
use leash_core::model::{LeaseEnv, ProcessInfo, Snapshot};
use leash_core::plan::{plan_lease, Decision};
use leash_core::verify::Expect;
use libfuzzer_sys::fuzz_target;
use std::path::Path;

const GATEWAY: &str = "4f9c2b4e-0d1c-4c1e-9a53-6f1f0c2b9d11";
const OTHER_GATEWAY: &str = "0b7e8f7a-1111-4222-8333-944455556666";
const LEASE: &str = "01900000-0000-7000-8000-000000000001";
const OTHER_LEASE: &str = "01900000-0000-7000-8000-000000000002";
const WRAPPERS: &str = "/state/wrappers";
const OUR_UID: u32 = 1000;

#[derive(Debug, Arbitrary)]
enum Exe {
    ExactWrapper,
    UnderWrapperRoot,
    Elsewhere,
    Unreadable,
}

#[derive(Debug, Arbitrary)]
enum Env {
    Ours,
    OtherLease,
    OtherGateway,
    LeaseOnly,
    Plain,
    Unreadable,
}

#[derive(Debug, Arbitrary)]
struct Proc {
    pid: u8,
    ppid: u8,
    pgid: u8,
    foreign_uid: bool,
    start: u8,
    zombie: bool,
    exe: Exe,
    argv_matches: bool,
    env: Env,
}

#[derive(Debug, Arbitrary)]
struct Input {
    procs: Vec<Proc>,
    root_pid: u8,
    root_start: u8,
    group: Option<u8>,
    adapter: Option<(u8, u8)>,
    caller_pid: u8,
    caller_pgid: u8,
}

/// Small pids (0..=40) so that collisions are the rule, not the exception.
fn pid(v: u8) -> i32 {
    i32::from(v % 41)
}

fn env(e: &Env) -> Option<LeaseEnv> {
    let mk = |l: Option<&str>, g: Option<&str>| {
        Some(LeaseEnv {
            lease_id: l.map(str::to_owned),
            gateway_instance_id: g.map(str::to_owned),
        })
    };
    match e {
        Env::Ours => mk(Some(LEASE), Some(GATEWAY)),
        Env::OtherLease => mk(Some(OTHER_LEASE), Some(GATEWAY)),
        Env::OtherGateway => mk(Some(LEASE), Some(OTHER_GATEWAY)),
        Env::LeaseOnly => mk(Some(LEASE), None),
        Env::Plain => mk(None, None),
        Env::Unreadable => None,
    }
}

fuzz_target!(|input: Input| {
    let wrapper_path = format!("{WRAPPERS}/leash-wrap-1");
    let adapter_argv = vec!["adapter".to_string(), "--acp".to_string()];
    let mut procs = Vec::new();
    for p in input.procs.iter().take(64) {
        let exe = match p.exe {
            Exe::ExactWrapper => Some(wrapper_path.clone()),
            Exe::UnderWrapperRoot => Some(format!("{WRAPPERS}/leash-wrap-0 (deleted)")),
            Exe::Elsewhere => Some("/usr/bin/sleep".to_string()),
            Exe::Unreadable => None,
        };
        let argv = if p.argv_matches {
            let mut a = vec![wrapper_path.clone(), "--".to_string()];
            a.extend(adapter_argv.iter().cloned());
            a
        } else {
            vec!["sleep".to_string(), "1000".to_string()]
        };
        procs.push(ProcessInfo {
            pid: pid(p.pid),
            ppid: pid(p.ppid),
            pgid: pid(p.pgid),
            sid: 1,
            uid: if p.foreign_uid { 0 } else { OUR_UID },
            start_time: u64::from(p.start),
            state: if p.zombie { 'Z' } else { 'S' },
            exe,
            argv: Some(argv),
            env: env(&p.env),
            pidfs_ino: None,
        });
    }
    let snap = Snapshot::new(procs);
    let lease = Lease::builder(LEASE, GATEWAY)
        .wrapper(WRAPPERS, wrapper_path)
        .root(pid(input.root_pid).max(1), u64::from(input.root_start))
        .process_group(input.group.map(|g| pid(g).max(1)))
        .adapter(input.adapter.map(|(p, s)| (pid(p).max(1), u64::from(s))))
        .command(adapter_argv)
        .owner(2, 0)
        .state(LeaseState::Closing)
        .build();
    let caller = Caller {
        pid: pid(input.caller_pid),
        pgid: pid(input.caller_pgid),
        uid: OUR_UID,
    };
    let expect = Expect {
        gateway_instance_id: GATEWAY,
        wrapper_root: Path::new(WRAPPERS),
        cgroup_root: None,
    };
    let plan = plan_lease(&lease, &expect, Ok(&snap), &caller, 100);

    if plan.decision != Decision::Terminate {
        assert!(plan.signals.is_empty(), "{plan:?}");
    }
    let mut seen = std::collections::HashSet::new();
    for s in &plan.signals {
        assert!(seen.insert(s.pid), "pid {} planned twice: {plan:?}", s.pid);
        assert!(s.pid > 1, "pid {} planned: {plan:?}", s.pid);
        assert_ne!(s.pid, caller.pid, "the caller planned: {plan:?}");
        assert_ne!(
            s.pid, caller.pgid,
            "the caller's group leader planned: {plan:?}"
        );
        let p = snap
            .get(s.pid)
            .unwrap_or_else(|| panic!("pid {} is not in the table: {plan:?}", s.pid));
        assert_eq!(
            p.start_time, s.start_time,
            "another instance planned: {plan:?}"
        );
        assert_eq!(p.uid, OUR_UID, "another uid planned: {plan:?}");
        assert_ne!(p.state, 'Z', "a zombie planned: {plan:?}");
        assert!(
            p.start_time >= lease.root_start_time,
            "a process older than the lease planned: {plan:?}"
        );
        if let Some(e) = &p.env {
            assert!(
                e.lease_id.as_deref().is_none_or(|l| l == LEASE),
                "another lease's process planned: {plan:?}"
            );
            assert!(
                e.gateway_instance_id
                    .as_deref()
                    .is_none_or(|g| g == GATEWAY),
                "another gateway's process planned: {plan:?}"
            );
        }
    }
});
