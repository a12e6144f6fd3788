//! `reap`: off the connection's thread; the plan of a dry run, or the report.

use super::cx::*;

fn reap(d: &Daemon, r: &protocol::Reap) -> Reply<Reaped> {
    let ctl = &d.ctl;
    let opts = ReapOptions {
        include_live: r.include_live,
        retention_ms: r
            .retention_ms
            .unwrap_or_else(leash_core::limits::default_retention_ms)
            .min(i64::MAX as u64) as i64,
        now_ms: crate::lease::now_ms(),
        grace_ms: r.grace_ms,
    };
    if r.dry_run {
        return Ok(Reaped::Plan(ctl.plan_reap(&opts)?));
    }
    let report = ctl.reap(&opts)?;
    d.metrics.record_outcomes(&report.leases, true);
    for s in d.all_sessions() {
        s.sync_events();
    }
    Ok(Reaped::Report(report))
}

impl Handles<Reap> for Cx<'_> {
    type Done = Timed;

    fn handle(self, r: Reap) -> Timed {
        self.off_thread::<Reap>(move |d| reap(d, &r))
    }
}
