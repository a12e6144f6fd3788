//! The start-up steps of `serve` that are not the socket or the lock: the start-up reap of a
//! previous daemon's leases, and the daemon's own cgroup leaf.

use super::metrics;
use super::state::*;
use crate::controller::Controller;
use crate::lease::now_ms;
use crate::protocol;
use leash_core::plan::ReapOptions;
use std::fs::{self};
use std::time::Instant;

/// Leases of a previous daemon (owner gone) are verified and terminated or marked lost; leases
/// with a live owner (another process's sessions) are left alone.
pub(super) fn startup_reap(
    ctl: &Controller<'_>,
    cfg: &ServeConfig,
    metrics: &metrics::Metrics,
) -> Result<protocol::StartupReap, ServeError> {
    let reap_started = Instant::now();
    let report = ctl.reap(&ReapOptions {
        include_live: false,
        retention_ms: cfg.retention.as_millis() as i64,
        now_ms: now_ms(),
        grace_ms: None,
    })?;
    metrics.record_outcomes(&report.leases, true);
    let count =
        |r: crate::controller::CloseResult| report.leases.iter().filter(|o| o.result == r).count();
    use crate::controller::CloseResult as R;
    let summary = protocol::StartupReap {
        bad_rows: report.bad_rows.len(),
        closed: count(R::Closed),
        conflict: count(R::Conflict),
        expired: report.expired,
        left_open: count(R::LeftOpen),
        legacy: report.legacy.len(),
        lost: count(R::Lost),
        skipped: report.skipped.len(),
    };
    metrics
        .startup_reap_seconds
        .set(reap_started.elapsed().as_secs_f64());
    tracing::info!(
        summary = crate::logvalue::json(&summary),
        "startup reap done"
    );
    Ok(summary)
}

/// A daemon that runs in the leash cgroup root itself (a systemd unit with `Delegate=yes`) moves
/// into a leaf of its own, `<root>/leash-daemon`: a cgroup with processes cannot enable
/// controllers for its children (the no-internal-processes rule), and the session cgroups need
/// them for limits. Anywhere else it stays where it is.
pub(super) fn enter_daemon_leaf(gateway: &str) {
    let settings = crate::cgroup::Settings::from_env().unwrap_or_default();
    let c = crate::cgroup::Containment::resolve(&settings, gateway);
    let (Some(root), Some(mount)) = (c.root.as_deref(), c.mount.as_deref()) else {
        return;
    };
    let own = fs::read_to_string("/proc/self/cgroup")
        .ok()
        .and_then(|t| crate::cgroup::own_cgroup(&t));
    let Some(own) = own else { return };
    if mount.join(own.trim_start_matches('/')) != root {
        return;
    }
    match crate::cgroup::move_self_to_leaf(root) {
        Ok(leaf) => {
            tracing::info!(cgroup = %leaf.display(), "moved the daemon into its leaf cgroup")
        }
        Err(e) => {
            tracing::warn!(cgroup = %root.display(), error = %e, "cannot move the daemon into a leaf cgroup; limits may be refused")
        }
    }
}

/// The containment the daemon's sessions run under, resolved once it stands in its own leaf
/// cgroup ([`enter_daemon_leaf`]).
pub(super) fn enter_containment(gateway: &str) -> crate::cgroup::Containment {
    enter_daemon_leaf(gateway);
    crate::cgroup::Containment::resolve_lean(
        &crate::cgroup::Settings::from_env().unwrap_or_default(),
        gateway,
    )
}

/// Keeps the gateway's cgroup directory while the daemon serves (see
/// [`leash_core::model::GATEWAY_HOLD`]); without it everything works as before, one `mkdir` and
/// `rmdir` more per session start.
pub(super) fn hold_gateway_dir(containment: &crate::cgroup::Containment) {
    if let (true, Some(gw)) = (containment.is_on(), &containment.gateway_root) {
        if let Err(e) = crate::cgroup::hold_gateway_dir(gw) {
            tracing::warn!(cgroup = %gw.display(), error = %e, "cannot hold the gateway's cgroup directory");
        }
    }
}
