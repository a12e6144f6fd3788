//! The schema, one migration per version, and the step every open runs: bring the database to
//! the newest version in one write transaction and create the gateway instance id once.

use super::db::{map_err, Store, StoreError};
use std::time::Duration;

/// The schema, one migration per version. Never edit a published step; add one.
pub(super) const MIGRATIONS: &[&str] = &[
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
    // 5: each lease's ownership as its session row said when the lease was committed. The
    // `sessions` row holds only the newest owner of a key; history is scoped per lease, so a key
    // reused by a new owner shows neither owner the other's events. Only the lease a row names
    // is known to have had that row's ownership: older leases get no row here (their events are
    // shown to the session's own key alone).
    r#"
    CREATE TABLE lease_owners (
        lease_id            TEXT PRIMARY KEY,
        session_key         TEXT NOT NULL,
        agent_id            TEXT,
        owner_session_key   TEXT,
        spawned_by          TEXT,
        parent_session_key  TEXT
    );
    CREATE INDEX lease_owners_by_session ON lease_owners(session_key);
    INSERT OR IGNORE INTO lease_owners (lease_id, session_key, agent_id, owner_session_key, spawned_by,
                              parent_session_key)
        SELECT lease_id, session_key, agent_id, owner_session_key, spawned_by, parent_session_key
        FROM sessions WHERE lease_id IS NOT NULL;
    "#,
    // 6: legacy records imported from the acpx extension's own lease store: where they came
    // from, the incumbent's lease id and gateway id (carried by its wrappers' argv and env), its
    // command hash, process group and start (ms, its clock), as evidence for the fail-safe path.
    r#"
    ALTER TABLE legacy_records ADD COLUMN source TEXT;
    ALTER TABLE legacy_records ADD COLUMN acpx_lease_id TEXT;
    ALTER TABLE legacy_records ADD COLUMN acpx_gateway_id TEXT;
    ALTER TABLE legacy_records ADD COLUMN command_hash TEXT;
    ALTER TABLE legacy_records ADD COLUMN process_group_id INTEGER;
    ALTER TABLE legacy_records ADD COLUMN acpx_started_at INTEGER;
    CREATE UNIQUE INDEX legacy_records_one_per_acpx_lease
        ON legacy_records(acpx_lease_id) WHERE acpx_lease_id IS NOT NULL;
    "#,
    // 7: where the lease's wrapper writes its report, when not in the state root's `run/`: a
    // private runtime directory on tmpfs (`state::resolve_reports_dir`). NULL: `run/`.
    r#"
    ALTER TABLE leases ADD COLUMN report_dir TEXT;
    "#,
];

impl Store {
    pub(super) fn migrate(&mut self, busy: Duration) -> Result<(), StoreError> {
        let known = MIGRATIONS.len() as i64;
        // Fast path, read-only: an up-to-date database with its gateway id (every `leash exec`
        // passes here; a write transaction would cost a WAL append per spawn).
        let version: i64 = self
            .conn
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .map_err(|e| map_err(&self.path, busy, e))?;
        if version == known {
            if let Some(id) = self.read_gateway_id()? {
                return self.set_gateway_id(id);
            }
        }
        self.write(|tx, ctx| {
            let version: i64 = tx
                .query_row("PRAGMA user_version", [], |r| r.get(0))
                .map_err(|e| ctx.err(e))?;
            if version > known {
                return Err(StoreError::TooNew {
                    path: ctx.path.to_path_buf(),
                    found: version,
                    known,
                });
            }
            for (i, sql) in MIGRATIONS.iter().enumerate().skip(version as usize) {
                tx.execute_batch(sql).map_err(|e| ctx.err(e))?;
                tx.pragma_update(None, "user_version", (i + 1) as i64)
                    .map_err(|e| ctx.err(e))?;
            }
            // The gateway instance id is created once, on first use, and kept for the life of
            // the state root.
            super::meta::create_gateway_id(tx).map_err(|e| ctx.err(e))
        })?;
        let id = self.read_gateway_id()?.unwrap_or_default();
        self.set_gateway_id(id)
    }
}
