//! `leash verify`: the one question a gateway asks before it resumes a stored session — is this
//! lease's process still alive and ours (`owned`), is ownership disproven (`dead`: gone, or its
//! pid now names someone else), or can nobody tell (`unavailable`: the process table could not
//! be read)?
//!
//! [`judge`] is pure: a lease, what the state root expects of it, and a process snapshot (or the
//! reason there is none) in; a [`VerifyReport`] with its evidence out. [`Controller::verify`]
//! (the CLI's direct path and the daemon's `verify` op) reads the lease row and the same
//! evidence `leash ps` reads ([`crate::ps::observe_lease`]: the root's subtree while the root
//! runs, else the whole table, plus the lease's cgroup), and judges it with the same
//! [`verify_owned_tree`] `reap --dry-run` and `close` use, so every verb gives one answer about
//! one lease. Nothing here signals.
//!
//! The answer is deliberately coarser than [`leash_core::verify::Verdict`]: a lease whose wrapper is
//! gone but whose escapees still run (verdict `escaped`, the escapees listed as members) is
//! `dead` for a gateway (there is no session to resume; `reap` or the daemon's reconcile takes
//! the escapees), and `not-owned` is `dead` too (the evidence disproves ownership, so resuming
//! would talk to a stranger).

use super::{Controller, LeaseRef};
use crate::store::StoreError;
use leash_core::guard::Caller;
use leash_core::kind::{HasKind, Kind};
use leash_core::model::Snapshot;
use leash_core::model::TableError;
use leash_core::model::{Lease, LeaseState};
use leash_core::verify::{verify_owned_tree, Expect, Role, Verdict};
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

impl From<&leash_core::verify::Member> for LiveMember {
    fn from(m: &leash_core::verify::Member) -> LiveMember {
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

#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("no lease {0}")]
    NoLease(String),
    #[error("session {0} has no lease")]
    NoSession(String),
}

impl HasKind for VerifyError {
    fn kind(&self) -> Kind {
        match self {
            VerifyError::Store(e) => e.kind(),
            VerifyError::NoLease(_) | VerifyError::NoSession(_) => Kind::NotFound,
        }
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
                    report.evidence.push(format!(
                        "pid {} ({}, start time {}): {}",
                        m.pid,
                        m.role.name(),
                        m.start_time,
                        m.evidence
                    ));
                    report.members.push(LiveMember::from(m));
                }
            }
            None => {
                // Escaped: the lease's processes still run (the verdict and the members say
                // which), but its wrapper is gone, so there is no session to resume.
                // What reap would do with them is decided by the same guards reap applies.
                report.answer = Answer::Dead;
                report.evidence = tree.evidence.clone();
                let (signals, refused) = leash_core::plan::signals_for(&tree, snap, caller);
                for m in tree.children_first() {
                    if signals.iter().any(|s| s.pid == m.pid) {
                        report.evidence.push(format!(
                            "pid {} ({}, start time {}): {}",
                            m.pid,
                            m.role.name(),
                            m.start_time,
                            m.evidence
                        ));
                        report.members.push(LiveMember::from(m));
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

impl Controller<'_> {
    /// Reads the lease and its root's tree and judges it. Never signals. A session key names its
    /// active lease, else its latest one (a gateway asking about a stored session whose lease has
    /// ended gets `dead`, not "not found").
    pub fn verify(&self, target: &LeaseRef) -> Result<VerifyReport, VerifyError> {
        let lease = {
            let store = self.store();
            match target {
                LeaseRef::Id(id) => store
                    .lease(id)?
                    .ok_or_else(|| VerifyError::NoLease(id.clone()))?,
                LeaseRef::Session(key) => match store.active_lease_for_session(key)? {
                    Some(l) => l,
                    None => store
                        .latest_lease_for_session(key)?
                        .ok_or_else(|| VerifyError::NoSession(key.clone()))?,
                },
            }
        };
        let wrapper_root = self.wrapper_root();
        let cgroup_root = self.cgroup_root();
        let expect = Expect {
            gateway_instance_id: &self.gateway,
            wrapper_root: &wrapper_root,
            cgroup_root: cgroup_root.as_deref(),
        };
        // The same evidence `ps` reads, judged by the same verifier `reap --dry-run` and `close`
        // use: one ownership answer whichever verb asks.
        let snap = crate::ps::observe_lease(&lease, &expect, self.table);
        let report = judge(&lease, &expect, snap.as_ref(), &self.caller);
        tracing::info!(lease_id = %report.lease_id, session = %report.session_key, pid = report.root_pid, op = "verify", answer = report.answer.as_str(), "verified");
        Ok(report)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proc::{FixtureTable, ProcessTable};
    use leash_core::model::{LeaseEnv, ProcessInfo};
    use std::path::Path;

    fn lease() -> Lease {
        serde_json::from_value(serde_json::json!({
            "leaseId": "L1", "sessionKey": "s", "gatewayInstanceId": "G",
            "state": "open", "ownerPid": 50, "ownerStartTime": 5,
            "rootPid": 100, "rootStartTime": 10, "commandHash": leash_core::model::command_hash(&["adapter".to_string()]),
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

    fn judge_with(t: &FixtureTable) -> VerifyReport {
        let snap = t.snapshot();
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
        let t = FixtureTable {
            processes: vec![escapee],
            unavailable: None,
        };
        let snap = t.snapshot();
        let l = lease();
        // The caller is uid 1000; the escapee runs as uid 0.
        let r = judge(&l, &expect(), snap.as_ref(), &caller(1000));
        assert_eq!(r.answer, Answer::Dead, "{r:?}");
        let text = r.evidence.join("\n");
        assert!(!text.contains("terminates them"), "{text}");
        assert!(text.contains("leaves it alone"), "{text}");
        assert!(r.members.is_empty(), "{r:?}");
        // Reap's plan for the same lease, the same snapshot and caller: nothing signalled.
        let plan = leash_core::plan::plan_lease(&l, &expect(), snap.as_ref(), &caller(1000), 100);
        assert!(plan.signals.is_empty(), "{plan:?}");
        // The lease's own uid: the escapee is reap's to end, and verify says that.
        let r = judge(&l, &expect(), snap.as_ref(), &caller(0));
        assert!(r.evidence.join("\n").contains("terminates them"), "{r:?}");
        assert_eq!(r.members.len(), 1);
    }

    #[test]
    fn a_verified_wrapper_is_owned() {
        let r = judge_with(&FixtureTable {
            processes: vec![wrapper(10)],
            unavailable: None,
        });
        assert_eq!(r.answer, Answer::Owned, "{r:?}");
        assert_eq!(r.members.len(), 1);
        assert_eq!(r.members[0].role, Role::Root);
    }

    #[test]
    fn a_recycled_pid_is_dead() {
        let mut stranger = wrapper(99);
        stranger.env = None;
        let r = judge_with(&FixtureTable {
            processes: vec![stranger],
            unavailable: None,
        });
        assert_eq!(r.answer, Answer::Dead);
        assert!(r.evidence.iter().any(|e| e.contains("reused")), "{r:?}");
    }

    #[test]
    fn an_absent_root_is_dead() {
        let r = judge_with(&FixtureTable::default());
        assert_eq!(r.answer, Answer::Dead);
        assert_eq!(r.verdict, "gone");
    }

    #[test]
    fn an_unreadable_table_is_unavailable() {
        let r = judge_with(&FixtureTable {
            processes: Vec::new(),
            unavailable: Some("/proc is not mounted".into()),
        });
        assert_eq!(r.answer, Answer::Unavailable);
        assert!(r.evidence[0].contains("/proc is not mounted"), "{r:?}");
    }
}
