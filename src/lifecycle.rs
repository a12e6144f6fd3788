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

use crate::cgroup::{self, Containment, Verified};
use crate::lease::{Lease, LeaseState, ProcessId};
use crate::legacy::{self, LegacyRecord};
use crate::plan::{self, CgroupAction, Decision, PlannedSignal, ReapOptions, ReapPlan};
use crate::proc::{self, ProcessTable, Snapshot, TableError};
use crate::report::{self, WrapperReport};
use crate::signal::{self, Caller, CurrentCaller, Delivery, Pinned, Sig, SignalError};
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
    /// Stray cgroups swept (containment).
    #[serde(default)]
    pub cgroups: Vec<SweptCgroup>,
    /// Escapees of closed and lost leases terminated (their leases stay as they were).
    #[serde(default)]
    pub escapees: Vec<CloseOutcome>,
}

/// A stray cgroup and what the sweep did with it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SweptCgroup {
    pub path: String,
    pub id: u64,
    /// `removed`, `left` (not verified, or too young), or `failed`.
    pub result: String,
    pub reason: String,
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
    containment: Containment,
    /// The host-wide pass `plan_reap` took, for `reap` to reuse (one pass per reap).
    last_scan: Option<Result<Snapshot, TableError>>,
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
    /// The lease's verified cgroup (path, id), killed at the end of the grace and removed.
    cgroup: Option<(PathBuf, u64)>,
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
            cgroup: None,
        }
    }

    /// At the end of the grace: `cgroup.kill` takes every member of the verified cgroup at once
    /// (escapees included); the per-process SIGKILLs that follow find them gone.
    fn kill_cgroup(&mut self) {
        let Some((path, id)) = &self.cgroup else {
            return;
        };
        match Verified::open(path, *id) {
            Ok(h) => {
                let listed = h.procs();
                let hit: Vec<(ProcessId, Role)> = self
                    .pins
                    .iter()
                    .filter(|(p, _)| listed.contains(&p.id.pid) && !signal::exited(p))
                    .map(|(p, role)| (p.id, *role))
                    .collect();
                match h.kill() {
                    Ok(()) => {
                        tracing::info!(cgroup = %path.display(), members = listed.len(), "cgroup.kill");
                        for (id, role) in hit {
                            self.signals.push(SignalRecord {
                                pid: id.pid,
                                start_time: id.start_time,
                                role,
                                signal: Sig::Kill,
                                delivery: Delivery::CgroupKill,
                            });
                        }
                    }
                    Err(e) => {
                        tracing::warn!(cgroup = %path.display(), error = %e, "cgroup.kill failed")
                    }
                }
                // No wait here: the kernel queued SIGKILL for every member before the write
                // returned; the jobs' common wait below sees them go.
            }
            Err(e) => tracing::warn!(cgroup = %path.display(), error = %e, "cgroup not killed"),
        }
    }

    /// SIGKILLs the pinned members that are still alive and match `which`.
    fn kill_alive(&mut self, which: impl Fn(Role) -> bool) {
        for (p, role) in &self.pins {
            if !which(*role) || signal::exited(p) {
                continue;
            }
            // Already given SIGKILL by cgroup.kill (pending from the moment the write returned).
            let by_cgroup = self.signals.iter().any(|s| {
                s.delivery == Delivery::CgroupKill
                    && s.pid == p.id.pid
                    && s.start_time == p.id.start_time
            });
            if by_cgroup {
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

// One per lease being closed, moved around rarely: boxing the lease buys nothing.
#[allow(clippy::large_enum_variant)]
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
            containment: Containment::default_off(),
            last_scan: None,
        })
        .map(|mut c| {
            let settings = cgroup::Settings::from_env().unwrap_or_else(|e| {
                tracing::warn!(error = %e, "containment setting unreadable; using on");
                cgroup::Settings::default()
            });
            c.containment = Containment::resolve_lean(&settings, c.store.gateway_instance_id());
            c
        })
    }

    /// Uses these containment settings instead of the environment's.
    pub fn with_containment(mut self, settings: &cgroup::Settings) -> Self {
        self.containment = Containment::resolve_lean(settings, self.store.gateway_instance_id());
        self
    }

    pub fn containment(&self) -> &Containment {
        &self.containment
    }

    fn cgroup_root(&self) -> Option<PathBuf> {
        self.containment.gateway_root.clone()
    }

    /// Observes the cgroups of these leases that lie where this gateway puts them (nothing else
    /// is even read), and adds their members to `list` when they are missing from it.
    fn observe_cgroups(&self, leases: &[&Lease]) -> Vec<cgroup::Observation> {
        let Some(root) = self.cgroup_root() else {
            return Vec::new();
        };
        leases
            .iter()
            .filter_map(|l| {
                let p = PathBuf::from(l.cgroup_path.as_ref()?);
                (p == root.join(&l.lease_id)).then(|| cgroup::observe(&p))
            })
            .collect()
    }

    /// Adds the observations, and the members they list that the snapshot lacks.
    fn with_cgroups(&self, snap: Snapshot, obs: Vec<cgroup::Observation>) -> Snapshot {
        let missing: Vec<i32> = obs
            .iter()
            .flat_map(|o| o.procs.iter().copied())
            .filter(|pid| snap.get(*pid).is_none())
            .collect();
        let mut snap = if missing.is_empty() {
            snap
        } else {
            let mut list: Vec<_> = snap.iter().cloned().collect();
            for pid in missing {
                if let Ok(Some(p)) = self.table.process(pid) {
                    list.push(p);
                }
            }
            Snapshot::new(list)
        };
        for o in obs {
            snap.add_cgroup(o);
        }
        snap
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

    /// [`Controller::resolve`] for a close: an active lease whose row does not read is repaired
    /// first ([`Store::repair_lease`]: fields that are not evidence reset to safe values, a
    /// `repaired` event), then closed like any other, verification included. An invalid row
    /// never makes a live tree unkillable; a row whose evidence does not read is refused (it
    /// cannot be verified, so nothing is signalled).
    fn resolve_or_repair(&mut self, r: &LeaseRef) -> Result<Lease, LifecycleError> {
        match self.resolve(r) {
            Err(LifecycleError::Store(StoreError::BadRow { lease_id, detail })) => {
                match self.store.repair_lease(&lease_id)? {
                    Some((lease, _)) => Ok(lease),
                    None => Err(StoreError::BadRow { lease_id, detail }.into()),
                }
            }
            other => other,
        }
    }

    /// Repairs the active rows that do not read (see [`Controller::resolve_or_repair`]) before
    /// a reap plans; those whose evidence does not read stay in the plan's bad rows.
    fn repair_active_rows(&mut self) -> Result<(), StoreError> {
        let bad: Vec<String> = self
            .store
            .leases(&[LeaseState::Open, LeaseState::Closing])?
            .into_iter()
            .filter_map(|r| match r {
                Err(StoreError::BadRow { lease_id, .. }) => Some(lease_id),
                _ => None,
            })
            .collect();
        for id in bad {
            if let Err(e) = self.store.repair_lease(&id) {
                tracing::warn!(lease_id = %id, error = %e, "unreadable lease row left alone");
            }
        }
        Ok(())
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
            leases.push(self.resolve_or_repair(r)?);
        }
        let ids: Vec<&str> = leases.iter().map(|l| l.lease_id.as_str()).collect();
        let ((claimed, lost_race), _held) = self.claim_all(&ids)?;
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
        let active: Vec<&Lease> = leases
            .iter()
            .filter_map(|l| l.as_ref().ok())
            .filter(|l| l.state.is_active())
            .collect();
        let obs = self.observe_cgroups(&active);
        let snap = self
            .reap_scan(&leases, &legacy)
            .map(|s| self.with_cgroups(s, obs));
        let plan = self.plan_reap_from(&leases, &legacy, snap.as_ref(), opts);
        self.last_scan = Some(snap);
        Ok(plan)
    }

    /// Reap's one pass over the host, shared by every lease (issue 16): `stat` and uid of every
    /// process, and the costly fields (exe, cmdline, environ) only where they can matter — the
    /// processes of the caller's uid (the only ones leash may signal, so the only possible
    /// members and marker carriers) and the recorded roots, adapters, owners and legacy pids.
    fn reap_scan(
        &self,
        leases: &[Result<Lease, String>],
        legacy: &[LegacyRecord],
    ) -> Result<Snapshot, TableError> {
        let mut named = std::collections::HashSet::new();
        for l in leases.iter().filter_map(|l| l.as_ref().ok()) {
            named.insert(l.root_pid);
            named.extend(l.adapter_pid);
        }
        named.extend(legacy.iter().map(|r| r.pid));
        let uid = self.caller.uid;
        self.table
            .scan(&|p: &proc::ProcessInfo| p.uid == uid || named.contains(&p.pid))
    }

    fn plan_reap_from(
        &self,
        leases: &[Result<Lease, String>],
        legacy: &[LegacyRecord],
        snap: Result<&Snapshot, &TableError>,
        opts: &ReapOptions,
    ) -> ReapPlan {
        let gateway = self.store.gateway_instance_id().to_string();
        let wrapper_root = self.wrapper_root();
        let cgroup_root = self.cgroup_root();
        let expect = Expect {
            gateway_instance_id: &gateway,
            wrapper_root: &wrapper_root,
            cgroup_root: cgroup_root.as_deref(),
        };
        let mut plan = plan::plan_reap(leases, legacy, &expect, snap, &self.caller, opts);
        if let Some(root) = &cgroup_root {
            plan.stray_cgroups = plan::plan_strays(
                root,
                &cgroup::children(root),
                leases,
                opts.now_ms,
                stray_min_age_ms(),
            );
        }
        plan
    }

    /// Sweeps the stray cgroups under this gateway's cgroup root: those of closed, lost or
    /// expired leases, or of none (a crash between mkdir and commit). Each is verified (a
    /// directory directly under this gateway's root, named for a lease id, with the id seen when
    /// it was listed), killed, and removed. Nothing happens when containment is not on.
    pub fn sweep_stray_cgroups(&mut self, now_ms: i64) -> Result<Vec<SweptCgroup>, StoreError> {
        if self.cgroup_root().is_none() {
            return Ok(Vec::new());
        }
        let leases: Vec<Result<Lease, String>> = self
            .store
            .leases(&[])?
            .into_iter()
            .map(|r| r.map_err(|e| e.to_string()))
            .collect();
        Ok(self.sweep_stray_cgroups_among(&leases, now_ms))
    }

    /// [`Controller::sweep_stray_cgroups`] against lease rows the caller has just read.
    pub fn sweep_stray_cgroups_among(
        &self,
        leases: &[Result<Lease, String>],
        now_ms: i64,
    ) -> Vec<SweptCgroup> {
        let Some(root) = self.cgroup_root() else {
            return Vec::new();
        };
        let strays = plan::plan_strays(
            &root,
            &cgroup::children(&root),
            leases,
            now_ms,
            stray_min_age_ms(),
        );
        strays.into_iter().map(sweep_one).collect()
    }

    /// Startup reap: orphaned leases (owner gone) are verified and terminated or marked lost,
    /// legacy records handled fail-safe, old closed/lost leases expired.
    pub fn reap(&mut self, opts: &ReapOptions) -> Result<ReapReport, LifecycleError> {
        self.refresh()?;
        self.repair_active_rows()?;
        let plan = self.plan_reap(opts)?;
        let mut report = ReapReport {
            leases: Vec::new(),
            legacy: Vec::new(),
            skipped: Vec::new(),
            expired: 0,
            bad_rows: plan.bad_rows.clone(),
            cgroups: Vec::new(),
            escapees: Vec::new(),
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
        let ((claimed, lost_race), _held) = self.claim_all(&candidates)?;
        report.skipped.extend(lost_race);
        // The plan's snapshot predates the claims: terminate_leases reads the evidence again
        // from each lease down (live roots, cgroups), so what is signalled is judged by what is
        // alive once the leases are ours; only where that needs the whole host does it reuse the
        // plan's one pass instead of a second one (every signal re-checks its process anyway).
        let scan = self.last_scan.take().and_then(Result::ok);
        report.leases = self.terminate_leases_with(claimed, opts.grace_ms, scan.as_ref())?;
        report.escapees = self.reap_escapees(&plan)?;
        report.legacy = self.reap_legacy(&plan, opts.grace_ms)?;
        report.expired = self.store.expire(opts.now_ms - opts.retention_ms)?;
        for id in &plan.expire {
            report::remove_report(&self.root, id);
        }
        // After the leases: a cgroup whose lease was just closed is already gone, and one whose
        // lease just expired is swept now.
        report.cgroups = self.sweep_stray_cgroups(opts.now_ms)?;
        Ok(report)
    }

    /// Claims leases for closing, in one transaction. Returns the claimed leases, and for the
    /// others why not (someone else holds it, or it is not active any more), and the guard that
    /// keeps the claims exclusive inside this process until it is dropped.
    ///
    /// In the store a claimant is a process, and a claim held by the same process counts as
    /// stale (it is what a retry after an error looks like). Inside a daemon many requests share
    /// one pid, so the store alone would let concurrent closes and reaps of one lease all go
    /// ahead; the process-wide [`HeldClaims`] set refuses a lease another thread of this process
    /// is closing right now, before the store is asked.
    fn claim_all(&mut self, ids: &[&str]) -> Result<(Claimed, HeldClaims), StoreError> {
        let mut refused = Vec::new();
        let mut held = HeldClaims::default();
        let mut mine: Vec<&str> = Vec::with_capacity(ids.len());
        for id in ids {
            if held.take(id) {
                mine.push(id);
            } else {
                refused.push((
                    id.to_string(),
                    format!(
                        "being closed by another request in this process (pid {})",
                        self.me.pid
                    ),
                ));
            }
        }
        let table = self.table;
        let stale = |c: ProcessId| !matches!(table.alive(c), Ok(true));
        let results = self.store.claim_many(&mine, self.me, stale)?;
        let mut claimed = Vec::new();
        for (id, r) in mine.iter().zip(results) {
            match r {
                Some(l) => claimed.push(l),
                None => {
                    held.release(id);
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
        Ok(((claimed, refused), held))
    }

    /// A snapshot that covers the given leases, read from each lease down, never from the host
    /// when it can be helped (issue 16): a lease with a verified cgroup is its live root plus the
    /// members `cgroup.procs` lists (whatever forked, re-parented or left the group, it cannot
    /// leave the cgroup: no tree walk); a lease with a live root is its subtree (a live wrapper is
    /// a subreaper, so its whole tree hangs below it). Only a lease whose wrapper is gone and
    /// that has no cgroup, or whose recorded process group still has members (every one of them
    /// is judged, and a refusal reported, as before), needs the whole table (escapees are found
    /// by their markers), and so does a batch of more than 64 uncontained leases (one pass is
    /// cheaper then).
    fn snapshot_for(
        &self,
        leases: &[&Lease],
        scan: Option<&Snapshot>,
    ) -> Result<Snapshot, TableError> {
        let obs = self.observe_cgroups(leases);
        let contained = |l: &Lease| {
            obs.iter().any(|o| {
                l.cgroup_path.as_deref() == o.path.to_str()
                    && o.error.is_none()
                    && o.id.is_some()
                    && o.id == l.cgroup_id
            })
        };
        // Reap hands in its one pass: reused as it is when a root is gone (its escapees are
        // looked for by their markers anyway) or the batch is large, without a read per lease.
        if let Some(all) = scan {
            let mut all_alive = true;
            for l in leases {
                if !self.table.alive(l.root())? {
                    all_alive = false;
                    break;
                }
            }
            if !all_alive || leases.len() > 64 {
                return Ok(self.with_cgroups(all.clone(), obs));
            }
        }
        let mut list = Vec::new();
        let mut walks = Vec::new();
        let mut full = false;
        for l in leases {
            // Whatever runs at the root pid goes in, our wrapper or not: verification says
            // "the pid was reused" only if it sees the stranger.
            let at_root = self.table.process(l.root_pid)?;
            let alive = at_root
                .as_ref()
                .is_some_and(|p| p.start_time == l.root_start_time && p.state != 'Z');
            let group_left = || {
                l.process_group_id
                    .is_some_and(|g| group_has_members(g, Instant::now()))
            };
            if contained(l) && (alive || !group_left()) {
                list.extend(at_root);
            } else if alive {
                walks.push(l.root_pid);
            } else {
                full = true;
            }
        }
        if full || walks.len() > 64 {
            let all = match scan {
                Some(s) => s.clone(),
                None => self.table.snapshot()?,
            };
            return Ok(self.with_cgroups(all, obs));
        }
        let mut seen = std::collections::HashSet::new();
        list.retain(|p| seen.insert(p.pid));
        for pid in walks {
            for p in self.table.subtree(pid)?.iter() {
                if seen.insert(p.pid) {
                    list.push(p.clone());
                }
            }
        }
        Ok(self.with_cgroups(Snapshot::new(list), obs))
    }

    fn expect_parts(&self) -> (String, PathBuf, Option<PathBuf>) {
        (
            self.store.gateway_instance_id().to_string(),
            self.wrapper_root(),
            self.cgroup_root(),
        )
    }

    /// Terminates the verified escapees of closed and lost leases the reap plan found (their
    /// markers in the one pass), without reopening the leases; each gets an `escapees` event.
    fn reap_escapees(&mut self, plan: &ReapPlan) -> Result<Vec<CloseOutcome>, StoreError> {
        let mut jobs = Vec::new();
        for lp in &plan.escapees {
            let Some(lease) = self.store.lease(&lp.lease_id)? else {
                continue;
            };
            jobs.push(Job::new(
                JobKind::Lease(lease),
                lp.session_key.clone(),
                lp.grace_ms,
                lp.signals.clone(),
                lp.refused.clone(),
            ));
        }
        if jobs.is_empty() {
            return Ok(Vec::new());
        }
        self.run_jobs(&mut jobs);
        let mut out = Vec::new();
        for j in jobs {
            let JobKind::Lease(lease) = j.kind else {
                continue;
            };
            let reason = format!(
                "terminated {} escaped process(es) carrying the {} lease's markers",
                j.pins.len(),
                lease.state
            );
            let detail = serde_json::json!({"reason": reason, "pids": j.pins.iter().map(|(p, _)| p.id.pid).collect::<Vec<_>>()});
            self.store.record_event(
                &lease.session_key,
                Some(&lease.lease_id),
                "escapees",
                Some(detail),
            )?;
            tracing::info!(lease_id = %lease.lease_id, processes = j.pins.len(), "escapees reaped");
            out.push(CloseOutcome {
                exit_status: lease.exit_status,
                lease_id: lease.lease_id,
                session_key: lease.session_key,
                result: CloseResult::Closed,
                reason,
                signals: j.signals,
                refused: j.refused,
            });
        }
        Ok(out)
    }

    /// Verifies and terminates claimed (`closing`) leases; every lease ends closed, lost, or
    /// open again with the reason.
    fn terminate_leases(
        &mut self,
        claimed: Vec<Lease>,
        grace_override: Option<u64>,
    ) -> Result<Vec<CloseOutcome>, StoreError> {
        self.terminate_leases_with(claimed, grace_override, None)
    }

    /// [`Controller::terminate_leases`], given a whole-host snapshot just taken (reap's one
    /// pass) to use where a lease needs one.
    fn terminate_leases_with(
        &mut self,
        claimed: Vec<Lease>,
        grace_override: Option<u64>,
        scan: Option<&Snapshot>,
    ) -> Result<Vec<CloseOutcome>, StoreError> {
        if claimed.is_empty() {
            return Ok(Vec::new());
        }
        let (gateway, wrapper_root, cgroup_root) = self.expect_parts();
        let expect = Expect {
            gateway_instance_id: &gateway,
            wrapper_root: &wrapper_root,
            cgroup_root: cgroup_root.as_deref(),
        };
        let refs: Vec<&Lease> = claimed.iter().collect();
        let snap = self.snapshot_for(&refs, scan);
        let mut finishes = Vec::new();
        let mut jobs = Vec::new();
        for lease in claimed {
            let grace = grace_override.unwrap_or(lease.grace_ms);
            let lp = plan::plan_lease(&lease, &expect, snap.as_ref(), &self.caller, grace);
            let cg = lp.cgroup.as_ref().and_then(|c| match c.action {
                CgroupAction::KillAndRemove | CgroupAction::Remove => {
                    Some((PathBuf::from(&c.path), c.id))
                }
                CgroupAction::None | CgroupAction::Leave => None,
            });
            match lp.decision {
                Decision::Terminate => {
                    let key = lease.session_key.clone();
                    let mut job =
                        Job::new(JobKind::Lease(lease), key, grace, lp.signals, lp.refused);
                    job.cgroup = cg;
                    jobs.push(job);
                }
                Decision::MarkLost { mut reason } => {
                    if let Some((path, id)) = cg {
                        reason.push_str(&remove_cgroup(&path, id));
                    }
                    finishes.push(Finish {
                        lease,
                        to: LeaseState::Lost,
                        reason,
                        signals: Vec::new(),
                        refused: Vec::new(),
                    })
                }
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
        // grace, re-parented late) gets SIGKILL too, after the same verification. A lease with a
        // verified cgroup needs none: whatever it forked is in the cgroup, which is killed and
        // emptied below, so no walk of the whole process table is spent on it.
        let lease_jobs: Vec<&Lease> = jobs
            .iter()
            .filter_map(|j| match &j.kind {
                JobKind::Lease(l) if j.cgroup.is_none() => Some(l),
                _ => None,
            })
            .collect();
        // Only a lease of which something may still run takes that look: a member pinned but
        // not seen to exit, or a process group that still has members (a child forked during
        // the grace stays in it). When all are gone the look is skipped: it would read the whole
        // host to find nothing, and a marker carrier that left the group too is `reap`'s (its
        // escapee sweep).
        // A killed member is a zombie for a moment before its parent reaps it, and a zombie
        // still counts in its group: give the groups a short, shared moment to empty.
        let settle = Instant::now() + Duration::from_millis(100);
        let lease_jobs: Vec<&Lease> = lease_jobs
            .into_iter()
            .filter(|l| {
                let j = jobs
                    .iter()
                    .find(|j| matches!(&j.kind, JobKind::Lease(x) if x.lease_id == l.lease_id));
                let pins_left = j.is_some_and(|j| j.pins.iter().any(|(p, _)| !signal::exited(p)));
                let groups: Vec<i32> = l
                    .process_group_id
                    .into_iter()
                    .chain(j.into_iter().flat_map(|j| {
                        j.pins
                            .iter()
                            .filter(|(p, r)| *r != Role::Root && p.pgid == p.id.pid)
                            .map(|(p, _)| p.pgid)
                    }))
                    .collect();
                pins_left || groups.into_iter().any(|g| group_has_members(g, settle))
            })
            .collect();
        if !lease_jobs.is_empty() {
            let wanted: Vec<String> = lease_jobs.iter().map(|l| l.lease_id.clone()).collect();
            let snap = self.table.snapshot();
            for j in jobs.iter_mut() {
                let JobKind::Lease(lease) = &j.kind else {
                    continue;
                };
                if j.cgroup.is_some() || !wanted.contains(&lease.lease_id) {
                    continue;
                }
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
        // The verified cgroups: all killed first, then one wait for all of them to empty, then
        // each removed; never a wait per cgroup in turn.
        let cgroups: Vec<(PathBuf, u64)> = jobs.iter().filter_map(|j| j.cgroup.clone()).collect();
        let mut removed = remove_cgroups(&cgroups).into_iter();
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
                .filter(|s| {
                    s.signal == Sig::Kill
                        && matches!(s.delivery, Delivery::Delivered | Delivery::CgroupKill)
                })
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
            let mut cgroup_members = 0;
            if j.pins.is_empty() {
                reason = "every member had exited before it could be signalled".into();
            }
            if j.cgroup.is_some() {
                let (members, clause) = removed.next().unwrap_or_default();
                cgroup_members = members;
                reason.push_str(&clause);
            }
            let state = if j.pins.is_empty() && cgroup_members == 0 {
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
            // Saturating: a grace read from a row is at most an hour, but never panic on one.
            let now = Instant::now();
            j.deadline = now.checked_add(j.grace).unwrap_or(now);
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
                        j.kill_cgroup();
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
            let signalled = f.signals.iter().any(|s| s.delivery == Delivery::Delivered);
            let result = match (changed, f.to) {
                // What this close did is the answer: signals sent are never a "conflict", even
                // when the row was settled by someone else meanwhile.
                (false, LeaseState::Closed) if signalled => CloseResult::Closed,
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
                } else if signalled {
                    format!(
                        "{}; the lease row was settled by another process meanwhile",
                        f.reason
                    )
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

/// The leases some thread of this process is closing right now (see [`Controller::claim_all`]).
static HELD: std::sync::Mutex<std::collections::BTreeSet<String>> =
    std::sync::Mutex::new(std::collections::BTreeSet::new());

/// A set of in-process claims; dropping it releases them (also on an error or a panic).
#[derive(Default)]
struct HeldClaims(Vec<String>);

impl HeldClaims {
    fn set() -> std::sync::MutexGuard<'static, std::collections::BTreeSet<String>> {
        HELD.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes `id` for this holder; false when another holder in this process has it.
    fn take(&mut self, id: &str) -> bool {
        if Self::set().insert(id.to_string()) {
            self.0.push(id.to_string());
            true
        } else {
            false
        }
    }

    fn release(&mut self, id: &str) {
        if let Some(i) = self.0.iter().position(|h| h == id) {
            self.0.swap_remove(i);
            Self::set().remove(id);
        }
    }
}

/// How old (by its lease id's timestamp) a cgroup without a lease must be before the sweep takes
/// it: `leash exec` makes the directory just before it commits the lease, and it cannot wait
/// longer than the database's busy timeout for that commit.
fn stray_min_age_ms() -> i64 {
    (crate::store::busy_timeout().as_millis() as i64).saturating_mul(2) + 1_000
}

/// True when a process group still has a member ([`proc::group_exists`]), polling until
/// `settle` while it does (a killed member is a zombie until its parent reaps it).
fn group_has_members(pgid: i32, settle: Instant) -> bool {
    loop {
        if !proc::group_exists(pgid) {
            return false;
        }
        if Instant::now() >= settle {
            return true;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Kills, waits for and removes many cgroups at once: every populated one is killed first, then
/// all are waited for together (one deadline), then each is removed; a cgroup that could not be
/// opened as the lease's or killed is left, with the reason in its clause. Returns, per cgroup in order, the
/// members it had before the kill and the clause its lease's reason gets.
fn remove_cgroups(list: &[(PathBuf, u64)]) -> Vec<(usize, String)> {
    let started = Instant::now();
    let mut out: Vec<(usize, String)> = Vec::with_capacity(list.len());
    let mut open: Vec<Option<Verified>> = Vec::with_capacity(list.len());
    for (path, id) in list {
        if !path.exists() {
            out.push((0, format!("; cgroup {} already removed", path.display())));
            open.push(None);
            continue;
        }
        match Verified::open(path, *id) {
            Ok(h) => {
                let members = h.procs().len();
                if members > 0 || h.populated() {
                    if let Err(e) = h.kill() {
                        tracing::warn!(cgroup = %path.display(), error = %e, "cgroup not removed");
                        out.push((members, format!("; {e}")));
                        open.push(None);
                        continue;
                    }
                }
                out.push((members, String::new()));
                open.push(Some(h));
            }
            Err(e) => {
                tracing::warn!(cgroup = %path.display(), error = %e, "cgroup not removed");
                out.push((0, format!("; {e}")));
                open.push(None);
            }
        }
    }
    let deadline = started + cgroup::KILL_WAIT;
    loop {
        let busy = open.iter().flatten().any(|h| h.populated());
        if !busy || Instant::now() >= deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    for (((path, _), h), (members, clause)) in list.iter().zip(open).zip(out.iter_mut()) {
        let Some(h) = h else { continue };
        if h.populated() {
            let e = cgroup::CgroupError::Stuck {
                path: path.clone(),
                waited_ms: started.elapsed().as_millis(),
            };
            tracing::warn!(cgroup = %path.display(), error = %e, "cgroup not removed");
            *clause = format!("; {e}");
            continue;
        }
        *clause = match h.remove() {
            Ok(()) if *members == 0 => format!("; cgroup {} removed", path.display()),
            Ok(()) => format!(
                "; cgroup.kill took {members} remaining member(s) of {} and it was removed",
                path.display()
            ),
            Err(e) => {
                tracing::warn!(cgroup = %path.display(), error = %e, "cgroup not removed");
                format!("; {e}")
            }
        };
    }
    out
}

/// Kills what is left in a verified cgroup, waits until it is empty and removes it
/// ([`remove_cgroups`] for one); returns the clause the lease's reason gets.
fn remove_cgroup(path: &std::path::Path, id: u64) -> String {
    let mut out = remove_cgroups(&[(path.to_path_buf(), id)]);
    out.pop().map(|(_, clause)| clause).unwrap_or_default()
}

impl Drop for HeldClaims {
    fn drop(&mut self) {
        let mut set = Self::set();
        for id in &self.0 {
            set.remove(id);
        }
    }
}

fn sweep_one(s: plan::StrayCgroup) -> SweptCgroup {
    let (result, reason) = match s.action {
        CgroupAction::KillAndRemove | CgroupAction::Remove => {
            let r = Verified::open(std::path::Path::new(&s.path), s.id)
                .and_then(|h| h.kill_and_remove(cgroup::KILL_WAIT));
            match r {
                Ok(()) => ("removed", s.reason),
                Err(e) => ("failed", format!("{}; {e}", s.reason)),
            }
        }
        CgroupAction::Leave | CgroupAction::None => ("left", s.reason),
    };
    tracing::info!(cgroup = %s.path, result, reason = %reason, "stray cgroup");
    SweptCgroup {
        path: s.path,
        id: s.id,
        result: result.into(),
        reason,
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
