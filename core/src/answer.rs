//! `leash verify`'s answer: is a lease's process still alive and ours (`owned`), is ownership
//! disproven (`dead`: gone, or its pid now names someone else), or can nobody tell
//! (`unavailable`: the process table could not be read)? [`judge`] gives it, with its evidence,
//! from a lease, what the state root expects of it and a process snapshot (or the reason there
//! is none), through the same [`verify_owned_tree`] and signalling guards as `reap` and `close`.
//!
//! The answer is deliberately coarser than [`Verdict`]: a lease whose wrapper is gone but whose
//! escapees still run (verdict `escaped`, the escapees listed as members) is `dead` for a
//! gateway (there is no session to resume; `reap` or the daemon's reconcile takes the escapees),
//! and `not-owned` is `dead` too (the evidence disproves ownership, so resuming would talk to a
//! stranger).

use crate::guard::Caller;
use crate::model::{Lease, LeaseState, Snapshot, TableError};
use crate::verify::{verify_owned_tree, Expect, Role, Verdict};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Answer {
    /// The wrapper is alive and verified against the lease: safe to resume.
    Owned,
    /// Ownership is disproven: nothing of the lease's wrapper is alive, or its pid names
    /// another process now. Do not resume; start a new session.
    Dead,
    /// The process table could not be read, so nothing could be proven either way.
    Unavailable,
}

impl Answer {
    pub fn as_str(self) -> &'static str {
        match self {
            Answer::Owned => "owned",
            Answer::Dead => "dead",
            Answer::Unavailable => "unavailable",
        }
    }
}

/// A live process proven to belong to the lease.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LiveMember {
    pub pid: i32,
    pub start_time: u64,
    pub role: Role,
    pub argv0: Option<String>,
}

impl From<&crate::verify::Member> for LiveMember {
    fn from(m: &crate::verify::Member) -> LiveMember {
        LiveMember {
            pid: m.pid,
            start_time: m.start_time,
            role: m.role,
            argv0: m.argv0.clone(),
        }
    }
}

/// The reply of `leash verify` and of the daemon's `verify` op.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VerifyReport {
    pub answer: Answer,
    pub lease_id: String,
    pub session_key: String,
    /// The lease's recorded state (a closed lease can only be `dead`, but the row says why).
    pub state: LeaseState,
    pub root_pid: i32,
    pub root_start_time: u64,
    pub owner_pid: i32,
    /// The finer verdict of [`leash_core::verify`] this answer comes from.
    pub verdict: String,
    /// Why, in words: what was compared and what it showed.
    pub evidence: Vec<String>,
    /// The lease's proven live processes, root last: the verified tree with `owned`, the
    /// escapees with `dead` and verdict `escaped` (the wrapper is gone, they still run).
    pub members: Vec<LiveMember>,
}

impl VerifyReport {
    /// One live member of the lease's tree, in the evidence and the members.
    fn add_member(&mut self, m: &crate::verify::Member) {
        self.evidence.push(format!(
            "pid {} ({}, start time {}): {}",
            m.pid,
            m.role.name(),
            m.start_time,
            m.evidence
        ));
        self.members.push(LiveMember::from(m));
    }
}

/// The answer for `lease`, from a snapshot that covers its root's tree. Pure.
///
/// `caller` is who would signal: an escapee the signalling guards refuse to it (another uid's
/// process, say) is what `reap` leaves alone, and the answer says so, never that reap ends it.
pub fn judge(
    lease: &Lease,
    expect: &Expect<'_>,
    snap: Result<&Snapshot, &TableError>,
    caller: &Caller,
) -> VerifyReport {
    let mut report = VerifyReport {
        answer: Answer::Unavailable,
        lease_id: lease.lease_id.clone(),
        session_key: lease.session_key.clone(),
        state: lease.state,
        root_pid: lease.root_pid,
        root_start_time: lease.root_start_time,
        owner_pid: lease.owner_pid,
        verdict: "unverifiable".into(),
        evidence: Vec::new(),
        members: Vec::new(),
    };
    let snap = match snap {
        Ok(s) => s,
        Err(e) => {
            report
                .evidence
                .push(format!("{e}; nothing could be proven"));
            return report;
        }
    };
    let verdict = verify_owned_tree(lease, expect, snap);
    report.verdict = verdict.name().into();
    match verdict {
        Verdict::Owned(tree) => match &tree.root {
            Some(_) => {
                report.answer = Answer::Owned;
                report.evidence = tree.evidence.clone();
                for m in tree.children_first() {
                    report.add_member(m);
                }
            }
            None => {
                // Escaped: the lease's processes still run (the verdict and the members say
                // which), but its wrapper is gone, so there is no session to resume.
                // What reap would do with them is decided by the same guards reap applies.
                report.answer = Answer::Dead;
                report.evidence = tree.evidence.clone();
                let (signals, refused) = crate::plan::signals_for(&tree, snap, caller);
                for m in tree.children_first() {
                    if signals.iter().any(|s| s.pid == m.pid) {
                        report.add_member(m);
                    }
                }
                for r in refused.iter().filter(|r| tree.contains(r.pid)) {
                    report.evidence.push(format!(
                        "pid {} carries the lease's markers, but `leash reap` leaves it alone: {}",
                        r.pid, r.reason
                    ));
                }
                report.evidence.push(if signals.is_empty() {
                    "the wrapper is gone, so there is no session to resume; `leash reap` \
                     signals none of the processes that carry the lease's markers (the \
                     signalling guards refuse each one): they are left alone"
                        .to_string()
                } else {
                    format!(
                        "the wrapper is gone, so there is no session to resume; {} escaped \
                         process(es) of the lease still run: `leash reap` (or the daemon's \
                         reconcile) terminates them",
                        signals.len()
                    )
                });
            }
        },
        Verdict::Gone { reason } | Verdict::NotOwned { reason } => {
            report.answer = Answer::Dead;
            report.evidence.push(reason);
        }
        Verdict::Unverifiable { reason } => {
            report.answer = Answer::Unavailable;
            report.evidence.push(reason);
        }
    }
    if lease.state.is_terminal() {
        report.evidence.push(format!(
            "the lease is {}{}",
            lease.state,
            lease
                .state_reason
                .as_deref()
                .map(|r| format!(": {r}"))
                .unwrap_or_default()
        ));
    }
    report
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{LeaseEnv, ProcessInfo};
    use std::path::Path;

    fn lease() -> Lease {
        serde_json::from_value(serde_json::json!({
            "leaseId": "L1", "sessionKey": "s", "gatewayInstanceId": "G",
            "state": "open", "ownerPid": 50, "ownerStartTime": 5,
            "rootPid": 100, "rootStartTime": 10, "commandHash": crate::model::command_hash(&["adapter".to_string()]),
            "command": ["adapter"], "wrapperPath": "/w/leash-wrap", "wrapperRoot": "/w", "startedAt": 1, "graceMs": 100,
        }))
        .expect("lease fixture")
    }

    fn wrapper(start_time: u64) -> ProcessInfo {
        ProcessInfo {
            pid: 100,
            ppid: 50,
            pgid: 100,
            sid: 100,
            uid: 0,
            start_time,
            state: 'S',
            exe: Some("/w/leash-wrap".into()),
            argv: Some(vec!["/w/leash-wrap".into(), "--".into(), "adapter".into()]),
            env: Some(LeaseEnv {
                lease_id: Some("L1".into()),
                gateway_instance_id: Some("G".into()),
            }),
            pidfs_ino: None,
        }
    }

    fn expect() -> Expect<'static> {
        Expect {
            gateway_instance_id: "G",
            wrapper_root: Path::new("/w"),
            cgroup_root: None,
        }
    }

    /// The answer from a table of `processes`, or from an unreadable one (`unavailable`).
    fn judge_with(processes: Vec<ProcessInfo>, unavailable: Option<&str>) -> VerifyReport {
        let snap = match unavailable {
            Some(why) => Err(TableError::Unavailable(why.into())),
            None => Ok(Snapshot::new(processes)),
        };
        judge(&lease(), &expect(), snap.as_ref(), &caller(0))
    }

    fn caller(uid: u32) -> Caller {
        Caller {
            pid: 7,
            pgid: 7,
            uid,
        }
    }

    /// An escapee of another uid (it carries the lease's markers; its wrapper is gone) is what
    /// `reap` leaves alone, and `verify` says the same: one verdict, not "reap terminates it".
    #[test]
    fn another_uids_escapee_is_what_reap_leaves_alone() {
        let mut escapee = wrapper(20);
        escapee.pid = 300;
        escapee.ppid = 1;
        escapee.exe = Some("/usr/bin/adapter".into());
        escapee.argv = Some(vec!["adapter".into()]);
        let snap: Result<Snapshot, TableError> = Ok(Snapshot::new(vec![escapee]));
        let l = lease();
        // The caller is uid 1000; the escapee runs as uid 0.
        let r = judge(&l, &expect(), snap.as_ref(), &caller(1000));
        assert_eq!(r.answer, Answer::Dead, "{r:?}");
        let text = r.evidence.join("\n");
        assert!(!text.contains("terminates them"), "{text}");
        assert!(text.contains("leaves it alone"), "{text}");
        assert!(r.members.is_empty(), "{r:?}");
        // Reap's plan for the same lease, the same snapshot and caller: nothing signalled.
        let plan = crate::plan::plan_lease(&l, &expect(), snap.as_ref(), &caller(1000), 100);
        assert!(plan.signals.is_empty(), "{plan:?}");
        // The lease's own uid: the escapee is reap's to end, and verify says that.
        let r = judge(&l, &expect(), snap.as_ref(), &caller(0));
        assert!(r.evidence.join("\n").contains("terminates them"), "{r:?}");
        assert_eq!(r.members.len(), 1);
    }

    #[test]
    fn a_verified_wrapper_is_owned() {
        let r = judge_with(vec![wrapper(10)], None);
        assert_eq!(r.answer, Answer::Owned, "{r:?}");
        assert_eq!(r.members.len(), 1);
        assert_eq!(r.members[0].role, Role::Root);
    }

    #[test]
    fn a_recycled_pid_is_dead() {
        let mut stranger = wrapper(99);
        stranger.env = None;
        let r = judge_with(vec![stranger], None);
        assert_eq!(r.answer, Answer::Dead);
        assert!(r.evidence.iter().any(|e| e.contains("reused")), "{r:?}");
    }

    #[test]
    fn an_absent_root_is_dead() {
        let r = judge_with(Vec::new(), None);
        assert_eq!(r.answer, Answer::Dead);
        assert_eq!(r.verdict, "gone");
    }

    #[test]
    fn an_unreadable_table_is_unavailable() {
        let r = judge_with(Vec::new(), Some("/proc is not mounted"));
        assert_eq!(r.answer, Answer::Unavailable);
        assert!(r.evidence[0].contains("/proc is not mounted"), "{r:?}");
    }
}
