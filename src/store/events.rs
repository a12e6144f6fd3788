//! The `events` table and the per-session seq space: lifecycle events in order, and the blocks
//! of seqs the daemon reserves (`seq_floor`) for output it streams but never stores, so stored
//! events and streamed output never share a seq.

use super::db::{Store, StoreError};
use rusqlite::{params, Connection};
use serde::Serialize;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Event {
    pub session_key: String,
    pub lease_id: Option<String>,
    pub seq: i64,
    pub kind: String,
    pub detail: Option<serde_json::Value>,
    pub at: i64,
}

impl Store {
    /// Appends a lifecycle event to a session's history and returns its seq.
    pub fn record_event(
        &mut self,
        session_key: &str,
        lease_id: Option<&str>,
        kind: &str,
        detail: Option<serde_json::Value>,
    ) -> Result<i64, StoreError> {
        self.write(|tx, ctx| {
            insert_event(
                tx,
                session_key,
                lease_id,
                kind,
                detail,
                crate::lease::now_ms(),
            )
            .map_err(|e| ctx.err(e))
        })
    }

    /// A session's lifecycle events in order.
    pub fn events(&self, session_key: &str) -> Result<Vec<Event>, StoreError> {
        self.events_since(session_key, 0)
    }

    /// A session's lifecycle events with a seq above `after`, in order.
    pub fn events_since(&self, session_key: &str, after: i64) -> Result<Vec<Event>, StoreError> {
        events_after(&self.conn, session_key, after).map_err(|e| self.err(e))
    }

    /// The highest seq a session has used or reserved (0 for a new session).
    pub fn last_seq(&self, session_key: &str) -> Result<i64, StoreError> {
        last_seq(&self.conn, session_key).map_err(|e| self.err(e))
    }

    /// Reserves the next `n` seqs of a session for a stream that is not stored line by line, and
    /// returns the first one together with the events recorded since `after` (all of them below
    /// the block), in one transaction. Events recorded later get seqs above the block.
    pub fn reserve_seqs(
        &mut self,
        session_key: &str,
        n: i64,
        after: i64,
    ) -> Result<(i64, Vec<Event>), StoreError> {
        self.write(|tx, ctx| {
            let err = |e| ctx.err(e);
            let last = last_seq(tx, session_key).map_err(err)?;
            tx.execute(
                "INSERT INTO seq_floor (session_key, floor) VALUES (?1, ?2) \
                 ON CONFLICT(session_key) DO UPDATE SET floor = MAX(floor, excluded.floor)",
                params![session_key, last + n.max(1)],
            )
            .map_err(err)?;
            let events = events_after(tx, session_key, after).map_err(err)?;
            Ok((last + 1, events))
        })
    }
}

/// Appends an event with the next seq of its session. Call inside a write transaction.
pub(super) fn insert_event(
    conn: &Connection,
    session_key: &str,
    lease_id: Option<&str>,
    kind: &str,
    detail: Option<serde_json::Value>,
    at: i64,
) -> rusqlite::Result<i64> {
    let seq = last_seq(conn, session_key)? + 1;
    conn.prepare_cached(
        "INSERT INTO events (session_key, lease_id, seq, kind, detail, at) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
    )?
    .execute(params![
            session_key,
            lease_id,
            seq,
            kind,
            detail.map(|d| d.to_string()),
            at
        ],
    )?;
    Ok(seq)
}

/// The highest seq used or reserved in a session's seq space.
fn last_seq(conn: &Connection, session_key: &str) -> rusqlite::Result<i64> {
    conn.prepare_cached(
        "SELECT MAX(COALESCE((SELECT MAX(seq) FROM events WHERE session_key = ?1), 0), \
         COALESCE((SELECT floor FROM seq_floor WHERE session_key = ?1), 0))",
    )?
    .query_row([session_key], |r| r.get(0))
}

fn events_after(conn: &Connection, session_key: &str, after: i64) -> rusqlite::Result<Vec<Event>> {
    let mut stmt = conn.prepare_cached(
        "SELECT session_key, lease_id, seq, kind, detail, at FROM events \
         WHERE session_key = ?1 AND seq > ?2 ORDER BY seq, id",
    )?;
    let rows = stmt.query_map(params![session_key, after], |r| {
        let detail: Option<String> = r.get(4)?;
        Ok(Event {
            session_key: r.get(0)?,
            lease_id: r.get(1)?,
            seq: r.get(2)?,
            kind: r.get(3)?,
            detail: detail.and_then(|d| serde_json::from_str(&d).ok()),
            at: r.get(5)?,
        })
    })?;
    rows.collect()
}
