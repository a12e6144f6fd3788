//! `leash serve`: the supervisor daemon. It owns the wrappers of the sessions it spawns (it is
//! their parent, hence the owner in their leases), so sessions outlive the clients that asked
//! for them; clients talk to it over a Unix socket with newline-delimited JSON
//! ([`protocol`], `docs/protocol.md`).
//!
//! `serve` reads as a checklist: `watch_signals → lock_state_root → bind_metrics →
//! startup_reap → enter_containment → take_interrupted → listen → name_the_daemon`, then an
//! accept loop (one thread per connection, see [`conn`]) beside a housekeeping thread (idle
//! close, event sync, pruning of ended sessions), and on SIGTERM/SIGINT/SIGHUP `shutdown`:
//! record the busy sessions, close every session through the normal close path, remove the
//! socket, exit 0.
//!
//! By concern: this file holds the daemon's state (its controller and its database
//! connections), the close every path goes through, and `serve` with its steps; `lock.rs` the
//! lock file; `socket.rs` the socket, the signals and the accept loop; `startup.rs` the start-up
//! reap and the daemon's leaf cgroup; `status.rs` `status` and the usage sampling;
//! `housekeeping.rs` the housekeeping thread; `shutdown.rs` the shutdown and the resumable
//! sessions it leaves; `conn.rs` (and one file per op in `conn/`) a client connection.
//!
//! One daemon per state root: an exclusive `flock` on `<state-dir>/daemon.lock`, which also
//! tells clients where the socket is. The kernel drops the lock when the daemon dies, however it
//! dies, so a stale lock cannot exist; a stale socket file can, and is found by probing and
//! replaced. If the daemon is SIGKILLed its wrappers see their parent die and take their
//! adapters down; the next daemon's startup reap settles their leases.

mod admission;
mod checkpoint;
mod housekeeping;
mod lock;
mod shutdown;
mod socket;
mod startup;
mod status;
pub use lock::LockInfo;
use socket::MAX_SOCKET_PATH;
mod conn;
pub mod metrics;
pub(crate) mod priority;
mod push;
mod reconcile;
pub mod session;
pub mod spec;
mod stdin_pipe;
mod systemd;

use crate::controller::{CloseOutcome, Controller, LeaseRef, LifecycleError};
use crate::lease::now_ms;
use crate::proc::LiveTable;
use crate::protocol::{self, Phase};
use crate::state::StateRoot;
use crate::store::{Store, StoreError};
use leash_core::kind::{HasKind, Kind};
use leash_core::model::ProcessId;
use leash_core::plan::ReapOptions;
use nix::fcntl::{Flock, FlockArg};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use session::{Limits, Supervised};
use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read};
use std::os::fd::AsFd;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Receiver;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// Where to listen (default `<state-dir>/leash.sock`).
    pub socket: Option<PathBuf>,
    /// Close sessions without traffic for this long (never a busy one).
    pub idle_close: Option<Duration>,
    pub replay: Limits,
    /// Grace of sessions whose `ensure` gives none.
    pub default_grace_ms: u64,
    /// Retention of closed/lost leases for the startup reap.
    pub retention: Duration,
    /// Run the orphans-only reap of the state root this often (`None`: never).
    pub reconcile_interval: Option<Duration>,
    /// Serve the metrics over HTTP on this address.
    pub metrics: Option<std::net::SocketAddr>,
    /// How long `ensure` watches a new adapter for an early death (see `Supervised::await_early_exit`).
    pub ensure_wait: Duration,
}

/// `serve --ensure-wait-ms` by default: no wait. An `ensure` answers once the adapter started;
/// an exit before its first line of output is a start failure told by the stream, whenever it
/// comes (a 200 ms watch made the answer depend on whether the crash fell inside it).
pub const DEFAULT_ENSURE_WAIT: Duration = Duration::ZERO;

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("another leash serve (pid {pid}) already serves state root {root} (socket {socket}); stop it first, or use another --state-dir")]
    AlreadyRunning {
        pid: String,
        root: PathBuf,
        socket: String,
    },
    #[error("something already answers on socket {0}; not replacing it (stop it, or choose another --socket)")]
    SocketInUse(PathBuf),
    #[error("{0} exists and is not a socket; refusing to replace it (choose another --socket)")]
    NotASocket(PathBuf),
    #[error("socket path {0} is longer than {MAX_SOCKET_PATH} bytes; choose a shorter --socket or --state-dir")]
    PathTooLong(PathBuf),
    #[error("cannot use {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Lifecycle(#[from] LifecycleError),
    #[error("cannot install signal handlers: {0}")]
    Signals(io::Error),
    #[error(transparent)]
    Activation(#[from] systemd::ActivationError),
    #[error("the state directory {0} was removed or replaced while the daemon ran; it closed its sessions and stopped (start leash serve again to serve a new state root there)")]
    StateRootGone(PathBuf),
    #[error("cannot serve metrics on {addr}: {source} (choose another --metrics address)")]
    Metrics {
        addr: std::net::SocketAddr,
        #[source]
        source: io::Error,
    },
}

impl HasKind for ServeError {
    fn kind(&self) -> Kind {
        match self {
            ServeError::AlreadyRunning { .. }
            | ServeError::SocketInUse(_)
            | ServeError::Metrics { .. } => Kind::Conflict,
            _ => Kind::Internal,
        }
    }
}

/// The daemon's state shared by every thread.
pub(crate) struct Daemon {
    root: StateRoot,
    /// Containment as resolved at start, after the daemon entered its leaf (the mount, the
    /// roots, the mode; `status` re-reads only the controllers).
    containment: crate::cgroup::Containment,
    cfg: ServeConfig,
    exe: PathBuf,
    me: ProcessId,
    started_at: i64,
    socket: PathBuf,
    sessions: Mutex<HashMap<String, Arc<Supervised>>>,
    /// Keys whose `ensure` is in flight, and the closes that meet them (`admission`).
    admission: admission::Admission,
    /// The one controller every verb of the daemon runs on: the `close`, `cancel`, `reap`,
    /// `leases`, `events`, `verify` and sessions query ops, idle close, shutdown, the settle of a
    /// wrapper that exited, and the reconcile passes. Its store connection (a writer, as each
    /// request's controller was) is taken per database step, never across a grace, so closes of
    /// different leases still run their graces together.
    ctl: Arc<Controller<'static>>,
    /// The daemon's own reads (the sessions rows, the lease watch). Never held across a
    /// write: the daemon's writes go through `session_store` ([`Daemon::writer`]) or its
    /// controller. In WAL mode a read does not wait for the writer either, and sees everything
    /// committed before it began.
    store: Mutex<Store>,
    /// The health checks' own read connection (`status`, the metrics' lease counts): no other
    /// thread holds it, so a health check never waits behind a request or the housekeeping
    /// thread's reads (which run at the daemon's priority, below the connection threads).
    health_store: Mutex<Store>,
    /// The one connection all sessions write their seqs and events through (a connection per
    /// session leaked two descriptors per session that ever ran).
    session_store: session::SharedStore,
    /// The connection the `exec` op commits leases through (`conn/exec.rs`): not the sessions'
    /// writer, so a lease commit never waits behind their output, nor they behind it.
    exec_store: Mutex<Store>,
    /// The exec connection's checkpoints, done by a thread of their own (`checkpoint.rs`).
    checkpoints: checkpoint::Checkpoints,
    shutting_down: AtomicBool,
    /// Sessions that were busy when the previous daemon stopped, until they are ensured again.
    resumable: Mutex<Vec<protocol::Resumable>>,
    startup_reap: protocol::StartupReap,
    metrics: metrics::Metrics,
    /// The last reconcile pass, for `status`.
    last_reconcile: Mutex<Value>,
    /// The socket came from systemd: it is systemd's to remove, not ours.
    activated: bool,
    /// Connections subscribed to lifecycle pushes (`hello {"events": true}`).
    push: push::Hub,
    /// The connections each peer process holds, under a cap (`socket::PeerConnections`).
    peers: socket::PeerConnections,
    /// Failed accepts (out of descriptors): logged once a period.
    accept_failures: socket::RateLog,
    /// The contained sessions' usage as `status` last sampled it (see [`Daemon::usage_for`]).
    usage: Mutex<status::UsageCache>,
    /// The state directory and the socket as the daemon found them at start (device, inode):
    /// see [`headless`]. No socket here under socket activation (the path is systemd's).
    root_inode: Option<(u64, u64)>,
    socket_inode: Option<(u64, u64)>,
    /// Wakes the accept loop as a termination signal does (the shutdown of a headless daemon).
    wake: UnixStream,
    /// Set when the daemon stops because its state directory or socket went away.
    headless: AtomicBool,
}

impl Daemon {
    fn sessions(&self) -> MutexGuard<'_, HashMap<String, Arc<Supervised>>> {
        self.sessions.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The read connection (see the field): for reads only.
    fn store(&self) -> MutexGuard<'_, Store> {
        self.store.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The health checks' read connection (see the field).
    fn health_store(&self) -> MutexGuard<'_, Store> {
        self.health_store.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The write connection the sessions share, for the daemon's own writes.
    fn writer(&self) -> MutexGuard<'_, Store> {
        self.session_store.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The `exec` op's write connection (see the field).
    fn exec_store(&self) -> MutexGuard<'_, Store> {
        self.exec_store.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn session(&self, key: &str) -> Option<Arc<Supervised>> {
        self.sessions().get(key).cloned()
    }

    fn session_by_lease(&self, lease_id: &str) -> Option<Arc<Supervised>> {
        self.sessions()
            .values()
            .find(|s| s.lease_id() == Some(lease_id))
            .cloned()
    }

    fn all_sessions(&self) -> Vec<Arc<Supervised>> {
        let mut v: Vec<Arc<Supervised>> = self.sessions().values().cloned().collect();
        v.sort_by(|a, b| a.key.cmp(&b.key));
        v
    }

    fn is_shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::SeqCst)
    }

    /// Closes leases through the lifecycle controller, sessions of this daemon included: they
    /// are marked closing first (so later requests see it) and settled after. Every close path
    /// of the daemon — the `close` op, idle close, shutdown — comes through here.
    fn close(
        &self,
        refs: &[LeaseRef],
        grace_ms: Option<u64>,
        why: &str,
    ) -> Result<Vec<CloseOutcome>, LifecycleError> {
        let mut marked: Vec<Arc<Supervised>> = Vec::new();
        for r in refs {
            let s = match r {
                LeaseRef::Session(k) => self.session(k),
                LeaseRef::Id(id) => self.session_by_lease(id),
            };
            if let Some(s) = s {
                if s.begin_close() {
                    tracing::info!(session = %s.key, reason = why, "closing session");
                    marked.push(s);
                }
            }
        }
        self.close_marked(&marked, refs, grace_ms)
    }

    /// The second half of [`Daemon::close`], for callers that marked their sessions closing
    /// themselves (idle close decides and marks atomically). Every close of the daemon comes
    /// here: an ensure of a marked session's key in flight is met as the `close` op meets it
    /// (see `admission`), so it answers with this close's outcome.
    fn close_marked(
        &self,
        marked: &[Arc<Supervised>],
        refs: &[LeaseRef],
        grace_ms: Option<u64>,
    ) -> Result<Vec<CloseOutcome>, LifecycleError> {
        let met: Vec<admission::PendingClose> = marked
            .iter()
            .filter_map(|s| self.admission.close_meets(&s.key))
            .collect();
        let result = self.ctl.close(refs, grace_ms);
        if let Ok(out) = &result {
            self.metrics.record_outcomes(out, false);
        }
        for s in marked {
            let outcome = result.as_ref().ok().and_then(|out| {
                out.iter()
                    .find(|o| Some(o.lease_id.as_str()) == s.lease_id())
            });
            s.end_close(outcome);
        }
        for p in met {
            p.done(result.as_deref().ok());
        }
        result
    }
}

/// Stack of the daemon's short helper threads (and of each session's threads, see `session`):
/// they run no deep recursion, and a thousand sessions must not reserve 2 MiB each.
pub(crate) const SMALL_STACK: usize = 256 * 1024;

/// Runs the daemon until SIGTERM, SIGINT or SIGHUP; returns after an orderly shutdown. A
/// checklist, one named step a line, in the order they must run.
pub fn serve(root: StateRoot, mut cfg: ServeConfig) -> Result<(), ServeError> {
    let socket = socket::requested_path(&root, &cfg)?;
    // Before anything can reach us: once the socket is bound (or the lock names us), a client
    // or a supervisor may send SIGTERM at any moment, and without the handlers its default
    // action would kill the daemon instead of shutting it down (seen: a test's SIGTERM right
    // after the socket appeared ended the daemon by the signal). A signal that arrives during
    // the start-up is kept in the pipe and honoured by the accept loop's first poll.
    let (signals, wake) = socket::watch_signals()?;
    let activated = systemd::activated_listener()?;
    let socket = socket::activated_path(&activated).unwrap_or(socket);
    let lock = lock::lock_state_root(&root, &socket)?;
    let metrics_listener = bind_metrics(&mut cfg)?;
    let metrics = metrics::Metrics::new();
    // The daemon's one controller, from the start-up reap to the shutdown.
    let ctl = Controller::open(root.clone(), &LiveTable)?;
    let startup_reap = startup::startup_reap(&ctl, &cfg, &metrics)?;
    let mut store = Store::open(&root.db_path())?;
    let containment = startup::enter_containment(store.gateway_instance_id());
    startup::hold_gateway_dir(&containment);
    // Every verb from here on sees the containment the daemon resolved in its leaf.
    let ctl = Arc::new(ctl.with_resolved_containment(containment.clone()));
    let resumable = shutdown::take_interrupted(&mut store)?;
    let listening = socket::listen(&socket, activated)?;
    let started_at = lock::name_the_daemon(&lock, &socket, listening.listener_pid);
    let exe = std::env::current_exe().map_err(|source| ServeError::Io {
        path: PathBuf::from("/proc/self/exe"),
        source,
    })?;
    let root_db = root.db_path();
    let daemon = Arc::new(Daemon {
        root_inode: fs::metadata(root.dir()).map(|m| (m.dev(), m.ino())).ok(),
        root,
        containment,
        cfg,
        exe,
        me: crate::proc::self_id(),
        started_at,
        socket: socket.clone(),
        sessions: Mutex::new(HashMap::new()),
        admission: admission::Admission::default(),
        ctl,
        store: Mutex::new(store),
        health_store: Mutex::new(Store::open(&root_db)?),
        session_store: Arc::new(Mutex::new(Store::open(&root_db)?)),
        exec_store: Mutex::new(Store::open(&root_db)?.without_autocheckpoint()?),
        checkpoints: checkpoint::Checkpoints::default(),
        shutting_down: AtomicBool::new(false),
        resumable: Mutex::new(Vec::new()),
        startup_reap,
        metrics,
        last_reconcile: Mutex::new(Value::Null),
        activated: listening.activated,
        push: push::Hub::default(),
        peers: socket::PeerConnections::default(),
        accept_failures: socket::RateLog::default(),
        usage: Mutex::new(status::UsageCache::default()),
        socket_inode: listening.bound.filter(|_| !listening.activated),
        wake,
        headless: AtomicBool::new(false),
    });
    shutdown::announce_resumable(&daemon, resumable);
    serve_metrics(&daemon, metrics_listener);
    let reconciler = Helper::start(&daemon, "reconcile", reconcile_thread(&daemon));
    tracing::info!(pid = daemon.me.pid, socket = %socket.display(), state_dir = %daemon.root.dir().display(), "leash serve ready");
    // Only now: the start-up reap is done and the socket accepts requests.
    systemd::notify_ready(&systemd::ready_status(&daemon.startup_reap));
    let housekeeping = Helper::start(&daemon, "housekeeping", Some(housekeeping::run));
    let checkpointer = {
        let (d, store) = (daemon.clone(), Store::open(&root_db)?);
        std::thread::Builder::new()
            .name("checkpoint".into())
            .spawn(move || checkpoint::run(&d, store))
            .expect("spawn thread")
    };
    socket::accept_loop(&daemon, &listening.listener, &signals);
    systemd::notify_stopping();
    reconciler.stop();
    // New sessions are refused from here on; housekeeping finishes its round (an idle close
    // in flight completes) before the shutdown closes the rest.
    daemon.shutting_down.store(true, Ordering::SeqCst);
    housekeeping.stop();
    shutdown::shutdown(&daemon);
    daemon.checkpoints.stop();
    let _ = checkpointer.join();
    remove_gateway_dir(&daemon);
    drop(listening.listener);
    socket::remove_if_ours(&daemon, &socket, listening.bound);
    let _ = lock.set_len(0);
    stopped(&daemon)
}

/// Binds the `--metrics` address, before the start-up reap so a taken address fails the start
/// at once. Port 0 picks a free port: `status` reports the one bound.
fn bind_metrics(cfg: &mut ServeConfig) -> Result<Option<std::net::TcpListener>, ServeError> {
    let Some(addr) = cfg.metrics else {
        return Ok(None);
    };
    let l =
        std::net::TcpListener::bind(addr).map_err(|source| ServeError::Metrics { addr, source })?;
    cfg.metrics = l.local_addr().ok().or(cfg.metrics);
    Ok(Some(l))
}

/// Serves the metrics over HTTP on the bound `--metrics` address, if any.
fn serve_metrics(d: &Arc<Daemon>, listener: Option<std::net::TcpListener>) {
    if let Some(l) = listener {
        let md = d.clone();
        metrics::serve_http(l, move || metrics::render(&md));
    }
}

/// The reconcile pass every `--reconcile-interval`, if one is set.
fn reconcile_thread(d: &Daemon) -> Option<impl FnOnce(&Arc<Daemon>, &Receiver<()>) + 'static> {
    let interval = d.cfg.reconcile_interval?;
    Some(move |d: &Arc<Daemon>, stop: &Receiver<()>| reconcile::run(d, interval, stop))
}

/// A helper thread of the daemon (reconcile, housekeeping) and the channel that stops it: the
/// sender is dropped, and the thread's wait ends at once.
struct Helper {
    running: Option<(std::sync::mpsc::Sender<()>, std::thread::JoinHandle<()>)>,
}

impl Helper {
    fn start(
        d: &Arc<Daemon>,
        name: &str,
        run: Option<impl FnOnce(&Arc<Daemon>, &Receiver<()>) + Send + 'static>,
    ) -> Helper {
        let running = run.map(|run| {
            let (stop, stopped) = std::sync::mpsc::channel::<()>();
            let d = d.clone();
            let handle = std::thread::Builder::new()
                .name(name.into())
                .spawn(move || run(&d, &stopped))
                .expect("spawn thread");
            (stop, handle)
        });
        Helper { running }
    }

    /// Stops the thread and waits for it to finish its round.
    fn stop(self) {
        if let Some((stop, handle)) = self.running {
            drop(stop);
            let _ = handle.join();
        }
    }
}

/// Removes this gateway's cgroup directory once its sessions are gone (the daemon's hold first).
fn remove_gateway_dir(d: &Daemon) {
    if let Some(gw) = &d.containment.gateway_root {
        crate::cgroup::release_gateway_dir(gw);
        if crate::cgroup::remove_gateway_dir_if_empty(gw) {
            tracing::info!(cgroup = %gw.display(), "removed this gateway's empty cgroup directory");
        }
    }
}

/// How `serve` ends: an error if the daemon stopped because its state directory went away.
fn stopped(d: &Daemon) -> Result<(), ServeError> {
    if d.headless.load(Ordering::SeqCst) {
        tracing::error!(state_dir = %d.root.dir().display(), "leash serve stopped: its state directory went away");
        return Err(ServeError::StateRootGone(d.root.dir().to_path_buf()));
    }
    tracing::info!("leash serve stopped");
    Ok(())
}
