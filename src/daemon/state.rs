//! The daemon's shared types, below every other file of `daemon/`: its configuration
//! ([`ServeConfig`]), its errors ([`ServeError`]), the state every thread shares ([`Daemon`]) with
//! the close every close path goes through, and the stack size of its short threads. `serve`
//! (`mod.rs`) builds them; the other files take them from here, never from `mod.rs`.

use super::admission;
use super::ask;
use super::checkpoint;
use super::gate;
use super::metrics;
use super::peers;
use super::push;
use super::session::{self, Limits, Supervised};
use super::systemd;
use super::usage;
use crate::controller::{CloseOutcome, Controller, LeaseRef, LifecycleError};
use crate::protocol;
use crate::state::StateRoot;
use crate::store::{Store, StoreError};
use leash_core::kind::{HasKind, Kind};
use leash_core::model::ProcessId;
use serde_json::Value;
use std::collections::HashMap;
use std::io;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

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
    /// The program an upgrade execs (default: the path this one was started from).
    pub upgrade_program: Option<PathBuf>,
    /// The arguments (after the program's name) an upgrade execs the next program with: this
    /// program's own, so every option carries over.
    pub args: Vec<std::ffi::OsString>,
    /// Take over from the program that handed over, whose handoff is on this descriptor.
    pub takeover_fd: Option<std::os::fd::RawFd>,
    /// Set when this program takes over back from a new program that could not: why it could
    /// not (this program then answers the upgrade with it).
    pub takeover_failed: Option<String>,
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
    #[error("cannot take over from the previous program: {0}")]
    Handoff(String),
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
    pub(super) root: StateRoot,
    /// Containment as resolved at start, after the daemon entered its leaf (the mount, the
    /// roots, the mode; `status` re-reads only the controllers).
    pub(super) containment: crate::cgroup::Containment,
    pub(super) cfg: ServeConfig,
    pub(super) exe: PathBuf,
    pub(super) me: ProcessId,
    pub(super) started_at: i64,
    pub(super) socket: PathBuf,
    pub(super) sessions: Mutex<HashMap<String, Arc<Supervised>>>,
    /// Keys whose `ensure` is in flight, and the closes that meet them (`admission`).
    pub(super) admission: admission::Admission,
    /// The one controller every verb of the daemon runs on: the `close`, `cancel`, `reap`,
    /// `leases`, `events`, `verify` and sessions query ops, idle close, shutdown, the settle of a
    /// wrapper that exited, and the reconcile passes. Its store connection (a writer, as each
    /// request's controller was) is taken per database step, never across a grace, so closes of
    /// different leases still run their graces together.
    pub(super) ctl: Arc<Controller<'static>>,
    /// The daemon's own reads (the sessions rows, the lease watch). Never held across a
    /// write: the daemon's writes go through `session_store` ([`Daemon::writer`]) or its
    /// controller. In WAL mode a read does not wait for the writer either, and sees everything
    /// committed before it began.
    pub(super) store: Mutex<Store>,
    /// The health checks' own read connection (`status`, the metrics' lease counts): no other
    /// thread holds it, so a health check never waits behind a request or the housekeeping
    /// thread's reads (which run at the daemon's priority, below the connection threads).
    pub(super) health_store: Mutex<Store>,
    /// The one connection all sessions write their seqs and events through (a connection per
    /// session leaked two descriptors per session that ever ran).
    pub(super) session_store: session::SharedStore,
    /// The connection the `exec` op commits leases through (`conn/exec.rs`): not the sessions'
    /// writer, so a lease commit never waits behind their output, nor they behind it.
    pub(super) exec_store: Mutex<Store>,
    /// The exec connection's checkpoints, done by a thread of their own (`checkpoint.rs`).
    pub(super) checkpoints: checkpoint::Checkpoints,
    pub(super) shutting_down: AtomicBool,
    /// Sessions that were busy when the previous daemon stopped, until they are ensured again.
    pub(super) resumable: Mutex<Vec<protocol::Resumable>>,
    pub(super) startup_reap: protocol::StartupReap,
    pub(super) metrics: metrics::Metrics,
    /// The last reconcile pass, for `status`.
    pub(super) last_reconcile: Mutex<Value>,
    /// The socket came from systemd: it is systemd's to remove, not ours.
    pub(super) activated: bool,
    /// Connections subscribed to lifecycle pushes (`hello {"events": true}`).
    pub(super) push: push::Hub,
    /// The connections each peer process holds, under a cap (`socket::PeerConnections`).
    pub(super) peers: peers::PeerConnections,
    /// Failed accepts (out of descriptors): logged once a period.
    pub(super) accept_failures: peers::RateLog,
    /// The contained sessions' usage as `status` last sampled it (see [`Daemon::usage_for`]).
    pub(super) usage: Mutex<usage::UsageCache>,
    /// The state directory and the socket as the daemon found them at start (device, inode):
    /// see [`headless`]. No socket here under socket activation (the path is systemd's).
    pub(super) root_inode: Option<(u64, u64)>,
    pub(super) socket_inode: Option<(u64, u64)>,
    /// Wakes the accept loop as a termination signal does (the shutdown of a headless daemon).
    pub(super) wake: UnixStream,
    /// Set when the daemon stops because its state directory or socket went away.
    pub(super) headless: AtomicBool,
    /// The freeze of a handoff, heeded by every session's threads (`session/freeze.rs`).
    pub(super) freeze: Arc<session::Freeze>,
    /// The gate of the ops that change something, closed by a handoff (`gate.rs`).
    pub(super) gate: Arc<gate::Gate>,
    /// An upgrade asked for, and the write end that wakes `serve`'s loop for it (as SIGHUP does).
    pub(super) asks: ask::Asks,
    pub(super) upgrade_wake: UnixStream,
    /// What `status` says of this program and of the handoffs (`upgrade.rs`).
    pub(super) program: Mutex<ProgramInfo>,
}

/// This program of the daemon: since when it serves, how the last handoff went (how many the
/// daemon has done is its `handoffs` counter).
#[derive(Debug, Clone, Default)]
pub(crate) struct ProgramInfo {
    pub(super) serving_since: i64,
    pub(super) last: Option<protocol::LastHandoff>,
    /// The program an upgrade execs (`--upgrade-program`, else the path this one was started
    /// from).
    pub(super) upgrade_program: PathBuf,
}

impl Daemon {
    /// What a session needs of the daemon to start (`ensure`) or to be adopted (a handoff).
    pub(super) fn spawn_spec(&self) -> super::session::SpawnSpec<'_> {
        super::session::SpawnSpec {
            root: &self.root,
            store: &self.session_store,
            ctl: &self.ctl,
            exe: &self.exe,
            daemon_pid: self.me.pid,
            default_grace_ms: self.cfg.default_grace_ms,
            limits: self.cfg.replay,
            freeze: &self.freeze,
        }
    }

    pub(super) fn sessions(&self) -> MutexGuard<'_, HashMap<String, Arc<Supervised>>> {
        self.sessions.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The read connection (see the field): for reads only.
    pub(super) fn store(&self) -> MutexGuard<'_, Store> {
        self.store.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The health checks' read connection (see the field).
    pub(super) fn health_store(&self) -> MutexGuard<'_, Store> {
        self.health_store.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The write connection the sessions share, for the daemon's own writes.
    pub(super) fn writer(&self) -> MutexGuard<'_, Store> {
        self.session_store.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The `exec` op's write connection (see the field).
    pub(super) fn exec_store(&self) -> MutexGuard<'_, Store> {
        self.exec_store.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn session(&self, key: &str) -> Option<Arc<Supervised>> {
        self.sessions().get(key).cloned()
    }

    pub(super) fn session_by_lease(&self, lease_id: &str) -> Option<Arc<Supervised>> {
        self.sessions()
            .values()
            .find(|s| s.lease_id() == Some(lease_id))
            .cloned()
    }

    pub(super) fn all_sessions(&self) -> Vec<Arc<Supervised>> {
        let mut v: Vec<Arc<Supervised>> = self.sessions().values().cloned().collect();
        v.sort_by(|a, b| a.key.cmp(&b.key));
        v
    }

    pub(super) fn is_shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::SeqCst)
    }

    /// Closes leases through the lifecycle controller, sessions of this daemon included: they
    /// are marked closing first (so later requests see it) and settled after. Every close path
    /// of the daemon — the `close` op, idle close, shutdown — comes through here.
    pub(super) fn close(
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
    pub(super) fn close_marked(
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

/// Longest socket path `bind` accepts (sun_path is 108 bytes, NUL included).
pub(super) const MAX_SOCKET_PATH: usize = 107;

impl Daemon {
    /// Queues an upgrade and wakes `serve`'s loop for it; refused while another is under way.
    pub(super) fn ask_upgrade(&self, ask: ask::Ask) -> Result<(), String> {
        if self.is_shutting_down() {
            return Err("the daemon is shutting down".into());
        }
        self.asks
            .put(ask)
            .map_err(|_| "an upgrade is already under way".to_string())?;
        use std::io::Write;
        let _ = (&self.upgrade_wake).write(&[1]);
        Ok(())
    }

    pub(super) fn program(&self) -> MutexGuard<'_, ProgramInfo> {
        self.program.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The metrics page: the gauges of the present refreshed, then everything encoded.
    pub(super) fn render_metrics(&self) -> String {
        metrics::render(
            &self.metrics,
            self.health_store().counts(),
            &self.all_sessions(),
        )
    }
}
