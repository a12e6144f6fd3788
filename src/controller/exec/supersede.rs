//! The supersede check's live reads: whether a session's previous lease is over (the decision
//! is the core's, [`leash_core::plan::supersede`], over the reads of [`LiveReads`]), and how
//! that lease ends when a new one takes its place.

use crate::cgroup;
use crate::proc::ProcessTable;
use crate::state::StateRoot;
use leash_core::model::Lease;
use leash_core::verify::Expect;

/// Whether a session's previous active lease is over, so that a new one may take its place;
/// `Some(reason)` when it is. The cost does not grow with the host: the answer comes
/// from the old root's `/proc/<pid>/stat` (pid, start time, pidfs inode), and only when that
/// root is gone from the lease's cgroup (`cgroup.procs`) and its process group (one `kill(-pgid,
/// 0)`). Only when the group still has members — something of the session may still run — is the
/// old lease verified the full way, against the whole process table, as before.
///
/// What this leaves to `leash reap`: a process that carries the old lease's markers but left its
/// wrapper's tree, its group and (without containment) any cgroup — a `setsid` escapee of a
/// wrapper that was SIGKILLed. Finding it needs a look at every process, which only `reap` takes
/// (its escapee sweep covers lost leases too).
pub fn supersede_reason(
    old: &Lease,
    expect: &Expect<'_>,
    table: &dyn ProcessTable,
    root: &StateRoot,
    new_lease_id: &str,
) -> Option<String> {
    leash_core::plan::supersede(old, expect, new_lease_id, &LiveReads { table, root })
}

/// The live reads of [`supersede_reason`]: the process table, the wrapper's report, the group's
/// `kill(-pgid, 0)` and the lease's cgroup. The decision is the core's
/// ([`leash_core::plan::supersede`]).
pub(super) struct LiveReads<'a> {
    table: &'a dyn ProcessTable,
    root: &'a StateRoot,
}

impl leash_core::plan::SupersedeReads for LiveReads<'_> {
    fn root_may_run(&self, old: &Lease) -> bool {
        use crate::proc::Liveness;
        !matches!(
            self.table.liveness(old.root(), old.root_pidfs_ino),
            Ok(Liveness::Gone) | Ok(Liveness::Zombie)
        )
    }

    fn reported(&self, old: &Lease) -> (Option<i32>, Option<leash_core::model::ProcessId>) {
        let Some(r) = crate::report::WrapperReport::read_for(self.root, old) else {
            return (None, None);
        };
        let adapter = r
            .adapter_pid
            .zip(r.adapter_start_time)
            .map(|(pid, start_time)| leash_core::model::ProcessId { pid, start_time });
        (r.process_group_id, adapter)
    }

    fn group_alive(&self, pgid: i32) -> bool {
        crate::signal::group_alive(pgid)
    }

    fn adapter_may_run(&self, adapter: leash_core::model::ProcessId) -> bool {
        !matches!(
            self.table.liveness(adapter, None),
            Ok(crate::proc::Liveness::Gone)
        )
    }

    fn snapshot(&self) -> Option<leash_core::model::Snapshot> {
        self.table.snapshot().ok()
    }

    fn observe(&self, path: &std::path::Path) -> leash_core::model::Observation {
        cgroup::observe(path)
    }

    fn process(&self, pid: i32) -> Option<leash_core::model::ProcessInfo> {
        self.table.process(pid).ok().flatten()
    }
}

/// How a session's previous lease, whose processes are verifiably gone, ends as `new_lease_id`
/// takes its place: `ended` with the exit status its wrapper reported (its root is gone, so the
/// report's end record is the wrapper's last word), else `lost` for `gone` (the verdict's
/// reason).
pub(super) fn superseded_by_report(
    root: &StateRoot,
    old: &Lease,
    new_lease_id: &str,
    gone: String,
) -> crate::store::Superseded {
    let report = crate::report::WrapperReport::read_for(root, old);
    match report.as_ref().and_then(|r| Some((r, r.exit_status?))) {
        Some((r, code)) => crate::store::Superseded {
            reason: format!("{}; superseded by lease {new_lease_id}", r.end_words(code)),
            exit_status: Some(code),
        },
        None => crate::store::Superseded::lost(gone),
    }
}
