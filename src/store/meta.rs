//! The `meta` table: the gateway instance id (created with the schema, kept for the life of the
//! state root) and the daemon's bookkeeping kept across restarts.

use super::db::{Store, StoreError};
use rusqlite::{params, Connection, OptionalExtension};

/// The `meta` keys of the daemon's stored ensure specs: `session.spec.<session key>`
/// (`daemon/spec.rs`). The store knows the prefix so that a spec is pruned with its session.
pub const SPEC_KEY_PREFIX: &str = "session.spec.";

/// Deletes the stored specs of sessions that no lease names any more (their last lease expired,
/// or they never had one). Inside a write.
pub(super) fn prune_specs(tx: &Connection) -> rusqlite::Result<usize> {
    // substr, not LIKE: a session key may contain '%' or '_'.
    tx.execute(
        "DELETE FROM meta WHERE substr(key, 1, ?1) = ?2 \
         AND substr(key, ?1 + 1) NOT IN (SELECT session_key FROM leases)",
        params![SPEC_KEY_PREFIX.len() as i64, SPEC_KEY_PREFIX],
    )
}

/// Creates the gateway instance id unless the table has one. Inside the migration's write.
pub(super) fn create_gateway_id(tx: &Connection) -> rusqlite::Result<()> {
    let fresh = uuid::Uuid::new_v4().to_string();
    tx.execute(
        "INSERT OR IGNORE INTO meta(key, value) VALUES ('gateway_instance_id', ?1)",
        [&fresh],
    )
    .map(|_| ())
}

impl Store {
    /// A value of the `meta` table (daemon bookkeeping kept across restarts).
    pub fn meta(&self, key: &str) -> Result<Option<String>, StoreError> {
        self.conn
            .query_row("SELECT value FROM meta WHERE key = ?1", [key], |r| r.get(0))
            .optional()
            .map_err(|e| self.err(e))
    }

    /// Sets (or, with `None`, deletes) a value of the `meta` table.
    pub fn set_meta(&mut self, key: &str, value: Option<&str>) -> Result<(), StoreError> {
        let r = match value {
            Some(v) => self.conn.execute(
                "INSERT INTO meta (key, value) VALUES (?1, ?2) \
                 ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                params![key, v],
            ),
            None => self.conn.execute("DELETE FROM meta WHERE key = ?1", [key]),
        };
        r.map(|_| ()).map_err(|e| self.err(e))
    }

    pub(super) fn read_gateway_id(&self) -> Result<Option<String>, StoreError> {
        self.conn
            .query_row(
                "SELECT value FROM meta WHERE key = 'gateway_instance_id'",
                [],
                |r| r.get(0),
            )
            .optional()
            .map_err(|e| self.err(e))
    }

    pub(super) fn set_gateway_id(&mut self, id: String) -> Result<(), StoreError> {
        if uuid::Uuid::parse_str(&id).is_err() {
            return Err(StoreError::Corrupt {
                path: self.path.clone(),
                detail: format!("gateway instance id '{id}' is not a UUID"),
            });
        }
        self.gateway_instance_id = id;
        Ok(())
    }
}
