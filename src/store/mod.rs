//! The lease store: one SQLite database per state root (WAL, busy timeout, versioned migrations).
//!
//! Every state change that two processes could race on (claiming a lease for closing, finishing
//! a close) is a single conditional UPDATE inside an immediate transaction, so two reapers on one
//! root never both act on a lease. Commits are not fsynced one by one (`synchronous=NORMAL` in
//! WAL mode: durable against process crashes, which is what leases must survive) and the database
//! is never VACUUMed in normal operation.
//!
//! `db.rs` holds what every file shares (the [`Store`] handle, the busy timeout, the
//! [`StoreError`]s); then one file per table: [`migrations`] (the schema and the gateway id it
//! creates), [`leases`],
//! [`sessions`], [`events`] (with the seq space the daemon reserves from), [`meta`] and
//! [`legacy`] (the old gateway's records). Every multi-statement write goes through
//! [`Store::write`], and no caller outside this module sees the connection: a table's SQL lives
//! in its file here, with the store's errors.

mod db;
mod events;
mod leases;
pub mod legacy;
mod meta;
mod migrations;
mod sessions;

pub use db::{busy_timeout, Store, StoreError, DEFAULT_BUSY_TIMEOUT, ENV_BUSY_TIMEOUT_MS};
use db::{map_err, Ctx};
pub use events::Event;
pub use leases::{Counts, ReportUpdate, Superseded, Transition};
pub use legacy::NewLegacyRecord;
pub use meta::SPEC_KEY_PREFIX;

use rusqlite::config::DbConfig;
use rusqlite::{Connection, Transaction, TransactionBehavior};
use std::path::{Path, PathBuf};
use std::time::Duration;

impl Store {
    /// Opens (creating and migrating when needed) the database at `path`.
    pub fn open(path: &Path) -> Result<Store, StoreError> {
        Self::open_with_timeout(path, busy_timeout())
    }

    pub fn open_with_timeout(path: &Path, busy: Duration) -> Result<Store, StoreError> {
        match Self::open_once(path, busy) {
            // A database whose `-shm` must be made (or grown) on a full disk cannot even be
            // read: the reserve gives the room for it.
            Err(e) if (e.is_disk_full() || e.is_io_error()) && give_back_reserve(path) => {
                Self::open_once(path, busy)
            }
            other => other,
        }
    }

    fn open_once(path: &Path, busy: Duration) -> Result<Store, StoreError> {
        let err = |e| map_err(path, busy, e);
        refuse_symlinks(path)?;
        create_private(path).map_err(|source| StoreError::Create {
            path: path.to_path_buf(),
            source,
        })?;
        let conn = Connection::open(path).map_err(err)?;
        conn.busy_timeout(busy).map_err(err)?;
        // journal_mode returns a row; a corrupt file fails here first.
        let mode = switch_to_wal(&conn, busy).map_err(err)?;
        // SQLite made `-wal` and `-shm` with the database's mode (0600); ones an older leash
        // left looser are tightened.
        for suffix in ["-wal", "-shm"] {
            let mut p = path.as_os_str().to_owned();
            p.push(suffix);
            tighten(Path::new(&p));
        }
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(StoreError::Corrupt {
                path: path.to_path_buf(),
                detail: format!("cannot switch to WAL journal (got {mode})"),
            });
        }
        conn.execute_batch("PRAGMA synchronous=NORMAL; PRAGMA foreign_keys=ON;")
            .map_err(err)?;
        // The WAL outlives the connection (see `settle_wal`): no checkpoint, fsync, unlink of
        // `-wal`/`-shm` when the last connection closes, and no file creation on the next open.
        conn.set_db_config(DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, true)
            .map_err(err)?;
        conn.pragma_update(None, "wal_autocheckpoint", WAL_FRAMES)
            .map_err(err)?;
        let mut store = Store {
            conn,
            path: path.to_path_buf(),
            gateway_instance_id: String::new(),
            busy,
        };
        store.migrate(busy)?;
        keep_reserve(&reserve_path(path));
        Ok(store)
    }

    /// Gives the reserve's room back to the filesystem (the disk is full and a write that ends
    /// a lease needs it). Whether there was one to give.
    fn give_back_reserve(&self) -> bool {
        give_back_reserve(&self.path)
    }

    /// [`Store::write`] for what ends a lease (a claim for closing, a transition to its end):
    /// when the disk is full, the reserve is given back and the write tried once more, so a
    /// verified tree can still be closed and recorded.
    fn write_ending<T>(
        &mut self,
        mut body: impl FnMut(&Transaction<'_>, Ctx<'_>) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        match self.write(&mut body) {
            Err(e) if e.is_disk_full() && self.give_back_reserve() => self.write(body),
            other => other,
        }
    }

    fn err(&self, e: rusqlite::Error) -> StoreError {
        map_err(&self.path, self.busy, e)
    }

    /// The one write transaction of the store: `BEGIN IMMEDIATE` (a writer takes the lock up
    /// front and waits the busy timeout for it, rather than failing when a read upgrades), then
    /// `body`, then commit. An error from `body` drops the transaction: nothing it wrote is kept.
    fn write<T>(
        &mut self,
        body: impl FnOnce(&Transaction<'_>, Ctx<'_>) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let Store {
            conn, path, busy, ..
        } = self;
        let ctx = Ctx { path, busy: *busy };
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(|e| ctx.err(e))?;
        let out = body(&tx, ctx)?;
        tx.commit().map_err(|e| ctx.err(e))?;
        Ok(out)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Bounds the WAL the next process will replay. With no checkpoint on close, every process
    /// that opens the database first rebuilds the WAL index from the whole `-wal` file (the
    /// index, in `-shm`, is reset by the first connection), and a checkpoint's progress is lost
    /// with it: a WAL that was only checkpointed would never restart and would grow for ever.
    /// So once it holds [`WAL_FRAMES`] frames, the connection closing copies it into the
    /// database and truncates it (`wal_checkpoint(TRUNCATE)`), without waiting: a reader holding
    /// it (another process) makes this a no-op, and a later close does it.
    fn settle_wal(&mut self) {
        let mut wal = self.path.as_os_str().to_owned();
        wal.push("-wal");
        let frames = std::fs::metadata(&wal).map_or(0, |m| m.len() / WAL_FRAME_BYTES);
        if frames < WAL_FRAMES {
            return;
        }
        if self.conn.busy_timeout(Duration::ZERO).is_ok() {
            // The first column is 1 when a reader or writer was in the way (nothing truncated).
            let busy = self
                .conn
                .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| {
                    r.get::<_, i64>(0)
                });
            tracing::debug!(
                frames,
                busy = busy.as_ref().ok(),
                error = busy.as_ref().err().map(tracing::field::display),
                "wal checkpoint (truncate) on close"
            );
        }
    }

    pub fn gateway_instance_id(&self) -> &str {
        &self.gateway_instance_id
    }

    /// Leaves this connection's checkpoints to another (the daemon's checkpointer thread): its
    /// commits do not run SQLite's automatic checkpoint, which runs inside the committing call
    /// — four `fsync`s, 2–3 ms on the benchmark VM, in the reply of one `leash exec` in ten.
    pub fn without_autocheckpoint(self) -> Result<Store, StoreError> {
        self.conn
            .pragma_update(None, "wal_autocheckpoint", 0)
            .map_err(|e| self.err(e))?;
        Ok(self)
    }

    /// Checkpoints the WAL once it holds [`WAL_FRAMES`] frames, waiting for nobody (`PASSIVE`:
    /// writers go on committing meanwhile, and the WAL restarts from its start once all of it is
    /// in the database). What a connection [`Store::without_autocheckpoint`] leaves to another.
    /// Returns the frames the WAL held, or `None` when it was not due.
    pub fn checkpoint_if_due(&self) -> Option<u64> {
        let mut wal = self.path.as_os_str().to_owned();
        wal.push("-wal");
        let frames = std::fs::metadata(&wal).map_or(0, |m| m.len() / WAL_FRAME_BYTES);
        if frames < WAL_FRAMES {
            return None;
        }
        let done = self
            .conn
            .query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| r.get::<_, i64>(2));
        tracing::debug!(
            frames,
            checkpointed = done.as_ref().ok(),
            error = done.as_ref().err().map(tracing::field::display),
            "wal checkpoint (passive)"
        );
        Some(frames)
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        self.settle_wal();
    }
}

/// The room kept for closing leases on a full disk: a file of this many bytes beside the
/// database (`leash.db-reserve`), allocated when a store opens and there is room, and removed
/// when a write that ends a lease finds the disk full (as databases keep ballast). A close's
/// claim and its end take a few WAL frames of 4 KiB each; this is room for hundreds.
pub const RESERVE_BYTES: u64 = 1 << 20;

/// The reserve beside the database at `db` (`leash.db-reserve`): see [`RESERVE_BYTES`].
fn reserve_path(db: &Path) -> PathBuf {
    let mut p = db.as_os_str().to_owned();
    p.push("-reserve");
    PathBuf::from(p)
}

/// Removes the reserve of the database at `db`; whether there was one.
fn give_back_reserve(db: &Path) -> bool {
    let p = reserve_path(db);
    match std::fs::remove_file(&p) {
        Ok(()) => {
            tracing::warn!(path = %p.display(), bytes = RESERVE_BYTES, "the state database's disk is full: gave back its reserve so that leases can still be read and closed; free some space (the reserve is kept again once there is room)");
            true
        }
        Err(_) => false,
    }
}

/// Allocates the reserve when it is missing (best effort: without room, there is none to keep).
fn keep_reserve(path: &Path) {
    use std::os::unix::fs::OpenOptionsExt;
    if std::fs::symlink_metadata(path).is_ok() {
        return;
    }
    let made = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path);
    let Ok(f) = made else {
        return;
    };
    // Blocks really allocated (a sparse file would give nothing back).
    use std::os::fd::AsRawFd;
    if nix::fcntl::posix_fallocate(f.as_raw_fd(), 0, RESERVE_BYTES as i64).is_err() {
        drop(f);
        let _ = std::fs::remove_file(path);
    }
}

/// One WAL frame: a 24-byte header and a page (the database keeps SQLite's default 4 KiB pages).
const WAL_FRAME_BYTES: u64 = 24 + 4096;

/// How many frames the WAL may hold before it is checkpointed: SQLite's automatic checkpoint at
/// a commit, and [`Store::settle_wal`] on close. Every process that opens the database first
/// replays the whole WAL (≈ 1.5 µs a frame here), and a checkpoint cycle costs four `fsync`s (the
/// checkpoint's two, then the new WAL's header and directory), ≈ 2-3 ms here; at ≈ 6 frames per
/// `leash exec`, 128 frames (≈ 0.5 MB) keeps the sum of the two near its minimum, ≈ 0.2 ms an
/// exec (docs/benchmarks.md, Host scale).
const WAL_FRAMES: u64 = 128;

/// Creates the database file mode 0600 when it is missing (SQLite would create it 0644 less the
/// umask: 0644 under umask 0 — and `-wal`/`-shm` copy the database's mode), and tightens one that
/// is looser. Never through a symlink.
fn create_private(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    // Only a missing file is made here: whatever stands at the path already (a database, or
    // something that is not one, like a directory) is SQLite's to open and to judge, so it is
    // reported as the state database it fails to be.
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
    {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    tighten(path);
    Ok(())
}

/// Makes an existing file 0600 when others (group, world) have any access to it.
fn tighten(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    if let Ok(m) = std::fs::symlink_metadata(path) {
        if m.is_file() && m.permissions().mode() & 0o077 != 0 {
            if let Err(e) = std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)) {
                tracing::warn!(path = %path.display(), error = %e, "cannot make the database 0600");
            }
        }
    }
}

/// `PRAGMA journal_mode=WAL`, waiting for a racing opener. On a fresh database (still in rollback
/// mode) two processes that switch at once both hold a read lock and both want to write the
/// header; SQLite answers the second `SQLITE_BUSY` at once, without calling the busy handler (it
/// would deadlock), so a busy timeout alone does not help: two first `leash exec`s on a new state
/// root, or one and a `leash leases` that opened the new file, failed in milliseconds with "locked
/// (waited 5000 ms)". The failed statement holds no lock, so it is retried until the busy timeout.
fn switch_to_wal(conn: &Connection, busy: Duration) -> rusqlite::Result<String> {
    let deadline = std::time::Instant::now() + busy;
    loop {
        match conn.query_row("PRAGMA journal_mode=WAL", [], |r| r.get::<_, String>(0)) {
            Err(rusqlite::Error::SqliteFailure(f, _))
                if f.code == rusqlite::ErrorCode::DatabaseBusy
                    && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(Duration::from_millis(2));
            }
            other => return other,
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    use crate::lease::{new_lease_id, now_ms};
    use leash_core::model::{Lease, LeaseState, ProcessId};

    fn temp_db() -> PathBuf {
        let dir = std::env::temp_dir().join(format!("leash-store-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        dir.join("leash.db")
    }

    fn lease(store: &Store, session: &str) -> Lease {
        Lease::builder(new_lease_id(), store.gateway_instance_id())
            .session(session)
            .wrapper("/w", "/w/leash-wrap")
            .root(4242, 1)
            .command(["x"])
            .owner(4241, 1)
            .started_at(now_ms())
            .build()
    }

    #[test]
    fn a_spec_goes_with_the_last_lease_of_its_key_and_no_other() {
        let db = temp_db();
        let mut store = Store::open(&db).unwrap();
        // Keys a LIKE pattern would confuse: '%' and '_' match anything there.
        let (gone, kept, live) = ("a%_", "a%x", "ab");
        let mut old = lease(&store, gone);
        old.state = LeaseState::Closed;
        old.closed_at = Some(1);
        store.insert_lease(&old, None, |_| None).unwrap();
        let mut recent = lease(&store, kept);
        recent.state = LeaseState::Closed;
        recent.closed_at = Some(now_ms());
        store.insert_lease(&recent, None, |_| None).unwrap();
        store
            .insert_lease(&lease(&store, live), None, |_| None)
            .unwrap();
        for k in [gone, kept, live, "never-leased"] {
            store
                .set_meta(&format!("{SPEC_KEY_PREFIX}{k}"), Some("{}"))
                .unwrap();
        }
        store.set_meta("unrelated", Some("v")).unwrap();
        assert_eq!(store.expire(1_000).unwrap(), 1);
        let spec = |k: &str| store.meta(&format!("{SPEC_KEY_PREFIX}{k}")).unwrap();
        assert_eq!(spec(gone), None);
        assert_eq!(spec("never-leased"), None);
        assert!(spec(kept).is_some());
        assert!(spec(live).is_some());
        assert_eq!(store.meta("unrelated").unwrap().as_deref(), Some("v"));
        drop(store);
        let _ = std::fs::remove_dir_all(db.parent().unwrap());
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
            .insert_lease(&b, None, |old| {
                Some(Superseded::lost(format!("{} gone", old.lease_id)))
            })
            .unwrap();
        assert_eq!(
            store.lease(&a.lease_id).unwrap().unwrap().state,
            LeaseState::Lost
        );
        // Tamper a row: a bad state and a pid of -1.
        store
            .conn
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

    fn wal_len(db: &Path) -> Option<u64> {
        let mut wal = db.as_os_str().to_owned();
        wal.push("-wal");
        std::fs::metadata(wal).ok().map(|m| m.len())
    }

    /// The WAL outlives a closing connection (no checkpoint, no `fsync`, no unlink on close: the
    /// next open creates no file), and it stays bounded: many short-lived connections, one
    /// commit each as `leash exec` makes them, truncate it once it reaches the limit, and every
    /// commit reads back from a fresh connection whether it was in the WAL or the database.
    #[test]
    fn the_wal_outlives_a_close_and_stays_bounded() {
        let db = temp_db();
        let mut ids = Vec::new();
        let (mut peak, mut truncations, mut last) = (0, 0, 0);
        for i in 0..200 {
            let mut store = Store::open(&db).unwrap();
            let l = lease(&store, &format!("s{i}"));
            store.insert_lease(&l, None, |_| None).unwrap();
            ids.push(l.lease_id);
            drop(store);
            let len = wal_len(&db).expect("the WAL is kept when the last connection closes");
            if i == 0 {
                assert!(
                    len > 0,
                    "the first commit is in the WAL, not checkpointed on close"
                );
            }
            if len < last {
                truncations += 1;
            }
            (peak, last) = (peak.max(len), len);
        }
        assert!(
            truncations >= 1,
            "the WAL was never truncated (peak {peak} bytes)"
        );
        // The limit, plus what one connection commits before it closes.
        assert!(
            peak <= (WAL_FRAMES + 32) * WAL_FRAME_BYTES,
            "the WAL grew to {peak} bytes"
        );
        let store = Store::open(&db).unwrap();
        for id in &ids {
            assert!(store.lease(id).unwrap().is_some(), "lease {id} lost");
        }
        let _ = std::fs::remove_dir_all(db.parent().unwrap());
    }

    /// A reader holding the WAL (another connection mid-read) makes the truncation a no-op,
    /// never a wait or an error: each close returns at once, and the first close after the
    /// reader is gone truncates.
    #[test]
    fn a_reader_defers_the_truncation_without_waiting() {
        let db = temp_db();
        drop(Store::open(&db).unwrap());
        let reader = Connection::open(&db).unwrap();
        // Mid-statement: its read transaction stays open until the statement is dropped.
        let mut read = reader.prepare("SELECT key FROM meta").unwrap();
        let mut rows = read.query([]).unwrap();
        assert!(rows.next().unwrap().is_some());
        let mut slowest = Duration::ZERO;
        for i in 0..120 {
            let mut store = Store::open(&db).unwrap();
            let l = lease(&store, &format!("s{i}"));
            store.insert_lease(&l, None, |_| None).unwrap();
            let t = std::time::Instant::now();
            drop(store);
            slowest = slowest.max(t.elapsed());
        }
        let held = wal_len(&db).unwrap();
        assert!(
            held > WAL_FRAMES * WAL_FRAME_BYTES,
            "the WAL ({held} bytes) never reached the limit, so nothing was deferred"
        );
        // The busy timeout is 5 s: a close that waited for the reader would show it.
        assert!(
            slowest < Duration::from_secs(2),
            "a close waited {slowest:?}"
        );
        // The read ends; the connection stays open (its own close, the last, would checkpoint).
        drop(rows);
        drop(read);
        drop(Store::open(&db).unwrap());
        assert_eq!(
            wal_len(&db),
            Some(0),
            "the first close after the read truncates"
        );
        drop(reader);
        let _ = std::fs::remove_dir_all(db.parent().unwrap());
    }

    /// The one write helper keeps all or nothing: a body that fails after writing leaves no
    /// trace, one that succeeds is committed.
    #[test]
    fn a_failed_write_leaves_nothing() {
        let (mut store, dir) = temp_store();
        let failed: Result<(), StoreError> = store.write(|tx, ctx| {
            tx.execute("INSERT INTO meta (key, value) VALUES ('k', 'v')", [])
                .map_err(|e| ctx.err(e))?;
            Err(StoreError::BadRow {
                lease_id: "x".into(),
                detail: "refused after the write".into(),
            })
        });
        assert!(failed.is_err());
        assert_eq!(store.meta("k").unwrap(), None);
        store
            .write(|tx, ctx| {
                tx.execute("INSERT INTO meta (key, value) VALUES ('k', 'v')", [])
                    .map_err(|e| ctx.err(e))
            })
            .unwrap();
        assert_eq!(store.meta("k").unwrap().as_deref(), Some("v"));
        let _ = std::fs::remove_dir_all(dir);
    }
}
