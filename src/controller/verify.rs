//! `leash verify`: the one question a gateway asks before it resumes a stored session — is this
//! lease's process still alive and ours (`owned`), is ownership disproven (`dead`), or can nobody
//! tell (`unavailable`)?
//!
//! The answer is the core's [`judge`] ([`leash_core::answer`]): a lease, what the state root
//! expects of it, and a process snapshot (or the reason there is none) in; a [`VerifyReport`]
//! with its evidence out. [`Controller::verify`] (the CLI's direct path and the daemon's `verify`
//! op) reads the lease row and the same evidence `leash ps` reads
//! ([`crate::ps::observe_lease`]: the root's subtree while the root runs, else the whole table,
//! plus the lease's cgroup), and judges it with the same verifier `reap --dry-run` and `close`
//! use, so every verb gives one answer about one lease. Nothing here signals.

use super::base::{Controller, LeaseRef};
use crate::store::StoreError;
use leash_core::answer::{judge, VerifyReport};
use leash_core::kind::{HasKind, Kind};
use leash_core::verify::Expect;

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
