//! Bad input: `/proc` entries that vanish mid-read or cannot be read. A process that exits between
//! the listing of `/proc` and the reading of its files is simply absent (never an error, never a
//! half-read process); a zombie is dead; fields that cannot be read (`exe`, `environ`) make a lease
//! unverifiable or a process excluded, never a signal.
use leash::proc::{FixtureTable, LiveTable, ProcessTable};
use leash_core::guard::Caller;
use leash_core::model::{Lease, LeaseState};
use leash_core::plan::{plan_lease, Decision};
use leash_core::verify::{verify_owned_tree, Expect, Verdict};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

#[test]
fn processes_vanishing_while_the_table_is_read_are_simply_absent() {
    // Short-lived processes are born and die while snapshots and subtrees are taken: every read
    // must succeed, and every process in a snapshot must be whole (a start time, a state).
    let stop = Arc::new(AtomicBool::new(false));
    let churn = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut n = 0u32;
            while !stop.load(Ordering::Relaxed) && n < 5_000 {
                // Each `sh` forks a child that exits at once: a tree that keeps vanishing.
                let mut c = Command::new("sh")
                    .args(["-c", "true & true & wait"])
                    .stdin(Stdio::null())
                    .spawn()
                    .unwrap();
                c.wait().unwrap();
                n += 1;
            }
            n
        })
    };
    let me = std::process::id() as i32;
    let table = LiveTable;
    for _ in 0..60 {
        let snap = table
            .snapshot()
            .expect("a snapshot never fails on a vanishing process");
        assert!(snap.get(me).is_some());
        for p in snap.iter() {
            assert!(p.pid > 0, "{p:?}");
            assert!("RSDZTtWXIPKW".contains(p.state), "{p:?}");
        }
        let sub = table
            .subtree(me)
            .expect("a subtree never fails on a vanishing child");
        assert!(sub.get(me).is_some());
        for p in sub.iter().filter(|p| p.pid != me) {
            // Whatever the subtree holds was our descendant when it was read.
            assert!(sub.get(p.ppid).is_some(), "{p:?} hangs below the root");
        }
    }
    stop.store(true, Ordering::Relaxed);
    assert!(churn.join().unwrap() > 0);
}

#[test]
fn an_exited_process_is_absent_or_dead_never_an_error() {
    let mut c = Command::new("true").spawn().unwrap();
    let pid = c.id() as i32;
    let table = LiveTable;
    // Unreaped, it is a zombie: present but not alive.
    let mut zombie = None;
    for _ in 0..2_000 {
        match table.process(pid).unwrap() {
            Some(p) if p.state == 'Z' => {
                zombie = Some(p);
                break;
            }
            Some(_) => std::thread::sleep(std::time::Duration::from_millis(2)),
            None => panic!("an unreaped child cannot vanish"),
        }
    }
    let zombie = zombie.expect("the child became a zombie");
    assert!(!table.alive(zombie.id()).unwrap(), "a zombie is not alive");
    c.wait().unwrap();
    // Reaped, its pid names nothing (or, recycled already, another instance).
    match table.process(pid).unwrap() {
        None => {}
        Some(p) => assert_ne!(p.start_time, zombie.start_time, "{p:?}"),
    }
    assert!(!table.alive(zombie.id()).unwrap());
    assert_eq!(table.process(-1).unwrap(), None);
    assert_eq!(table.process(0).unwrap(), None);
}

const GATEWAY: &str = "4f9c2b4e-0d1c-4c1e-9a53-6f1f0c2b9d11";
const LEASE: &str = "01900000-0000-7000-8000-000000000001";
const WRAPPERS: &str = "/state/wrappers";

fn lease() -> Lease {
    Lease::builder(LEASE, GATEWAY)
        .wrapper(WRAPPERS, format!("{WRAPPERS}/leash-wrap-1"))
        .root(100, 1_000)
        .process_group(101)
        .adapter((101, 1_001))
        .command(["adapter"])
        .owner(99, 900)
        .state(LeaseState::Closing)
        .build()
}

const CALLER: Caller = Caller {
    pid: 5,
    pgid: 5,
    uid: 1000,
};

fn table(json: &str) -> FixtureTable {
    FixtureTable::from_json(json).unwrap()
}

fn expect() -> Expect<'static> {
    Expect {
        gateway_instance_id: GATEWAY,
        wrapper_root: Path::new(WRAPPERS),
        cgroup_root: None,
    }
}

fn plan(t: &FixtureTable) -> leash_core::plan::LeasePlan {
    let snap = t.snapshot();
    plan_lease(&lease(), &expect(), snap.as_ref(), &CALLER, 100)
}

fn markers() -> String {
    format!(r#"{{"leaseId":"{LEASE}","gatewayInstanceId":"{GATEWAY}"}}"#)
}

#[test]
fn a_live_root_whose_exe_is_unreadable_is_unverifiable_and_not_signalled() {
    let t = table(&format!(
        r#"{{"processes":[
        {{"pid":100,"ppid":99,"pgid":99,"sid":99,"uid":1000,"startTime":1000,
          "argv":["{WRAPPERS}/leash-wrap-1","--","adapter"],"env":{m}}},
        {{"pid":101,"ppid":100,"pgid":101,"sid":99,"uid":1000,"startTime":1001,"env":{m}}}]}}"#,
        m = markers()
    ));
    let p = plan(&t);
    assert_eq!(p.verdict.as_deref(), Some("unverifiable"), "{p:?}");
    match &p.decision {
        Decision::Leave { reason } => assert!(reason.contains("exe is unreadable"), "{reason}"),
        d => panic!("{d:?}"),
    }
    assert!(p.signals.is_empty());
}

#[test]
fn a_group_member_whose_environment_is_unreadable_is_excluded_with_a_reason() {
    // The root is gone; in the recorded group, the adapter (pid and start time as recorded)
    // carries the markers, a second member's environ cannot be read: it is not signalled.
    let t = table(&format!(
        r#"{{"processes":[
        {{"pid":101,"ppid":1,"pgid":101,"sid":99,"uid":1000,"startTime":1001,"env":{m}}},
        {{"pid":150,"ppid":1,"pgid":101,"sid":99,"uid":1000,"startTime":1500}}]}}"#,
        m = markers()
    ));
    let snap = t.snapshot().unwrap();
    let Verdict::Owned(tree) = verify_owned_tree(&lease(), &expect(), &snap) else {
        panic!("the adapter is the lease's")
    };
    assert!(tree
        .excluded
        .iter()
        .any(|e| e.pid == 150 && e.reason.contains("environment is unreadable")));
    let p = plan(&t);
    assert_eq!(p.decision, Decision::Terminate);
    let pids: Vec<i32> = p.signals.iter().map(|s| s.pid).collect();
    assert_eq!(pids, vec![101], "only the verified adapter: {p:?}");
    assert!(p.refused.iter().any(|r| r.pid == 150));
}

#[test]
fn an_escapee_whose_environment_is_unreadable_is_not_found_by_markers() {
    // With the root and group gone, only markers identify escapees; a process whose environ
    // cannot be read offers none, so the lease is gone as far as evidence goes.
    let t = table(
        r#"{"processes":[
        {"pid":200,"ppid":1,"pgid":200,"sid":200,"uid":1000,"startTime":2000}]}"#,
    );
    let p = plan(&t);
    assert!(matches!(p.decision, Decision::MarkLost { .. }), "{p:?}");
    assert!(p.signals.is_empty());
}

#[test]
fn a_table_that_cannot_be_read_at_all_leaves_the_lease_alone() {
    let t = table(r#"{"unavailable":"cannot list /proc: permission denied"}"#);
    let p = plan(&t);
    match &p.decision {
        Decision::Leave { reason } => assert!(reason.contains("permission denied"), "{reason}"),
        d => panic!("{d:?}"),
    }
    assert!(p.signals.is_empty());
}
