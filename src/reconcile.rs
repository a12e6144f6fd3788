//! Continuous reconcile: what `leash serve --reconcile-interval` runs on a timer so that leases
//! of sessions started outside the daemon (plain `leash exec`) are settled without anyone running
//! `reap` — the incumbent gateways' lost leases piled up because their reaper ran only at
//! start-up.
//!
//! A pass reads the lease rows, and for each active lease only its owner, its root and its
//! claimant (three `/proc/<pid>` entries): the pure [`decide`] then says what each lease needs.
//! Only when some lease needs settling does the pass go further, through the same controller
//! paths as `reap` and `close` (verify against live evidence, terminate children first, mark
//! lost): so a pass with nothing to do costs O(active leases) reads, never a scan of the host,
//! and never a command-line search. Settling an orphan reads the process table once, as `reap`
//! does, because the escapees of a SIGKILLed wrapper are found only by their markers.
//!
//! The rules are `reap`'s: a lease whose owner is alive is a live session and is left alone,
//! unless its wrapper is verifiably gone (then nothing of the session can be resumed, and the
//! lease is settled by `close`, which only signals what still carries the lease's markers). The
//! daemon's own sessions are the daemon's to settle and are never touched here.

use crate::controller::{CloseOutcome, CloseResult, Controller, LeaseRef, LifecycleError};
use crate::lease::now_ms;
use crate::proc::ProcessTable;
use leash_core::model::{Lease, ProcessId};
use leash_core::plan::ReapOptions;
use leash_core::reconcile::{decide, Action, Decider, Facts};
use serde::{Deserialize, Serialize};
use std::time::{Duration, Instant};

/// What one pass did: logged, counted in the metrics, and kept for `status`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PassReport {
    /// Active leases looked at.
    pub active: usize,
    /// Leases settled, by result (`closed`, `lost`, `leftOpen`, `conflict`).
    pub closed: usize,
    pub lost: usize,
    pub left_open: usize,
    pub conflict: usize,
    pub expired: usize,
    /// Facts that could not be read (the lease was left alone).
    pub unreadable: usize,
    /// Stray cgroups (of ended leases, or of none) removed by this pass, under containment.
    pub strays_removed: usize,
    pub duration_ms: u64,
    /// The outcomes of the settled leases (signals, refusals, reasons).
    pub outcomes: Vec<CloseOutcome>,
}

impl PassReport {
    fn count(&mut self, outcomes: Vec<CloseOutcome>) {
        for o in &outcomes {
            match o.result {
                CloseResult::Closed => self.closed += 1,
                CloseResult::Lost => self.lost += 1,
                CloseResult::LeftOpen => self.left_open += 1,
                CloseResult::Conflict => self.conflict += 1,
            }
        }
        self.outcomes.extend(outcomes);
    }

    /// True when the pass changed something.
    pub fn acted(&self) -> bool {
        self.strays_removed > 0
            || self.closed + self.lost + self.left_open + self.conflict + self.expired > 0
    }
}

fn alive(table: &dyn ProcessTable, id: ProcessId) -> Option<bool> {
    // Unavailable: unknown, and an unknown fact never leads to action.
    table.alive(id).ok()
}

/// One reconcile pass over the controller's state root (the daemon passes the one controller it
/// holds: the pass's closes and reaps are the same calls as its requests').
pub fn pass(
    ctl: &Controller<'_>,
    me: ProcessId,
    retention: Duration,
) -> Result<PassReport, LifecycleError> {
    let started = Instant::now();
    let mut report = PassReport::default();
    let table = ctl.table();
    // Wrappers that exited on their own leave a report: fold those in first (cheap, and it
    // settles most ended sessions without looking at any process).
    ctl.ingest_reports_marking_ended_lost()?;
    let now = now_ms();
    let gateway = ctl.gateway_instance_id().to_string();
    let who = Decider {
        me,
        gateway_instance_id: &gateway,
    };
    let rows = ctl.store().leases(&[])?;
    let (mut reap, mut settle, mut expire) = (false, Vec::new(), false);
    for lease in rows.iter().flatten() {
        let facts = if lease.state.is_active() {
            report.active += 1;
            Facts {
                owner_alive: alive(table, lease.owner()),
                root_alive: alive(table, lease.root()),
                claimant_alive: lease
                    .claimed_by
                    .map(|c| alive(table, c))
                    .unwrap_or(Some(false)),
            }
        } else {
            Facts {
                owner_alive: None,
                root_alive: None,
                claimant_alive: None,
            }
        };
        if lease.state.is_active() && (facts.owner_alive.is_none() || facts.root_alive.is_none()) {
            report.unreadable += 1;
        }
        match decide(lease, facts, who, now, retention) {
            Action::Leave => {}
            Action::Reap => reap = true,
            Action::Settle => settle.push(LeaseRef::Id(lease.lease_id.clone())),
            Action::Expire => expire = true,
        }
    }
    if reap {
        // `reap`'s own rules decide again from one snapshot (owner gone, claimant gone), verify,
        // terminate, and expire old leases.
        let r = ctl.reap(&ReapOptions {
            include_live: false,
            retention_ms: retention.as_millis().min(i64::MAX as u128) as i64,
            now_ms: now,
            grace_ms: None,
        })?;
        report.expired = r.expired;
        report.strays_removed = removed(&r.cgroups);
        report.count(r.leases);
    } else {
        if expire {
            let cutoff = now.saturating_sub(retention.as_millis().min(i64::MAX as u128) as i64);
            report.expired = ctl.store().expire(cutoff)?;
        }
        // Under containment: cgroups of ended leases, or of no lease (a crash between mkdir and
        // the commit), each verified before it is killed and removed. One readdir of this
        // gateway's cgroup root when there is nothing to do.
        // The rows this pass read serve it; no second read of the lease table.
        if ctl.containment().gateway_root.is_some() {
            let rows: Vec<Result<Lease, String>> = rows
                .into_iter()
                .map(|r| r.map_err(|e| e.to_string()))
                .collect();
            report.strays_removed = removed(&ctl.sweep_stray_cgroups_among(&rows, now));
        }
    }
    if !settle.is_empty() {
        // One at a time: a lease that settled meanwhile (its report arrived) must not fail the
        // others.
        for r in &settle {
            match ctl.close(std::slice::from_ref(r), None) {
                Ok(out) => report.count(out),
                Err(LifecycleError::NotOpen { .. }) | Err(LifecycleError::NoLease(_)) => {}
                Err(e) => return Err(e),
            }
        }
    }
    report.duration_ms = started.elapsed().as_millis() as u64;
    Ok(report)
}

fn removed(swept: &[crate::controller::SweptCgroup]) -> usize {
    swept.iter().filter(|c| c.result == "removed").count()
}
