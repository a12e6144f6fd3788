//! The lock file: one daemon per state root (an exclusive `flock` on
//! `<state-dir>/daemon.lock`), and what it tells clients (the pid and the socket).

use super::state::*;
use crate::lease::now_ms;
use crate::state::StateRoot;
use nix::fcntl::{Flock, FlockArg};
use serde::{Deserialize, Serialize};
use std::fs::{File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// What the lock file says, for clients and for the refusal message of a second daemon.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LockInfo {
    pub pid: i32,
    pub socket: PathBuf,
    pub started_at: i64,
    /// Under socket activation, the pid that called listen() on the socket (the service
    /// manager): clients see it, not the daemon, as their peer (`SO_PEERCRED`), so they trust it
    /// for this socket too. Absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub listener_pid: Option<i32>,
}

/// How long a starting daemon waits for clients' shared probes of the lock file to end before it
/// gives up (a probe lasts microseconds; this bounds a client descheduled while holding one).
pub(super) const LOCK_PROBE_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// Takes the state root's daemon lock, or says who holds it.
pub(super) fn lock_state_root(root: &StateRoot, socket: &Path) -> Result<Flock<File>, ServeError> {
    let path = root.daemon_lock_path();
    let io_err = |source| ServeError::Io {
        path: path.clone(),
        source,
    };
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        // Never through a symlink: the lock file is trusted by clients (it names the daemon).
        .custom_flags(libc::O_NOFOLLOW)
        .open(&path)
        .map_err(io_err)?;
    // Clients probe the lock with a momentary shared lock (`client::daemon_pid`): a start that
    // meets only that probe waits for it instead of refusing as if a daemon held the root. A
    // daemon holds the lock exclusively, so a shared lock we can take means no daemon does.
    let deadline = std::time::Instant::now() + LOCK_PROBE_WAIT;
    let mut file = file;
    let refused = loop {
        match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(lock) => return Ok(lock),
            Err((f, nix::errno::Errno::EWOULDBLOCK)) => {
                match Flock::lock(f, FlockArg::LockSharedNonblock) {
                    Ok(shared) if std::time::Instant::now() < deadline => {
                        file = shared
                            .unlock()
                            .map_err(|(_, e)| io_err(io::Error::from(e)))?;
                        std::thread::sleep(std::time::Duration::from_millis(5));
                    }
                    Ok(shared) => {
                        break shared
                            .unlock()
                            .map_err(|(_, e)| io_err(io::Error::from(e)))?
                    }
                    Err((f, _)) => break f,
                }
            }
            Err((_, errno)) => return Err(io_err(io::Error::from(errno))),
        }
    };
    let mut file = refused;
    let mut text = String::new();
    let _ = file.read_to_string(&mut text);
    let held: Option<LockInfo> = serde_json::from_str(&text).ok();
    Err(ServeError::AlreadyRunning {
        pid: held
            .as_ref()
            .map_or("unknown".into(), |h| h.pid.to_string()),
        root: root.dir().to_path_buf(),
        socket: held
            .map(|h| h.socket)
            .unwrap_or_else(|| socket.to_path_buf())
            .display()
            .to_string(),
    })
}

pub(super) fn write_lock_info(lock: &Flock<File>, info: &LockInfo) {
    use std::os::unix::fs::FileExt;
    let text = serde_json::to_string(info).expect("serialisable");
    let _ = lock.set_len(0);
    if let Err(e) = lock.write_all_at(text.as_bytes(), 0) {
        tracing::warn!(error = %e, "cannot write the lock file; clients will look for the default socket");
    }
}

/// Names the daemon in the lock file (its pid, its socket, when it started): clients find the
/// socket there and trust the peer with that pid. Returns the start time written.
pub(super) fn name_the_daemon(lock: &Flock<File>, socket: &Path, listener_pid: Option<i32>) -> i64 {
    let info = LockInfo {
        pid: crate::proc::self_id().pid,
        socket: socket.to_path_buf(),
        started_at: now_ms(),
        listener_pid,
    };
    write_lock_info(lock, &info);
    info.started_at
}
