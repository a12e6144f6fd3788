//! Issue 15: the cost of a continuous-reconcile pass is bounded by the leases, not the host. A
//! counting `ProcessTable` (every `/proc` entry read through the trait, and every host-wide pass)
//! shows that an idle pass over live sessions started with `leash exec` reads only each lease's
//! owner/root entries — no host-wide snapshot, no command-line search — and that only a pass that
//! has an orphan to settle reads the process table (once, as `reap` does: a SIGKILLed wrapper's
//! escapees are found only by their markers; uncontained, once more when something outlived its
//! grace). Live processes, a real store.
mod common;
use common::*;
use leash::lease::ProcessId;
use leash::proc::{LiveTable, Liveness, ProcessInfo, ProcessTable, Snapshot, TableError};
use leash::state::StateRoot;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// The live table, counting what is read through it.
#[derive(Default)]
struct Counting {
    host_scans: AtomicUsize,
    entries: AtomicUsize,
}

impl Counting {
    fn scans(&self) -> usize {
        self.host_scans.load(Ordering::SeqCst)
    }
    fn entries(&self) -> usize {
        self.entries.load(Ordering::SeqCst)
    }
    fn count(&self, n: usize) {
        self.entries.fetch_add(n, Ordering::SeqCst);
    }
}

impl ProcessTable for Counting {
    fn snapshot(&self) -> Result<Snapshot, TableError> {
        self.host_scans.fetch_add(1, Ordering::SeqCst);
        let s = LiveTable.snapshot()?;
        self.count(s.len());
        Ok(s)
    }
    fn scan(&self, wants: &dyn Fn(&ProcessInfo) -> bool) -> Result<Snapshot, TableError> {
        self.host_scans.fetch_add(1, Ordering::SeqCst);
        let s = LiveTable.scan(wants)?;
        self.count(s.len());
        Ok(s)
    }
    fn process(&self, pid: i32) -> Result<Option<ProcessInfo>, TableError> {
        self.count(1);
        LiveTable.process(pid)
    }
    fn process_stat(&self, pid: i32) -> Result<Option<ProcessInfo>, TableError> {
        self.count(1);
        LiveTable.process_stat(pid)
    }
    fn subtree(&self, root: i32) -> Result<Snapshot, TableError> {
        let s = LiveTable.subtree(root)?;
        self.count(s.len().max(1));
        Ok(s)
    }
    fn liveness(&self, id: ProcessId, ino: Option<u64>) -> Result<Liveness, TableError> {
        self.count(1);
        LiveTable.liveness(id, ino)
    }
}

/// A process id that is not the one of any lease's owner or claimant (the daemon's `me`).
fn me() -> ProcessId {
    leash::proc::self_id()
}

#[test]
fn an_idle_pass_reads_only_the_leases_and_an_orphan_pass_scans_once() {
    let tmp = TempDir::new("reconcile-cost");
    let state = tmp.join("state");
    let mut guard = Guard::new();
    // Three live sessions started outside any daemon.
    let mut lives = Vec::new();
    for i in 0..3 {
        let (owner, wrapper, escapee) =
            outside_session(&mut guard, &state, tmp.path(), &format!("live{i}"), "true");
        lives.push((owner, wrapper, escapee));
    }
    let root = StateRoot::open(&state).unwrap();
    let retention = Duration::from_secs(86_400);

    let t = Counting::default();
    let r = leash::reconcile::pass(&root, &t, me(), retention).unwrap();
    assert_eq!(r.active, 3, "{r:?}");
    assert!(!r.acted(), "a live session was acted on: {r:?}");
    assert_eq!(t.scans(), 0, "an idle pass read the host's process table");
    // Per active lease: owner, root and (unclaimed) nothing else; a small constant each.
    assert!(
        t.entries() <= 3 * 3,
        "an idle pass over 3 leases read {} /proc entries",
        t.entries()
    );
    for (_, _, e) in &lives {
        assert!(e.pid.alive());
        assert_eq!(e.signals(), "", "a live session was signalled");
    }

    // One of them is orphaned: its wrapper is SIGKILLed and its owner exits.
    let (owner, wrapper, escapee) = &lives[0];
    signal(*wrapper, libc::SIGKILL);
    assert!(wait_for(|| !owner.alive()), "the owner did not exit");
    assert!(escapee.pid.alive(), "an escapee expected");
    let t = Counting::default();
    let r = leash::reconcile::pass(&root, &t, me(), retention).unwrap();
    assert!(r.acted(), "{r:?}");
    assert_eq!(r.closed, 1, "{r:?}");
    // One host-wide pass finds the escapees by their markers; without a cgroup, a second one
    // follows only when something outlived its grace (this escapee traps SIGTERM), to SIGKILL
    // whatever it forked meanwhile. Under containment the lease's cgroup replaces both.
    let contained = std::env::var("LEASH_TEST_CONTAINMENT").as_deref() != Ok("off")
        && cgroup2_mount().is_some()
        && is_root();
    assert!(
        (1..=if contained { 1 } else { 2 }).contains(&t.scans()),
        "a pass that settles an orphan read the process table {} times (contained: {contained})",
        t.scans()
    );
    assert!(
        wait_for(|| !escapee.pid.alive()),
        "the escapee was not reaped"
    );
    for (_, _, e) in &lives[1..] {
        assert!(e.pid.alive());
        assert_eq!(e.signals(), "", "a live session was signalled");
    }
}
