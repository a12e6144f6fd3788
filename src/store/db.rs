//! The open database as every file of the store sees it: the [`Store`] handle (its methods are
//! in the file of the table they touch; opening and the write transaction in `mod.rs`), the
//! busy timeout, the [`StoreError`]s, and how a SQLite error becomes one.

use leash_core::kind::{HasKind, Kind};
use rusqlite::Connection;
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
    #[error(
        "{path}: this state root is in use with gateway instance id {ours}, and the acpx \
         extension's is {theirs}; importing makes the incumbent's id this root's own (so its \
         wrappers' markers agree with leash's): pass --adopt-gateway-id to adopt it; nothing \
         imported"
    )]
    GatewayIdInUse {
        path: PathBuf,
        ours: String,
        theirs: String,
    },
    #[error(
        "{path}: refusing to adopt gateway instance id {theirs}: {active} lease(s) or imported \
         acpx record(s) of this root are open, and their processes carry {ours} (after adoption \
         leash would take them for another gateway's and never clean them up): close them (or \
         let `leash reap` end them) and retry; nothing imported"
    )]
    GatewayIdBusy {
        path: PathBuf,
        ours: String,
        theirs: String,
        active: i64,
    },
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
    #[error("cannot create the state database {path}: {source}")]
    Create {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("state database {path}: {source}")]
    Sqlite {
        path: PathBuf,
        #[source]
        source: rusqlite::Error,
    },
}

impl StoreError {
    /// The filesystem of the state database has no room left (SQLite's `SQLITE_FULL`, or
    /// `ENOSPC`/`EDQUOT` creating it).
    pub fn is_disk_full(&self) -> bool {
        match self {
            StoreError::Sqlite {
                source: rusqlite::Error::SqliteFailure(f, _),
                ..
            } => f.code == rusqlite::ErrorCode::DiskFull,
            StoreError::Create { source, .. } => {
                matches!(source.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT))
            }
            _ => false,
        }
    }

    /// SQLite's `SQLITE_IOERR` (among its causes: no room to grow the `-shm` index).
    pub fn is_io_error(&self) -> bool {
        matches!(self, StoreError::Sqlite {
            source: rusqlite::Error::SqliteFailure(f, _),
            ..
        } if f.code == rusqlite::ErrorCode::SystemIoFailure)
    }
}

impl HasKind for StoreError {
    fn kind(&self) -> Kind {
        match self {
            StoreError::SessionBusy { .. } => Kind::Conflict,
            StoreError::Unstorable { .. } => Kind::Usage,
            _ => Kind::Internal,
        }
    }
}

pub struct Store {
    pub(super) conn: Connection,
    pub(super) path: PathBuf,
    pub(super) gateway_instance_id: String,
    pub(super) busy: Duration,
}

/// What a write needs to turn a SQLite error into a [`StoreError`] while the connection is
/// borrowed by its transaction.
#[derive(Clone, Copy)]
pub(super) struct Ctx<'a> {
    pub(super) path: &'a Path,
    pub(super) busy: Duration,
}

impl Ctx<'_> {
    pub(super) fn err(&self, e: rusqlite::Error) -> StoreError {
        map_err(self.path, self.busy, e)
    }
}

pub(super) fn map_err(path: &Path, busy: Duration, e: rusqlite::Error) -> StoreError {
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
