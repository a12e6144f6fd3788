//! The socket and the signals: binding the socket (0600, replacing a stale one), the
//! termination signals as a readable socket, and the connection threads that accept (one thread
//! per connection; the idle ones wait on the socket themselves: [`Pool`]).

use super::state::*;
use super::{conn, systemd};
use crate::state::StateRoot;

use std::fs;
use std::io::{self, Read};
use std::os::fd::AsFd;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

/// The socket `serve` listens on unless systemd passes one: `--socket`, else
/// `<state-dir>/leash.sock`, made absolute (the lock file names it for clients).
pub(super) fn requested_path(root: &StateRoot, cfg: &ServeConfig) -> Result<PathBuf, ServeError> {
    let socket = cfg.socket.clone().unwrap_or_else(|| root.socket_path());
    let socket = absolute(&socket);
    if socket.as_os_str().len() > MAX_SOCKET_PATH {
        return Err(ServeError::PathTooLong(socket));
    }
    Ok(socket)
}

/// A socket passed by systemd replaces --socket (the unit names the path once, in
/// leash.socket).
pub(super) fn activated_path(
    activated: &Option<(UnixListener, Option<PathBuf>)>,
) -> Option<PathBuf> {
    match activated {
        Some((_, Some(path))) => Some(path.clone()),
        _ => None,
    }
}

/// The listening socket, bound here or passed by systemd.
pub(super) struct Listening {
    pub(super) listener: UnixListener,
    /// The socket came from systemd (socket activation).
    pub(super) activated: bool,
    /// Under socket activation, the pid that listen()ed on it (see [`LockInfo::listener_pid`]).
    pub(super) listener_pid: Option<i32>,
    /// The socket file as bound (device, inode), to remove only our own at the end.
    pub(super) bound: Option<(u64, u64)>,
}

/// Listens: on the socket systemd passed, or on `socket`, bound now.
pub(super) fn listen(
    socket: &Path,
    activated: Option<(UnixListener, Option<PathBuf>)>,
) -> Result<Listening, ServeError> {
    let me = crate::proc::self_id().pid;
    let is_activated = activated.is_some();
    let listener_pid = activated
        .as_ref()
        .and_then(|(l, _)| systemd::listener_pid(l))
        .filter(|&p| p != me);
    let listener = match activated {
        Some((l, _)) => {
            l.set_nonblocking(true).map_err(|source| ServeError::Io {
                path: socket.to_path_buf(),
                source,
            })?;
            tracing::info!(socket = %socket.display(), "serving the socket passed by systemd (socket activation)");
            l
        }
        None => bind_socket(socket)?,
    };
    Ok(Listening {
        listener,
        activated: is_activated,
        listener_pid,
        bound: inode(socket),
    })
}

fn inode(p: &Path) -> Option<(u64, u64)> {
    fs::metadata(p).map(|m| (m.dev(), m.ino())).ok()
}

/// Removes the socket only if it is still the one we bound (an activated socket is systemd's:
/// it keeps listening and starts the next daemon on the next connection).
pub(super) fn remove_if_ours(d: &Daemon, socket: &Path, bound: Option<(u64, u64)>) {
    if !d.activated && inode(socket) == bound {
        let _ = fs::remove_file(socket);
    }
}

pub(super) fn absolute(p: &Path) -> PathBuf {
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        std::env::current_dir()
            .map(|d| d.join(p))
            .unwrap_or_else(|_| p.to_path_buf())
    }
}

/// Binds the socket (mode 0600 from the start), replacing a stale one.
pub(super) fn bind_socket(path: &Path) -> Result<UnixListener, ServeError> {
    let io_err = |source| ServeError::Io {
        path: path.to_path_buf(),
        source,
    };
    match fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => {
            if UnixStream::connect(path).is_ok() {
                return Err(ServeError::SocketInUse(path.to_path_buf()));
            }
            tracing::info!(socket = %path.display(), "replacing a stale socket (nothing answers on it)");
            fs::remove_file(path).map_err(io_err)?;
        }
        Ok(_) => return Err(ServeError::NotASocket(path.to_path_buf())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(io_err(e)),
    }
    // The umask makes the socket 0600 at bind(2), with no window in which others could
    // connect; serve runs this before it starts any thread, so the process-wide umask is ours.
    let old = nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o177));
    let bound = UnixListener::bind(path);
    nix::sys::stat::umask(old);
    let listener = bound.map_err(io_err)?;
    let mode = fs::metadata(path).map_err(io_err)?.permissions().mode() & 0o777;
    if mode != 0o600 {
        // Only where the umask did not apply (some filesystems ignore it for sockets).
        fs::set_permissions(path, fs::Permissions::from_mode(0o600)).map_err(io_err)?;
    }
    listener.set_nonblocking(true).map_err(io_err)?;
    Ok(listener)
}

/// The signals `serve` waits for, each kind as a readable socket with a write end that makes it
/// readable as the signal does.
pub(super) struct Signals {
    /// SIGTERM or SIGINT: shut down.
    pub(super) stop: UnixStream,
    /// Makes `stop` readable (the shutdown of a headless daemon, see [`headless`]).
    pub(super) stop_wake: UnixStream,
    /// SIGHUP: upgrade (a handoff to the daemon's program, `upgrade.rs`).
    pub(super) upgrade: UnixStream,
    /// Makes `upgrade` readable (the `upgrade` op).
    pub(super) upgrade_wake: UnixStream,
}

pub(super) fn watch_signals() -> Result<Signals, ServeError> {
    let pair = |sigs: &[i32]| -> io::Result<(UnixStream, UnixStream)> {
        let (read, write) = UnixStream::pair()?;
        write.set_nonblocking(true)?;
        read.set_nonblocking(true)?;
        let wake = write.try_clone()?;
        for &sig in sigs {
            signal_hook::low_level::pipe::register(sig, write.try_clone()?)?;
        }
        Ok((read, wake))
    };
    let (stop, stop_wake) = pair(&[signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT])
        .map_err(ServeError::Signals)?;
    let (upgrade, upgrade_wake) =
        pair(&[signal_hook::consts::SIGHUP]).map_err(ServeError::Signals)?;
    // Blocked across a handoff's exec (their handlers are installed now): pending, they come
    // to the handlers from here on.
    crate::sys::block_stop_signals(false);
    Ok(Signals {
        stop,
        stop_wake,
        upgrade,
        upgrade_wake,
    })
}

/// Why the accept loop returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Stop {
    /// SIGTERM, SIGINT, a headless daemon: shut down.
    Shutdown,
    /// SIGHUP or the `upgrade` op: hand over to a new program, then (when that did not
    /// happen) accept again.
    Upgrade,
}

/// Serves connections until a signal (or a wake-up) says to stop, and why.
pub(super) fn accept_loop(d: &Arc<Daemon>, listener: &UnixListener, signals: &Signals) -> Stop {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    let pool = match Pool::new(listener) {
        Ok(p) => Arc::new(p),
        Err(e) => {
            tracing::error!(error = %e, "cannot set up the connection threads; shutting down");
            return Stop::Shutdown;
        }
    };
    pool.start(d);
    // The connection threads accept: this thread waits for a signal only.
    let stop = loop {
        let mut fds = [
            PollFd::new(signals.stop.as_fd(), PollFlags::POLLIN),
            PollFd::new(signals.upgrade.as_fd(), PollFlags::POLLIN),
        ];
        match poll(&mut fds, PollTimeout::NONE) {
            Ok(_) => {}
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => {
                tracing::error!(error = %e, "poll failed; shutting down");
                break Stop::Shutdown;
            }
        }
        if fds[0].revents().is_some_and(|r| !r.is_empty()) {
            if !d.headless.load(Ordering::SeqCst) {
                tracing::info!("termination signal received; shutting down");
            }
            break Stop::Shutdown;
        }
        if fds[1].revents().is_some_and(|r| !r.is_empty()) {
            drain(&signals.upgrade);
            break Stop::Upgrade;
        }
    };
    // New connections wait in the listening socket's backlog from here on.
    pool.close();
    stop
}

/// Empties a signal socket (the bytes the handler or a wake-up wrote).
fn drain(s: &UnixStream) {
    let mut buf = [0u8; 64];
    while matches!((&*s).read(&mut buf), Ok(n) if n > 0) {}
}

/// How many connection threads wait, idle, for the next connection.
const IDLE_WORKERS: usize = 2;

/// The connection threads. Each connection has a thread of its own for its whole life; the
/// threads that have none wait on the listening socket themselves (each on an epoll instance of
/// its own, `EPOLLEXCLUSIVE`: a connection wakes one of them), accept, and serve. So a
/// connection is served by the thread its `connect` woke: no accept thread wakes first to hand
/// it over (one wake-up and two context switches less on every `leash exec`). A thread
/// that takes a connection while no other waits starts one that does; one done with its
/// connection waits for the next, up to [`IDLE_WORKERS`] of them, and ends beyond that. They
/// stop waiting when the daemon stops ([`Pool::close`]); a thread still serving ends after its
/// connection.
struct Pool {
    /// The listening socket (a descriptor of our own on it), until the pool closes: then only
    /// `serve`'s own is left, which it closes once the sessions are closed.
    listener: Mutex<Option<UnixListener>>,
    stop: crate::sys::Latch,
    state: Mutex<PoolState>,
}

#[derive(Default)]
struct PoolState {
    /// Threads waiting on the listener, or started to.
    waiting: usize,
    closed: bool,
}

const LISTENER: u64 = 0;
const STOP: u64 = 1;

impl Pool {
    fn new(listener: &UnixListener) -> io::Result<Pool> {
        Ok(Pool {
            listener: Mutex::new(Some(listener.try_clone()?)),
            stop: crate::sys::Latch::new()?,
            state: Mutex::new(PoolState::default()),
        })
    }

    fn state(&self) -> MutexGuard<'_, PoolState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Starts a thread that waits for a connection.
    fn start(self: &Arc<Self>, d: &Arc<Daemon>) {
        {
            let mut st = self.state();
            if st.closed {
                return;
            }
            st.waiting += 1;
        }
        let (d, pool) = (d.clone(), self.clone());
        // Started by a raised connection thread, the new one would inherit the raise and raise
        // itself again: it starts at the daemon's priority and raises itself once.
        let _lowered = super::priority::lowered();
        let spawned = std::thread::Builder::new()
            .name("conn".into())
            .spawn(move || worker(&d, &pool));
        if let Err(e) = spawned {
            self.gone();
            tracing::error!(error = %e, "cannot start a connection thread");
        }
    }

    /// The next connection, or `None` once the pool closed (or waiting failed).
    fn accept(&self, d: &Daemon, ready: &crate::sys::Readable) -> Option<UnixStream> {
        loop {
            match ready.wait() {
                Ok(LISTENER) => {}
                Ok(_) => return None,
                Err(e) => {
                    tracing::error!(error = %e, "cannot wait for connections");
                    return None;
                }
            }
            let guard = self.listener.lock().unwrap_or_else(|p| p.into_inner());
            let listener = guard.as_ref()?;
            match listener.accept() {
                Ok((stream, _)) => return Some(stream),
                // Another thread took it (an exclusive wake may wake more than one).
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    // EMFILE and friends: log (once a period), let the others try, come back
                    // later.
                    drop(guard);
                    if let Some(unlogged) = d.accept_failures.due() {
                        tracing::warn!(error = %e, "accept failed (logged once a minute; {unlogged} more since the last line)");
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        }
    }

    /// A waiting thread took a connection: when no other waits, one is started.
    fn took_one(self: &Arc<Self>, d: &Arc<Daemon>) {
        let none_left = {
            let mut st = self.state();
            st.waiting -= 1;
            st.waiting == 0
        };
        if none_left {
            self.start(d);
        }
    }

    /// A thread is done with its connection: whether it waits for the next one.
    fn wait_again(&self) -> bool {
        let mut st = self.state();
        if st.closed || st.waiting >= IDLE_WORKERS {
            return false;
        }
        st.waiting += 1;
        true
    }

    /// What a new thread waits on: the listening socket and the stop (`None`: closed already).
    fn waiter(&self) -> io::Result<Option<crate::sys::Readable>> {
        let guard = self.listener.lock().unwrap_or_else(|p| p.into_inner());
        guard
            .as_ref()
            .map(|l| {
                crate::sys::Readable::new(&[
                    (l.as_fd(), LISTENER, true),
                    (self.stop.as_fd(), STOP, false),
                ])
            })
            .transpose()
    }

    /// A thread that was counted as waiting ends without a connection.
    fn gone(&self) {
        self.state().waiting -= 1;
    }

    /// The daemon stops: the waiting threads end, and the listening socket is ours no longer.
    fn close(&self) {
        self.state().closed = true;
        self.stop.set();
        self.listener
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
    }
}

/// A connection thread: waits for a connection, serves it, and again while it is wanted.
fn worker(d: &Arc<Daemon>, pool: &Arc<Pool>) {
    // Above the adapters for the thread's life (see `priority`).
    super::priority::raise();
    // Counted as waiting from its start: it must come to wait, or no thread might accept.
    let ready = loop {
        match pool.waiter() {
            Ok(Some(r)) => break r,
            Ok(None) => return pool.gone(),
            Err(e) => {
                // EMFILE and friends, as for `accept`: try again a little later.
                tracing::warn!(error = %e, "a connection thread cannot wait for connections yet");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    };
    loop {
        let Some(stream) = pool.accept(d, &ready) else {
            return pool.gone();
        };
        pool.took_one(d);
        conn::serve_connection(d.clone(), stream);
        if !pool.wait_again() {
            return;
        }
    }
}
