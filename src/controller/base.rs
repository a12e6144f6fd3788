//! The `Controller` every verb runs on, as all of `controller/` sees it: the struct (opening the
//! store and the machine: process table, signaller, clock, containment), naming leases
//! ([`LeaseRef`]), folding the wrappers' reports in, claiming leases for closing exclusively
//! across processes (the store) and across the threads of one (`HeldClaims`), the jobs of the
//! TERM → grace → KILL engine; and the vocabulary every verb file takes from here with
//! `use super::base::*`.

pub(super) use super::terminate::{self, Engine, Job, SignalRecord};
pub(super) use crate::cgroup::{self, Containment, Verified};
pub(super) use crate::proc::{self, ProcessTable};
pub(super) use crate::report::{self, WrapperReport};
pub(super) use crate::signal::{
    Clock, CurrentCaller, Delivery, PidfdSignaller, Signaller, SystemClock,
};
pub(super) use crate::state::StateRoot;
pub(super) use crate::store::{Store, StoreError, Transition};
pub(super) use leash_core::guard::Caller;
pub(super) use leash_core::kind::{HasKind, Kind};
pub(super) use leash_core::model::LegacyRecord;
pub(super) use leash_core::model::Snapshot;
pub(super) use leash_core::model::TableError;
pub(super) use leash_core::model::{Lease, LeaseState, ProcessId};
pub(super) use leash_core::plan::{
    self, CgroupAction, Decision, ReapOptions, ReapPlan, RefusedSignal,
};
pub(super) use leash_core::verify::Expect;
pub(super) use serde::{Deserialize, Serialize};
pub(super) use std::path::PathBuf;
pub(super) use std::sync::{Mutex, MutexGuard, OnceLock};
pub(super) use std::time::{Duration, Instant};

use super::session_input::{NoSessionInput, SessionInput};

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

impl HasKind for LifecycleError {
    fn kind(&self) -> Kind {
        match self {
            LifecycleError::Store(e) => e.kind(),
            LifecycleError::NoLease(_) | LifecycleError::NoActiveLease(_) => Kind::NotFound,
            LifecycleError::NotOpen { .. } => Kind::Conflict,
        }
    }
}

/// Names a lease: by id, or as the active lease of a session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseRef {
    Id(String),
    Session(String),
}

/// The verbs of one state root. Every verb takes `&self`, so one controller serves many threads
/// at once (the daemon holds one for its whole life and shares it among its connections, its
/// settles and its reconcile passes; the CLI makes one per process). Its one database
/// connection sits behind a mutex that each verb takes for one database step at a time (a read,
/// a claim, a batch of transitions) and never across a grace period, a signal or a wait: two
/// closes of different leases run their graces together, as they did with a connection each.
pub struct Controller<'t> {
    pub(super) root: StateRoot,
    pub(super) store: Mutex<Store>,
    /// The store's gateway instance id, read once (it never changes), so naming the database
    /// takes no lock.
    pub(super) gateway: String,
    pub(super) table: &'t (dyn ProcessTable + Sync),
    pub(super) caller: Caller,
    pub(super) me: ProcessId,
    /// Resolved on first use ([`Controller::containment`]).
    pub(super) containment: OnceLock<Containment>,
    /// Who signals, and the clock the graces run on (pidfds and the system's, live).
    pub(super) signaller: &'t (dyn Signaller + Sync),
    pub(super) clock: &'t (dyn Clock + Sync),
    /// Whoever holds the adapters' stdin, for `sessions send` (a front door sets it).
    pub(super) input: Box<dyn SessionInput + Send + Sync>,
    /// The stray cgroups the last sweep reported, by (path, cgroup id, result): a controller
    /// that sweeps again and again (the daemon's reconcile passes) reports each once at its
    /// level and a stray that stays the same at debug only.
    pub(super) strays_reported: Mutex<std::collections::HashSet<(String, u64, String)>>,
}

/// Leases claimed, and (lease id, why not) for the others.
pub(super) type Claimed = (Vec<Lease>, Vec<(String, String)>);

/// How one claimed lease ends.
pub(super) struct Finish {
    pub(super) lease: Lease,
    pub(super) to: LeaseState,
    pub(super) reason: String,
    pub(super) signals: Vec<SignalRecord>,
    pub(super) refused: Vec<RefusedSignal>,
}

// One per lease being closed, moved around rarely: boxing the lease buys nothing.
#[allow(clippy::large_enum_variant)]
pub(super) enum JobKind {
    Lease(Lease),
    Legacy(LegacyRecord),
}

impl terminate::Subject for JobKind {
    fn lease_id(&self) -> Option<&str> {
        match self {
            JobKind::Lease(l) => Some(&l.lease_id),
            JobKind::Legacy(_) => None,
        }
    }
}

/// The leases some thread of this process is closing right now (see [`Controller::claim_all`]),
/// each named by its database's gateway instance id and its lease id: two stores open in one
/// process (two state roots, or the controller simulator's cases running as threads of one test
/// binary) hold independent leases, even when their ids are spelt alike. The gateway id, not the
/// database's path, names the database, so two spellings of one path can never both claim.
pub(super) type HeldKey = (String, String);

pub(super) static HELD: std::sync::Mutex<std::collections::BTreeSet<HeldKey>> =
    std::sync::Mutex::new(std::collections::BTreeSet::new());

/// A set of in-process claims in one database; dropping it releases them (also on an error or a
/// panic).
pub(super) struct HeldClaims {
    pub(super) gateway: String,
    pub(super) ids: Vec<String>,
}

impl HeldClaims {
    pub(super) fn new(gateway: &str) -> Self {
        HeldClaims {
            gateway: gateway.to_string(),
            ids: Vec::new(),
        }
    }

    pub(super) fn set() -> std::sync::MutexGuard<'static, std::collections::BTreeSet<HeldKey>> {
        HELD.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn key(&self, id: &str) -> HeldKey {
        (self.gateway.clone(), id.to_string())
    }

    /// Takes `id` for this holder; false when another holder in this process has it.
    pub(super) fn take(&mut self, id: &str) -> bool {
        if Self::set().insert(self.key(id)) {
            self.ids.push(id.to_string());
            true
        } else {
            false
        }
    }

    pub(super) fn release(&mut self, id: &str) {
        if let Some(i) = self.ids.iter().position(|h| h == id) {
            self.ids.swap_remove(i);
            let key = self.key(id);
            Self::set().remove(&key);
        }
    }
}

impl Drop for HeldClaims {
    fn drop(&mut self) {
        let mut set = Self::set();
        for id in &self.ids {
            set.remove(&(self.gateway.clone(), id.clone()));
        }
    }
}

impl<'t> Controller<'t> {
    /// Opens the state root's store. Containment is resolved from the environment when a verb
    /// first needs it (the sessions queries never do), unless [`Controller::with_containment`]
    /// set it.
    pub fn open(root: StateRoot, table: &'t (dyn ProcessTable + Sync)) -> Result<Self, StoreError> {
        let store = Store::open(&root.db_path())?;
        crate::sys::raise_nofile_limit();
        Ok(Controller {
            root,
            gateway: store.gateway_instance_id().to_string(),
            store: Mutex::new(store),
            table,
            caller: Caller::current(),
            me: proc::self_id(),
            containment: OnceLock::new(),
            signaller: &PidfdSignaller,
            clock: &SystemClock,
            input: Box::new(NoSessionInput),
            strays_reported: Mutex::default(),
        })
    }

    /// Signals through `signaller` on `clock`, as `caller` (the controller simulator: the
    /// recording signaller over a fixture host; live, pidfds and the system clock as leash).
    pub fn with_signaller(
        mut self,
        signaller: &'t (dyn Signaller + Sync),
        clock: &'t (dyn Clock + Sync),
        caller: Caller,
    ) -> Self {
        self.signaller = signaller;
        self.clock = clock;
        self.caller = caller;
        self
    }

    /// The TERM → grace → KILL engine over this controller's table, signaller and clock.
    pub(super) fn engine(&self) -> Engine<'_> {
        Engine {
            table: self.table,
            caller: &self.caller,
            signaller: self.signaller,
            clock: self.clock,
        }
    }

    /// Uses these containment settings instead of the environment's.
    pub fn with_containment(mut self, settings: &cgroup::Settings) -> Self {
        self.containment = OnceLock::from(Containment::resolve_lean(settings, &self.gateway));
        self
    }

    /// Uses this containment, resolved by the caller (the daemon resolves it once, in its leaf
    /// cgroup, and its controller uses the same value).
    pub fn with_resolved_containment(mut self, containment: Containment) -> Self {
        self.containment = OnceLock::from(containment);
        self
    }

    /// The containment in force: the one set, or the environment's (read once).
    pub fn containment(&self) -> &Containment {
        self.containment.get_or_init(|| {
            let settings = cgroup::Settings::from_env().unwrap_or_else(|e| {
                tracing::warn!(error = %e, "containment setting unreadable; using on");
                cgroup::Settings::default()
            });
            Containment::resolve_lean(&settings, &self.gateway)
        })
    }

    pub(super) fn cgroup_root(&self) -> Option<PathBuf> {
        self.containment().gateway_root.clone()
    }

    /// Observes the cgroups of these leases that lie where this gateway puts them (nothing else
    /// is even read), and adds their members to `list` when they are missing from it.
    pub(super) fn observe_cgroups(&self, leases: &[&Lease]) -> Vec<leash_core::model::Observation> {
        let Some(root) = self.cgroup_root() else {
            return Vec::new();
        };
        leases
            .iter()
            .filter_map(|l| {
                let p = PathBuf::from(l.cgroup_path.as_ref()?);
                (p == root.join(&l.lease_id)).then(|| self.table.cgroup(&p))
            })
            .collect()
    }

    /// Adds the observations, and the members they list that the snapshot lacks.
    pub(super) fn with_cgroups(
        &self,
        snap: Snapshot,
        obs: Vec<leash_core::model::Observation>,
    ) -> Snapshot {
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

    /// The store, for one database step. Hold the guard only as long as that step: every other
    /// thread using this controller waits for it.
    pub fn store(&self) -> MutexGuard<'_, Store> {
        self.store.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The database's gateway instance id.
    pub fn gateway_instance_id(&self) -> &str {
        &self.gateway
    }

    /// The process table the verbs read.
    pub fn table(&self) -> &'t (dyn ProcessTable + Sync) {
        self.table
    }

    pub fn root(&self) -> &StateRoot {
        &self.root
    }

    pub(super) fn wrapper_root(&self) -> PathBuf {
        self.root.wrapper_root()
    }

    /// Folds the wrappers' reports into the leases (see [`report::ingest_reports`]): a lease
    /// whose wrapper reported its end and is gone moves to `ended`, with the reported exit status
    /// (the name is older than the `ended` state: it marks ended leases, never `lost` ones).
    /// Returns how many leases changed state.
    ///
    /// On a full disk what cannot be recorded stays as it is (the report stays too, for the
    /// next look): reading never needs room, so a `leases`, `status` or `ps` answers from the
    /// rows as they are, and a close goes on to its own claim (which has the store's reserve).
    pub fn ingest_reports_marking_ended_lost(&self) -> Result<usize, StoreError> {
        match report::ingest_reports(&self.root, &mut self.store(), self.table) {
            Err(e) if e.is_disk_full() => {
                tracing::warn!(error = %e, "the wrappers' reports cannot be recorded now (the state database's disk is full); answering from the rows as they are");
                Ok(0)
            }
            other => other,
        }
    }

    pub fn resolve(&self, r: &LeaseRef) -> Result<Lease, LifecycleError> {
        match r {
            LeaseRef::Id(id) => self
                .store()
                .lease(id)?
                .ok_or_else(|| LifecycleError::NoLease(id.clone())),
            LeaseRef::Session(key) => self
                .store()
                .active_lease_for_session(key)?
                .ok_or_else(|| LifecycleError::NoActiveLease(key.clone())),
        }
    }

    /// [`Controller::resolve`] for a close: an active lease whose row does not read is repaired
    /// first ([`Store::repair_lease`]: fields that are not evidence reset to safe values, a
    /// `repaired` event), then closed like any other, verification included. An invalid row
    /// never makes a live tree unkillable; a row whose evidence does not read is refused (it
    /// cannot be verified, so nothing is signalled).
    pub(super) fn resolve_or_repair(&self, r: &LeaseRef) -> Result<Lease, LifecycleError> {
        match self.resolve(r) {
            Err(LifecycleError::Store(StoreError::BadRow { lease_id, detail })) => {
                let repaired = self.store().repair_lease(&lease_id)?;
                match repaired {
                    Some((lease, _)) => Ok(lease),
                    None => Err(StoreError::BadRow { lease_id, detail }.into()),
                }
            }
            other => other,
        }
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
    pub(super) fn claim_all(&self, ids: &[&str]) -> Result<(Claimed, HeldClaims), StoreError> {
        let mut refused = Vec::new();
        let mut held = HeldClaims::new(&self.gateway);
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
        let mut store = self.store();
        let results = store.claim_many(&mine, self.me, stale)?;
        let mut claimed = Vec::new();
        for (id, r) in mine.iter().zip(results) {
            match r {
                Some(l) => claimed.push(l),
                None => {
                    held.release(id);
                    let why = match store.lease(id)? {
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

    pub(super) fn expect_parts(&self) -> (String, PathBuf, Option<PathBuf>) {
        (
            self.gateway.clone(),
            self.wrapper_root(),
            self.cgroup_root(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::HeldClaims;

    /// In-process claims are per database: a lease id held in one store does not block the
    /// same id in another (the controller simulator's cases share fixture ids and run as
    /// threads of one process), while a second holder in the same store is refused until the
    /// first is dropped.
    #[test]
    fn held_claims_are_per_database() {
        let id = "01936b2a-7c4e-7d10-9a51-held00000001";
        let mut a = HeldClaims::new("gateway-a");
        assert!(a.take(id));
        let mut b = HeldClaims::new("gateway-b");
        assert!(b.take(id), "another database's lease of the same id");
        let mut a2 = HeldClaims::new("gateway-a");
        assert!(!a2.take(id), "the same database's lease is held");
        drop(a);
        assert!(a2.take(id), "released when the holder is dropped");
    }
}
