//! `cancel`: record the intent, and write the ACP notification to a supervised adapter.

use super::cx::*;
use super::send::write_failed;

/// How long `cancel` waits for a send in progress, and then for its notification to be written.
const CANCEL_WAIT: Duration = Duration::from_secs(1);

fn cancel(d: &Daemon, target: &LeaseRef, acp: Option<String>) -> Reply<Cancelled> {
    let supervised = match target {
        LeaseRef::Session(k) => d.session(k),
        LeaseRef::Id(id) => d.session_by_lease(id),
    };
    let cancelled = |outcome, acp_session_id, notified, supervised, reason| Cancelled {
        outcome,
        notice: Some(CancelNotice {
            acp_session_id,
            notified,
            reason,
            supervised,
        }),
    };
    let Some(s) = supervised.filter(|s| s.phase() != Phase::Ended) else {
        // Not one of ours: record the intent only, as `leash cancel` does without a daemon.
        let detail = json!({"acpSessionId": acp, "notified": false});
        let out = d.ctl.cancel(target, Some(detail))?;
        return Ok(cancelled(out, acp, false, Some(false), None));
    };
    // A send blocked on an adapter that does not read holds the order lock for up to its
    // timeout: cancel, the no-signal way to stop a turn, does not queue behind it. It records
    // the intent and says the notification could not be written.
    let order = s.order_within(CANCEL_WAIT);
    if !matches!(s.phase(), Phase::Running | Phase::Starting) {
        return Err(fail(
            Code::NotRunning,
            format!("session {} is being closed; nothing written", s.key),
        ));
    }
    let Some(lease_id) = s.lease_id().map(str::to_owned) else {
        return Err(fail(
            Code::NotRunning,
            format!("session {} is still starting; nothing written", s.key),
        ));
    };
    let Some(acp) = acp.or_else(|| s.infer_acp_session()) else {
        // No single ACP session to notify: the intent is recorded all the same, as without a
        // daemon (`leash cancel` answers the same either way); `notified: false` says why not.
        let detail = json!({"acpSessionId": null, "notified": false});
        let out = d.ctl.cancel(&LeaseRef::Id(lease_id), Some(detail));
        s.sync_events();
        return Ok(cancelled(out?, None, false, Some(true), None));
    };
    let not_written = match order {
        None => Some("a send to the adapter is blocked (it does not read its stdin)".to_string()),
        Some(_) => match s.write_line(&session::cancel_notification(&acp), CANCEL_WAIT) {
            Ok(()) => None,
            Err(e @ crate::daemon::stdin_pipe::PipeError::TimedOut { .. }) => Some(e.to_string()),
            Err(e) => return Err(write_failed(&s.key, e)),
        },
    };
    if let Some(why) = not_written {
        let detail = json!({"acpSessionId": acp, "notified": false, "reason": why});
        let outcome = d.ctl.cancel(&LeaseRef::Id(lease_id), Some(detail));
        s.sync_events();
        let reason = format!("the cancel was recorded but not written to the adapter: {why}");
        return Ok(cancelled(outcome?, Some(acp), false, None, Some(reason)));
    }
    let detail = json!({"acpSessionId": acp, "notified": true});
    let outcome = d.ctl.cancel(&LeaseRef::Id(lease_id), Some(detail));
    s.sync_events();
    Ok(cancelled(outcome?, Some(acp), true, Some(true), None))
}

impl Handles<Cancel> for Cx<'_> {
    type Done = Timed;

    fn handle(self, c: Cancel) -> Timed {
        let cancelled = cancel(self.d, &c.target, c.acp_session_id);
        self.answer::<Cancel>(cancelled)
    }
}
