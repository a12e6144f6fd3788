//! `leash serve`: the supervisor daemon. It owns the wrappers of the sessions it spawns (it is
//! their parent, hence the owner in their leases), so sessions outlive the clients that asked
//! for them; clients talk to it over a Unix socket with newline-delimited JSON
//! ([`protocol`], `docs/protocol.md`).
//!
//! `serve` reads as a checklist: `lock_state_root → startup_reap → take_interrupted →
//! watch_signals → bind_socket`, then an accept loop (one thread per connection, see [`conn`])
//! beside a housekeeping thread (idle close, event sync, pruning of ended sessions), and on
//! SIGTERM/SIGINT/SIGHUP `shutdown`: record the busy sessions, close every session through the
//! normal close path, remove the socket, exit 0.
//!
//! One daemon per state root: an exclusive `flock` on `<state-dir>/daemon.lock`, which also
//! tells clients where the socket is. The kernel drops the lock when the daemon dies, however it
//! dies, so a stale lock cannot exist; a stale socket file can, and is found by probing and
//! replaced. If the daemon is SIGKILLed its wrappers see their parent die and take their
//! adapters down; the next daemon's startup reap settles their leases.

mod admission;
pub mod client;
mod conn;
pub mod metrics;
pub(crate) mod priority;
pub mod protocol;
mod push;
mod reconcile;
pub mod session;
pub mod session_input;
pub mod spec;
mod stdin_pipe;
pub mod strict_json;
mod systemd;

use crate::controller::{CloseOutcome, Controller, LeaseRef, LifecycleError};
use crate::lease::now_ms;
use crate::proc::LiveTable;
use crate::state::StateRoot;
use crate::store::{Store, StoreError};
use leash_core::kind::{HasKind, Kind};
use leash_core::model::ProcessId;
use leash_core::plan::ReapOptions;
use nix::fcntl::{Flock, FlockArg};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use session::{Limits, Phase, Supervised};
use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read};
use std::os::fd::AsFd;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The lock file that makes one daemon per state root and names its socket.
pub const LOCK_FILE: &str = "daemon.lock";
/// `meta` key under which a stopping daemon leaves the sessions that were busy.
const META_INTERRUPTED: &str = "daemon.interruptedSessions";
/// Ended sessions stay attachable (their last lines and exit) this long, and at most
/// [`MAX_ENDED`] of them (the newest): a daemon that runs for weeks under churn must stay flat.
/// Their events stay in the database (`events`, `sessions history`).
const ENDED_RETENTION: Duration = Duration::from_secs(300);
const MAX_ENDED: usize = 64;
/// How long shutdown waits for the wrappers to be reaped after the close.
const SHUTDOWN_REAP_WAIT: Duration = Duration::from_secs(15);
/// Longest socket path `bind` accepts (sun_path is 108 bytes, NUL included).
const MAX_SOCKET_PATH: usize = 107;

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
/// How long shutdown lets attach streams write their last items (the `end`) before exiting.
const ATTACH_FLUSH_WAIT: Duration = Duration::from_secs(2);

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
const LOCK_PROBE_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// The lock file of a state root.
pub fn lock_path(root: &StateRoot) -> PathBuf {
    root.dir().join(LOCK_FILE)
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
    /// The contained sessions' usage as `status` last sampled it (see [`Daemon::usage_for`]).
    usage: Mutex<UsageCache>,
    /// The state directory and the socket as the daemon found them at start (device, inode):
    /// see [`headless`]. No socket here under socket activation (the path is systemd's).
    root_inode: Option<(u64, u64)>,
    socket_inode: Option<(u64, u64)>,
    /// Wakes the accept loop as a termination signal does (the shutdown of a headless daemon).
    wake: UnixStream,
    /// Set when the daemon stops because its state directory or socket went away.
    headless: AtomicBool,
}

/// How old a usage sample may be before `status` has it sampled again. Sampling reads each
/// session's cgroup and its members' `/proc` entries (some 10 file reads a session): 100
/// sessions cost several milliseconds of CPU, which a health check on a busy host should not
/// pay, so `status` answers from the last sample and a background thread takes the next.
const USAGE_MAX_AGE: Duration = Duration::from_secs(1);

/// Usage samples by lease id.
#[derive(Default)]
struct UsageCache {
    by_lease: HashMap<String, (Instant, crate::ps::Totals)>,
    /// A background sample is running.
    sampling: bool,
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
    /// themselves (idle close decides and marks atomically).
    fn close_marked(
        &self,
        marked: &[Arc<Supervised>],
        refs: &[LeaseRef],
        grace_ms: Option<u64>,
    ) -> Result<Vec<CloseOutcome>, LifecycleError> {
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
        result
    }

    /// The usage of the contained leases: from the last sample when it is at most
    /// [`USAGE_MAX_AGE`] old; a lease never sampled is sampled now; older samples are returned
    /// as they are while one background thread takes fresh ones (so `status` never waits on
    /// more than the new sessions' reads). Samples of leases no longer contained are dropped.
    fn usage_for(
        self: &Arc<Self>,
        contained: HashMap<String, leash_core::model::Lease>,
        gateway: &str,
        cgroup_root: Option<PathBuf>,
    ) -> HashMap<String, (Instant, crate::ps::Totals)> {
        let (mut known, missing, stale) = {
            let mut c = self.usage.lock().unwrap_or_else(|p| p.into_inner());
            c.by_lease.retain(|id, _| contained.contains_key(id));
            let mut known = HashMap::new();
            let mut missing = Vec::new();
            let mut stale = false;
            for (id, lease) in &contained {
                match c.by_lease.get(id) {
                    Some(u) => {
                        stale |= u.0.elapsed() > USAGE_MAX_AGE;
                        known.insert(id.clone(), u.clone());
                    }
                    None => missing.push(lease.clone()),
                }
            }
            let start_sampler = stale && !c.sampling;
            if start_sampler {
                c.sampling = true;
            }
            (known, missing, start_sampler)
        };
        if !missing.is_empty() {
            let fresh = sample_usage(&missing, &self.root, gateway, cgroup_root.as_deref());
            let mut c = self.usage.lock().unwrap_or_else(|p| p.into_inner());
            for (id, u) in fresh {
                c.by_lease.insert(id.clone(), u.clone());
                known.insert(id, u);
            }
        }
        if stale {
            let d = self.clone();
            let leases: Vec<leash_core::model::Lease> = contained.into_values().collect();
            let gateway = gateway.to_string();
            let spawned = std::thread::Builder::new()
                .name("usage".into())
                .stack_size(SMALL_STACK)
                .spawn(move || {
                    let fresh = sample_usage(&leases, &d.root, &gateway, cgroup_root.as_deref());
                    let mut c = d.usage.lock().unwrap_or_else(|p| p.into_inner());
                    for (id, u) in fresh {
                        // A lease that stopped being contained meanwhile is not brought back.
                        if let Some(slot) = c.by_lease.get_mut(&id) {
                            *slot = u;
                        }
                    }
                    c.sampling = false;
                });
            if spawned.is_err() {
                self.usage
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .sampling = false;
            }
        }
        known
    }

    fn status(self: &Arc<Self>) -> Result<protocol::Status, StoreError> {
        // Read before the store lock is taken: file reads have no business under it.
        let containment = self.containment.clone().with_controllers();
        let (root, contained) = {
            let mut store = self.health_store();
            // The state root's part, as `leash status` builds it (the controller's one builder).
            let root = crate::controller::store_status_with(&self.root, &mut store, containment)?;
            // Only leases with a cgroup: their totals cost a few file reads each, never a
            // walk of /proc.
            let contained: HashMap<String, leash_core::model::Lease> = store
                .leases(&[
                    leash_core::model::LeaseState::Open,
                    leash_core::model::LeaseState::Closing,
                ])?
                .into_iter()
                .filter_map(Result::ok)
                .filter(|l| l.cgroup_path.is_some())
                .map(|l| (l.lease_id.clone(), l))
                .collect();
            (root, contained)
        };
        let gateway = root.gateway_instance_id.clone();
        let cgroup_root = root.containment.gateway_root.clone();
        let mut status = protocol::Status { root, daemon: None };
        let usage = self.usage_for(contained, &gateway, cgroup_root);
        let sessions: Vec<protocol::StatusSession> = self
            .all_sessions()
            .iter()
            .map(|s| {
                let live = s.status();
                let u = live.lease_id.as_ref().and_then(|id| usage.get(id));
                protocol::StatusSession {
                    usage: u.map(|u| u.1.clone()),
                    usage_age_ms: u.map(|(at, _)| at.elapsed().as_millis() as u64),
                    live,
                }
            })
            .collect();
        let busy: Vec<String> = sessions
            .iter()
            .filter(|s| s.live.busy)
            .map(|s| s.live.session_key.clone())
            .collect();
        let resumable = self
            .resumable
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let last = reconcile::last(self);
        status.daemon = Some(protocol::DaemonStatus {
            busy,
            idle_close_ms: self.cfg.idle_close.map(|d| d.as_millis() as u64),
            metrics: self.cfg.metrics,
            pid: self.me.pid,
            reconcile: protocol::ReconcileStatus {
                interval_ms: self.cfg.reconcile_interval.map(|d| d.as_millis() as u64),
                last: serde_json::from_value(last).ok().flatten(),
            },
            replay_bytes: self.cfg.replay.bytes,
            replay_lines: self.cfg.replay.lines,
            resumable,
            sessions,
            shutting_down: self.is_shutting_down(),
            socket: self.socket.clone(),
            socket_activated: self.activated,
            started_at: self.started_at,
            startup_reap: self.startup_reap.clone(),
            version: env!("CARGO_PKG_VERSION").into(),
        });
        Ok(status)
    }
}

/// Stack of the daemon's short helper threads (and of each session's threads, see `session`):
/// they run no deep recursion, and a thousand sessions must not reserve 2 MiB each.
pub(crate) const SMALL_STACK: usize = 256 * 1024;

/// Reads the usage of contained leases as `leash ps` does (the cgroup's counters and its
/// members' `/proc` entries; never a walk of `/proc`).
fn sample_usage(
    leases: &[leash_core::model::Lease],
    root: &StateRoot,
    gateway: &str,
    cgroup_root: Option<&Path>,
) -> Vec<(String, (Instant, crate::ps::Totals))> {
    let wrapper_root = root.wrapper_root();
    let expect = leash_core::verify::Expect {
        gateway_instance_id: gateway,
        wrapper_root: &wrapper_root,
        cgroup_root,
    };
    let reader = crate::ps::Reader::new();
    leases
        .iter()
        .map(|l| {
            let totals = crate::ps::usage_of(l, &expect, &crate::proc::LiveTable, &reader).totals;
            (l.lease_id.clone(), (Instant::now(), totals))
        })
        .collect()
}

/// A daemon that runs in the leash cgroup root itself (a systemd unit with `Delegate=yes`) moves
/// into a leaf of its own, `<root>/leash-daemon`: a cgroup with processes cannot enable
/// controllers for its children (the no-internal-processes rule), and the session cgroups need
/// them for limits. Anywhere else it stays where it is.
fn enter_daemon_leaf(gateway: &str) {
    let settings = crate::cgroup::Settings::from_env().unwrap_or_default();
    let c = crate::cgroup::Containment::resolve(&settings, gateway);
    let (Some(root), Some(mount)) = (c.root.as_deref(), c.mount.as_deref()) else {
        return;
    };
    let own = fs::read_to_string("/proc/self/cgroup")
        .ok()
        .and_then(|t| crate::cgroup::own_cgroup(&t));
    let Some(own) = own else { return };
    if mount.join(own.trim_start_matches('/')) != root {
        return;
    }
    match crate::cgroup::move_self_to_leaf(root) {
        Ok(leaf) => {
            tracing::info!(cgroup = %leaf.display(), "moved the daemon into its leaf cgroup")
        }
        Err(e) => {
            tracing::warn!(cgroup = %root.display(), error = %e, "cannot move the daemon into a leaf cgroup; limits may be refused")
        }
    }
}

/// Runs the daemon until SIGTERM, SIGINT or SIGHUP; returns after an orderly shutdown.
pub fn serve(root: StateRoot, mut cfg: ServeConfig) -> Result<(), ServeError> {
    let socket = cfg.socket.clone().unwrap_or_else(|| root.socket_path());
    let socket = absolute(&socket);
    if socket.as_os_str().len() > MAX_SOCKET_PATH {
        return Err(ServeError::PathTooLong(socket));
    }
    // Before anything can reach us: once the socket is bound (or the lock names us), a client
    // or a supervisor may send SIGTERM at any moment, and without the handlers its default
    // action would kill the daemon instead of shutting it down (seen: a test's SIGTERM right
    // after the socket appeared ended the daemon by the signal). A signal that arrives during
    // the start-up is kept in the pipe and honoured by the accept loop's first poll.
    let (signals, wake) = watch_signals()?;
    // A socket passed by systemd replaces --socket (the unit names the path once, in
    // leash.socket).
    let activated = systemd::activated_listener()?;
    let socket = match &activated {
        Some((_, Some(path))) => path.clone(),
        _ => socket,
    };
    let lock = lock_state_root(&root, &socket)?;
    let me = crate::proc::self_id();
    // Bound before the start-up reap, so a taken address fails the start at once.
    let metrics_listener = match cfg.metrics {
        Some(addr) => {
            let l = std::net::TcpListener::bind(addr)
                .map_err(|source| ServeError::Metrics { addr, source })?;
            // Port 0 picks a free port: status reports the one bound.
            cfg.metrics = l.local_addr().ok().or(cfg.metrics);
            Some(l)
        }
        None => None,
    };
    let metrics = metrics::Metrics::new();
    // The daemon's one controller, from the start-up reap to the shutdown.
    let ctl = Controller::open(root.clone(), &LiveTable)?;
    let reap_started = Instant::now();
    let startup_reap = startup_reap(&ctl, &cfg, &metrics)?;
    metrics
        .startup_reap_seconds
        .set(reap_started.elapsed().as_secs_f64());
    let mut store = Store::open(&root.db_path())?;
    enter_daemon_leaf(store.gateway_instance_id());
    let containment = crate::cgroup::Containment::resolve_lean(
        &crate::cgroup::Settings::from_env().unwrap_or_default(),
        store.gateway_instance_id(),
    );
    // Every verb from here on sees the containment the daemon resolved in its leaf.
    let ctl = Arc::new(ctl.with_resolved_containment(containment.clone()));
    let resumable = take_interrupted(&mut store)?;
    let is_activated = activated.is_some();
    let listener_pid = activated
        .as_ref()
        .and_then(|(l, _)| systemd::listener_pid(l))
        .filter(|&p| p != me.pid);
    let listener = match activated {
        Some((l, _)) => {
            l.set_nonblocking(true).map_err(|source| ServeError::Io {
                path: socket.clone(),
                source,
            })?;
            tracing::info!(socket = %socket.display(), "serving the socket passed by systemd (socket activation)");
            l
        }
        None => bind_socket(&socket)?,
    };
    let bound = fs::metadata(&socket).map(|m| (m.dev(), m.ino())).ok();
    let info = LockInfo {
        pid: me.pid,
        socket: socket.clone(),
        started_at: now_ms(),
        listener_pid,
    };
    write_lock_info(&lock, &info);
    let exe = std::env::current_exe().map_err(|source| ServeError::Io {
        path: PathBuf::from("/proc/self/exe"),
        source,
    })?;

    let root_db = root.db_path();
    let root_inode = fs::metadata(root.dir()).map(|m| (m.dev(), m.ino())).ok();
    let daemon = Arc::new(Daemon {
        root,
        containment,
        cfg,
        exe,
        me,
        started_at: info.started_at,
        socket: socket.clone(),
        sessions: Mutex::new(HashMap::new()),
        admission: admission::Admission::default(),
        ctl,
        store: Mutex::new(store),
        health_store: Mutex::new(Store::open(&root_db)?),
        session_store: Arc::new(Mutex::new(Store::open(&root_db)?)),
        shutting_down: AtomicBool::new(false),
        resumable: Mutex::new(Vec::new()),
        startup_reap,
        metrics,
        last_reconcile: Mutex::new(Value::Null),
        activated: is_activated,
        push: push::Hub::default(),
        usage: Mutex::new(UsageCache::default()),
        root_inode,
        socket_inode: bound.filter(|_| !is_activated),
        wake,
        headless: AtomicBool::new(false),
    });
    announce_resumable(&daemon, resumable);
    if let Some(l) = metrics_listener {
        let md = daemon.clone();
        metrics::serve_http(l, move || metrics::render(&md));
    }
    let (stop_reconcile, reconcile_stopped) = std::sync::mpsc::channel::<()>();
    let reconciler = daemon.cfg.reconcile_interval.map(|interval| {
        let rd = daemon.clone();
        std::thread::Builder::new()
            .name("reconcile".into())
            .spawn(move || reconcile::run(&rd, interval, &reconcile_stopped))
            .expect("spawn thread")
    });
    tracing::info!(pid = me.pid, socket = %socket.display(), state_dir = %daemon.root.dir().display(), "leash serve ready");
    // Only now: the start-up reap is done and the socket accepts requests.
    systemd::notify_ready(&systemd::ready_status(&daemon.startup_reap));

    let hk = daemon.clone();
    let (stop_housekeeping, stopped) = std::sync::mpsc::channel::<()>();
    let housekeeping = std::thread::Builder::new()
        .name("housekeeping".into())
        .spawn(move || housekeeping_loop(&hk, &stopped))
        .expect("spawn thread");

    accept_loop(&daemon, &listener, &signals);
    systemd::notify_stopping();
    drop(stop_reconcile);
    if let Some(r) = reconciler {
        let _ = r.join();
    }

    // New sessions are refused from here on; housekeeping finishes its round (an idle close
    // in flight completes) before the shutdown closes the rest.
    daemon.shutting_down.store(true, Ordering::SeqCst);
    drop(stop_housekeeping);
    let _ = housekeeping.join();
    shutdown(&daemon);
    if let Some(gw) = &daemon.containment.gateway_root {
        if crate::cgroup::remove_gateway_dir_if_empty(gw) {
            tracing::info!(cgroup = %gw.display(), "removed this gateway's empty cgroup directory");
        }
    }
    drop(listener);
    // Remove the socket only if it is still the one we bound (an activated socket is systemd's:
    // it keeps listening and starts the next daemon on the next connection).
    if !daemon.activated && fs::metadata(&socket).map(|m| (m.dev(), m.ino())).ok() == bound {
        let _ = fs::remove_file(&socket);
    }
    let _ = lock.set_len(0);
    if daemon.headless.load(Ordering::SeqCst) {
        tracing::error!(state_dir = %daemon.root.dir().display(), "leash serve stopped: its state directory went away");
        return Err(ServeError::StateRootGone(daemon.root.dir().to_path_buf()));
    }
    tracing::info!("leash serve stopped");
    Ok(())
}

fn absolute(p: &Path) -> PathBuf {
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        std::env::current_dir()
            .map(|d| d.join(p))
            .unwrap_or_else(|_| p.to_path_buf())
    }
}

/// Takes the state root's daemon lock, or says who holds it.
fn lock_state_root(root: &StateRoot, socket: &Path) -> Result<Flock<File>, ServeError> {
    let path = lock_path(root);
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

fn write_lock_info(lock: &Flock<File>, info: &LockInfo) {
    use std::os::unix::fs::FileExt;
    let text = serde_json::to_string(info).expect("serialisable");
    let _ = lock.set_len(0);
    if let Err(e) = lock.write_all_at(text.as_bytes(), 0) {
        tracing::warn!(error = %e, "cannot write the lock file; clients will look for the default socket");
    }
}

/// Leases of a previous daemon (owner gone) are verified and terminated or marked lost; leases
/// with a live owner (another process's sessions) are left alone.
fn startup_reap(
    ctl: &Controller<'_>,
    cfg: &ServeConfig,
    metrics: &metrics::Metrics,
) -> Result<protocol::StartupReap, ServeError> {
    let report = ctl.reap(&ReapOptions {
        include_live: false,
        retention_ms: cfg.retention.as_millis() as i64,
        now_ms: now_ms(),
        grace_ms: None,
    })?;
    metrics.record_outcomes(&report.leases, true);
    let count =
        |r: crate::controller::CloseResult| report.leases.iter().filter(|o| o.result == r).count();
    use crate::controller::CloseResult as R;
    let summary = protocol::StartupReap {
        bad_rows: report.bad_rows.len(),
        closed: count(R::Closed),
        conflict: count(R::Conflict),
        expired: report.expired,
        left_open: count(R::LeftOpen),
        legacy: report.legacy.len(),
        lost: count(R::Lost),
        skipped: report.skipped.len(),
    };
    tracing::info!(
        summary = crate::cli::logging::json(&summary),
        "startup reap done"
    );
    Ok(summary)
}

/// Reads (and clears) what the previous daemon left about its busy sessions.
fn take_interrupted(store: &mut Store) -> Result<Vec<Value>, StoreError> {
    let Some(text) = store.meta(META_INTERRUPTED)? else {
        return Ok(Vec::new());
    };
    store.set_meta(META_INTERRUPTED, None)?;
    match serde_json::from_str::<Vec<Value>>(&text) {
        Ok(v) => Ok(v),
        Err(e) => {
            tracing::warn!(error = %e, "ignoring an unreadable list of interrupted sessions");
            Ok(Vec::new())
        }
    }
}

/// Records a `resumable` event for each session the previous daemon stopped while busy, and
/// keeps them for `status` until they are ensured again.
fn announce_resumable(d: &Daemon, list: Vec<Value>) {
    let mut kept = Vec::new();
    // An entry without a session key is skipped; the others are kept as they were recorded.
    for mut entry in list
        .into_iter()
        .filter_map(|e| serde_json::from_value::<protocol::Resumable>(e).ok())
    {
        let key = entry.session_key.clone();
        let lease = entry
            .rest
            .get("leaseId")
            .and_then(Value::as_str)
            .map(str::to_owned);
        let mut detail = serde_json::to_value(&entry).expect("entries serialise");
        // Kept off the event log (see `shutdown`): the entry in `status` has it.
        if let Some(m) = detail.as_object_mut() {
            m.remove("acpSessions");
        }
        let seq = d
            .writer()
            .record_event(&key, lease.as_deref(), "resumable", Some(detail));
        match seq {
            Ok(seq) => {
                entry.rest.insert("eventSeq".into(), json!(seq));
            }
            Err(e) => {
                tracing::warn!(session = %key, error = %e, "cannot record the resumable event")
            }
        }
        tracing::info!(session = %key, "session was busy when the previous daemon stopped: resumable");
        kept.push(entry);
    }
    *d.resumable.lock().unwrap_or_else(|p| p.into_inner()) = kept;
}

/// Binds the socket (mode 0600 from the start), replacing a stale one.
fn bind_socket(path: &Path) -> Result<UnixListener, ServeError> {
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
fn watch_signals() -> Result<(UnixStream, UnixStream), ServeError> {
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

fn accept_loop(d: &Arc<Daemon>, listener: &UnixListener, signals: &UnixStream) {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
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
                Ok((stream, _)) => {
                    let d = d.clone();
                    let spawned = std::thread::Builder::new()
                        .name("conn".into())
                        .spawn(move || conn::serve_connection(d, stream));
                    if let Err(e) = spawned {
                        tracing::error!(error = %e, "cannot start a connection thread");
                    }
                }
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

fn housekeeping_loop(d: &Arc<Daemon>, stop: &std::sync::mpsc::Receiver<()>) {
    let tick = d
        .cfg
        .idle_close
        .map_or(Duration::from_secs(1), |i| i / 4)
        .clamp(Duration::from_millis(50), Duration::from_secs(1));
    // The sender is dropped at shutdown: the wait ends at once.
    while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = stop.recv_timeout(tick) {
        if let Some(why) = headless(d) {
            tracing::error!(state_dir = %d.root.dir().display(), socket = %d.socket.display(),
                "{why}: no client can reach this daemon any more, and another leash serve could start on the path (two daemons for one root); closing every session as on SIGTERM and stopping");
            d.headless.store(true, Ordering::SeqCst);
            use std::io::Write;
            let _ = (&d.wake).write(&[1]);
            return;
        }
        let sessions = d.all_sessions();
        for s in &sessions {
            if s.phase() != Phase::Ended {
                s.sync_events();
            }
        }
        notice_changed_leases(d, &sessions);
        if let Some(idle) = d.cfg.idle_close {
            let due: Vec<(Arc<Supervised>, Duration)> = sessions
                .iter()
                .filter_map(|s| s.begin_idle_close(idle).map(|quiet| (s.clone(), quiet)))
                .collect();
            if !due.is_empty() {
                let mut refs = Vec::new();
                for (s, quiet) in &due {
                    tracing::info!(session = %s.key, idle_ms = quiet.as_millis() as u64, "closing idle session");
                    let detail = json!({"idleMs": quiet.as_millis() as u64, "idleCloseMs": idle.as_millis() as u64});
                    let _ = s.record_event("idle", Some(detail));
                    if let Some(id) = s.lease_id() {
                        refs.push(LeaseRef::Id(id.to_string()));
                    }
                }
                let marked: Vec<Arc<Supervised>> = due.into_iter().map(|(s, _)| s).collect();
                if let Err(e) = d.close_marked(&marked, &refs, None) {
                    tracing::warn!(error = %e, "idle close failed");
                }
            }
        }
        prune_ended(d);
    }
}

/// Why the daemon lost its state root, if it did: the state directory (or, unless socket
/// activation owns it, the socket) is gone or is another inode than the one it started with — an
/// `rm -rf` of the root, a root moved away and recreated. Such a daemon runs its sessions
/// headless (no socket a client can reach) while a second `leash serve` could take the path with
/// a new database and gateway id, so it shuts down (checked every housekeeping round).
fn headless(d: &Daemon) -> Option<String> {
    let id = |p: &Path| fs::metadata(p).ok().map(|m| (m.dev(), m.ino()));
    let what = |name: &str, p: &Path, was: (u64, u64)| match id(p) {
        None => Some(format!("the {name} {} was removed", p.display())),
        Some(now) if now != was => Some(format!(
            "the {name} {} was replaced (inode {} is now {})",
            p.display(),
            was.1,
            now.1
        )),
        Some(_) => None,
    };
    d.root_inode
        .and_then(|was| what("state directory", d.root.dir(), was))
        .or_else(|| {
            d.socket_inode
                .and_then(|was| what("socket", &d.socket, was))
        })
}

/// A lease of a live session that another process moved out of `open` (a `leash --no-daemon
/// close`, a reap run against the database) while the daemon was not closing it. The session
/// stops taking input at once (phase `closing`), and the daemon finishes the close itself: the
/// claim of a closer that died mid-grace is stale and is taken over, and a closer still at work
/// keeps its claim (the attempt is a conflict, repeated each round until the lease settles).
fn notice_changed_leases(d: &Arc<Daemon>, sessions: &[Arc<Supervised>]) {
    for s in sessions {
        if !s.watch_lease() {
            continue;
        }
        let Some(id) = s.lease_id().map(str::to_owned) else {
            continue;
        };
        let row = d.store().lease(&id);
        let Ok(Some(lease)) = row else {
            continue;
        };
        if lease.state == leash_core::model::LeaseState::Open || !s.begin_takeover() {
            continue;
        }
        tracing::warn!(session_key = %s.key, lease_id = %id, state = %lease.state,
            claimed_by = lease.claimed_by.map(|c| c.pid),
            "the lease changed underneath the daemon; the session takes no more input and the daemon finishes the close");
        let (d, s) = (d.clone(), s.clone());
        let spawned = std::thread::Builder::new()
            .name("takeover".into())
            .spawn(move || {
                // Bounded like the settles: a burst of wrapper deaths on a loaded host changes
                // many leases at once (reconcile marks them), and one connection and process-table
                // read each, all together, is what the daemon's footprint would keep.
                let _slot = session::settle_slot();
                let refs = [LeaseRef::Id(id)];
                if let Err(e) = d.close_marked(std::slice::from_ref(&s), &refs, None) {
                    tracing::warn!(session_key = %s.key, error = %e, "cannot finish the close");
                }
            });
        if let Err(e) = spawned {
            tracing::error!(error = %e, "cannot start a thread to finish a close");
        }
    }
}

/// Drops ended sessions older than [`ENDED_RETENTION`], and the oldest beyond [`MAX_ENDED`].
fn prune_ended(d: &Daemon) {
    // Each session's end is read without the sessions' map lock: reading it takes the
    // session's own lock, which a niced output reader may hold while preempted, and every
    // request (`status` first) needs the map lock.
    let ended: Vec<(Instant, Arc<Supervised>)> = d
        .all_sessions()
        .into_iter()
        .filter_map(|s| s.ended_at().map(|at| (at, s)))
        .collect();
    let gone = to_prune(ended.iter().map(|(at, s)| (*at, s.key.as_str())));
    if gone.is_empty() {
        return;
    }
    let mut map = d.sessions();
    for (_, s) in ended.iter().filter(|(_, s)| gone.contains(&s.key.as_str())) {
        // Only the ended session itself: an ensure may have put a new one under the key.
        if map.get(&s.key).is_some_and(|cur| Arc::ptr_eq(cur, s)) {
            map.remove(&s.key);
        }
    }
}

/// Which ended sessions (when they ended, their key) to forget: those ended longer than
/// [`ENDED_RETENTION`] ago, and the oldest beyond the newest [`MAX_ENDED`].
fn to_prune<'a>(ended: impl Iterator<Item = (Instant, &'a str)>) -> Vec<&'a str> {
    let (mut kept, mut gone): (Vec<_>, Vec<_>) =
        ended.partition(|(at, _)| at.elapsed() < ENDED_RETENTION);
    if kept.len() > MAX_ENDED {
        kept.sort();
        let extra = kept.len() - MAX_ENDED;
        gone.extend(kept.drain(..extra));
    }
    gone.into_iter().map(|(_, k)| k).collect()
}

/// Records the busy sessions, closes every session through the normal close path and waits for
/// their wrappers to be reaped.
fn shutdown(d: &Daemon) {
    // Ensures in flight finish first (they saw the flag too late to refuse), so their sessions
    // are closed below like the others.
    let deadline = Instant::now() + SHUTDOWN_REAP_WAIT;
    while Instant::now() < deadline && !d.admission.is_empty() {
        std::thread::sleep(Duration::from_millis(10));
    }
    let sessions = d.all_sessions();
    let mut interrupted = Vec::new();
    for s in &sessions {
        if !matches!(s.phase(), Phase::Starting | Phase::Running) || !s.busy() {
            continue;
        }
        let st = s.status();
        let entry = json!({
            "sessionKey": s.key,
            "leaseId": st.lease_id,
            "pendingPrompts": st.pending_prompts,
            "acpSessionIds": st.acp_session_ids,
            "at": now_ms(),
        });
        if let Err(e) = s.record_event("interrupted", Some(entry.clone())) {
            tracing::error!(session = %s.key, error = %e, "cannot record the interrupted session");
        }
        // The setup (cwd, mcpServers, whose env values may be credentials) goes into the one
        // meta entry the next daemon takes and deletes at its start, not into the event log.
        let mut entry = entry;
        entry["acpSessions"] = json!(st.acp_sessions);
        tracing::info!(session = %s.key, "busy at shutdown: recorded for resumption");
        interrupted.push(entry);
    }
    if !interrupted.is_empty() {
        let text = serde_json::to_string(&interrupted).expect("serialisable");
        if let Err(e) = d.writer().set_meta(META_INTERRUPTED, Some(&text)) {
            tracing::error!(error = %e, "cannot persist the interrupted sessions");
        }
    }
    let refs: Vec<LeaseRef> = sessions
        .iter()
        .filter(|s| matches!(s.phase(), Phase::Starting | Phase::Running))
        .filter_map(|s| s.lease_id().map(|id| LeaseRef::Id(id.to_string())))
        .collect();
    if !refs.is_empty() {
        match d.close(&refs, None, "daemon shutdown") {
            Ok(out) => {
                for o in out {
                    tracing::info!(lease_id = %o.lease_id, session = %o.session_key, result = crate::cli::logging::json(&o.result), "closed at shutdown");
                }
            }
            Err(e) => tracing::error!(error = %e, "closing sessions at shutdown failed"),
        }
    }
    let deadline = Instant::now() + SHUTDOWN_REAP_WAIT;
    while Instant::now() < deadline
        && sessions
            .iter()
            .any(|s| s.lease().is_some() && s.phase() != Phase::Ended)
    {
        std::thread::sleep(Duration::from_millis(10));
    }
    // The streams of ended sessions write their last items and their `end`, so an attached client
    // learns that its session ended rather than seeing the connection drop mid-stream.
    let deadline = Instant::now() + ATTACH_FLUSH_WAIT;
    while Instant::now() < deadline
        && sessions
            .iter()
            .any(|s| s.phase() == Phase::Ended && s.status().attached > 0)
    {
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ended_sessions_go_after_the_retention_and_beyond_the_newest_few() {
        let now = Instant::now();
        let old = now - (ENDED_RETENTION + Duration::from_secs(1));
        let keys: Vec<String> = (0..MAX_ENDED + 3).map(|i| format!("k{i:03}")).collect();
        // k000..: ended i ms apart, the first the oldest; one more ended long ago.
        let mut ended: Vec<(Instant, &str)> = keys
            .iter()
            .enumerate()
            .map(|(i, k)| (now - Duration::from_millis(1000 - i as u64), k.as_str()))
            .collect();
        ended.push((old, "stale"));
        let mut gone = to_prune(ended.into_iter());
        gone.sort();
        assert_eq!(gone, vec!["k000", "k001", "k002", "stale"]);
        assert!(to_prune([(now, "fresh")].into_iter()).is_empty());
    }
}
