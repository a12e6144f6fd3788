//! Decisions, kept pure: from leases, a process snapshot and the caller's identity, decide what
//! `close` or `reap` would do to each lease and each process, with the evidence. `reap --dry-run`
//! prints exactly this; the lifecycle controller carries it out (re-checking every process right
//! before it signals it).

use crate::guard::{self, Caller, Sig};
use crate::legacy::{verify_legacy, LegacyVerdict};
use crate::model::LegacyRecord;
use crate::model::{Lease, LeaseState, ProcessId};
use crate::model::{Snapshot, TableError};
use crate::verify::{
    check_cgroup, verify_owned_tree, CgroupState, Expect, Member, OwnedTree, Role, Verdict,
};
use serde::{Deserialize, Serialize};

/// What will happen to a lease.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "action", rename_all = "camelCase")]
pub enum Decision {
    /// SIGTERM the listed processes (children first), SIGKILL survivors after the grace, then
    /// mark the lease closed.
    Terminate,
    /// Nothing of the lease is alive: mark it lost.
    MarkLost { reason: String },
    /// Ownership could not be proven: signal nothing, keep the lease open with the reason.
    Leave { reason: String },
    /// Not a candidate (live owner, being closed by someone else, ...).
    Skip { reason: String },
}

/// One process that would be signalled, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PlannedSignal {
    pub pid: i32,
    pub start_time: u64,
    pub role: Role,
    pub argv0: Option<String>,
    /// SIGTERM first; SIGKILL to whatever is still alive after `graceMs`.
    pub signals: Vec<Sig>,
    pub evidence: String,
    /// Signalled as its process group (`PIDFD_SIGNAL_PROCESS_GROUP`, which also reaches members
    /// forked since the snapshot): only a proven member that leads its group, and only when every
    /// live member of that group in the snapshot is a proven member too. Otherwise each member
    /// gets its own signal.
    #[serde(default)]
    pub group: bool,
}

/// A process the plan will not signal, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RefusedSignal {
    pub pid: i32,
    pub reason: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LeasePlan {
    pub lease_id: String,
    pub session_key: String,
    pub state: LeaseState,
    pub owner_alive: Option<bool>,
    pub grace_ms: u64,
    pub verdict: Option<String>,
    pub decision: Decision,
    /// Children first, root last.
    pub signals: Vec<PlannedSignal>,
    pub refused: Vec<RefusedSignal>,
    pub evidence: Vec<String>,
    /// The lease's cgroup and what happens to it (containment).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cgroup: Option<CgroupPlan>,
}

/// What happens to a cgroup (a lease's, or a stray one).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum CgroupAction {
    /// Verified and populated, and every live member passes the per-member check:
    /// `cgroup.kill` (after the grace), wait until empty, remove.
    KillAndRemove,
    /// Verified and empty: remove.
    Remove,
    /// Already gone.
    None,
    /// Not verified, or populated by a process that is not proven the lease's (a bystander moved
    /// in, or a stray no open lease names): never written to, never removed.
    Leave,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CgroupPlan {
    pub path: String,
    pub id: u64,
    pub action: CgroupAction,
    /// Its members (`cgroup.procs`) when it verified.
    pub members: Vec<i32>,
    pub evidence: String,
    /// The per-member check its members passed, re-applied to whatever is in it right before
    /// `cgroup.kill` is written (`None`: no member was proven, so it is never killed, only
    /// removed when empty).
    #[serde(skip)]
    pub rule: Option<crate::verify::MemberRule>,
}

/// A cgroup under this gateway's root that no open lease accounts for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StrayCgroup {
    pub path: String,
    pub id: u64,
    pub action: CgroupAction,
    pub reason: String,
    /// The processes found in it (a populated stray is reported, never signalled).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub processes: Vec<StrayProcess>,
}

/// A process found in a stray cgroup: reported so an operator can see whose it is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StrayProcess {
    pub pid: i32,
    pub command: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LegacyPlan {
    pub id: i64,
    pub session_key: String,
    pub pid: i32,
    pub verdict: String,
    pub decision: Decision,
    pub signals: Vec<PlannedSignal>,
    pub refused: Vec<RefusedSignal>,
    pub reason: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReapPlan {
    pub gateway_instance_id: String,
    pub leases: Vec<LeasePlan>,
    pub legacy: Vec<LegacyPlan>,
    /// Closed or lost leases past the retention that would be deleted.
    pub expire: Vec<String>,
    /// Rows that could not be read (tampered or corrupt); never acted on.
    pub bad_rows: Vec<String>,
    /// Cgroups under this gateway's root of closed, lost or expired leases, or of none.
    #[serde(default)]
    pub stray_cgroups: Vec<StrayCgroup>,
    /// Closed or lost leases of which processes carrying their markers still run: escapees that
    /// left every tree (a `setsid` child of a SIGKILLed wrapper, of a lease a later `leash exec`
    /// superseded from its root's `stat`). Reap finds them by their markers: in its host-wide pass, or,
    /// for a contained lease, among what its cgroup still holds (they cannot leave it).
    #[serde(default)]
    pub escapees: Vec<LeasePlan>,
}

#[derive(Debug, Clone, Copy)]
pub struct ReapOptions {
    /// Treat leases whose owner is alive as orphans too.
    pub include_live: bool,
    pub retention_ms: i64,
    pub now_ms: i64,
    /// Overrides each lease's own grace.
    pub grace_ms: Option<u64>,
}

/// Turns a verdict into a plan for one lease: the decision, each process with its signals and
/// evidence, and the processes the signalling guards refuse.
pub fn plan_lease(
    lease: &Lease,
    expect: &Expect<'_>,
    snap: Result<&Snapshot, &TableError>,
    caller: &Caller,
    grace_ms: u64,
) -> LeasePlan {
    let mut plan = LeasePlan {
        lease_id: lease.lease_id.clone(),
        session_key: lease.session_key.clone(),
        state: lease.state,
        owner_alive: None,
        grace_ms,
        verdict: None,
        decision: Decision::Leave {
            reason: String::new(),
        },
        signals: Vec::new(),
        refused: Vec::new(),
        evidence: Vec::new(),
        cgroup: None,
    };
    let snap = match snap {
        Ok(s) => s,
        Err(e) => {
            plan.verdict = Some("unverifiable".into());
            plan.decision = Decision::Leave {
                reason: e.to_string(),
            };
            return plan;
        }
    };
    let verdict = verify_owned_tree(lease, expect, snap);
    plan.verdict = Some(verdict.name().into());
    let verifies = matches!(verdict, Verdict::Owned(_) | Verdict::Gone { .. });
    // `cgroup.kill` takes every process in the cgroup, so it is used only when every live one
    // is a proven member (a bystander moved in is neither killed with them nor counted as
    // theirs); otherwise the members are signalled one by one and the cgroup is left.
    let unproven = |procs: &[i32]| -> Vec<i32> {
        procs
            .iter()
            .copied()
            .filter(|pid| {
                let live = snap.get(*pid).is_none_or(|p| p.state != 'Z');
                let proven = matches!(&verdict, Verdict::Owned(t) if t.contains(*pid));
                // A member the signal guards refuse (another uid) is never taken by the
                // cgroup's kill either: with the root gone, a tree's uid is its first member's,
                // so a bystander of another uid alone in the cgroup would otherwise pass.
                let guarded = snap
                    .get(*pid)
                    .is_some_and(|p| guard::check_process(p.pid, p.uid, caller).is_err());
                live && (!proven || guarded)
            })
            .collect()
    };
    plan.cgroup = check_cgroup(lease, expect, snap).map(|c| {
        let mut evidence = c.evidence.clone();
        let (action, members) = match &c.state {
            _ if !verifies => (CgroupAction::Leave, Vec::new()),
            CgroupState::Verified { populated, procs } => {
                let strangers = unproven(procs);
                if !strangers.is_empty() {
                    evidence.push_str(&format!(
                        "; not proven the lease's (so no cgroup.kill; the members are signalled \
                         one by one and the cgroup is left): pid(s) {strangers:?}"
                    ));
                    (CgroupAction::Leave, procs.clone())
                } else if *populated {
                    (CgroupAction::KillAndRemove, procs.clone())
                } else {
                    (CgroupAction::Remove, procs.clone())
                }
            }
            CgroupState::Missing => (CgroupAction::None, Vec::new()),
            CgroupState::NotVerified { .. } => (CgroupAction::Leave, Vec::new()),
        };
        if !verifies {
            evidence.push_str("; the lease does not verify, so it is left alone");
        }
        CgroupPlan {
            path: c.path,
            id: c.id,
            action,
            members,
            evidence,
            rule: match &verdict {
                Verdict::Owned(t) => Some(t.rule(lease, expect)),
                _ => None,
            },
        }
    });
    let cgroup_kill = plan
        .cgroup
        .as_ref()
        .is_some_and(|c| c.action == CgroupAction::KillAndRemove);
    match verdict {
        Verdict::Owned(tree) => {
            plan.evidence = tree.evidence.clone();
            let (signals, refused) = signals_for(&tree, snap, caller);
            plan.decision = if cgroup_kill {
                // The verified cgroup takes whatever the per-process guards refuse.
                Decision::Terminate
            } else {
                terminate_unless_all_refused(&signals)
            };
            plan.signals = signals;
            plan.refused = refused;
        }
        // Root gone, no member provable one by one, but the verified cgroup is populated: its
        // members are the lease's (they could not leave it), so it is reaped, not lost.
        Verdict::Gone { .. } if cgroup_kill => plan.decision = Decision::Terminate,
        Verdict::Gone { reason } => plan.decision = Decision::MarkLost { reason },
        Verdict::NotOwned { reason } | Verdict::Unverifiable { reason } => {
            plan.decision = Decision::Leave { reason }
        }
    }
    plan
}

/// A verified tree is terminated, unless the guards refuse every one of its members.
fn terminate_unless_all_refused(signals: &[PlannedSignal]) -> Decision {
    if signals.is_empty() {
        Decision::Leave {
            reason: "every live member is refused by the signalling guards".into(),
        }
    } else {
        Decision::Terminate
    }
}

/// Applies the signalling guards to each member of a verified tree.
pub fn signals_for(
    tree: &OwnedTree,
    snap: &Snapshot,
    caller: &Caller,
) -> (Vec<PlannedSignal>, Vec<RefusedSignal>) {
    let mut signals = Vec::new();
    let mut refused: Vec<RefusedSignal> = tree
        .excluded
        .iter()
        .map(|e| RefusedSignal {
            pid: e.pid,
            reason: e.reason.clone(),
        })
        .collect();
    for m in tree.children_first() {
        let guard = match snap.get(m.pid) {
            Some(info) => guard::check_process(info.pid, info.uid, caller),
            None => Ok(()),
        };
        // A group signal reaches every process in the group, so only a proven leader whose
        // group holds nothing but proven members (zombies aside) gets one.
        let group = m.role == Role::Adapter
            && m.pgid == m.pid
            && snap
                .group(m.pgid)
                .all(|p| p.state == 'Z' || tree.contains(p.pid));
        match guard {
            Ok(()) => signals.push(PlannedSignal {
                group,
                ..planned(m)
            }),
            Err(r) => refused.push(RefusedSignal {
                pid: m.pid,
                reason: r.to_string(),
            }),
        }
    }
    (signals, refused)
}

fn planned(m: &Member) -> PlannedSignal {
    PlannedSignal {
        pid: m.pid,
        start_time: m.start_time,
        role: m.role,
        argv0: m.argv0.clone(),
        signals: vec![Sig::Term, Sig::Kill],
        evidence: m.evidence.clone(),
        group: false,
    }
}

/// Is this process instance alive in the snapshot?
fn alive(snap: &Snapshot, id: ProcessId) -> bool {
    snap.instance(id).is_some_and(|p| p.state != 'Z')
}

/// The startup-reap plan: for this gateway's open and closing leases whose owner is gone (and
/// whose closing claimant, if any, is gone too), verify and decide; live sessions are skipped.
pub fn plan_reap(
    leases: &[Result<Lease, String>],
    legacy: &[LegacyRecord],
    expect: &Expect<'_>,
    snap: Result<&Snapshot, &TableError>,
    caller: &Caller,
    opts: &ReapOptions,
) -> ReapPlan {
    let mut plan = ReapPlan {
        gateway_instance_id: expect.gateway_instance_id.to_string(),
        leases: Vec::new(),
        legacy: Vec::new(),
        expire: Vec::new(),
        bad_rows: Vec::new(),
        stray_cgroups: Vec::new(),
        escapees: Vec::new(),
    };
    for l in leases {
        let lease = match l {
            Ok(l) => l,
            Err(e) => {
                plan.bad_rows.push(e.clone());
                continue;
            }
        };
        if lease.state.is_terminal() {
            let ended = lease.closed_at.unwrap_or(lease.started_at);
            if ended < opts.now_ms - opts.retention_ms {
                plan.expire.push(lease.lease_id.clone());
            }
            // Its escapees: found by their markers in the one pass (an index lookup per lease),
            // verified like any member (started after the root, same uid, no other lease's
            // marker), and terminated without reopening the lease.
            let carriers = snap
                .ok()
                .is_some_and(|s| s.marked(&lease.lease_id).next().is_some());
            if carriers && lease.gateway_instance_id == expect.gateway_instance_id {
                let grace = opts.grace_ms.unwrap_or(lease.grace_ms);
                let lp = plan_lease(lease, expect, snap, caller, grace);
                if lp.decision == Decision::Terminate {
                    plan.escapees.push(lp);
                }
            }
            continue;
        }
        let grace = opts.grace_ms.unwrap_or(lease.grace_ms);
        let owner_alive = snap.ok().map(|s| alive(s, lease.owner()));
        let claimant_alive = match (snap, lease.claimed_by) {
            (Ok(s), Some(c)) => alive(s, c),
            _ => false,
        };
        let mut lp = plan_lease(lease, expect, snap, caller, grace);
        lp.owner_alive = owner_alive;
        // A session whose wrapper is gone while its verified cgroup is still populated is over,
        // whoever its owner is (an OOM kill or `kill -9` of the wrapper): nothing supervises what
        // is left in it, so it is reaped even while the owner lives.
        let root_alive = snap.ok().map(|s| alive(s, lease.root()));
        let unsupervised = root_alive == Some(false)
            && lp
                .cgroup
                .as_ref()
                .is_some_and(|c| c.action == CgroupAction::KillAndRemove);
        let skip = if lease.gateway_instance_id != expect.gateway_instance_id {
            // Reported by verification too, but never even planned: not this gateway's lease.
            None
        } else if lease.state == LeaseState::Closing && claimant_alive {
            Some(format!(
                "being closed by pid {}",
                lease.claimed_by.map_or(0, |c| c.pid)
            ))
        } else if owner_alive == Some(true) && !unsupervised && !opts.include_live {
            Some(format!(
                "owner pid {} is alive: a live session (use --include-live to reap it anyway)",
                lease.owner_pid
            ))
        } else {
            None
        };
        if let Some(reason) = skip {
            lp.decision = Decision::Skip { reason };
            lp.signals.clear();
        }
        plan.leases.push(lp);
    }
    for rec in legacy {
        plan.legacy.push(plan_legacy(rec, expect, snap, caller));
    }
    plan
}

/// Which directories under this gateway's cgroup root are strays: named for a lease that is
/// closed, lost, expired or unknown (a crash between mkdir and the commit). An unknown name is a
/// stray only once it is older than `min_age_ms` by its UUID v7 timestamp, because `leash exec`
/// makes the directory just before it commits the lease; names that are not lease ids are left
/// alone (leash never makes them). Active leases' cgroups are their leases' business.
pub fn plan_strays(
    gateway_root: &std::path::Path,
    dirs: &[(String, u64)],
    leases: &[Result<Lease, String>],
    now_ms: i64,
    min_age_ms: i64,
) -> Vec<StrayCgroup> {
    let known: std::collections::HashMap<&str, &Lease> = leases
        .iter()
        .filter_map(|l| l.as_ref().ok())
        .map(|l| (l.lease_id.as_str(), l))
        .collect();
    let mut out = Vec::new();
    for (name, id) in dirs {
        if name == crate::model::GATEWAY_HOLD {
            continue;
        }
        let path = gateway_root.join(name).display().to_string();
        let stray = |action, reason: String| StrayCgroup {
            path: path.clone(),
            id: *id,
            action,
            reason,
            processes: Vec::new(),
        };
        let Ok(uuid) = uuid::Uuid::try_parse(name) else {
            out.push(stray(
                CgroupAction::Leave,
                "not named for a lease id: leash did not make it".into(),
            ));
            continue;
        };
        match known.get(name.as_str()) {
            Some(l) if l.state.is_active() => {}
            Some(l) => match l.cgroup_id {
                Some(rec) if rec == *id => out.push(stray(
                    CgroupAction::Remove,
                    format!("its lease is {}", l.state),
                )),
                Some(rec) => out.push(stray(
                    CgroupAction::Leave,
                    format!(
                        "its lease is {} but records cgroup id {rec}, not {id}: not the lease's",
                        l.state
                    ),
                )),
                None => out.push(stray(
                    CgroupAction::Leave,
                    format!(
                        "its lease is {} and records no cgroup id, so cgroup id {id} is not \
                         proven the lease's",
                        l.state
                    ),
                )),
            },
            None => {
                let made_ms = uuid_time_ms(&uuid).unwrap_or(0);
                if now_ms - made_ms < min_age_ms {
                    out.push(stray(
                        CgroupAction::Leave,
                        "no lease yet: a leash exec may be committing it now".into(),
                    ));
                } else {
                    out.push(stray(
                        CgroupAction::Remove,
                        "no lease names it (a leash exec ended between mkdir and commit, or \
                         its lease expired)"
                            .into(),
                    ));
                }
            }
        }
    }
    out
}

/// The time a lease id carries, in milliseconds since the Unix epoch: a UUIDv7's 48-bit prefix
/// (and a v1's or v6's timestamp, as `uuid` reads it); `None` for a UUID without one.
fn uuid_time_ms(u: &uuid::Uuid) -> Option<i64> {
    let (secs, nanos) = u.get_timestamp()?.to_unix();
    Some(secs as i64 * 1000 + i64::from(nanos) / 1_000_000)
}

/// What the sweep may do with a stray it would remove, given what is in it now. No open lease
/// names a stray, and a lease's wrapper starts only after the lease is committed, so nothing
/// leash started can be in one: an empty stray is removed (`rmdir`, which the kernel refuses
/// should a process be moved in meanwhile), a populated one is reported with its processes and
/// never signalled, never removed. `command` names a pid's command line where it is readable.
pub fn settle_stray(
    mut s: StrayCgroup,
    obs: &crate::model::Observation,
    command: impl Fn(i32) -> Option<String>,
) -> StrayCgroup {
    if s.action != CgroupAction::Remove {
        return s;
    }
    if let Some(e) = &obs.error {
        s.action = CgroupAction::Leave;
        s.reason = format!("{}; not read ({e}), so left alone", s.reason);
    } else if obs.id.is_none() {
        s.action = CgroupAction::None;
        s.reason = format!("{}; already gone", s.reason);
    } else if let Some(now) = obs.id.filter(|&now| now != s.id) {
        s.action = CgroupAction::Leave;
        s.reason = format!(
            "{}; made again since it was listed (cgroup id {now}, listed {}), so left alone",
            s.reason, s.id
        );
    } else if obs.populated || !obs.procs.is_empty() {
        s.processes = obs
            .procs
            .iter()
            .map(|&pid| StrayProcess {
                pid,
                command: command(pid),
            })
            .collect();
        s.action = CgroupAction::Leave;
        s.reason = format!(
            "{}; populated by {} process(es) leash did not start (a lease's wrapper starts only \
             after its lease is committed): reported, never signalled, left in place",
            s.reason,
            s.processes.len()
        );
    }
    s
}

/// Settles every stray [`plan_strays`] found, from what the live system shows of each: `observe`
/// reads a stray's cgroup now, `command` names a pid's command line, and `wrapper_may_run` says
/// whether an ended lease's wrapper may still run (alive, or not readable). [`settle_stray`]
/// first; then a stray it would remove stays while the wrapper of its ended lease may still run
/// ([`keep_while_wrapper_runs`]). The dry run and the sweep both come here, so they say the same.
pub fn settle_strays(
    strays: Vec<StrayCgroup>,
    leases: &[Result<Lease, String>],
    observe: impl Fn(&str) -> crate::model::Observation,
    command: impl Fn(i32) -> Option<String>,
    wrapper_may_run: impl Fn(&Lease) -> bool,
) -> Vec<StrayCgroup> {
    // The ended leases by id, once: each stray to remove is looked up here, not searched for.
    let ended: std::collections::HashMap<&str, &Lease> = leases
        .iter()
        .filter_map(|l| l.as_ref().ok())
        .filter(|l| l.state.is_terminal())
        .map(|l| (l.lease_id.as_str(), l))
        .collect();
    strays
        .into_iter()
        .map(|s| {
            let obs = observe(&s.path);
            let s = settle_stray(s, &obs, &command);
            keep_while_wrapper_runs(s, &ended, &wrapper_may_run)
        })
        .collect()
}

/// A stray the sweep would remove stays while the wrapper of its (ended) lease may still run:
/// the lease's cgroup is what tells reap to look for that wrapper, so it goes only once the
/// wrapper is gone (the wrapper removes it itself as it exits). `wrapper_may_run` is asked only
/// for a stray that would be removed and is named for an ended lease: one live read per such
/// stray, none for the leases' history.
pub fn keep_while_wrapper_runs(
    mut s: StrayCgroup,
    ended: &std::collections::HashMap<&str, &Lease>,
    wrapper_may_run: impl Fn(&Lease) -> bool,
) -> StrayCgroup {
    if s.action != CgroupAction::Remove {
        return s;
    }
    let name = std::path::Path::new(&s.path)
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("");
    let Some(l) = ended.get(name) else {
        return s;
    };
    if wrapper_may_run(l) {
        s.action = CgroupAction::Leave;
        s.reason = format!(
            "{}; but its wrapper (pid {}) still runs, so it stays until the wrapper ends",
            s.reason, l.root_pid
        );
    }
    s
}

pub fn plan_legacy(
    rec: &LegacyRecord,
    expect: &Expect<'_>,
    snap: Result<&Snapshot, &TableError>,
    caller: &Caller,
) -> LegacyPlan {
    let mut lp = LegacyPlan {
        id: rec.id,
        session_key: rec.session_key.clone(),
        pid: rec.pid,
        verdict: "unverifiable".into(),
        decision: Decision::Leave {
            reason: String::new(),
        },
        signals: Vec::new(),
        refused: Vec::new(),
        reason: String::new(),
    };
    let snap = match snap {
        Ok(s) => s,
        Err(e) => {
            lp.reason = e.to_string();
            lp.decision = Decision::Leave {
                reason: lp.reason.clone(),
            };
            return lp;
        }
    };
    match verify_legacy(rec, expect, snap, caller) {
        LegacyVerdict::Owned { tree, reason } => {
            lp.verdict = "owned".into();
            lp.reason = reason;
            let (signals, refused) = signals_for(&tree, snap, caller);
            lp.decision = terminate_unless_all_refused(&signals);
            lp.signals = signals;
            lp.refused = refused;
        }
        LegacyVerdict::Gone { reason } => {
            lp.verdict = "gone".into();
            lp.reason = reason.clone();
            lp.decision = Decision::MarkLost { reason };
        }
        LegacyVerdict::Refused { reason } => {
            lp.verdict = "refused".into();
            lp.reason = reason.clone();
            lp.decision = Decision::Leave { reason };
        }
    }
    lp
}

/// What [`supersede`] reads of the live system about a previous lease of the same session key.
/// Each read is asked only when the decision needs it, in the order below.
pub trait SupersedeReads {
    /// The old lease's root still runs, or cannot be read: the session is live either way.
    fn root_may_run(&self, old: &Lease) -> bool;
    /// The adapter and its process group from the wrapper's report (when the row has neither
    /// folded in yet): `(process group, adapter)`.
    fn reported(&self, old: &Lease) -> (Option<i32>, Option<ProcessId>);
    /// A member of process group `pgid` is alive.
    fn group_alive(&self, pgid: i32) -> bool;
    /// The adapter is not gone (alive, a zombie, or unreadable).
    fn adapter_may_run(&self, adapter: ProcessId) -> bool;
    /// The whole process table; `None` when it cannot be read.
    fn snapshot(&self) -> Option<Snapshot>;
    /// The cgroup at `path` as it is now.
    fn observe(&self, path: &std::path::Path) -> crate::model::Observation;
    /// The process at `pid`, if one runs there.
    fn process(&self, pid: i32) -> Option<crate::model::ProcessInfo>;
}

/// Whether a new lease of the same session key supersedes `old`: `Some(reason)` when nothing of
/// it is alive any more (the reason is recorded as the old lease's end), `None` when it may still
/// be live (then `exec` refuses the key). The old root still running, or unreadable, keeps it
/// without another read. Otherwise a host-wide snapshot is read only when its group or adapter
/// may still run (something of it may live outside any cgroup); else the old lease's own cgroup,
/// `<cgroup root>/<lease id>` exactly, is what is looked at: its members are read one by one, and
/// an env-less escapee in it keeps the lease alive.
pub fn supersede(
    old: &Lease,
    expect: &Expect<'_>,
    new_lease_id: &str,
    reads: &dyn SupersedeReads,
) -> Option<String> {
    if reads.root_may_run(old) {
        return None;
    }
    let needs_report = old.process_group_id.is_none() || old.adapter().is_none();
    let (rep_pgid, rep_adapter) = if needs_report {
        reads.reported(old)
    } else {
        (None, None)
    };
    let pgid = old.process_group_id.or(rep_pgid);
    let adapter = old.adapter().or(rep_adapter);
    let group_alive = pgid.is_some_and(|g| reads.group_alive(g));
    let adapter_alive = adapter.is_some_and(|a| reads.adapter_may_run(a));
    let mut snap = if group_alive || adapter_alive {
        reads.snapshot()?
    } else {
        Snapshot::default()
    };
    if let (Some(p), Some(cg_root)) = (&old.cgroup_path, expect.cgroup_root) {
        let path = std::path::Path::new(p);
        if path == cg_root.join(&old.lease_id) {
            let obs = reads.observe(path);
            if !group_alive && !adapter_alive && !obs.procs.is_empty() {
                snap = Snapshot::new(obs.procs.iter().filter_map(|&pid| reads.process(pid)));
            }
            snap.add_cgroup(obs);
        }
    }
    match verify_owned_tree(old, expect, &snap) {
        Verdict::Gone { reason } => Some(format!("superseded by lease {new_lease_id}: {reason}")),
        _ => None,
    }
}

/// Whether the daemon takes over the close of a live session whose lease row another process moved
/// to `state`. `Open` is not a change. `Ended` is not a close either: it is the wrapper's report of
/// the adapter's own exit, ingested by whichever process read it first (the session's waiter,
/// another session's settle, a `leash reap`) — nothing was signalled and there is nothing to
/// finish; the session's waiter settles the lease when it reaps the wrapper, and how the session
/// ended (a start failure among others) is its to tell. A lease someone else is closing, closed
/// or marked lost is taken over: the session stops taking input and the daemon finishes the close.
pub fn take_over_changed_lease(state: LeaseState) -> bool {
    match state {
        LeaseState::Open | LeaseState::Ended => false,
        LeaseState::Closing | LeaseState::Closed | LeaseState::Lost => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Observation;
    use std::cell::Cell;

    const LID: &str = "01936b2a-7c4e-7d10-9a51-3b2c1d0e9f8a";
    const OTHER: &str = "01936b2a-7c4e-7d10-9a51-3b2c1d0e9f8b";
    const ROOT: &str = "/cg/leash/gw";

    #[test]
    fn a_lease_ended_by_its_wrappers_report_is_not_taken_over() {
        let taken: Vec<LeaseState> = LeaseState::ALL
            .into_iter()
            .filter(|s| take_over_changed_lease(*s))
            .collect();
        assert_eq!(
            taken,
            [LeaseState::Closing, LeaseState::Closed, LeaseState::Lost]
        );
    }

    fn ended_lease(id: &str, cgroup_id: u64) -> Lease {
        Lease::builder(id, "gw")
            .wrapper("/s/wrappers", "/s/wrappers/leash-wrap")
            .root(100, 1000)
            .cgroup((format!("{ROOT}/{id}"), cgroup_id))
            .process_group(101)
            .adapter((101, 1001))
            .owner(50, 10)
            .state(LeaseState::Closed)
            .closed_at(1)
            .build()
    }

    fn seen(path: &str, id: u64, procs: Vec<i32>) -> Observation {
        Observation {
            path: path.into(),
            id: Some(id),
            populated: !procs.is_empty(),
            procs,
            error: None,
        }
    }

    /// One stray per case: the ended lease's empty cgroup (7), an ended lease's populated one
    /// (8), and a directory no lease names, old enough to go (9).
    fn settle(wrapper_runs: bool, asked: &Cell<usize>) -> Vec<StrayCgroup> {
        let old = "01000000-0000-7000-8000-000000000000";
        let leases = vec![Ok(ended_lease(LID, 7)), Ok(ended_lease(OTHER, 8))];
        let dirs = vec![
            (LID.to_string(), 7),
            (OTHER.to_string(), 8),
            (old.to_string(), 9),
        ];
        let strays = plan_strays(std::path::Path::new(ROOT), &dirs, &leases, i64::MAX / 2, 1);
        let observe = |path: &str| {
            let id = dirs
                .iter()
                .find(|(n, _)| path.ends_with(n.as_str()))
                .map(|d| d.1)
                .unwrap();
            seen(path, id, if id == 8 { vec![4242] } else { vec![] })
        };
        let wrapper_may_run = |l: &Lease| {
            asked.set(asked.get() + 1);
            assert_eq!(l.lease_id, LID, "asked only of the removable ended lease");
            wrapper_runs
        };
        settle_strays(strays, &leases, observe, |_| None, wrapper_may_run)
    }

    /// A lease id's time, as stray cgroups are aged by it: a v7's millisecond prefix; none for
    /// a v4; a name that is no UUID is no lease id.
    #[test]
    fn a_lease_id_carries_its_time() {
        // A v7 made at 2025-01-01T00:00:00Z.
        let v7 = uuid::Uuid::try_parse("01941f29-7c00-7abc-8def-0123456789ab").unwrap();
        assert_eq!(uuid_time_ms(&v7), Some(1_735_689_600_000));
        let v4 = uuid::Uuid::try_parse("0b5c1e6a-2f1d-4c3b-9a8e-7d6c5b4a3f2e").unwrap();
        assert_eq!(uuid_time_ms(&v4), None);
        for bad in ["", "lease", "01941f29-7c00-7abc-8def-0123456789a"] {
            assert!(uuid::Uuid::try_parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_daemons_hold_is_no_stray() {
        let dirs = vec![
            (crate::model::GATEWAY_HOLD.to_string(), 3),
            ("not-a-lease".to_string(), 4),
        ];
        let strays = plan_strays(std::path::Path::new(ROOT), &dirs, &[], i64::MAX / 2, 1);
        let paths: Vec<&str> = strays.iter().map(|s| s.path.as_str()).collect();
        assert_eq!(paths, [format!("{ROOT}/not-a-lease")]);
    }

    /// A stray's reason names cgroup ids as numbers (what `cgroupId` holds), never Rust's
    /// `Some(…)`: a lease that records another id, one that records none, and a directory made
    /// again between the listing and the look.
    #[test]
    fn stray_reasons_name_cgroup_ids_in_plain_words() {
        let mut unrecorded = ended_lease(OTHER, 0);
        unrecorded.cgroup_id = None;
        let leases = vec![Ok(ended_lease(LID, 276950)), Ok(unrecorded)];
        let dirs = vec![(LID.to_string(), 7), (OTHER.to_string(), 8)];
        let strays = plan_strays(std::path::Path::new(ROOT), &dirs, &leases, i64::MAX / 2, 1);
        assert_eq!(
            strays[0].reason,
            "its lease is closed but records cgroup id 276950, not 7: not the lease's"
        );
        assert_eq!(
            strays[1].reason,
            "its lease is closed and records no cgroup id, so cgroup id 8 is not proven the \
             lease's"
        );
        let remade = StrayCgroup {
            path: format!("{ROOT}/{LID}"),
            id: 7,
            action: CgroupAction::Remove,
            reason: "its lease is closed".into(),
            processes: Vec::new(),
        };
        let s = settle_stray(remade, &seen(&format!("{ROOT}/{LID}"), 9, vec![]), |_| None);
        assert_eq!(
            s.reason,
            "its lease is closed; made again since it was listed (cgroup id 9, listed 7), so left \
             alone"
        );
        for r in [&strays[0].reason, &strays[1].reason, &s.reason] {
            assert!(!r.contains("Some(") && !r.contains("None"), "{r}");
        }
    }

    #[test]
    fn an_ended_leases_empty_cgroup_stays_while_its_wrapper_may_run() {
        let asked = Cell::new(0);
        let s = settle(true, &asked);
        assert_eq!(asked.get(), 1);
        assert_eq!(s[0].action, CgroupAction::Leave);
        assert_eq!(
            s[0].reason,
            "its lease is closed; but its wrapper (pid 100) still runs, so it stays until the \
             wrapper ends"
        );
        // The populated one is reported and left whatever the wrapper does; the one no lease
        // names goes.
        assert_eq!(s[1].action, CgroupAction::Leave);
        assert_eq!(s[1].processes.len(), 1);
        assert_eq!(s[2].action, CgroupAction::Remove);
    }

    #[test]
    fn an_ended_leases_empty_cgroup_goes_once_its_wrapper_is_gone() {
        let asked = Cell::new(0);
        let s = settle(false, &asked);
        assert_eq!(asked.get(), 1);
        assert_eq!(s[0].action, CgroupAction::Remove);
        assert_eq!(s[0].reason, "its lease is closed");
        assert_eq!(s[1].action, CgroupAction::Leave);
        assert_eq!(s[2].action, CgroupAction::Remove);
    }

    /// A scripted live system for [`supersede`], counting what it was asked.
    #[derive(Default)]
    struct Scripted {
        root_runs: bool,
        group: bool,
        adapter: bool,
        members: Vec<i32>,
        table: bool,
        asked: std::cell::RefCell<Vec<&'static str>>,
    }

    impl Scripted {
        fn ask(&self, what: &'static str) {
            self.asked.borrow_mut().push(what);
        }
        fn asked(&self) -> Vec<&'static str> {
            self.asked.borrow().clone()
        }
    }

    impl SupersedeReads for Scripted {
        fn root_may_run(&self, _: &Lease) -> bool {
            self.ask("root");
            self.root_runs
        }
        fn reported(&self, _: &Lease) -> (Option<i32>, Option<ProcessId>) {
            self.ask("report");
            (None, None)
        }
        fn group_alive(&self, _: i32) -> bool {
            self.ask("group");
            self.group
        }
        fn adapter_may_run(&self, _: ProcessId) -> bool {
            self.ask("adapter");
            self.adapter
        }
        fn snapshot(&self) -> Option<Snapshot> {
            self.ask("snapshot");
            self.table.then(Snapshot::default)
        }
        fn observe(&self, path: &std::path::Path) -> Observation {
            self.ask("observe");
            seen(path.to_str().unwrap(), 7, self.members.clone())
        }
        fn process(&self, pid: i32) -> Option<crate::model::ProcessInfo> {
            self.ask("process");
            Some(crate::model::ProcessInfo {
                pid,
                ppid: 1,
                pgid: pid,
                sid: pid,
                uid: 0,
                start_time: 5000,
                state: 'S',
                exe: Some("/usr/bin/escapee".into()),
                argv: Some(vec!["escapee".into()]),
                env: None,
                pidfs_ino: None,
            })
        }
    }

    fn supersede_of(reads: &Scripted) -> Option<String> {
        let mut old = ended_lease(LID, 7);
        old.state = LeaseState::Open;
        old.closed_at = None;
        let expect = Expect {
            gateway_instance_id: "gw",
            wrapper_root: std::path::Path::new("/s/wrappers"),
            cgroup_root: Some(std::path::Path::new(ROOT)),
        };
        supersede(&old, &expect, "next", reads)
    }

    #[test]
    fn a_running_root_keeps_the_old_lease_without_another_read() {
        let r = Scripted {
            root_runs: true,
            ..Scripted::default()
        };
        assert_eq!(supersede_of(&r), None);
        assert_eq!(r.asked(), ["root"]);
    }

    #[test]
    fn a_lease_with_nothing_left_is_superseded_without_the_host_table() {
        let r = Scripted::default();
        let reason = supersede_of(&r).expect("superseded");
        assert!(reason.starts_with("superseded by lease next: "), "{reason}");
        // The row names the group and the adapter, so the report is not read; no snapshot.
        assert_eq!(r.asked(), ["root", "group", "adapter", "observe"]);
    }

    #[test]
    fn an_env_less_escapee_in_the_old_cgroup_keeps_it() {
        let r = Scripted {
            members: vec![4242],
            ..Scripted::default()
        };
        assert_eq!(supersede_of(&r), None, "its cgroup still has a member");
        assert_eq!(
            r.asked(),
            ["root", "group", "adapter", "observe", "process"]
        );
    }

    #[test]
    fn a_live_group_takes_the_host_table_and_an_unreadable_one_keeps_the_lease() {
        let r = Scripted {
            group: true,
            ..Scripted::default()
        };
        assert_eq!(supersede_of(&r), None, "no table, no proof it is over");
        assert_eq!(r.asked(), ["root", "group", "adapter", "snapshot"]);
        let r = Scripted {
            group: true,
            table: true,
            ..Scripted::default()
        };
        assert!(supersede_of(&r).is_some(), "the table shows nothing of it");
        assert_eq!(
            r.asked(),
            ["root", "group", "adapter", "snapshot", "observe"]
        );
    }

    #[test]
    fn the_report_is_read_only_for_what_the_row_lacks() {
        let r = Scripted::default();
        let mut old = ended_lease(LID, 7);
        old.process_group_id = None;
        old.adapter_pid = None;
        let expect = Expect {
            gateway_instance_id: "gw",
            wrapper_root: std::path::Path::new("/s/wrappers"),
            cgroup_root: None,
        };
        assert!(supersede(&old, &expect, "next", &r).is_some());
        assert_eq!(
            r.asked(),
            ["root", "report"],
            "no cgroup root: its cgroup is not looked at"
        );
    }
}
