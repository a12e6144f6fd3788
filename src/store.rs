//! The lease store: one SQLite database per state root (WAL, busy timeout, versioned migrations).
//!
//! Every state change that two processes could race on (claiming a lease for closing, finishing
//! a close) is a single conditional UPDATE inside an immediate transaction, so two reapers on one
//! root never both act on a lease. Commits are not fsynced one by one (`synchronous=NORMAL` in
//! WAL mode: durable against process crashes, which is what leases must survive) and the database
//! is never VACUUMed in normal operation.

use crate::lease::{Lease, LeaseState, ProcessId};
use rusqlite::{params, Connection, OptionalExtension, Row, TransactionBehavior};
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How long a writer waits for another writer before giving up with a clear error.
pub const DEFAULT_BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// Environment variable overriding [`DEFAULT_BUSY_TIMEOUT`], in milliseconds (tests use it to
/// meet a locked database without waiting five seconds).
pub const ENV_BUSY_TIMEOUT_MS: &str = "LEASH_BUSY_TIMEOUT_MS";

/// The busy timeout in force: `LEASH_BUSY_TIMEOUT_MS` when it holds a number, else the default.
pub fn busy_timeout() -> Duration {
    std::env::var(ENV_BUSY_TIMEOUT_MS)
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map_or(DEFAULT_BUSY_TIMEOUT, Duration::from_millis)
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("state database {path} is locked by another writer (waited {waited_ms} ms); retry, or find the process holding it")]
    Busy { path: PathBuf, waited_ms: u128 },
    #[error("state database {path} is corrupt or not a leash database ({detail}); move it aside to start fresh (its leases will then not be reaped)")]
    Corrupt { path: PathBuf, detail: String },
    #[error("state database {path} has schema version {found}, newer than this leash understands ({known}); upgrade leash")]
    TooNew {
        path: PathBuf,
        found: i64,
        known: i64,
    },
    #[error("lease row {lease_id} is invalid: {detail}")]
    BadRow { lease_id: String, detail: String },
    #[error(
        "refusing to store lease {lease_id}: {detail} (it would not read back); nothing stored"
    )]
    Unstorable { lease_id: String, detail: String },
    #[error("session {session_key} already has an active lease {lease_id}")]
    SessionBusy {
        session_key: String,
        lease_id: String,
    },
    #[error(
        "{path} is a symbolic link; leash does not open its database through a link (the \
             link's target would be turned into a leash database): replace the link with the real \
             file, or move it aside"
    )]
    Symlink { path: PathBuf },
    #[error("state database {path}: {source}")]
    Sqlite {
        path: PathBuf,
        #[source]
        source: rusqlite::Error,
    },
}

/// The schema, one migration per version. Never edit a published step; add one.
const MIGRATIONS: &[&str] = &[
    // 1: meta, leases, sessions, events, legacy records
    r#"
    CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
    CREATE TABLE leases (
        lease_id            TEXT PRIMARY KEY,
        gateway_instance_id TEXT NOT NULL,
        session_key         TEXT NOT NULL,
        agent_id            TEXT,
        wrapper_root        TEXT NOT NULL,
        wrapper_path        TEXT NOT NULL,
        root_pid            INTEGER NOT NULL,
        root_start_time     INTEGER NOT NULL,
        process_group_id    INTEGER,
        adapter_pid         INTEGER,
        adapter_start_time  INTEGER,
        command_hash        TEXT NOT NULL,
        command_json        TEXT NOT NULL,
        owner_pid           INTEGER NOT NULL,
        owner_start_time    INTEGER NOT NULL,
        started_at          INTEGER NOT NULL,
        grace_ms            INTEGER NOT NULL,
        state               TEXT NOT NULL,
        state_reason        TEXT,
        closed_at           INTEGER,
        exit_status         INTEGER,
        claimed_by_pid      INTEGER,
        claimed_by_start    INTEGER,
        updated_at          INTEGER NOT NULL
    );
    CREATE UNIQUE INDEX leases_one_active_per_session
        ON leases(session_key) WHERE state IN ('open', 'closing');
    CREATE INDEX leases_by_state ON leases(state, closed_at);
    CREATE TABLE sessions (
        session_key         TEXT PRIMARY KEY,
        agent_id            TEXT,
        owner_session_key   TEXT,
        spawned_by          TEXT,
        parent_session_key  TEXT,
        backend             TEXT NOT NULL DEFAULT 'acpx',
        gateway_instance_id TEXT NOT NULL,
        created_at          INTEGER NOT NULL,
        lease_id            TEXT
    );
    CREATE TABLE events (
        id          INTEGER PRIMARY KEY AUTOINCREMENT,
        session_key TEXT NOT NULL,
        lease_id    TEXT,
        seq         INTEGER NOT NULL,
        kind        TEXT NOT NULL,
        detail      TEXT,
        at          INTEGER NOT NULL
    );
    CREATE INDEX events_by_session ON events(session_key, seq);
    CREATE TABLE legacy_records (
        id           INTEGER PRIMARY KEY AUTOINCREMENT,
        session_key  TEXT NOT NULL,
        pid          INTEGER NOT NULL,
        command      TEXT NOT NULL,
        wrapper_path TEXT,
        wrapper_root TEXT,
        imported_ticks INTEGER NOT NULL DEFAULT 0,
        state        TEXT NOT NULL DEFAULT 'open',
        state_reason TEXT,
        imported_at  INTEGER NOT NULL,
        closed_at    INTEGER
    );
    "#,
    // 2: a per-session seq floor. The daemon streams adapter output with seqs from the same
    // per-session space as the lifecycle events, but never writes output to the database: it
    // reserves a block of seqs here instead, and every event recorded afterwards (by any
    // process) gets a seq above the block, so the two never collide and stay in order.
    r#"
    CREATE TABLE seq_floor (session_key TEXT PRIMARY KEY, floor INTEGER NOT NULL);
    "#,
    // 3: the root's pidfs inode, an identity that pid reuse within one clock tick cannot fake.
    r#"
    ALTER TABLE leases ADD COLUMN root_pidfs_ino INTEGER;
    "#,
    // 4: the lease's cgroup (containment): its path and id, recorded before the wrapper starts.
    r#"
    ALTER TABLE leases ADD COLUMN cgroup_path TEXT;
    ALTER TABLE leases ADD COLUMN cgroup_id INTEGER;
    "#,
];

pub struct Store {
    conn: Connection,
    path: PathBuf,
    gateway_instance_id: String,
    busy: Duration,
}

/// Lease counts by state, for `leash status`.
#[derive(Debug, Default, Clone, Serialize, PartialEq, Eq)]
pub struct Counts {
    pub open: u64,
    pub closing: u64,
    pub closed: u64,
    pub lost: u64,
}

/// What the wrapper reported about its lease (see `report.rs`).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ReportUpdate {
    pub process_group_id: Option<i32>,
    pub adapter_pid: Option<i32>,
    pub adapter_start_time: Option<u64>,
    pub exit_status: Option<i32>,
}

/// Ownership metadata of a session row (the seed's `AcpSessionOwner`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionRow {
    pub session_key: String,
    pub agent_id: Option<String>,
    pub owner_session_key: Option<String>,
    pub spawned_by: Option<String>,
    pub parent_session_key: Option<String>,
    pub backend: String,
    pub gateway_instance_id: String,
    pub created_at: i64,
    pub lease_id: Option<String>,
}

/// One lifecycle event of a session.
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
    /// Opens (creating and migrating when needed) the database at `path`.
    pub fn open(path: &Path) -> Result<Store, StoreError> {
        Self::open_with_timeout(path, busy_timeout())
    }

    pub fn open_with_timeout(path: &Path, busy: Duration) -> Result<Store, StoreError> {
        let err = |e| map_err(path, busy, e);
        refuse_symlinks(path)?;
        let conn = Connection::open(path).map_err(err)?;
        conn.busy_timeout(busy).map_err(err)?;
        // journal_mode returns a row; a corrupt file fails here first.
        let mode: String = conn
            .query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))
            .map_err(err)?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(StoreError::Corrupt {
                path: path.to_path_buf(),
                detail: format!("cannot switch to WAL journal (got {mode})"),
            });
        }
        conn.execute_batch("PRAGMA synchronous=NORMAL; PRAGMA foreign_keys=ON;")
            .map_err(err)?;
        let mut store = Store {
            conn,
            path: path.to_path_buf(),
            gateway_instance_id: String::new(),
            busy,
        };
        store.migrate(busy)?;
        Ok(store)
    }

    fn err(&self, e: rusqlite::Error) -> StoreError {
        map_err(&self.path, self.busy, e)
    }

    fn migrate(&mut self, busy: Duration) -> Result<(), StoreError> {
        let path = self.path.clone();
        let err = |e| map_err(&path, busy, e);
        let known = MIGRATIONS.len() as i64;
        // Fast path, read-only: an up-to-date database with its gateway id (every `leash exec`
        // passes here; a write transaction would cost a WAL append per spawn).
        let version: i64 = self
            .conn
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .map_err(err)?;
        if version == known {
            if let Some(id) = self.read_gateway_id().map_err(err)? {
                return self.set_gateway_id(id);
            }
        }
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(err)?;
        let version: i64 = tx
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .map_err(err)?;
        if version > known {
            return Err(StoreError::TooNew {
                path,
                found: version,
                known,
            });
        }
        for (i, sql) in MIGRATIONS.iter().enumerate().skip(version as usize) {
            tx.execute_batch(sql).map_err(err)?;
            tx.pragma_update(None, "user_version", (i + 1) as i64)
                .map_err(err)?;
        }
        // The gateway instance id is created once, on first use, and kept for the life of the
        // state root.
        let fresh = uuid::Uuid::new_v4().to_string();
        tx.execute(
            "INSERT OR IGNORE INTO meta(key, value) VALUES ('gateway_instance_id', ?1)",
            [&fresh],
        )
        .map_err(err)?;
        tx.commit().map_err(err)?;
        let id = self.read_gateway_id().map_err(err)?.unwrap_or_default();
        self.set_gateway_id(id)
    }

    fn read_gateway_id(&self) -> rusqlite::Result<Option<String>> {
        self.conn
            .query_row(
                "SELECT value FROM meta WHERE key = 'gateway_instance_id'",
                [],
                |r| r.get(0),
            )
            .optional()
    }

    fn set_gateway_id(&mut self, id: String) -> Result<(), StoreError> {
        if uuid::Uuid::parse_str(&id).is_err() {
            return Err(StoreError::Corrupt {
                path: self.path.clone(),
                detail: format!("gateway instance id '{id}' is not a UUID"),
            });
        }
        self.gateway_instance_id = id;
        Ok(())
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn gateway_instance_id(&self) -> &str {
        &self.gateway_instance_id
    }

    /// Inserts a new open lease (and the session row, when given) in one transaction. When the
    /// session already has an active lease, `supersede` decides: it is given that lease and
    /// returns `Some(reason)` to mark it lost (its processes are verifiably gone) or `None` to
    /// refuse with [`StoreError::SessionBusy`].
    pub fn insert_lease(
        &mut self,
        lease: &Lease,
        session: Option<&SessionRow>,
        supersede: impl FnOnce(&Lease) -> Option<String>,
    ) -> Result<(), StoreError> {
        let unstorable = |detail: String| StoreError::Unstorable {
            lease_id: lease.lease_id.clone(),
            detail,
        };
        crate::limits::check_grace_ms("the grace", lease.grace_ms)
            .map_err(|e| unstorable(e.to_string()))?;
        crate::limits::check_key("the session key", &lease.session_key)
            .map_err(|e| unstorable(e.to_string()))?;
        let now = crate::lease::now_ms();
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(|e| map_err(&self.path, self.busy, e))?;
        let path = self.path.clone();
        let err = |e| map_err(&path, self.busy, e);
        let existing = tx
            .query_row(
                &format!("SELECT {LEASE_COLS} FROM leases WHERE session_key = ?1 AND state IN ('open','closing')"),
                [&lease.session_key],
                |r| Ok(lease_from_row(r)),
            )
            .optional()
            .map_err(err)?;
        if let Some(old) = existing {
            let old = old?;
            match supersede(&old) {
                Some(reason) => {
                    tx.execute(
                        "UPDATE leases SET state = 'lost', state_reason = ?2, closed_at = ?3, \
                         updated_at = ?3, claimed_by_pid = NULL, claimed_by_start = NULL \
                         WHERE lease_id = ?1 AND state IN ('open','closing')",
                        params![old.lease_id, reason, now],
                    )
                    .map_err(err)?;
                    insert_event(
                        &tx,
                        &old.session_key,
                        Some(&old.lease_id),
                        "lost",
                        Some(serde_json::json!({"reason": reason})),
                        now,
                    )
                    .map_err(err)?;
                }
                None => {
                    return Err(StoreError::SessionBusy {
                        session_key: old.session_key,
                        lease_id: old.lease_id,
                    })
                }
            }
        }
        tx.execute(
            "INSERT INTO leases (lease_id, gateway_instance_id, session_key, agent_id, wrapper_root, \
             wrapper_path, root_pid, root_start_time, process_group_id, adapter_pid, \
             adapter_start_time, command_hash, command_json, owner_pid, owner_start_time, \
             started_at, grace_ms, state, state_reason, closed_at, exit_status, updated_at, \
             root_pidfs_ino, cgroup_path, cgroup_id) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, \
             ?18, ?19, ?20, ?21, ?22, ?23, ?24, ?25)",
            params![
                lease.lease_id,
                lease.gateway_instance_id,
                lease.session_key,
                lease.agent_id,
                lease.wrapper_root,
                lease.wrapper_path,
                lease.root_pid,
                lease.root_start_time as i64,
                lease.process_group_id,
                lease.adapter_pid,
                lease.adapter_start_time.map(|v| v as i64),
                lease.command_hash,
                serde_json::to_string(&lease.command).expect("argv serialises"),
                lease.owner_pid,
                lease.owner_start_time as i64,
                lease.started_at,
                lease.grace_ms as i64,
                lease.state.as_str(),
                lease.state_reason,
                lease.closed_at,
                lease.exit_status,
                now,
                lease.root_pidfs_ino.map(|v| v as i64),
                lease.cgroup_path,
                lease.cgroup_id.map(|v| v as i64),
            ],
        )
        .map_err(err)?;
        // Store only what reads back: the row just written must parse as the lease it came from,
        // else the transaction is dropped (rolled back) and nothing is stored. A row that does
        // not read can be neither listed nor closed nor reaped.
        let back = tx
            .query_row(
                &format!("SELECT {LEASE_COLS} FROM leases WHERE lease_id = ?1"),
                [&lease.lease_id],
                |r| Ok(lease_from_row(r)),
            )
            .map_err(err)?;
        match back {
            Ok(l) if l == *lease => {}
            Ok(_) => return Err(unstorable("a field reads back changed".into())),
            Err(e) => return Err(unstorable(e.to_string())),
        }
        if let Some(s) = session {
            tx.execute(
                "INSERT INTO sessions (session_key, agent_id, owner_session_key, spawned_by, \
                 parent_session_key, backend, gateway_instance_id, created_at, lease_id) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9) \
                 ON CONFLICT(session_key) DO UPDATE SET lease_id = excluded.lease_id, \
                 agent_id = COALESCE(excluded.agent_id, sessions.agent_id), \
                 owner_session_key = COALESCE(excluded.owner_session_key, sessions.owner_session_key), \
                 spawned_by = COALESCE(excluded.spawned_by, sessions.spawned_by), \
                 parent_session_key = COALESCE(excluded.parent_session_key, sessions.parent_session_key)",
                params![
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
            .map_err(err)?;
        }
        let kind = if lease.state == LeaseState::Open {
            "spawned"
        } else {
            lease.state.as_str()
        };
        let detail = serde_json::json!({
            "rootPid": lease.root_pid,
            "command": lease.command,
            "reason": lease.state_reason,
        });
        insert_event(
            &tx,
            &lease.session_key,
            Some(&lease.lease_id),
            kind,
            Some(detail),
            now,
        )
        .map_err(err)?;
        tx.commit().map_err(err)?;
        Ok(())
    }

    pub fn lease(&self, lease_id: &str) -> Result<Option<Lease>, StoreError> {
        self.conn
            .query_row(
                &format!("SELECT {LEASE_COLS} FROM leases WHERE lease_id = ?1"),
                [lease_id],
                |r| Ok(lease_from_row(r)),
            )
            .optional()
            .map_err(|e| self.err(e))?
            .transpose()
    }

    /// The active (open or closing) lease of a session, if any.
    pub fn active_lease_for_session(&self, session_key: &str) -> Result<Option<Lease>, StoreError> {
        self.conn
            .query_row(
                &format!(
                    "SELECT {LEASE_COLS} FROM leases WHERE session_key = ?1 \
                     AND state IN ('open','closing')"
                ),
                [session_key],
                |r| Ok(lease_from_row(r)),
            )
            .optional()
            .map_err(|e| self.err(e))?
            .transpose()
    }

    /// The newest lease of a session, whatever its state.
    pub fn latest_lease_for_session(&self, session_key: &str) -> Result<Option<Lease>, StoreError> {
        self.conn
            .query_row(
                &format!(
                    "SELECT {LEASE_COLS} FROM leases WHERE session_key = ?1 \
                     ORDER BY started_at DESC, lease_id DESC LIMIT 1"
                ),
                [session_key],
                |r| Ok(lease_from_row(r)),
            )
            .optional()
            .map_err(|e| self.err(e))?
            .transpose()
    }

    /// Leases, oldest first, optionally of some states only. A row that does not parse is
    /// returned as an error for that row (`Err` inside the vector), so one tampered row neither
    /// hides the others nor gets acted on.
    pub fn leases(
        &self,
        states: &[LeaseState],
    ) -> Result<Vec<Result<Lease, StoreError>>, StoreError> {
        let filter = if states.is_empty() {
            String::new()
        } else {
            let list: Vec<String> = states.iter().map(|s| format!("'{}'", s.as_str())).collect();
            format!("WHERE state IN ({})", list.join(","))
        };
        let mut stmt = self
            .conn
            .prepare(&format!(
                "SELECT {LEASE_COLS} FROM leases {filter} ORDER BY started_at, lease_id"
            ))
            .map_err(|e| self.err(e))?;
        let rows = stmt
            .query_map([], |r| Ok(lease_from_row(r)))
            .map_err(|e| self.err(e))?;
        let mut out = Vec::new();
        for r in rows {
            out.push(r.map_err(|e| self.err(e))?);
        }
        Ok(out)
    }

    pub fn counts(&self) -> Result<Counts, StoreError> {
        let mut c = Counts::default();
        let mut stmt = self
            .conn
            .prepare("SELECT state, COUNT(*) FROM leases GROUP BY state")
            .map_err(|e| self.err(e))?;
        let rows = stmt
            .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))
            .map_err(|e| self.err(e))?;
        for r in rows {
            let (state, n) = r.map_err(|e| self.err(e))?;
            let n = n as u64;
            match state.as_str() {
                "open" => c.open = n,
                "closing" => c.closing = n,
                "closed" => c.closed = n,
                "lost" => c.lost = n,
                _ => {} // a tampered state counts nowhere; `leases` shows it as an error
            }
        }
        Ok(c)
    }

    /// Claims a lease for closing: `open → closing`, or re-claims a `closing` lease whose
    /// claimant `stale_claim` says is gone. Returns the lease as claimed, or `None` when another
    /// process got there first or the lease is not in a claimable state. One conditional UPDATE
    /// in one immediate transaction: of two racing claimants exactly one wins.
    pub fn claim(
        &mut self,
        lease_id: &str,
        claimant: ProcessId,
        stale_claim: impl Fn(ProcessId) -> bool,
    ) -> Result<Option<Lease>, StoreError> {
        let mut claimed = self.claim_many(&[lease_id], claimant, stale_claim)?;
        Ok(claimed.pop().flatten())
    }

    /// [`Store::claim`] for many leases in one transaction (a startup reap may claim thousands):
    /// one result per id, in order.
    pub fn claim_many(
        &mut self,
        lease_ids: &[&str],
        claimant: ProcessId,
        stale_claim: impl Fn(ProcessId) -> bool,
    ) -> Result<Vec<Option<Lease>>, StoreError> {
        let path = self.path.clone();
        let err = |e| map_err(&path, self.busy, e);
        let now = crate::lease::now_ms();
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(err)?;
        let mut out = Vec::with_capacity(lease_ids.len());
        for id in lease_ids {
            out.push(
                claim_in(&tx, id, claimant, &stale_claim, now).map_err(|e| match e {
                    ClaimError::Sql(e) => err(e),
                    ClaimError::Row(e) => e,
                })?,
            );
        }
        tx.commit().map_err(err)?;
        Ok(out)
    }

    /// Moves a lease to `to`, only if it is currently in `from` (and, when `claimant` is given,
    /// held by that claimant). Returns whether the row changed. Records a lifecycle event.
    pub fn transition(
        &mut self,
        lease_id: &str,
        from: LeaseState,
        to: LeaseState,
        claimant: Option<ProcessId>,
        reason: &str,
    ) -> Result<bool, StoreError> {
        let changed = self.transition_many(
            &[Transition {
                lease_id,
                from,
                to,
                reason,
            }],
            claimant,
        )?;
        Ok(changed[0])
    }

    /// [`Store::transition`] for many leases in one transaction: whether each row changed.
    pub fn transition_many(
        &mut self,
        items: &[Transition<'_>],
        claimant: Option<ProcessId>,
    ) -> Result<Vec<bool>, StoreError> {
        for t in items {
            if !t.from.can_become(t.to) {
                return Err(StoreError::BadRow {
                    lease_id: t.lease_id.to_string(),
                    detail: format!("transition {} -> {} is not allowed", t.from, t.to),
                });
            }
        }
        let path = self.path.clone();
        let err = |e| map_err(&path, self.busy, e);
        let now = crate::lease::now_ms();
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(err)?;
        let mut out = Vec::with_capacity(items.len());
        for t in items {
            out.push(transition_in(&tx, t, claimant, now).map_err(err)?);
        }
        tx.commit().map_err(err)?;
        Ok(out)
    }

    /// Fills in what the wrapper reported. Only fills: a reported value never overwrites one
    /// already recorded, so a forged report cannot redirect an existing lease.
    pub fn apply_report(&mut self, lease_id: &str, r: &ReportUpdate) -> Result<bool, StoreError> {
        let now = crate::lease::now_ms();
        let n = self
            .conn
            .execute(
                "UPDATE leases SET \
                 process_group_id = COALESCE(process_group_id, ?2), \
                 adapter_pid = COALESCE(adapter_pid, ?3), \
                 adapter_start_time = COALESCE(adapter_start_time, ?4), \
                 exit_status = COALESCE(exit_status, ?5), updated_at = ?6 \
                 WHERE lease_id = ?1 AND ( \
                   (process_group_id IS NULL AND ?2 IS NOT NULL) OR \
                   (adapter_pid IS NULL AND ?3 IS NOT NULL) OR \
                   (adapter_start_time IS NULL AND ?4 IS NOT NULL) OR \
                   (exit_status IS NULL AND ?5 IS NOT NULL))",
                params![
                    lease_id,
                    r.process_group_id,
                    r.adapter_pid,
                    r.adapter_start_time.map(|v| v as i64),
                    r.exit_status,
                    now
                ],
            )
            .map_err(|e| self.err(e))?;
        Ok(n == 1)
    }

    /// Deletes closed and lost leases that ended before `before_ms`. Returns how many.
    pub fn expire(&mut self, before_ms: i64) -> Result<usize, StoreError> {
        self.conn
            .execute(
                "DELETE FROM leases WHERE state IN ('closed','lost') AND closed_at IS NOT NULL \
                 AND closed_at < ?1",
                [before_ms],
            )
            .map_err(|e| self.err(e))
    }

    /// Appends a lifecycle event to a session's history and returns its seq.
    pub fn record_event(
        &mut self,
        session_key: &str,
        lease_id: Option<&str>,
        kind: &str,
        detail: Option<serde_json::Value>,
    ) -> Result<i64, StoreError> {
        let path = self.path.clone();
        let err = |e| map_err(&path, self.busy, e);
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(err)?;
        let seq = insert_event(
            &tx,
            session_key,
            lease_id,
            kind,
            detail,
            crate::lease::now_ms(),
        )
        .map_err(err)?;
        tx.commit().map_err(err)?;
        Ok(seq)
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
        let path = self.path.clone();
        let err = |e| map_err(&path, self.busy, e);
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(err)?;
        let last = last_seq(&tx, session_key).map_err(err)?;
        tx.execute(
            "INSERT INTO seq_floor (session_key, floor) VALUES (?1, ?2) \
             ON CONFLICT(session_key) DO UPDATE SET floor = MAX(floor, excluded.floor)",
            params![session_key, last + n.max(1)],
        )
        .map_err(err)?;
        let events = events_after(&tx, session_key, after).map_err(err)?;
        tx.commit().map_err(err)?;
        Ok((last + 1, events))
    }

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

    /// The underlying connection, for modules that own their own tables (legacy records).
    /// Repairs an active lease row that does not read, so that it can be closed: the fields that
    /// identify its processes (id, gateway, session, wrapper root and path, root pid, start time
    /// and pidfs inode, command hash, owner, state) must read, since verification compares them
    /// with the live process table; every other field that does not read is reset to a safe
    /// value (grace → the default, adapter pid/group/start time, exit status, claim and times →
    /// unknown, command → empty) and a `repaired` event records which. Returns the repaired
    /// lease and what was reset, `Ok(None)` when there is no such active row, and `BadRow` when
    /// an identifying field does not read (such a row cannot be verified and is never signalled).
    pub fn repair_lease(
        &mut self,
        lease_id: &str,
    ) -> Result<Option<(Lease, Vec<String>)>, StoreError> {
        let path = self.path.clone();
        let err = |e| map_err(&path, self.busy, e);
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(err)?;
        let read = |tx: &Connection| -> rusqlite::Result<Option<Result<Lease, StoreError>>> {
            tx.query_row(
                &format!(
                    "SELECT {LEASE_COLS} FROM leases WHERE lease_id = ?1 \
                     AND state IN ('open','closing')"
                ),
                [lease_id],
                |r| Ok(lease_from_row(r)),
            )
            .optional()
        };
        let Some(first) = read(&tx).map_err(err)? else {
            return Ok(None);
        };
        let detail = match first {
            Ok(l) => return Ok(Some((l, Vec::new()))),
            Err(e) => e.to_string(),
        };
        let mut fixed = Vec::new();
        for (check, reset, what) in REPAIRS {
            let bad: bool = tx
                .query_row(
                    &format!("SELECT NOT ({check}) FROM leases WHERE lease_id = ?1"),
                    [lease_id],
                    |r| r.get::<_, Option<bool>>(0),
                )
                .map_err(err)?
                .unwrap_or(true);
            if bad {
                let sql = format!("UPDATE leases SET {reset} WHERE lease_id = ?1");
                if reset.contains("?2") {
                    let grace = crate::limits::DEFAULT_GRACE_MS as i64;
                    tx.execute(&sql, params![lease_id, grace]).map_err(err)?;
                } else {
                    tx.execute(&sql, [lease_id]).map_err(err)?;
                }
                fixed.push(what.to_string());
            }
        }
        let lease = match read(&tx).map_err(err)? {
            Some(Ok(l)) => l,
            Some(Err(e)) => {
                return Err(StoreError::BadRow {
                    lease_id: lease_id.to_string(),
                    detail: format!(
                        "{e}; a field that identifies its processes does not read, so it cannot \
                         be verified and nothing is signalled (fix or delete the row by hand)"
                    ),
                })
            }
            None => return Ok(None),
        };
        insert_event(
            &tx,
            &lease.session_key,
            Some(lease_id),
            "repaired",
            Some(serde_json::json!({ "reset": fixed, "was": detail })),
            crate::lease::now_ms(),
        )
        .map_err(err)?;
        tx.commit().map_err(err)?;
        tracing::warn!(lease_id, reset = ?fixed, was = %detail, "repaired an unreadable lease row");
        Ok(Some((lease, fixed)))
    }

    pub fn conn(&mut self) -> &mut Connection {
        &mut self.conn
    }
}

const LEASE_COLS: &str = "lease_id, gateway_instance_id, session_key, agent_id, wrapper_root, \
    wrapper_path, root_pid, root_start_time, process_group_id, adapter_pid, adapter_start_time, \
    command_hash, command_json, owner_pid, owner_start_time, started_at, grace_ms, state, \
    state_reason, closed_at, exit_status, claimed_by_pid, claimed_by_start, root_pidfs_ino, \
    cgroup_path, cgroup_id";

/// The fields [`Store::repair_lease`] may reset: (SQL that holds when the field reads, the reset
/// (?2 is the default grace), what is said in the `repaired` event). They mirror the checks of
/// [`lease_from_row`]; none of them is evidence that verification compares with `/proc`.
const REPAIRS: &[(&str, &str, &str)] = &[
    (
        "typeof(grace_ms) = 'integer' AND grace_ms BETWEEN 0 AND 3600000",
        "grace_ms = ?2",
        "grace_ms (now the default)",
    ),
    (
        "process_group_id IS NULL OR (typeof(process_group_id) = 'integer' \
         AND process_group_id BETWEEN 1 AND 2147483647)",
        "process_group_id = NULL",
        "process_group_id",
    ),
    (
        "adapter_pid IS NULL OR (typeof(adapter_pid) = 'integer' \
         AND adapter_pid BETWEEN 1 AND 2147483647)",
        "adapter_pid = NULL",
        "adapter_pid",
    ),
    (
        "adapter_start_time IS NULL OR (typeof(adapter_start_time) = 'integer' \
         AND adapter_start_time >= 0)",
        "adapter_start_time = NULL",
        "adapter_start_time",
    ),
    (
        "exit_status IS NULL OR typeof(exit_status) = 'integer'",
        "exit_status = NULL",
        "exit_status",
    ),
    (
        "(claimed_by_pid IS NULL OR (typeof(claimed_by_pid) = 'integer' \
         AND claimed_by_pid BETWEEN 1 AND 2147483647)) AND (claimed_by_start IS NULL \
         OR (typeof(claimed_by_start) = 'integer' AND claimed_by_start >= 0))",
        "claimed_by_pid = NULL, claimed_by_start = NULL",
        "claimed_by",
    ),
    (
        "typeof(started_at) = 'integer'",
        "started_at = 0",
        "started_at",
    ),
    (
        "closed_at IS NULL OR typeof(closed_at) = 'integer'",
        "closed_at = NULL",
        "closed_at",
    ),
    (
        "state_reason IS NULL OR typeof(state_reason) = 'text'",
        "state_reason = NULL",
        "state_reason",
    ),
    (
        "agent_id IS NULL OR typeof(agent_id) = 'text'",
        "agent_id = NULL",
        "agent_id",
    ),
    (
        "typeof(command_json) = 'text' AND json_valid(command_json) \
         AND json_type(command_json) = 'array'",
        "command_json = '[]'",
        "command_json",
    ),
];

const SESSION_COLS: &str = "session_key, agent_id, owner_session_key, spawned_by, \
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

/// Parses a lease row, validating what a tampered or corrupt row could get wrong. Column types
/// are read loosely (SQLite is dynamically typed) and checked here, so a bad row becomes a
/// `BadRow` error for that row only.
fn lease_from_row(r: &Row<'_>) -> Result<Lease, StoreError> {
    let lease_id: String = r
        .get::<_, rusqlite::types::Value>(0)
        .ok()
        .and_then(|v| match v {
            rusqlite::types::Value::Text(t) => Some(t),
            _ => None,
        })
        .unwrap_or_else(|| "<unreadable id>".to_string());
    let bad = |detail: String| StoreError::BadRow {
        lease_id: lease_id.clone(),
        detail,
    };
    let text = |i: usize, name: &str| -> Result<String, StoreError> {
        r.get::<_, String>(i)
            .map_err(|e| bad(format!("{name}: {e}")))
    };
    let opt_text = |i: usize, name: &str| -> Result<Option<String>, StoreError> {
        r.get::<_, Option<String>>(i)
            .map_err(|e| bad(format!("{name}: {e}")))
    };
    let int = |i: usize, name: &str| -> Result<i64, StoreError> {
        r.get::<_, i64>(i).map_err(|e| bad(format!("{name}: {e}")))
    };
    let opt_int = |i: usize, name: &str| -> Result<Option<i64>, StoreError> {
        r.get::<_, Option<i64>>(i)
            .map_err(|e| bad(format!("{name}: {e}")))
    };
    let pid = |v: i64, name: &str| -> Result<i32, StoreError> {
        if v <= 0 || v > i32::MAX as i64 {
            Err(bad(format!("{name} {v} is not a valid pid")))
        } else {
            Ok(v as i32)
        }
    };
    let ticks = |v: i64, name: &str| -> Result<u64, StoreError> {
        u64::try_from(v).map_err(|_| bad(format!("{name} {v} is negative")))
    };
    if uuid::Uuid::parse_str(&lease_id).is_err() {
        return Err(bad("lease id is not a UUID".into()));
    }
    let state: LeaseState = text(17, "state")?
        .parse()
        .map_err(|e: crate::lease::BadState| bad(e.to_string()))?;
    let command_json = text(12, "command_json")?;
    let command: Vec<String> =
        serde_json::from_str(&command_json).map_err(|e| bad(format!("command_json: {e}")))?;
    let claimed_by = match (
        opt_int(21, "claimed_by_pid")?,
        opt_int(22, "claimed_by_start")?,
    ) {
        (Some(p), Some(s)) => Some(ProcessId {
            pid: pid(p, "claimed_by_pid")?,
            start_time: ticks(s, "claimed_by_start")?,
        }),
        _ => None,
    };
    Ok(Lease {
        gateway_instance_id: text(1, "gateway_instance_id")?,
        session_key: text(2, "session_key")?,
        agent_id: opt_text(3, "agent_id")?,
        wrapper_root: text(4, "wrapper_root")?,
        wrapper_path: text(5, "wrapper_path")?,
        root_pid: pid(int(6, "root_pid")?, "root_pid")?,
        root_start_time: ticks(int(7, "root_start_time")?, "root_start_time")?,
        process_group_id: opt_int(8, "process_group_id")?
            .map(|v| pid(v, "process_group_id"))
            .transpose()?,
        adapter_pid: opt_int(9, "adapter_pid")?
            .map(|v| pid(v, "adapter_pid"))
            .transpose()?,
        adapter_start_time: opt_int(10, "adapter_start_time")?
            .map(|v| ticks(v, "adapter_start_time"))
            .transpose()?,
        command_hash: text(11, "command_hash")?,
        command,
        owner_pid: pid(int(13, "owner_pid")?, "owner_pid")?,
        owner_start_time: ticks(int(14, "owner_start_time")?, "owner_start_time")?,
        started_at: int(15, "started_at")?,
        grace_ms: crate::limits::check_grace_ms(
            "grace_ms",
            ticks(int(16, "grace_ms")?, "grace_ms")?,
        )
        .map_err(|e| bad(e.to_string()))?,
        state,
        state_reason: opt_text(18, "state_reason")?,
        closed_at: opt_int(19, "closed_at")?,
        exit_status: opt_int(20, "exit_status")?.map(|v| v as i32),
        claimed_by,
        root_pidfs_ino: opt_int(23, "root_pidfs_ino")?
            .map(|v| ticks(v, "root_pidfs_ino"))
            .transpose()?,
        cgroup_path: opt_text(24, "cgroup_path")?,
        cgroup_id: opt_int(25, "cgroup_id")?
            .map(|v| ticks(v, "cgroup_id"))
            .transpose()?,
        lease_id,
    })
}

/// One state change for [`Store::transition_many`].
#[derive(Debug, Clone, Copy)]
pub struct Transition<'a> {
    pub lease_id: &'a str,
    pub from: LeaseState,
    pub to: LeaseState,
    pub reason: &'a str,
}

enum ClaimError {
    Sql(rusqlite::Error),
    Row(StoreError),
}

impl From<rusqlite::Error> for ClaimError {
    fn from(e: rusqlite::Error) -> Self {
        ClaimError::Sql(e)
    }
}

/// The body of a claim, inside the caller's immediate transaction.
fn claim_in(
    tx: &Connection,
    lease_id: &str,
    claimant: ProcessId,
    stale_claim: &impl Fn(ProcessId) -> bool,
    now: i64,
) -> Result<Option<Lease>, ClaimError> {
    let current = tx
        .prepare_cached(&format!(
            "SELECT {LEASE_COLS} FROM leases WHERE lease_id = ?1"
        ))?
        .query_row([lease_id], |r| Ok(lease_from_row(r)))
        .optional()?;
    let Some(current) = current else {
        return Ok(None);
    };
    let current = current.map_err(ClaimError::Row)?;
    let changed = match (current.state, current.claimed_by) {
        (LeaseState::Open, _) => tx
            .prepare_cached(
                "UPDATE leases SET state = 'closing', claimed_by_pid = ?2, \
                 claimed_by_start = ?3, updated_at = ?4 WHERE lease_id = ?1 AND state = 'open'",
            )?
            .execute(params![
                lease_id,
                claimant.pid,
                claimant.start_time as i64,
                now
            ])?,
        (LeaseState::Closing, claimed) => {
            let stale = match claimed {
                Some(c) => c == claimant || stale_claim(c),
                None => true,
            };
            if !stale {
                return Ok(None);
            }
            tx.prepare_cached(
                "UPDATE leases SET claimed_by_pid = ?2, claimed_by_start = ?3, updated_at = ?4 \
                 WHERE lease_id = ?1 AND state = 'closing' \
                 AND claimed_by_pid IS ?5 AND claimed_by_start IS ?6",
            )?
            .execute(params![
                lease_id,
                claimant.pid,
                claimant.start_time as i64,
                now,
                claimed.map(|c| c.pid),
                claimed.map(|c| c.start_time as i64)
            ])?
        }
        _ => 0,
    };
    if changed != 1 {
        return Ok(None);
    }
    if current.state == LeaseState::Open {
        insert_event(
            tx,
            &current.session_key,
            Some(lease_id),
            "closing",
            None,
            now,
        )?;
    }
    let mut lease = current;
    lease.state = LeaseState::Closing;
    lease.claimed_by = Some(claimant);
    Ok(Some(lease))
}

/// The body of a transition, inside the caller's immediate transaction.
fn transition_in(
    tx: &Connection,
    t: &Transition<'_>,
    claimant: Option<ProcessId>,
    now: i64,
) -> rusqlite::Result<bool> {
    let closed_at = t.to.is_terminal().then_some(now);
    let changed = tx
        .prepare_cached(
            "UPDATE leases SET state = ?3, state_reason = ?4, closed_at = COALESCE(?5, closed_at), \
             updated_at = ?6, claimed_by_pid = NULL, claimed_by_start = NULL \
             WHERE lease_id = ?1 AND state = ?2 \
             AND (?7 IS NULL OR (claimed_by_pid = ?7 AND claimed_by_start = ?8))",
        )?
        .execute(params![
            t.lease_id,
            t.from.as_str(),
            t.to.as_str(),
            t.reason,
            closed_at,
            now,
            claimant.map(|c| c.pid),
            claimant.map(|c| c.start_time as i64),
        ])?;
    if changed == 1 {
        let session: String = tx
            .prepare_cached("SELECT session_key FROM leases WHERE lease_id = ?1")?
            .query_row([t.lease_id], |r| r.get(0))?;
        let kind = if t.to == LeaseState::Open {
            "reopened"
        } else {
            t.to.as_str()
        };
        insert_event(
            tx,
            &session,
            Some(t.lease_id),
            kind,
            Some(serde_json::json!({ "reason": t.reason })),
            now,
        )?;
    }
    Ok(changed == 1)
}

/// Appends an event with the next seq of its session. Call inside a write transaction.
fn insert_event(
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

/// The database and its `-wal`/`-shm` companions must not be symlinks: SQLite would follow them
/// and make the link's target (any file of ours) a leash database, or its journal.
fn refuse_symlinks(path: &Path) -> Result<(), StoreError> {
    let mut names = vec![path.to_path_buf()];
    for suffix in ["-wal", "-shm", "-journal"] {
        let mut p = path.as_os_str().to_owned();
        p.push(suffix);
        names.push(PathBuf::from(p));
    }
    for p in names {
        if std::fs::symlink_metadata(&p).is_ok_and(|m| m.file_type().is_symlink()) {
            return Err(StoreError::Symlink { path: p });
        }
    }
    Ok(())
}

fn map_err(path: &Path, busy: Duration, e: rusqlite::Error) -> StoreError {
    use rusqlite::ErrorCode;
    if let rusqlite::Error::SqliteFailure(f, ref msg) = e {
        match f.code {
            ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked => {
                return StoreError::Busy {
                    path: path.to_path_buf(),
                    waited_ms: busy.as_millis(),
                }
            }
            ErrorCode::NotADatabase | ErrorCode::DatabaseCorrupt => {
                return StoreError::Corrupt {
                    path: path.to_path_buf(),
                    detail: msg.clone().unwrap_or_else(|| f.to_string()),
                }
            }
            _ => {}
        }
    }
    StoreError::Sqlite {
        path: path.to_path_buf(),
        source: e,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::lease::{command_hash, new_lease_id, now_ms};

    fn temp_db() -> PathBuf {
        let dir = std::env::temp_dir().join(format!("leash-store-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        dir.join("leash.db")
    }

    fn lease(store: &Store, session: &str) -> Lease {
        Lease {
            lease_id: new_lease_id(),
            gateway_instance_id: store.gateway_instance_id().to_string(),
            session_key: session.into(),
            agent_id: None,
            wrapper_root: "/w".into(),
            wrapper_path: "/w/leash-wrap".into(),
            root_pid: 4242,
            root_start_time: 1,
            process_group_id: None,
            adapter_pid: None,
            adapter_start_time: None,
            command_hash: command_hash(&["x"]),
            command: vec!["x".into()],
            owner_pid: 4241,
            owner_start_time: 1,
            started_at: now_ms(),
            grace_ms: 100,
            state: LeaseState::Open,
            state_reason: None,
            closed_at: None,
            exit_status: None,
            claimed_by: None,
            root_pidfs_ino: None,
            cgroup_path: None,
            cgroup_id: None,
        }
    }

    #[test]
    fn racing_claims_have_exactly_one_winner() {
        let db = temp_db();
        let mut store = Store::open(&db).unwrap();
        let l = lease(&store, "race");
        store.insert_lease(&l, None, |_| None).unwrap();
        let barrier = std::sync::Arc::new(std::sync::Barrier::new(8));
        let handles: Vec<_> = (0..8)
            .map(|i| {
                let (db, id, barrier) = (db.clone(), l.lease_id.clone(), barrier.clone());
                std::thread::spawn(move || {
                    let mut s = Store::open(&db).unwrap();
                    barrier.wait();
                    // Every claimant is "alive": no stale re-claim is possible.
                    s.claim(
                        &id,
                        ProcessId {
                            pid: 1000 + i,
                            start_time: 7,
                        },
                        |_| false,
                    )
                    .unwrap()
                    .is_some()
                })
            })
            .collect();
        let winners = handles
            .into_iter()
            .map(|h| h.join().unwrap())
            .filter(|&won| won)
            .count();
        assert_eq!(winners, 1);
        let now = store.lease(&l.lease_id).unwrap().unwrap();
        assert_eq!(now.state, LeaseState::Closing);
        // A stale claimant can be replaced, a live one cannot.
        let me = ProcessId {
            pid: 9,
            start_time: 9,
        };
        assert!(store.claim(&l.lease_id, me, |_| false).unwrap().is_none());
        assert!(store.claim(&l.lease_id, me, |_| true).unwrap().is_some());
        // Only the holder may finish it.
        let other = ProcessId {
            pid: 10,
            start_time: 10,
        };
        assert!(!store
            .transition(
                &l.lease_id,
                LeaseState::Closing,
                LeaseState::Closed,
                Some(other),
                "x"
            )
            .unwrap());
        assert!(store
            .transition(
                &l.lease_id,
                LeaseState::Closing,
                LeaseState::Closed,
                Some(me),
                "done"
            )
            .unwrap());
        let _ = std::fs::remove_dir_all(db.parent().unwrap());
    }

    #[test]
    fn one_active_lease_per_session_and_bad_rows_are_reported_not_used() {
        let db = temp_db();
        let mut store = Store::open(&db).unwrap();
        let a = lease(&store, "s");
        store.insert_lease(&a, None, |_| None).unwrap();
        let b = lease(&store, "s");
        assert!(matches!(
            store.insert_lease(&b, None, |_| None),
            Err(StoreError::SessionBusy { .. })
        ));
        store
            .insert_lease(&b, None, |old| Some(format!("{} gone", old.lease_id)))
            .unwrap();
        assert_eq!(
            store.lease(&a.lease_id).unwrap().unwrap().state,
            LeaseState::Lost
        );
        // Tamper a row: a bad state and a pid of -1.
        store
            .conn()
            .execute(
                "UPDATE leases SET state = 'zombie', root_pid = -1 WHERE lease_id = ?1",
                [&a.lease_id],
            )
            .unwrap();
        let rows = store.leases(&[]).unwrap();
        assert_eq!(rows.len(), 2);
        assert!(rows
            .iter()
            .any(|r| matches!(r, Err(StoreError::BadRow { .. }))));
        assert!(rows
            .iter()
            .any(|r| r.as_ref().is_ok_and(|l| l.lease_id == b.lease_id)));
        let _ = std::fs::remove_dir_all(db.parent().unwrap());
    }

    #[test]
    fn corrupt_and_foreign_files_get_a_clear_error() {
        let db = temp_db();
        std::fs::write(
            &db,
            b"this is not a database, just some bytes that are long enough to matter..........",
        )
        .unwrap();
        let e = Store::open(&db).err().expect("must fail");
        assert!(matches!(e, StoreError::Corrupt { .. }), "{e}");
        assert!(e.to_string().contains("move it aside"), "{e}");
        let _ = std::fs::remove_dir_all(db.parent().unwrap());
    }

    #[test]
    fn the_gateway_id_is_stable() {
        let db = temp_db();
        let a = Store::open(&db).unwrap().gateway_instance_id().to_string();
        let b = Store::open(&db).unwrap().gateway_instance_id().to_string();
        assert_eq!(a, b);
        let _ = std::fs::remove_dir_all(db.parent().unwrap());
    }
    fn temp_store() -> (Store, PathBuf) {
        let dir = std::env::temp_dir().join(format!("leash-store-test-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        (Store::open(&dir.join("leash.db")).unwrap(), dir)
    }

    #[test]
    fn events_recorded_after_a_reservation_land_above_it() {
        let (mut store, dir) = temp_store();
        assert_eq!(store.record_event("s", None, "spawned", None).unwrap(), 1);
        let (start, before) = store.reserve_seqs("s", 100, 0).unwrap();
        assert_eq!(start, 2, "the block starts after the recorded event");
        assert_eq!(before.len(), 1);
        assert_eq!(before[0].kind, "spawned");
        assert_eq!(store.last_seq("s").unwrap(), 101);
        assert_eq!(store.record_event("s", None, "cancel", None).unwrap(), 102);
        // Other sessions have their own space.
        assert_eq!(store.record_event("t", None, "spawned", None).unwrap(), 1);
        let (start, since) = store.reserve_seqs("s", 10, 1).unwrap();
        assert_eq!(start, 103);
        assert_eq!(since.iter().map(|e| e.seq).collect::<Vec<_>>(), vec![102]);
        assert_eq!(
            store
                .events_since("s", 0)
                .unwrap()
                .iter()
                .map(|e| e.seq)
                .collect::<Vec<_>>(),
            vec![1, 102]
        );
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn meta_values_round_trip_and_delete() {
        let (mut store, dir) = temp_store();
        assert_eq!(store.meta("k").unwrap(), None);
        store.set_meta("k", Some("v1")).unwrap();
        store.set_meta("k", Some("v2")).unwrap();
        assert_eq!(store.meta("k").unwrap().as_deref(), Some("v2"));
        store.set_meta("k", None).unwrap();
        assert_eq!(store.meta("k").unwrap(), None);
        std::fs::remove_dir_all(dir).unwrap();
    }
}
