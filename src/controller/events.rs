//! `events`: a session's lifecycle events, in seq order, two ways. [`Controller::events`] is the
//! operator's read (every event above a seq; the daemon's `events` op, which a client uses to
//! catch up after its replay buffer moved on); [`Controller::history`] is a requester's, behind
//! the sessions visibility gate (`leash sessions history`, directly or through the daemon's
//! `sessions` query).

use super::sessions::{SessionsError, View};
use super::*;
use crate::store::Event;
use crate::visibility::Grant;

#[derive(Debug, thiserror::Error)]
pub enum EventsError {
    /// No events, no lease and no session row, and no seq ever used: the key names nothing.
    #[error("no session {0} in this state root")]
    NoSession(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// A session's events as a requester may read them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct History {
    pub session_key: String,
    pub visible_as: Grant,
    pub events: Vec<Event>,
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
    pub fn history(&self, view: &View, key: &str) -> Result<History, SessionsError> {
        let (_, visible_as) = self.authorize(view, key)?;
        // Lease states and adapter pids current: the wrappers' reports folded in first.
        self.ingest_reports_marking_ended_lost()?;
        Ok(History {
            session_key: key.to_string(),
            visible_as,
            events: self.store().events(key)?,
        })
    }
}
