//! The daemon's reconcile timer: every `--reconcile-interval` it runs one
//! [`crate::reconcile::pass`] over its state root (leases of sessions started outside the daemon
//! whose owner died or whose wrapper is gone are settled, old leases expired), logs it, counts it
//! in the metrics and keeps the last pass for `status`. The decision rules are in
//! `src/reconcile.rs`; this file is only the timer and the bookkeeping.

use super::metrics::ResultLabel;
use super::state::Daemon;
use crate::reconcile::PassReport;
use serde_json::{json, Value};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::Duration;

/// Runs passes every `interval` until `stop` is dropped.
pub(super) fn run(d: &Daemon, interval: Duration, stop: &Receiver<()>) {
    while let Err(RecvTimeoutError::Timeout) = stop.recv_timeout(interval) {
        if d.is_shutting_down() {
            return;
        }
        let result = crate::reconcile::pass(&d.ctl, d.me, d.cfg.retention);
        record(d, result);
    }
}

fn record(d: &Daemon, result: Result<PassReport, crate::controller::LifecycleError>) {
    let m = &d.metrics;
    let passes = last(d)["passes"].as_u64().unwrap_or(0) + 1;
    let mut summary = match result {
        Ok(r) => {
            let kind = if r.acted() { "acted" } else { "idle" };
            m.reconcile_passes
                .get_or_create(&ResultLabel {
                    result: kind.into(),
                })
                .inc();
            m.reconcile_seconds.observe(r.duration_ms as f64 / 1000.0);
            m.record_outcomes(&r.outcomes, true);
            for (name, n) in [
                ("closed", r.closed),
                ("lost", r.lost),
                ("left_open", r.left_open),
                ("conflict", r.conflict),
                ("expired", r.expired),
            ] {
                if n > 0 {
                    m.reconcile_settled
                        .get_or_create(&ResultLabel {
                            result: name.into(),
                        })
                        .inc_by(n as u64);
                }
            }
            for o in &r.outcomes {
                tracing::info!(op = "reconcile", lease_id = %o.lease_id, session = %o.session_key, result = crate::logvalue::json(&o.result), reason = %o.reason, "reconcile settled a lease");
            }
            let level_info = r.acted();
            let s = json!({
                "at": crate::lease::now_ms(),
                "active": r.active,
                "closed": r.closed,
                "lost": r.lost,
                "leftOpen": r.left_open,
                "conflict": r.conflict,
                "expired": r.expired,
                "unreadable": r.unreadable,
                "straysRemoved": r.strays_removed,
                "durationMs": r.duration_ms,
            });
            if level_info {
                tracing::info!(
                    op = "reconcile",
                    active = r.active,
                    closed = r.closed,
                    lost = r.lost,
                    left_open = r.left_open,
                    expired = r.expired,
                    strays_removed = r.strays_removed,
                    duration_ms = r.duration_ms,
                    "reconcile pass"
                );
            } else {
                tracing::debug!(
                    op = "reconcile",
                    active = r.active,
                    unreadable = r.unreadable,
                    duration_ms = r.duration_ms,
                    "reconcile pass: nothing to do"
                );
            }
            s
        }
        Err(e) => {
            m.reconcile_passes
                .get_or_create(&ResultLabel {
                    result: "failed".into(),
                })
                .inc();
            tracing::warn!(op = "reconcile", error = %e, "reconcile pass failed; the next one tries again");
            json!({"at": crate::lease::now_ms(), "error": e.to_string()})
        }
    };
    // Numbered, so a client (or a test) can wait for "two more passes" without sleeping.
    summary["passes"] = json!(passes);
    *d.last_reconcile.lock().unwrap_or_else(|p| p.into_inner()) = summary;
}

/// The last pass, for `status` (`null` before the first).
pub(super) fn last(d: &Daemon) -> Value {
    d.last_reconcile
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone()
}
