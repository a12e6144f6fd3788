//! The lifecycle controller: the three intents, kept distinct.
//!
//! - `cancel` records the intent and signals nothing; the lease stays open (the ACP turn itself
//!   is cancelled by whoever holds the adapter's stdin: the daemon).
//! - `close` claims the lease (`open → closing`), verifies the live tree against it, SIGTERMs
//!   members children first, waits the grace, SIGKILLs survivors, and marks it `closed`; `lost`
//!   when nothing was alive; back to `open` with the reason when ownership could not be proven.
//!   Closing many leases runs their grace periods concurrently.
//! - `reap` starts from this gateway's open and closing leases whose owner is gone, never from a
//!   search of command lines, and does the same per lease; it also handles legacy records and
//!   expires old closed/lost leases.
//!
//! Every signal goes through [`crate::signal`], which re-checks the process through a pidfd.

use crate::lease::{Lease, LeaseState, ProcessId};
use crate::legacy::{self, LegacyRecord};
use crate::plan::{self, Decision, PlannedSignal, ReapOptions, ReapPlan};
use crate::proc::{self, ProcessTable, Snapshot, TableError};
use crate::report::{self, WrapperReport};
use crate::signal::{self, Caller, Delivery, Pinned, Sig, SignalError};
use crate::state::StateRoot;
use crate::store::{Store, StoreError, Transition};
use crate::verify::{Expect, Role};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// After SIGKILL, how long to wait for the kernel to finish the processes off before reporting.
const KILL_WAIT: Duration = Duration::from_secs(5);

/// After its tree got SIGKILL, how long the wrapper gets to reap it and exit on its own (so its
/// report carries the adapter's exit status) before it gets SIGKILL too.
const ROOT_GRACE: Duration = Duration::from_secs(1);

#[derive(Debug, thiserror::Error)]
pub enum LifecycleError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("no lease {0}")]
    NoLease(String),
    #[error("session {0} has no active lease")]
    NoActiveLease(String),
    #[error("lease {lease_id} is {state}, not open")]
    NotOpen { lease_id: String, state: LeaseState },
}

/// Names a lease: by id, or as the active lease of a session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseRef {
    Id(String),
    Session(String),
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SignalRecord {
    pub pid: i32,
    pub start_time: u64,
    pub role: Role,
    pub signal: Sig,
    pub delivery: Delivery,
}

/// A process not signalled, and why (the same record a plan carries).
pub use crate::plan::Refused as RefusedSignal;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum CloseResult {
    /// Verified and terminated.
    Closed,
    /// Nothing of it was alive.
    Lost,
    /// Ownership could not be proven: nothing signalled, the lease is open again.
    LeftOpen,
    /// Another process holds it, or it is not in a closable state.
    Conflict,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CloseOutcome {
    pub lease_id: String,
    pub session_key: String,
    pub result: CloseResult,
    pub reason: String,
    pub signals: Vec<SignalRecord>,
    pub refused: Vec<RefusedSignal>,
    pub exit_status: Option<i32>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LegacyOutcome {
    pub id: i64,
    pub session_key: String,
    pub pid: i32,
    pub result: CloseResult,
    pub reason: String,
    pub signals: Vec<SignalRecord>,
    pub refused: Vec<RefusedSignal>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReapReport {
    pub leases: Vec<CloseOutcome>,
    pub legacy: Vec<LegacyOutcome>,
    /// Leases left alone, with the reason (live sessions, closed by another process).
    pub skipped: Vec<(String, String)>,
    pub expired: usize,
    pub bad_rows: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CancelOutcome {
    pub lease_id: String,
    pub session_key: String,
    pub seq: i64,
}

pub struct Controller<'t> {
    root: StateRoot,
    store: Store,
    table: &'t dyn ProcessTable,
    caller: Caller,
    me: ProcessId,
}

/// One batch member being terminated.
struct Job {
    kind: JobKind,
    session_key: String,
    grace: Duration,
    planned: Vec<PlannedSignal>,
    pins: Vec<(Pinned, Role)>,
    signals: Vec<SignalRecord>,
    refused: Vec<RefusedSignal>,
    deadline: Instant,
    stage: Stage,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// SIGTERM is out; the grace runs.
    Terminating,
    /// Non-root survivors got SIGKILL; the root gets [`ROOT_GRACE`] to exit by itself.
    KillingChildren,
    /// Everything still alive got SIGKILL.
    Killed,
}

impl Job {
    fn new(
        kind: JobKind,
        session_key: String,
        grace_ms: u64,
        planned: Vec<PlannedSignal>,
        refused: Vec<RefusedSignal>,
    ) -> Job {
        Job {
            kind,
            session_key,
            grace: Duration::from_millis(grace_ms),
            planned,
            pins: Vec::new(),
            signals: Vec::new(),
            refused,
            // Set when its SIGTERMs are out (run_jobs).
            deadline: Instant::now(),
            stage: Stage::Terminating,
        }
    }

    /// SIGKILLs the pinned members that are still alive and match `which`.
    fn kill_alive(&mut self, which: impl Fn(Role) -> bool) {
        for (p, role) in &self.pins {
            if !which(*role) || signal::exited(p) {
                continue;
            }
            let delivery = signal::send(p, Sig::Kill).unwrap_or(Delivery::AlreadyGone);
            self.signals.push(SignalRecord {
                pid: p.id.pid,
                start_time: p.id.start_time,
                role: *role,
                signal: Sig::Kill,
                delivery,
            });
        }
    }
}

/// Leases claimed, and (lease id, why not) for the others.
type Claimed = (Vec<Lease>, Vec<(String, String)>);

/// How one claimed lease ends.
struct Finish {
    lease: Lease,
    to: LeaseState,
    reason: String,
    signals: Vec<SignalRecord>,
    refused: Vec<RefusedSignal>,
}

enum JobKind {
    Lease(Lease),
    Legacy(LegacyRecord),
}

impl<'t> Controller<'t> {
    pub fn open(root: StateRoot, table: &'t dyn ProcessTable) -> Result<Self, StoreError> {
        let store = Store::open(&root.db_path())?;
        crate::sys::raise_nofile_limit();
        Ok(Controller {
            root,
            store,
            table,
            caller: Caller::current(),
            me: proc::self_id(),
        })
    }

    pub fn store(&mut self) -> &mut Store {
        &mut self.store
    }

    pub fn root(&self) -> &StateRoot {
        &self.root
    }

    fn wrapper_root(&self) -> PathBuf {
        self.root.wrapper_root()
    }

    /// Folds the wrappers' reports into the leases (see [`report::ingest_reports`]).
    pub fn refresh(&mut self) -> Result<usize, StoreError> {
        report::ingest_reports(&self.root, &mut self.store, self.table)
    }

    pub fn resolve(&self, r: &LeaseRef) -> Result<Lease, LifecycleError> {
        match r {
            LeaseRef::Id(id) => self
                .store
                .lease(id)?
                .ok_or_else(|| LifecycleError::NoLease(id.clone())),
            LeaseRef::Session(key) => self
                .store
                .active_lease_for_session(key)?
                .ok_or_else(|| LifecycleError::NoActiveLease(key.clone())),
        }
    }

    /// Records the intent to cancel the active turn. Sends no signal; the lease stays open.
    pub fn cancel(
        &mut self,
        r: &LeaseRef,
        detail: Option<serde_json::Value>,
    ) -> Result<CancelOutcome, LifecycleError> {
        let lease = self.resolve(r)?;
        if lease.state != LeaseState::Open {
            return Err(LifecycleError::NotOpen {
                lease_id: lease.lease_id,
                state: lease.state,
            });
        }
        let seq =
            self.store
                .record_event(&lease.session_key, Some(&lease.lease_id), "cancel", detail)?;
        tracing::info!(lease_id = %lease.lease_id, session = %lease.session_key, "cancel recorded; nothing signalled");
        Ok(CancelOutcome {
            lease_id: lease.lease_id,
            session_key: lease.session_key,
            seq,
        })
    }

    /// Closes the named leases, their grace periods running concurrently.
    pub fn close(
        &mut self,
        refs: &[LeaseRef],
        grace_override: Option<u64>,
    ) -> Result<Vec<CloseOutcome>, LifecycleError> {
        self.refresh()?;
        let mut leases = Vec::new();
        for r in refs {
            leases.push(self.resolve(r)?);
        }
        let ids: Vec<&str> = leases.iter().map(|l| l.lease_id.as_str()).collect();
        let (claimed, lost_race) = self.claim_all(&ids)?;
        let mut outcomes: Vec<CloseOutcome> = lost_race
            .into_iter()
            .filter_map(|(id, reason)| {
                leases
                    .iter()
                    .find(|l| l.lease_id == id)
                    .map(|l| conflict(l, reason))
            })
            .collect();
        outcomes.extend(self.terminate_leases(claimed, grace_override)?);
        Ok(outcomes)
    }

    /// The reap plan, computed from one snapshot. Changes nothing, signals nothing.
    pub fn plan_reap(&mut self, opts: &ReapOptions) -> Result<ReapPlan, StoreError> {
        let leases: Vec<Result<Lease, String>> = self
            .store
            .leases(&[])?
            .into_iter()
            .map(|r| r.map_err(|e| e.to_string()))
            .collect();
        let legacy = legacy::records(&mut self.store, true)?;
        let snap = self.table.snapshot();
        let gateway = self.store.gateway_instance_id().to_string();
        let wrapper_root = self.wrapper_root();
        let expect = Expect {
            gateway_instance_id: &gateway,
            wrapper_root: &wrapper_root,
        };
        Ok(plan::plan_reap(
            &leases,
            &legacy,
            &expect,
            snap.as_ref(),
            &self.caller,
            opts,
        ))
    }

    /// Startup reap: orphaned leases (owner gone) are verified and terminated or marked lost,
    /// legacy records handled fail-safe, old closed/lost leases expired.
    pub fn reap(&mut self, opts: &ReapOptions) -> Result<ReapReport, LifecycleError> {
        self.refresh()?;
        let plan = self.plan_reap(opts)?;
        let mut report = ReapReport {
            leases: Vec::new(),
            legacy: Vec::new(),
            skipped: Vec::new(),
            expired: 0,
            bad_rows: plan.bad_rows.clone(),
        };
        let mut candidates = Vec::new();
        for lp in &plan.leases {
            match &lp.decision {
                Decision::Skip { reason } => {
                    report.skipped.push((lp.lease_id.clone(), reason.clone()))
                }
                _ => candidates.push(lp.lease_id.as_str()),
            }
        }
        let (claimed, lost_race) = self.claim_all(&candidates)?;
        report.skipped.extend(lost_race);
        // The plan's snapshot predates the claims: terminate_leases reads the evidence again, so
        // what is signalled is judged by what is alive once the leases are ours.
        report.leases = self.terminate_leases(claimed, opts.grace_ms)?;
        report.legacy = self.reap_legacy(&plan, opts.grace_ms)?;
        report.expired = self.store.expire(opts.now_ms - opts.retention_ms)?;
        for id in &plan.expire {
            report::remove_report(&self.root, id);
        }
        Ok(report)
    }

    /// Claims leases for closing, in one transaction. Returns the claimed leases, and for the
    /// others why not (someone else holds it, or it is not active any more).
    fn claim_all(&mut self, ids: &[&str]) -> Result<Claimed, StoreError> {
        let table = self.table;
        let stale = |c: ProcessId| !matches!(table.alive(c), Ok(true));
        let results = self.store.claim_many(ids, self.me, stale)?;
        let mut claimed = Vec::new();
        let mut refused = Vec::new();
        for (id, r) in ids.iter().zip(results) {
            match r {
                Some(l) => claimed.push(l),
                None => {
                    let why = match self.store.lease(id)? {
                        Some(l) if l.state == LeaseState::Closing => {
                            format!("being closed by pid {}", l.claimed_by.map_or(0, |c| c.pid))
                        }
                        Some(l) => format!("lease is {}", l.state),
                        None => "lease vanished".into(),
                    };
                    refused.push((id.to_string(), why));
                }
            }
        }
        Ok((claimed, refused))
    }

    /// A snapshot that covers the given leases: the union of their subtrees when every root is
    /// alive (a live wrapper is a subreaper, so its whole tree hangs below it), else the whole
    /// process table (escapees of a dead wrapper are found by their markers).
    fn snapshot_for(&self, leases: &[&Lease]) -> Result<Snapshot, TableError> {
        let mut all_alive = true;
        for l in leases {
            if !self.table.alive(l.root())? {
                all_alive = false;
                break;
            }
        }
        if !all_alive || leases.len() > 64 {
            return self.table.snapshot();
        }
        let mut list = Vec::new();
        for l in leases {
            list.extend(self.table.subtree(l.root_pid)?.iter().cloned());
        }
        Ok(Snapshot::new(list))
    }

    fn expect_parts(&self) -> (String, PathBuf) {
        (
            self.store.gateway_instance_id().to_string(),
            self.wrapper_root(),
        )
    }

    /// Verifies and terminates claimed (`closing`) leases; every lease ends closed, lost, or
    /// open again with the reason.
    fn terminate_leases(
        &mut self,
        claimed: Vec<Lease>,
        grace_override: Option<u64>,
    ) -> Result<Vec<CloseOutcome>, StoreError> {
        if claimed.is_empty() {
            return Ok(Vec::new());
        }
        let (gateway, wrapper_root) = self.expect_parts();
        let expect = Expect {
            gateway_instance_id: &gateway,
            wrapper_root: &wrapper_root,
        };
        let refs: Vec<&Lease> = claimed.iter().collect();
        let snap = self.snapshot_for(&refs);
        let mut finishes = Vec::new();
        let mut jobs = Vec::new();
        for lease in claimed {
            let grace = grace_override.unwrap_or(lease.grace_ms);
            let lp = plan::plan_lease(&lease, &expect, snap.as_ref(), &self.caller, grace);
            match lp.decision {
                Decision::Terminate => {
                    let key = lease.session_key.clone();
                    jobs.push(Job::new(
                        JobKind::Lease(lease),
                        key,
                        grace,
                        lp.signals,
                        lp.refused,
                    ));
                }
                Decision::MarkLost { reason } => finishes.push(Finish {
                    lease,
                    to: LeaseState::Lost,
                    reason,
                    signals: Vec::new(),
                    refused: Vec::new(),
                }),
                Decision::Leave { reason } | Decision::Skip { reason } => finishes.push(Finish {
                    lease,
                    to: LeaseState::Open,
                    reason,
                    signals: Vec::new(),
                    // The refusals are the evidence for leaving it open: report them.
                    refused: lp.refused,
                }),
            }
        }
        self.run_jobs(&mut jobs);
        // A second look after the kills: anything of the lease still alive (forked during the
        // grace, re-parented late) gets SIGKILL too, after the same verification.
        let lease_jobs: Vec<&Lease> = jobs
            .iter()
            .filter_map(|j| match &j.kind {
                JobKind::Lease(l) => Some(l),
                JobKind::Legacy(_) => None,
            })
            .collect();
        if !lease_jobs.is_empty() {
            let snap = self.table.snapshot();
            for j in jobs.iter_mut() {
                let JobKind::Lease(lease) = &j.kind else {
                    continue;
                };
                let lp = plan::plan_lease(lease, &expect, snap.as_ref(), &self.caller, 0);
                if lp.decision == Decision::Terminate {
                    let mut late = Vec::new();
                    for s in &lp.signals {
                        self.pin_and_send(s, Sig::Kill, &mut late, &mut j.signals, &mut j.refused);
                    }
                    let pins: Vec<&Pinned> = late.iter().map(|(p, _)| p).collect();
                    signal::wait_all(&pins, Instant::now() + KILL_WAIT);
                }
            }
        }
        for j in jobs {
            let JobKind::Lease(lease) = j.kind else {
                continue;
            };
            let survivors: Vec<i32> = j
                .pins
                .iter()
                .filter(|(p, _)| !signal::exited(p))
                .map(|(p, _)| p.id.pid)
                .collect();
            let kills = j
                .signals
                .iter()
                .filter(|s| s.signal == Sig::Kill && s.delivery == Delivery::Delivered)
                .count();
            let mut reason = format!(
                "terminated {} process(es) children first{}",
                j.pins.len(),
                if kills > 0 {
                    format!(", {kills} needed SIGKILL after {} ms", j.grace.as_millis())
                } else {
                    String::new()
                }
            );
            if !survivors.is_empty() {
                reason.push_str(&format!("; still alive after SIGKILL: {survivors:?}"));
            }
            if j.pins.is_empty() {
                reason = "every member had exited before it could be signalled".into();
            }
            let state = if j.pins.is_empty() {
                LeaseState::Lost
            } else {
                LeaseState::Closed
            };
            finishes.push(Finish {
                lease,
                to: state,
                reason,
                signals: j.signals,
                refused: j.refused,
            });
        }
        self.finish_all(finishes)
    }

    /// Pins one planned process and sends it `sig`, recording what happened.
    fn pin_and_send(
        &self,
        s: &PlannedSignal,
        sig: Sig,
        pins: &mut Vec<(Pinned, Role)>,
        signals: &mut Vec<SignalRecord>,
        refused: &mut Vec<RefusedSignal>,
    ) {
        let id = ProcessId {
            pid: s.pid,
            start_time: s.start_time,
        };
        match signal::pin(self.table, &self.caller, id) {
            Ok(Some(p)) => {
                let result = if s.role == Role::Adapter && p.pgid == p.id.pid {
                    // The verified leader's whole group, including members forked since the
                    // snapshot; then the leader itself (older kernels).
                    match signal::send_group(&p, sig, &self.caller) {
                        Ok(_) | Err(SignalError::GroupUnsupported) => signal::send(&p, sig),
                        Err(e) => Err(e),
                    }
                } else {
                    signal::send(&p, sig)
                };
                match result {
                    Ok(delivery) => {
                        tracing::info!(pid = s.pid, role = ?s.role, signal = sig.name(), ?delivery, "signalled");
                        signals.push(SignalRecord {
                            pid: s.pid,
                            start_time: s.start_time,
                            role: s.role,
                            signal: sig,
                            delivery,
                        });
                        pins.push((p, s.role));
                    }
                    Err(e) => refused.push(RefusedSignal {
                        pid: s.pid,
                        reason: e.to_string(),
                    }),
                }
            }
            Ok(None) => {} // already gone
            Err(e) => {
                tracing::warn!(pid = s.pid, error = %e, "not signalled");
                refused.push(RefusedSignal {
                    pid: s.pid,
                    reason: e.to_string(),
                });
            }
        }
    }

    /// SIGTERM every job's members (children first), then wait: when a job's own grace ends,
    /// its surviving non-root members get SIGKILL, and its root (the wrapper, which exits by
    /// itself once its tree is gone, writing the adapter's exit status) gets SIGKILL only if it
    /// is still there [`ROOT_GRACE`] later. All jobs' graces run at the same time.
    fn run_jobs(&self, jobs: &mut [Job]) {
        for j in jobs.iter_mut() {
            let planned = std::mem::take(&mut j.planned);
            for s in &planned {
                self.pin_and_send(s, Sig::Term, &mut j.pins, &mut j.signals, &mut j.refused);
            }
            j.planned = planned;
            j.deadline = Instant::now() + j.grace;
        }
        loop {
            let now = Instant::now();
            let mut next: Option<Instant> = None;
            for j in jobs.iter_mut() {
                if j.stage == Stage::Killed
                    || (0..j.pins.len()).all(|i| signal::exited(&j.pins[i].0))
                {
                    continue;
                }
                match j.stage {
                    Stage::Terminating if now >= j.deadline => {
                        j.kill_alive(|role| role != Role::Root);
                        j.stage = Stage::KillingChildren;
                        j.deadline = now + ROOT_GRACE;
                    }
                    Stage::KillingChildren if now >= j.deadline => {
                        j.kill_alive(|_| true);
                        j.stage = Stage::Killed;
                        continue;
                    }
                    _ => {}
                }
                next = Some(next.map_or(j.deadline, |n| n.min(j.deadline)));
            }
            let Some(until) = next else { break };
            let pins: Vec<&Pinned> = jobs
                .iter()
                .filter(|j| j.stage != Stage::Killed)
                .flat_map(|j| j.pins.iter().map(|(p, _)| p))
                .collect();
            // Returns early when they all exit; re-evaluated each round.
            signal::wait_all(
                &pins,
                until.min(Instant::now() + Duration::from_millis(100)),
            );
        }
        let killed: Vec<&Pinned> = jobs
            .iter()
            .filter(|j| j.stage != Stage::Terminating)
            .flat_map(|j| j.pins.iter().map(|(p, _)| p))
            .collect();
        signal::wait_all(&killed, Instant::now() + KILL_WAIT);
    }

    /// Records how each claimed lease ended (one transaction for all of them), folding in the
    /// wrapper's report where there is one.
    fn finish_all(&mut self, finishes: Vec<Finish>) -> Result<Vec<CloseOutcome>, StoreError> {
        let mut reports = Vec::with_capacity(finishes.len());
        for f in &finishes {
            let lease = &f.lease;
            let report = WrapperReport::read_for(&self.root, lease);
            if let Some(r) = &report {
                r.apply(&mut self.store, &lease.lease_id)?;
            }
            reports.push(report);
        }
        let transitions: Vec<Transition<'_>> = finishes
            .iter()
            .map(|f| Transition {
                lease_id: &f.lease.lease_id,
                from: LeaseState::Closing,
                to: f.to,
                reason: &f.reason,
            })
            .collect();
        let changed = self.store.transition_many(&transitions, Some(self.me))?;
        let mut outcomes = Vec::with_capacity(finishes.len());
        for ((f, changed), report) in finishes.into_iter().zip(changed).zip(reports) {
            let result = match (changed, f.to) {
                (false, _) => CloseResult::Conflict,
                (true, LeaseState::Closed) => CloseResult::Closed,
                (true, LeaseState::Lost) => CloseResult::Lost,
                (true, _) => CloseResult::LeftOpen,
            };
            if changed && f.to.is_terminal() && report.is_some() {
                report::remove_report(&self.root, &f.lease.lease_id);
            }
            tracing::info!(lease_id = %f.lease.lease_id, result = ?result, reason = %f.reason, "close finished");
            outcomes.push(CloseOutcome {
                exit_status: report.and_then(|r| r.exit_status).or(f.lease.exit_status),
                lease_id: f.lease.lease_id,
                session_key: f.lease.session_key,
                result,
                reason: if changed {
                    f.reason
                } else {
                    "lease changed hands during the close".into()
                },
                signals: f.signals,
                refused: f.refused,
            });
        }
        Ok(outcomes)
    }

    fn reap_legacy(
        &mut self,
        plan: &ReapPlan,
        grace_override: Option<u64>,
    ) -> Result<Vec<LegacyOutcome>, StoreError> {
        let records = legacy::records(&mut self.store, true)?;
        let mut out = Vec::new();
        let mut jobs = Vec::new();
        for lp in &plan.legacy {
            let Some(rec) = records.iter().find(|r| r.id == lp.id) else {
                continue;
            };
            match &lp.decision {
                Decision::Terminate => jobs.push(Job::new(
                    JobKind::Legacy(rec.clone()),
                    rec.session_key.clone(),
                    grace_override.unwrap_or(crate::exec::DEFAULT_GRACE_MS),
                    lp.signals.clone(),
                    lp.refused.clone(),
                )),
                Decision::MarkLost { reason } => {
                    legacy::finish(&mut self.store, rec.id, "lost", reason)?;
                    out.push(LegacyOutcome {
                        id: rec.id,
                        session_key: rec.session_key.clone(),
                        pid: rec.pid,
                        result: CloseResult::Lost,
                        reason: reason.clone(),
                        signals: Vec::new(),
                        refused: Vec::new(),
                    });
                }
                Decision::Leave { reason } | Decision::Skip { reason } => {
                    legacy::note(&mut self.store, rec.id, reason)?;
                    out.push(LegacyOutcome {
                        id: rec.id,
                        session_key: rec.session_key.clone(),
                        pid: rec.pid,
                        result: CloseResult::LeftOpen,
                        reason: reason.clone(),
                        signals: Vec::new(),
                        refused: lp.refused.clone(),
                    });
                }
            }
        }
        self.run_jobs(&mut jobs);
        for j in jobs {
            let JobKind::Legacy(rec) = j.kind else {
                continue;
            };
            let reason = format!(
                "legacy record verified; terminated {} process(es)",
                j.pins.len()
            );
            legacy::finish(&mut self.store, rec.id, "closed", &reason)?;
            out.push(LegacyOutcome {
                id: rec.id,
                session_key: j.session_key,
                pid: rec.pid,
                result: CloseResult::Closed,
                reason,
                signals: j.signals,
                refused: j.refused,
            });
        }
        Ok(out)
    }
}

fn conflict(lease: &Lease, reason: String) -> CloseOutcome {
    CloseOutcome {
        lease_id: lease.lease_id.clone(),
        session_key: lease.session_key.clone(),
        result: CloseResult::Conflict,
        reason,
        signals: Vec::new(),
        refused: Vec::new(),
        exit_status: lease.exit_status,
    }
}
