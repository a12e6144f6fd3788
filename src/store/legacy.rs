//! The `legacy_records` table: the old gateway's sessions, imported with their stored pid and
//! command, then ended (`closed` after a verified cleanup, `lost` when the process was gone) or
//! noted (why one was left alone). The verification of a record against the live process table
//! is pure and lives in [`crate::legacy`]; only its rows are here.

use super::{Store, StoreError};
use rusqlite::params;
use serde::{Deserialize, Serialize};

/// A legacy record in the store.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LegacyRecord {
    pub id: i64,
    pub session_key: String,
    pub pid: i32,
    pub command: String,
    pub wrapper_path: Option<String>,
    /// The directory the old gateway's wrappers live in (given at import).
    pub wrapper_root: Option<String>,
    pub state: String,
    pub state_reason: Option<String>,
    pub imported_at: i64,
    /// The importer's start time in clock ticks since boot: a process that started later cannot
    /// be the one the record describes.
    pub imported_ticks: u64,
}

/// One record to import, already checked (a pid in range, a key and a command that are not
/// empty).
#[derive(Debug, Clone, Copy)]
pub struct NewLegacyRecord<'a> {
    pub session_key: &'a str,
    pub pid: i64,
    pub command: &'a str,
    pub wrapper_path: Option<&'a str>,
}

impl Store {
    /// Imports records in one transaction, all or nothing, each stamped with the wrapper root,
    /// the importer's start time (`imported_ticks`) and `now`. Returns how many.
    pub fn import_legacy(
        &mut self,
        records: &[NewLegacyRecord<'_>],
        wrapper_root: Option<&str>,
        imported_ticks: u64,
        now: i64,
    ) -> Result<usize, StoreError> {
        self.write(|tx, ctx| {
            let mut insert = tx
                .prepare_cached(
                    "INSERT INTO legacy_records (session_key, pid, command, wrapper_path, \
                     wrapper_root, state, imported_at, imported_ticks) \
                     VALUES (?1, ?2, ?3, ?4, ?5, 'open', ?6, ?7)",
                )
                .map_err(|e| ctx.err(e))?;
            for r in records {
                insert
                    .execute(params![
                        r.session_key,
                        r.pid,
                        r.command,
                        r.wrapper_path,
                        wrapper_root,
                        now,
                        imported_ticks as i64
                    ])
                    .map_err(|e| ctx.err(e))?;
            }
            Ok(records.len())
        })
    }

    /// Legacy records in import order, optionally only the open ones.
    pub fn legacy_records(&self, only_open: bool) -> Result<Vec<LegacyRecord>, StoreError> {
        let sql = format!(
            "SELECT id, session_key, pid, command, wrapper_path, wrapper_root, state, \
             state_reason, imported_at, imported_ticks FROM legacy_records {} ORDER BY id",
            if only_open {
                "WHERE state = 'open'"
            } else {
                ""
            }
        );
        let mut stmt = self.conn.prepare(&sql).map_err(|e| self.err(e))?;
        let rows = stmt
            .query_map([], |r| {
                Ok(LegacyRecord {
                    id: r.get(0)?,
                    session_key: r.get(1)?,
                    pid: r.get::<_, i64>(2)?.clamp(i32::MIN as i64, i32::MAX as i64) as i32,
                    command: r.get(3)?,
                    wrapper_path: r.get(4)?,
                    wrapper_root: r.get(5)?,
                    state: r.get(6)?,
                    state_reason: r.get(7)?,
                    imported_at: r.get(8)?,
                    imported_ticks: r.get::<_, i64>(9)?.max(0) as u64,
                })
            })
            .map_err(|e| self.err(e))?;
        rows.collect::<Result<Vec<_>, _>>().map_err(|e| self.err(e))
    }

    /// Ends an open legacy record (`closed` or `lost`) with its reason. Whether it was open.
    pub fn finish_legacy(
        &mut self,
        id: i64,
        state: &str,
        reason: &str,
    ) -> Result<bool, StoreError> {
        let now = crate::lease::now_ms();
        self.conn
            .execute(
                "UPDATE legacy_records SET state = ?2, state_reason = ?3, closed_at = ?4 \
                 WHERE id = ?1 AND state = 'open'",
                params![id, state, reason, now],
            )
            .map(|n| n == 1)
            .map_err(|e| self.err(e))
    }

    /// Records why an open legacy record was left alone (it stays open).
    pub fn note_legacy(&mut self, id: i64, reason: &str) -> Result<(), StoreError> {
        self.conn
            .execute(
                "UPDATE legacy_records SET state_reason = ?2 WHERE id = ?1 AND state = 'open'",
                params![id, reason],
            )
            .map(|_| ())
            .map_err(|e| self.err(e))
    }
}
