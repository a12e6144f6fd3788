//! The `sessions` table: a session's ownership metadata (who owns it, who spawned it, its parent),
//! written with its lease and read by the visibility check.

use super::db::{Store, StoreError};
use rusqlite::{params, OptionalExtension, Row};

use leash_core::model::SessionRow;
use leash_core::visibility::SessionMeta;

impl Store {
    pub fn session(&self, session_key: &str) -> Result<Option<SessionRow>, StoreError> {
        self.conn
            .query_row(
                &format!("SELECT {SESSION_COLS} FROM sessions WHERE session_key = ?1"),
                [session_key],
                session_from_row,
            )
            .optional()
            .map_err(|e| self.err(e))
    }

    pub fn sessions(&self) -> Result<Vec<SessionRow>, StoreError> {
        let mut stmt = self
            .conn
            .prepare(&format!(
                "SELECT {SESSION_COLS} FROM sessions ORDER BY created_at, session_key"
            ))
            .map_err(|e| self.err(e))?;
        let rows = stmt
            .query_map([], session_from_row)
            .map_err(|e| self.err(e))?;
        rows.collect::<Result<Vec<_>, _>>().map_err(|e| self.err(e))
    }
}

pub(super) const SESSION_COLS: &str = "session_key, agent_id, owner_session_key, spawned_by, \
    parent_session_key, backend, gateway_instance_id, created_at, lease_id";

fn session_from_row(r: &Row<'_>) -> rusqlite::Result<SessionRow> {
    Ok(SessionRow {
        session_key: r.get(0)?,
        agent_id: r.get(1)?,
        owner_session_key: r.get(2)?,
        spawned_by: r.get(3)?,
        parent_session_key: r.get(4)?,
        backend: r.get(5)?,
        gateway_instance_id: r.get(6)?,
        created_at: r.get(7)?,
        lease_id: r.get(8)?,
    })
}

impl Store {
    /// The ownership each lease of a session had when it was committed, by lease id (leases
    /// committed before the store kept it are absent).
    pub fn lease_owners(
        &self,
        session_key: &str,
    ) -> Result<std::collections::HashMap<String, SessionMeta>, StoreError> {
        let mut stmt = self
            .conn
            .prepare_cached(
                "SELECT lease_id, session_key, agent_id, owner_session_key, spawned_by, \
                 parent_session_key FROM lease_owners WHERE session_key = ?1",
            )
            .map_err(|e| self.err(e))?;
        let rows = stmt
            .query_map([session_key], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    SessionMeta {
                        session_key: r.get(1)?,
                        agent_id: r.get(2)?,
                        owner_session_key: r.get(3)?,
                        spawned_by: r.get(4)?,
                        parent_session_key: r.get(5)?,
                    },
                ))
            })
            .map_err(|e| self.err(e))?;
        rows.collect::<Result<_, _>>().map_err(|e| self.err(e))
    }
}

/// Records a new lease's ownership: the session row as the upsert just left it (the fields the
/// new row leaves out are the earlier row's). Inside the lease's write, after [`upsert`].
pub(super) fn record_lease_owner(
    tx: &rusqlite::Connection,
    lease_id: &str,
    session_key: &str,
) -> rusqlite::Result<()> {
    tx.prepare_cached(
        "INSERT OR REPLACE INTO lease_owners (lease_id, session_key, agent_id, \
         owner_session_key, spawned_by, parent_session_key) \
         SELECT ?1, session_key, agent_id, owner_session_key, spawned_by, parent_session_key \
         FROM sessions WHERE session_key = ?2",
    )?
    .execute(params![lease_id, session_key])
    .map(|_| ())
}

/// Writes a session's row with its new lease, keeping the ownership fields an earlier row has
/// where the new one leaves them out. Inside the lease's write.
pub(super) fn upsert(tx: &rusqlite::Connection, s: &SessionRow) -> rusqlite::Result<()> {
    tx.prepare_cached(
                "INSERT INTO sessions (session_key, agent_id, owner_session_key, spawned_by, \
                 parent_session_key, backend, gateway_instance_id, created_at, lease_id) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9) \
                 ON CONFLICT(session_key) DO UPDATE SET lease_id = excluded.lease_id, \
                 agent_id = COALESCE(excluded.agent_id, sessions.agent_id), \
                 owner_session_key = COALESCE(excluded.owner_session_key, sessions.owner_session_key), \
                 spawned_by = COALESCE(excluded.spawned_by, sessions.spawned_by), \
                 parent_session_key = COALESCE(excluded.parent_session_key, sessions.parent_session_key)",
            )?
            .execute(params![
                    s.session_key,
                    s.agent_id,
                    s.owner_session_key,
                    s.spawned_by,
                    s.parent_session_key,
                    s.backend,
                    s.gateway_instance_id,
                    s.created_at,
                    s.lease_id,
                ],
            )
    .map(|_| ())
}
