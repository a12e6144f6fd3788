//! Stopping and starting again: the sessions busy at a stop are recorded for the next daemon,
//! which takes them up as resumable; the shutdown closes every session through the normal path.

use super::state::*;
use crate::controller::LeaseRef;
use crate::lease::now_ms;
use crate::protocol;
use crate::store::{Store, StoreError};
use protocol::Phase;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// `meta` key under which a stopping daemon leaves the sessions that were busy.
pub(super) const META_INTERRUPTED: &str = "daemon.interruptedSessions";

/// How long shutdown waits for the wrappers to be reaped after the close.
pub(super) const SHUTDOWN_REAP_WAIT: Duration = Duration::from_secs(15);

/// How long shutdown lets attach streams write their last items (the `end`) before exiting.
pub(super) const ATTACH_FLUSH_WAIT: Duration = Duration::from_secs(2);

/// Reads (and clears) what the previous daemon left about its busy sessions.
pub(super) fn take_interrupted(store: &mut Store) -> Result<Vec<Value>, StoreError> {
    let Some(text) = store.meta(META_INTERRUPTED)? else {
        return Ok(Vec::new());
    };
    store.set_meta(META_INTERRUPTED, None)?;
    match serde_json::from_str::<Vec<Value>>(&text) {
        Ok(v) => Ok(v),
        Err(e) => {
            tracing::warn!(error = %e, "ignoring an unreadable list of interrupted sessions");
            Ok(Vec::new())
        }
    }
}

/// Records a `resumable` event for each session the previous daemon stopped while busy, and
/// keeps them for `status` until they are ensured again.
pub(super) fn announce_resumable(d: &Daemon, list: Vec<Value>) {
    let mut kept = Vec::new();
    // An entry without a session key is skipped; the others are kept as they were recorded.
    for mut entry in list
        .into_iter()
        .filter_map(|e| serde_json::from_value::<protocol::Resumable>(e).ok())
    {
        let key = entry.session_key.clone();
        let lease = entry
            .rest
            .get("leaseId")
            .and_then(Value::as_str)
            .map(str::to_owned);
        let mut detail = serde_json::to_value(&entry).expect("entries serialise");
        // Kept off the event log (see `shutdown`): the entry in `status` has it.
        if let Some(m) = detail.as_object_mut() {
            m.remove("acpSessions");
        }
        let seq = d
            .writer()
            .record_event(&key, lease.as_deref(), "resumable", Some(detail));
        match seq {
            Ok(seq) => {
                entry.rest.insert("eventSeq".into(), json!(seq));
            }
            Err(e) => {
                tracing::warn!(session = %key, error = %e, "cannot record the resumable event")
            }
        }
        tracing::info!(session = %key, "session was busy when the previous daemon stopped: resumable");
        kept.push(entry);
    }
    *d.resumable.lock().unwrap_or_else(|p| p.into_inner()) = kept;
}

/// Records the busy sessions, closes every session through the normal close path and waits for
/// their wrappers to be reaped.
pub(super) fn shutdown(d: &Daemon) {
    // Ensures in flight finish first (they saw the flag too late to refuse), so their sessions
    // are closed below like the others.
    let deadline = Instant::now() + SHUTDOWN_REAP_WAIT;
    while Instant::now() < deadline && !d.admission.is_empty() {
        std::thread::sleep(Duration::from_millis(10));
    }
    let sessions = d.all_sessions();
    let mut interrupted = Vec::new();
    for s in &sessions {
        if !matches!(s.phase(), Phase::Starting | Phase::Running) || !s.busy() {
            continue;
        }
        let st = s.status();
        let entry = json!({
            "sessionKey": s.key,
            "leaseId": st.lease_id,
            "pendingPrompts": st.pending_prompts,
            "acpSessionIds": st.acp_session_ids,
            "at": now_ms(),
        });
        if let Err(e) = s.record_event("interrupted", Some(entry.clone())) {
            tracing::error!(session = %s.key, error = %e, "cannot record the interrupted session");
        }
        // The setup (cwd, mcpServers, whose env values may be credentials) goes into the one
        // meta entry the next daemon takes and deletes at its start, not into the event log.
        let mut entry = entry;
        entry["acpSessions"] = json!(st.acp_sessions);
        tracing::info!(session = %s.key, "busy at shutdown: recorded for resumption");
        interrupted.push(entry);
    }
    if !interrupted.is_empty() {
        let text = serde_json::to_string(&interrupted).expect("serialisable");
        if let Err(e) = d.writer().set_meta(META_INTERRUPTED, Some(&text)) {
            tracing::error!(error = %e, "cannot persist the interrupted sessions");
        }
    }
    // A session whose lease settled already (its wrapper exited and the lease was ended or
    // settled, while the session still drains its output) has nothing left to close: closing
    // it would only mark it closing and answer a conflict.
    let refs: Vec<LeaseRef> = sessions
        .iter()
        .filter(|s| matches!(s.phase(), Phase::Starting | Phase::Running))
        .filter_map(|s| s.lease_id())
        .filter(|id| !matches!(d.store().lease(id), Ok(Some(l)) if l.state.is_terminal()))
        .map(|id| LeaseRef::Id(id.to_string()))
        .collect();
    if !refs.is_empty() {
        match d.close(&refs, None, "daemon shutdown") {
            Ok(out) => {
                for o in out {
                    if o.result == crate::controller::CloseResult::Conflict {
                        // Settled meanwhile (its wrapper died and the lease ended before the
                        // session left the table): nothing was signalled, nothing was closed.
                        tracing::info!(lease_id = %o.lease_id, session = %o.session_key, reason = %o.reason, "already settled when shutdown reached it");
                        continue;
                    }
                    tracing::info!(lease_id = %o.lease_id, session = %o.session_key, result = crate::logvalue::json(&o.result), "closed at shutdown");
                }
            }
            Err(e) => tracing::error!(error = %e, "closing sessions at shutdown failed"),
        }
    }
    let deadline = Instant::now() + SHUTDOWN_REAP_WAIT;
    while Instant::now() < deadline
        && sessions
            .iter()
            .any(|s| s.lease().is_some() && s.phase() != Phase::Ended)
    {
        std::thread::sleep(Duration::from_millis(10));
    }
    // The streams of ended sessions write their last items and their `end`, so an attached client
    // learns that its session ended rather than seeing the connection drop mid-stream.
    let deadline = Instant::now() + ATTACH_FLUSH_WAIT;
    while Instant::now() < deadline
        && sessions
            .iter()
            .any(|s| s.phase() == Phase::Ended && s.status().attached > 0)
    {
        std::thread::sleep(Duration::from_millis(10));
    }
}
