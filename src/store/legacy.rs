//! The `legacy_records` table: the old gateway's sessions, imported with their stored pid and
//! command, then ended (`closed` after a verified cleanup, `lost` when the process was gone) or
//! noted (why one was left alone). The verification of a record against the live process table
//! is pure and lives in [`crate::legacy`]; only its rows are here, with the one read of the acpx
//! extension's own SQLite keyed store that `legacy import --acpx` makes
//! ([`acpx_keyed_entries`]).

use super::db::{Store, StoreError};
use leash_core::model::LegacyRecord;
use rusqlite::params;
use serde::Serialize;

/// Why the incumbent's keyed store could not be read, in words (its caller names the file).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct KeyedStoreError(pub String);

/// The incumbent's keyed store (its SQLite file `db`, opened read-only), its table's rows for
/// the acpx plugin in `namespace` that have not expired at `now`: (entry key, value JSON), oldest
/// first.
pub fn acpx_keyed_entries(
    db: &std::path::Path,
    namespace: &str,
    now: i64,
) -> Result<Vec<(String, String)>, KeyedStoreError> {
    use rusqlite::OpenFlags;
    let bad = KeyedStoreError;
    let conn = rusqlite::Connection::open_with_flags(
        db,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|e| bad(format!("cannot open the incumbent's SQLite store: {e}")))?;
    conn.busy_timeout(super::db::DEFAULT_BUSY_TIMEOUT)
        .map_err(|e| bad(e.to_string()))?;
    // The incumbent's store keeps a plain table. A view (a recursive one never ends) or a
    // virtual table under that name is not its store, and is not queried.
    let kind: Option<(String, String)> = conn
        .query_row(
            "SELECT type, COALESCE(sql, '') FROM sqlite_master WHERE name = 'plugin_state_entries'",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .map(Some)
        .or_else(|e| match e {
            rusqlite::Error::QueryReturnedNoRows => Ok(None),
            e => Err(e),
        })
        .map_err(|e| bad(format!("cannot read the incumbent's SQLite store: {e}")))?;
    match kind {
        Some((t, sql)) if t == "table" && !sql.to_ascii_uppercase().contains("VIRTUAL") => {}
        Some((t, _)) => {
            return Err(bad(format!(
                "not the incumbent's plugin state store: plugin_state_entries is a {} here, not                  a plain table (refused, not queried)",
                if t == "table" { "virtual table" } else { t.as_str() }
            )))
        }
        None => {
            return Err(bad(
                "not the incumbent's plugin state store (no plugin_state_entries table)".into(),
            ))
        }
    }
    let mut stmt = conn
        .prepare(
            "SELECT entry_key, value_json FROM plugin_state_entries \
             WHERE plugin_id = 'acpx' AND namespace = ?1 \
             AND (expires_at IS NULL OR expires_at > ?2) ORDER BY created_at, entry_key",
        )
        .map_err(|e| {
            bad(format!(
                "not the incumbent's plugin state store (no readable plugin_state_entries \
                 table): {e}"
            ))
        })?;
    let rows = stmt
        .query_map(rusqlite::params![namespace, now], |r| {
            Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?))
        })
        .and_then(|rows| rows.collect::<Result<Vec<_>, _>>())
        .map_err(|e| bad(format!("reading namespace {namespace}: {e}")))?;
    Ok(rows)
}

/// One lease of the acpx extension to import, already checked.
#[derive(Debug, Clone)]
pub struct NewAcpxRecord {
    pub lease_id: String,
    pub gateway_instance_id: String,
    pub session_key: String,
    pub wrapper_root: String,
    pub wrapper_path: String,
    /// 0 while pending (saved before the wrapper started).
    pub root_pid: i32,
    pub process_group_id: Option<i32>,
    pub command_hash: String,
    pub started_at: i64,
}

/// A session record of the acpx extension, as an ownership row.
#[derive(Debug, Clone)]
pub struct NewAcpxSession {
    pub session_key: String,
    pub agent_id: Option<String>,
}

/// What adopting the incumbent's gateway instance id did to the state root.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Adoption {
    /// The root already had that id.
    Same,
    /// A fresh root (no lease, session or legacy row yet) took it.
    Fresh,
    /// A root in use took it, as asked (`--adopt-gateway-id`).
    Adopted,
}

/// What `leash legacy import --acpx` wrote.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AcpxImported {
    pub gateway_instance_id: String,
    pub adoption: Adoption,
    pub leases: usize,
    /// Leases already imported earlier (same incumbent lease id): skipped.
    pub already_present: usize,
    pub sessions: usize,
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

    /// Imports the acpx extension's state in one transaction, all or nothing: its gateway
    /// instance id becomes this root's own (see [`Adoption`]; a root in use with another id is
    /// refused unless `adopt`, and always while it has open or closing leases of its own), its
    /// open and closing leases become legacy records (a lease id imported before is skipped),
    /// and its session records become ownership rows where the root has none for that key.
    #[allow(clippy::too_many_arguments)]
    pub fn import_acpx(
        &mut self,
        gateway_id: &str,
        adopt: bool,
        leases: &[NewAcpxRecord],
        sessions: &[NewAcpxSession],
        imported_ticks: u64,
        now: i64,
    ) -> Result<AcpxImported, StoreError> {
        let current = self.gateway_instance_id.clone();
        let out = self.write(|tx, ctx| {
            let count = |sql: &str| -> Result<i64, StoreError> {
                tx.query_row(sql, [], |r| r.get(0)).map_err(|e| ctx.err(e))
            };
            let adoption = if current == gateway_id {
                Adoption::Same
            } else {
                // Open rows whose processes carry the current id: this root's own leases, and
                // acpx records imported under it. Adopting another id would strand them.
                let active = count(
                    "SELECT (SELECT COUNT(*) FROM leases WHERE state IN ('open', 'closing')) \
                     + (SELECT COUNT(*) FROM legacy_records WHERE state = 'open' \
                        AND source = 'acpx')",
                )?;
                let used = count(
                    "SELECT (SELECT COUNT(*) FROM leases) + (SELECT COUNT(*) FROM sessions) \
                     + (SELECT COUNT(*) FROM legacy_records)",
                )?;
                if used > 0 && !adopt {
                    return Err(StoreError::GatewayIdInUse {
                        path: ctx.path.to_path_buf(),
                        ours: current.clone(),
                        theirs: gateway_id.to_string(),
                    });
                }
                if active > 0 {
                    return Err(StoreError::GatewayIdBusy {
                        path: ctx.path.to_path_buf(),
                        ours: current.clone(),
                        theirs: gateway_id.to_string(),
                        active,
                    });
                }
                tx.execute(
                    "UPDATE meta SET value = ?1 WHERE key = 'gateway_instance_id'",
                    [gateway_id],
                )
                .map_err(|e| ctx.err(e))?;
                if used > 0 {
                    Adoption::Adopted
                } else {
                    Adoption::Fresh
                }
            };
            let mut insert = tx
                .prepare_cached(
                    "INSERT OR IGNORE INTO legacy_records (session_key, pid, command, \
                     wrapper_path, wrapper_root, state, imported_at, imported_ticks, source, \
                     acpx_lease_id, acpx_gateway_id, command_hash, process_group_id, \
                     acpx_started_at) \
                     VALUES (?1, ?2, ?3, ?4, ?5, 'open', ?6, ?7, 'acpx', ?8, ?9, ?10, ?11, ?12)",
                )
                .map_err(|e| ctx.err(e))?;
            let mut imported = 0;
            for l in leases {
                imported += insert
                    .execute(params![
                        l.session_key,
                        l.root_pid,
                        // The incumbent keeps only the hash of its command: the wrapper path
                        // stands for it where a command is shown.
                        l.wrapper_path,
                        l.wrapper_path,
                        l.wrapper_root,
                        now,
                        imported_ticks as i64,
                        l.lease_id,
                        l.gateway_instance_id,
                        l.command_hash,
                        l.process_group_id,
                        l.started_at,
                    ])
                    .map_err(|e| ctx.err(e))?;
            }
            let mut session = tx
                .prepare_cached(
                    "INSERT OR IGNORE INTO sessions (session_key, agent_id, backend, \
                     gateway_instance_id, created_at) VALUES (?1, ?2, 'acpx', ?3, ?4)",
                )
                .map_err(|e| ctx.err(e))?;
            let mut rows = 0;
            for s in sessions {
                rows += session
                    .execute(params![s.session_key, s.agent_id, gateway_id, now])
                    .map_err(|e| ctx.err(e))?;
            }
            Ok(AcpxImported {
                gateway_instance_id: gateway_id.to_string(),
                adoption,
                leases: imported,
                already_present: leases.len() - imported,
                sessions: rows,
            })
        })?;
        self.gateway_instance_id = gateway_id.to_string();
        Ok(out)
    }

    /// Legacy records in import order, optionally only the open ones.
    pub fn legacy_records(&self, only_open: bool) -> Result<Vec<LegacyRecord>, StoreError> {
        let sql = format!(
            "SELECT id, session_key, pid, command, wrapper_path, wrapper_root, state, \
             state_reason, imported_at, imported_ticks, source, acpx_lease_id, acpx_gateway_id, \
             command_hash, process_group_id, acpx_started_at FROM legacy_records {} ORDER BY id",
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
                    source: r.get(10)?,
                    acpx_lease_id: r.get(11)?,
                    acpx_gateway_id: r.get(12)?,
                    command_hash: r.get(13)?,
                    process_group_id: r
                        .get::<_, Option<i64>>(14)?
                        .map(|g| g.clamp(i32::MIN as i64, i32::MAX as i64) as i32),
                    acpx_started_at: r.get(15)?,
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
