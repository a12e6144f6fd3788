//! The socket and the signals: binding the socket (0600, replacing a stale one), the
//! termination signals as a readable socket, and the accept loop (one thread per connection,
//! taken from the idle connection threads when one waits: [`Workers`]).

use super::*;

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

/// Longest socket path `bind` accepts (sun_path is 108 bytes, NUL included).
pub(super) const MAX_SOCKET_PATH: usize = 107;

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

/// A socket that becomes readable when SIGTERM, SIGINT or SIGHUP arrives, and a write end that
/// makes it readable as they do (see [`headless`]).
pub(super) fn watch_signals() -> Result<(UnixStream, UnixStream), ServeError> {
    let (read, write) = UnixStream::pair().map_err(ServeError::Signals)?;
    write.set_nonblocking(true).map_err(ServeError::Signals)?;
    let wake = write.try_clone().map_err(ServeError::Signals)?;
    for sig in [
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGHUP,
    ] {
        let w = write.try_clone().map_err(ServeError::Signals)?;
        signal_hook::low_level::pipe::register(sig, w).map_err(ServeError::Signals)?;
    }
    Ok((read, wake))
}

pub(super) fn accept_loop(d: &Arc<Daemon>, listener: &UnixListener, signals: &UnixStream) {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    let workers = Workers::new();
    loop {
        let mut fds = [
            PollFd::new(listener.as_fd(), PollFlags::POLLIN),
            PollFd::new(signals.as_fd(), PollFlags::POLLIN),
        ];
        match poll(&mut fds, PollTimeout::NONE) {
            Ok(_) => {}
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => {
                tracing::error!(error = %e, "poll failed; shutting down");
                return;
            }
        }
        let ready = |f: &PollFd<'_>| f.revents().is_some_and(|r| !r.is_empty());
        if ready(&fds[1]) {
            if !d.headless.load(Ordering::SeqCst) {
                tracing::info!("termination signal received; shutting down");
            }
            return;
        }
        if !ready(&fds[0]) {
            continue;
        }
        loop {
            match listener.accept() {
                Ok((stream, _)) => workers.serve(d, stream),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    // EMFILE and friends: log and let poll come back to it.
                    tracing::warn!(error = %e, "accept failed");
                    std::thread::sleep(Duration::from_millis(50));
                    break;
                }
            }
        }
    }
}

/// How many connection threads wait, idle, for the next connection.
const IDLE_WORKERS: usize = 2;

/// A connection for an idle connection thread, sent on that thread's own channel.
type Handoff = std::sync::mpsc::SyncSender<UnixStream>;

/// The connection threads that finished a connection and wait for the next one. Each
/// connection still has a thread of its own for its whole life, as before; a thread that is
/// done with one takes the next instead of exiting, so a short request (`leash exec`'s one
/// `exec`, a `ping`) is not preceded by a thread's start and followed by its teardown (issue
/// 24). At most [`IDLE_WORKERS`] wait, each on a channel of its own (a handoff wakes that one
/// thread only), the last to finish served first; when none waits, a new one starts. They end
/// with the accept loop (their channels are dropped with it).
struct Workers {
    idle: Arc<Mutex<Idle>>,
}

/// The idle threads' channels, and whether the accept loop ended (then no thread parks again).
#[derive(Default)]
struct Idle {
    waiting: Vec<Handoff>,
    closed: bool,
}

impl Workers {
    fn new() -> Workers {
        Workers {
            idle: Arc::new(Mutex::new(Idle::default())),
        }
    }

    /// Serves the connection on an idle thread, else on a new one.
    fn serve(&self, d: &Arc<Daemon>, stream: UnixStream) {
        let waiting = self
            .idle
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .waiting
            .pop();
        let stream = match waiting {
            Some(handoff) => match handoff.send(stream) {
                Ok(()) => return,
                // That thread is gone (it cannot be while it waits): start another.
                Err(e) => e.0,
            },
            None => stream,
        };
        let (d, idle) = (d.clone(), self.idle.clone());
        let spawned = std::thread::Builder::new()
            .name("conn".into())
            .spawn(move || worker(d, stream, &idle));
        if let Err(e) = spawned {
            tracing::error!(error = %e, "cannot start a connection thread");
        }
    }
}

impl Drop for Workers {
    /// The accept loop ended: the idle threads' channels close, and they end; a thread still
    /// serving its connection ends after it instead of parking.
    fn drop(&mut self) {
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        idle.closed = true;
        idle.waiting.clear();
    }
}

/// A connection thread: serves its first connection, then the ones it is handed while idle.
fn worker(d: Arc<Daemon>, first: UnixStream, idle: &Mutex<Idle>) {
    let mut stream = first;
    loop {
        conn::serve_connection(d.clone(), stream);
        // The only sender goes to the idle list: dropped from there (the accept loop ended),
        // the wait below ends too.
        let (handoff, next) = std::sync::mpsc::sync_channel(1);
        {
            let mut idle = idle.lock().unwrap_or_else(|p| p.into_inner());
            if idle.closed || idle.waiting.len() >= IDLE_WORKERS {
                return;
            }
            idle.waiting.push(handoff);
        }
        match next.recv() {
            Ok(s) => stream = s,
            Err(_) => return, // the accept loop ended
        }
    }
}
