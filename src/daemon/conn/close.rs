//! `close`: off the connection's thread (grace periods); it meets the ensures of its keys in
//! flight, and with `discardPersistentState` deletes what would resume the sessions.

use super::cx::*;
use crate::daemon::spec;

/// The ensures in flight of the keys a close names (a lease id by its row's session key): each
/// is waited for until it has its session (see [`crate::daemon::admission`]).
fn meet_ensures(d: &Daemon, refs: &[LeaseRef]) -> Vec<crate::daemon::admission::PendingClose> {
    let mut keys: Vec<String> = Vec::new();
    for r in refs {
        let key = match r {
            LeaseRef::Session(k) => Some(k.clone()),
            LeaseRef::Id(id) => d.store().lease(id).ok().flatten().map(|l| l.session_key),
        };
        if let Some(k) = key.filter(|k| !keys.contains(k)) {
            keys.push(k);
        }
    }
    keys.iter()
        .filter_map(|k| d.admission.close_arrives(k, CLOSE_MEETS_ENSURE))
        .collect()
}

/// `close` with `discardPersistentState`: the stored specs and resumable entries of the sessions
/// named (by key, or by a lease the close settled) are deleted, whatever the close answered:
/// the caller wants nothing of them kept, and a session that is not running has only these left.
fn discard_persistent_state(
    d: &Daemon,
    refs: &[crate::controller::LeaseRef],
    closed: Option<&Vec<crate::controller::CloseOutcome>>,
) {
    let mut keys: Vec<String> = refs
        .iter()
        .filter_map(|r| match r {
            crate::controller::LeaseRef::Session(k) => Some(k.clone()),
            crate::controller::LeaseRef::Id(_) => None,
        })
        .collect();
    keys.extend(closed.into_iter().flatten().map(|o| o.session_key.clone()));
    keys.sort();
    keys.dedup();
    for k in &keys {
        if let Err(err) = spec::forget(&mut d.writer(), k) {
            tracing::warn!(session_key = %k, error = %err, "cannot delete the session's stored spec");
        }
    }
    d.resumable
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .retain(|r| !keys.contains(&r.session_key));
}

impl Handles<Close> for Cx<'_> {
    type Done = Timed;

    fn handle(self, c: Close) -> Timed {
        let refs = c.targets;
        self.off_thread::<Close>(move |d| {
            // Ensures of these keys in flight are waited for, and what they start is
            // closed with the rest (see `admission`).
            let pending = meet_ensures(d, &refs);
            let why = c.reason.as_deref().unwrap_or("requested");
            let out = d.close(&refs, c.grace_ms, why);
            if c.discard_persistent_state {
                discard_persistent_state(d, &refs, out.as_ref().ok());
            }
            for p in pending {
                p.done(out.as_deref().ok());
            }
            Ok(out?)
        })
    }
}
