//! `status`: the state root's part (the controller's builder), the daemon's sessions, and the
//! usage of contained sessions, sampled in the background so a health check stays cheap.

use super::state::*;
use super::{reconcile, usage};
use crate::protocol;
use crate::store::StoreError;
use std::collections::HashMap;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;
use usage::*;

impl Daemon {
    /// The usage of the contained leases: from the last sample when it is at most
    /// [`USAGE_MAX_AGE`] old; a lease never sampled is sampled now; older samples are returned
    /// as they are while one background thread takes fresh ones (so `status` never waits on
    /// more than the new sessions' reads). Samples of leases no longer contained are dropped.
    pub(super) fn usage_for(
        self: &Arc<Self>,
        contained: HashMap<String, leash_core::model::Lease>,
        gateway: &str,
        cgroup_root: Option<PathBuf>,
    ) -> HashMap<String, (Instant, crate::ps::Totals)> {
        let (mut known, missing, stale) = {
            let mut c = self.usage.lock().unwrap_or_else(|p| p.into_inner());
            c.by_lease.retain(|id, _| contained.contains_key(id));
            let mut known = HashMap::new();
            let mut missing = Vec::new();
            let mut stale = false;
            for (id, lease) in &contained {
                match c.by_lease.get(id) {
                    Some(u) => {
                        stale |= u.0.elapsed() > USAGE_MAX_AGE;
                        known.insert(id.clone(), u.clone());
                    }
                    None => missing.push(lease.clone()),
                }
            }
            let start_sampler = stale && !c.sampling;
            if start_sampler {
                c.sampling = true;
            }
            (known, missing, start_sampler)
        };
        if !missing.is_empty() {
            let fresh = sample_usage(&missing, &self.root, gateway, cgroup_root.as_deref());
            let mut c = self.usage.lock().unwrap_or_else(|p| p.into_inner());
            for (id, u) in fresh {
                c.by_lease.insert(id.clone(), u.clone());
                known.insert(id, u);
            }
        }
        if stale {
            let d = self.clone();
            let leases: Vec<leash_core::model::Lease> = contained.into_values().collect();
            let gateway = gateway.to_string();
            let spawned = std::thread::Builder::new()
                .name("usage".into())
                .stack_size(super::stack::SMALL_STACK)
                .spawn(move || {
                    let fresh = sample_usage(&leases, &d.root, &gateway, cgroup_root.as_deref());
                    let mut c = d.usage.lock().unwrap_or_else(|p| p.into_inner());
                    for (id, u) in fresh {
                        // A lease that stopped being contained meanwhile is not brought back.
                        if let Some(slot) = c.by_lease.get_mut(&id) {
                            *slot = u;
                        }
                    }
                    c.sampling = false;
                });
            if spawned.is_err() {
                self.usage
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .sampling = false;
            }
        }
        known
    }

    pub(super) fn status(self: &Arc<Self>) -> Result<protocol::Status, StoreError> {
        // Read before the store lock is taken: file reads have no business under it.
        let containment = self.containment.clone().with_controllers();
        let (root, contained) = {
            let mut store = self.health_store();
            // The state root's part, as `leash status` builds it (the controller's one builder).
            let root = crate::controller::store_status_with(&self.root, &mut store, containment)?;
            // Only leases with a cgroup: their totals cost a few file reads each, never a
            // walk of /proc.
            let contained: HashMap<String, leash_core::model::Lease> = store
                .leases(&[
                    leash_core::model::LeaseState::Open,
                    leash_core::model::LeaseState::Closing,
                ])?
                .into_iter()
                .filter_map(Result::ok)
                .filter(|l| l.cgroup_path.is_some())
                .map(|l| (l.lease_id.clone(), l))
                .collect();
            (root, contained)
        };
        let gateway = root.gateway_instance_id.clone();
        let cgroup_root = root.containment.gateway_root.clone();
        let mut status = protocol::Status { root, daemon: None };
        let usage = self.usage_for(contained, &gateway, cgroup_root);
        let sessions: Vec<protocol::StatusSession> = self
            .all_sessions()
            .iter()
            .map(|s| {
                let live = s.status();
                let u = live.lease_id.as_ref().and_then(|id| usage.get(id));
                protocol::StatusSession {
                    usage: u.map(|u| u.1.clone()),
                    usage_age_ms: u.map(|(at, _)| at.elapsed().as_millis() as u64),
                    live,
                }
            })
            .collect();
        let busy: Vec<String> = sessions
            .iter()
            .filter(|s| s.live.busy)
            .map(|s| s.live.session_key.clone())
            .collect();
        let resumable = self
            .resumable
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let last = reconcile::last(self);
        let program = self.program().clone();
        status.daemon = Some(protocol::DaemonStatus {
            busy,
            idle_close_ms: self.cfg.idle_close.map(|d| d.as_millis() as u64),
            metrics: self.cfg.metrics,
            pid: self.me.pid,
            reconcile: protocol::ReconcileStatus {
                interval_ms: self.cfg.reconcile_interval.map(|d| d.as_millis() as u64),
                last: serde_json::from_value(last).ok().flatten(),
            },
            replay_bytes: self.cfg.replay.bytes,
            replay_lines: self.cfg.replay.lines,
            resumable,
            sessions,
            shutting_down: self.is_shutting_down(),
            socket: self.socket.clone(),
            socket_activated: self.activated,
            started_at: self.started_at,
            startup_reap: self.startup_reap.clone(),
            version: super::version::version(),
            serving_since: program.serving_since,
            handoffs: self.metrics.handoffs.get(),
            last_handoff: program.last,
        });
        Ok(status)
    }
}
