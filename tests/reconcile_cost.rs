//! The cost of a continuous-reconcile pass is bounded by the leases, not the host. A
//! counting `ProcessTable` (every `/proc` entry read through the trait, and every host-wide pass)
//! shows that an idle pass over live sessions started with `leash exec` reads only each lease's
//! owner/root entries — no host-wide snapshot, no command-line search — and that only a pass that
//! has an orphan to settle reads the process table (once, as `reap` does: a SIGKILLed wrapper's
//! escapees are found only by their markers; uncontained, once more when something outlived its
//! grace). Live processes, a real store.
mod common;
use common::counting::Counting;
use common::*;
use leash::state::StateRoot;
use leash_core::model::ProcessId;
use std::time::Duration;

/// A process id that is not the one of any lease's owner or claimant (the daemon's `me`).
fn me() -> ProcessId {
    leash::proc::self_id()
}

/// One pass over `root` through a controller reading `t` (the daemon passes its own).
fn pass(root: &StateRoot, t: &Counting, retention: Duration) -> leash::reconcile::PassReport {
    let ctl = leash::controller::Controller::open(root.clone(), t).unwrap();
    leash::reconcile::pass(&ctl, me(), retention).unwrap()
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
    let r = pass(&root, &t, retention);
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
    let r = pass(&root, &t, retention);
    assert!(r.acted(), "{r:?}");
    assert_eq!(r.closed, 1, "{r:?}");
    // One host-wide pass finds the escapees by their markers; without a cgroup, a second one
    // follows only when something outlived its grace (this escapee traps SIGTERM), to SIGKILL
    // whatever it forked meanwhile. Under containment the lease's cgroup replaces both.
    let contained =
        std::env::var("LEASH_TEST_CONTAINMENT").as_deref() != Ok("off") && containment_available();
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
