//! `events`: a session's lifecycle events, in seq order, two ways. [`Controller::events`] is the
//! operator's read (every event above a seq; the daemon's `events` op, which a client uses to
//! catch up after its replay buffer moved on); [`Controller::history`] is a requester's, behind
//! the sessions visibility gate (`leash sessions history`, directly or through the daemon's
//! `sessions` query, and `leash mcp`'s `sessions_history`).
//!
//! History is judged per lease, not per key: a key reused by a new owner keeps one `sessions`
//! row (the newest owner's), but each lease's ownership is kept as it was when the lease was
//! committed (`lease_owners`), and a requester reads the events of the leases it could see as
//! they were owned then. An event without a lease id belongs to the lease before it.

use super::base::*;
use super::session_input::SessionsError;
use super::sessions::View;
use crate::store::Event;
use leash_core::kind::{HasKind, Kind};
use leash_core::visibility::{Grant, SessionIndex, SessionMeta};

#[derive(Debug, thiserror::Error)]
pub enum EventsError {
    /// No events, no lease and no session row, and no seq ever used: the key names nothing.
    #[error("no session {0} in this state root")]
    NoSession(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl HasKind for EventsError {
    fn kind(&self) -> Kind {
        match self {
            EventsError::NoSession(_) => Kind::NotFound,
            EventsError::Store(e) => e.kind(),
        }
    }
}

/// A session's events as a requester may read them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct History {
    pub session_key: String,
    pub visible_as: Grant,
    pub events: Vec<Event>,
    /// Whether the key's current lease (the one its session row names, which a running daemon
    /// supervises) is among those shown: only then may its live output be merged in (`leash
    /// mcp`), since a key reused by a new owner streams the new owner's output.
    #[serde(skip)]
    pub current_lease_visible: bool,
}

impl Controller<'_> {
    /// The session's events with a seq above `since`. A session with none yet is an empty list
    /// when anything knows the key (a row, a lease, a reserved seq), else
    /// [`EventsError::NoSession`] (as `attach` and `send` answer an unknown key).
    pub fn events(&self, key: &str, since: i64) -> Result<Vec<Event>, EventsError> {
        let store = self.store();
        let ev = store.events_since(key, since)?;
        if ev.is_empty()
            && store.session(key)?.is_none()
            && store.latest_lease_for_session(key)?.is_none()
            && store.last_seq(key)? == 0
        {
            return Err(EventsError::NoSession(key.to_string()));
        }
        Ok(ev)
    }

    /// Every event of a session the requester may see (else `NotFound` / `NotVisible`, see
    /// [`Controller::authorize`]), after the wrappers' reports are folded in.
    ///
    /// Only the events of the leases the requester may see, each judged by the ownership that
    /// lease had (see the module's note): the current row may name a new owner who must not
    /// read the previous owner's argv, and the previous owner still reads its own. A lease whose
    /// ownership was never recorded (committed before the store kept it) is shown to the
    /// session's own key alone.
    pub fn history(&self, view: &View, key: &str) -> Result<History, SessionsError> {
        let current = self.authorize(view, key);
        let (row, current_grant, hidden) = match current {
            Ok((row, g)) => (row, Some(g), None),
            Err(SessionsError::NotVisible { .. }) => {
                let row = self
                    .store()
                    .session(key)?
                    .ok_or_else(|| SessionsError::NotFound(key.to_string()))?;
                (row, None, current.err())
            }
            Err(e) => return Err(e),
        };
        // Lease states and adapter pids current: the wrappers' reports folded in first.
        self.ingest_reports_marking_ended_lost()?;
        let events = self.store().events(key)?;
        let owners = self.store().lease_owners(key)?;
        // The requester as every other row describes it: whether it owns this key is asked of
        // each lease's own ownership, never of the key's current row.
        let rows = self.store().sessions()?;
        let others = SessionIndex::from_rows(rows.iter().filter(|r| r.session_key != key));
        let requester = others.requester(&view.requester);
        let current_meta = SessionMeta::from(&row);
        let grant_of = |lease: Option<&str>| -> Option<Grant> {
            let meta = match lease {
                None => Some(&current_meta),
                Some(l) => owners
                    .get(l)
                    .or((row.lease_id.as_deref() == Some(l)).then_some(&current_meta)),
            };
            match meta {
                Some(m) => view.scope.grant(&requester, m),
                None => (view.requester == key).then_some(Grant::Requester),
            }
        };
        // Each event's lease: its own, else the one before it, else the first one after it.
        let first_lease = events.iter().find_map(|e| e.lease_id.clone());
        let mut lease = first_lease;
        let mut grants: std::collections::HashMap<Option<String>, Option<Grant>> =
            std::collections::HashMap::new();
        let mut visible_as = current_grant;
        let mut shown = Vec::with_capacity(events.len());
        for e in events {
            if e.lease_id.is_some() {
                lease = e.lease_id.clone();
            }
            let g = *grants
                .entry(lease.clone())
                .or_insert_with(|| grant_of(lease.as_deref()));
            if let Some(g) = g {
                visible_as.get_or_insert(g);
                shown.push(e);
            }
        }
        let current_lease_visible = grant_of(row.lease_id.as_deref()).is_some();
        match visible_as {
            Some(visible_as) => Ok(History {
                session_key: key.to_string(),
                visible_as,
                events: shown,
                current_lease_visible,
            }),
            // Nothing of it is the requester's: the same refusal as for any hidden session.
            None => Err(hidden.unwrap_or_else(|| SessionsError::NotFound(key.to_string()))),
        }
    }
}
