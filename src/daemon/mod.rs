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
//! By concern: this file holds `serve` with its steps; `state.rs`, below every other file, the
//! daemon's state (its controller and its database connections), its configuration and errors,
//! and the close every path goes through; `peers.rs` the per-peer connection cap; `usage.rs` the
//! sampled usage of contained sessions; `stack.rs` the short threads' stack; `lock.rs` the
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
mod ask;
mod checkpoint;
mod gate;
mod handoff;
mod housekeeping;
mod lock;
mod peers;
mod shutdown;
mod socket;
pub(crate) mod stack;
mod start;
mod startup;
mod state;
mod status;
mod upgrade;
mod usage;
pub mod version;
pub use lock::LockInfo;
use state::Daemon;
pub use state::{ServeConfig, ServeError, DEFAULT_ENSURE_WAIT};
pub use upgrade::print_check as upgrade_check;
mod conn;
pub mod metrics;
pub(crate) mod priority;
mod push;
mod reconcile;
pub mod session;
pub mod spec;
mod stdin_pipe;
mod systemd;

use crate::state::StateRoot;
use crate::store::Store;
use serde_json::Value;
use std::collections::HashMap;
use std::fs::{self};
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Receiver;
use std::sync::{Arc, Mutex};

/// Runs the daemon until SIGTERM or SIGINT; returns after an orderly shutdown. SIGHUP (and the
/// `upgrade` op) hands the daemon over to a new program of itself (`upgrade.rs`), which goes on
/// serving here, as the same process. A checklist, one named step a line, in the order they
/// must run.
pub fn serve(root: StateRoot, mut cfg: ServeConfig) -> Result<(), ServeError> {
    // Before anything can reach us: once the socket is bound (or the lock names us), a client
    // or a supervisor may send SIGTERM at any moment, and without the handlers its default
    // action would kill the daemon instead of shutting it down (seen: a test's SIGTERM right
    // after the socket appeared ended the daemon by the signal). A signal that arrives during
    // the start-up is kept in the pipe and honoured by the accept loop's first poll.
    let signals = socket::watch_signals()?;
    let (start, taken) = match cfg.takeover_fd {
        Some(fd) => upgrade::take_over(&root, &mut cfg, fd).map(|(s, t)| (s, Some(t)))?,
        None => (start::start_fresh(&root, &mut cfg)?, None),
    };
    let start::Start {
        state,
        lock,
        listening,
        metrics_listener,
        resumable,
    } = start;
    let daemon = Arc::new(assemble(root, cfg, state, &listening, &signals)?);
    let held = upgrade::Held::of(&lock, &listening, metrics_listener.as_ref());
    shutdown::announce_resumable(&daemon, resumable);
    let taken = taken.map(|t| upgrade::adopt_sessions(&daemon, t));
    serve_metrics(&daemon, metrics_listener);
    tracing::info!(pid = daemon.me.pid, socket = %daemon.socket.display(), state_dir = %daemon.root.dir().display(), version = %version::version(), "leash serve ready");
    // Only now: the start-up reap is done and the socket accepts requests.
    systemd::notify_ready(&systemd::ready_status(&daemon.startup_reap));
    if let Some(t) = taken {
        upgrade::taken_over(&daemon, t);
    }
    let mut helpers = Helpers::start(&daemon)?;
    while socket::accept_loop(&daemon, &listening.listener, &signals) == socket::Stop::Upgrade {
        helpers.stop(&daemon);
        upgrade::hand_over(&daemon, &held);
        helpers = Helpers::start(&daemon)?;
    }
    systemd::notify_stopping();
    // New sessions are refused from here on; housekeeping finishes its round (an idle close
    // in flight completes) before the shutdown closes the rest.
    daemon.shutting_down.store(true, Ordering::SeqCst);
    helpers.stop(&daemon);
    shutdown::shutdown(&daemon);
    remove_gateway_dir(&daemon);
    drop(listening.listener);
    socket::remove_if_ours(&daemon, &daemon.socket, listening.bound);
    let _ = lock.set_len(0);
    stopped(&daemon)
}

/// The daemon's state, from what it started with.
fn assemble(
    root: StateRoot,
    cfg: ServeConfig,
    s: start::StartState,
    listening: &socket::Listening,
    signals: &socket::Signals,
) -> Result<Daemon, ServeError> {
    let io = |source| ServeError::Io {
        path: PathBuf::from("/proc/self/exe"),
        source,
    };
    let exe = std::env::current_exe().map_err(io)?;
    let root_db = root.db_path();
    Ok(Daemon {
        root_inode: fs::metadata(root.dir()).map(|m| (m.dev(), m.ino())).ok(),
        root,
        containment: s.containment,
        cfg,
        exe,
        me: crate::proc::self_id(),
        started_at: s.started_at,
        socket: s.socket,
        sessions: Mutex::new(HashMap::new()),
        admission: admission::Admission::default(),
        ctl: Arc::new(s.ctl),
        store: Mutex::new(s.store),
        health_store: Mutex::new(Store::open(&root_db)?),
        session_store: Arc::new(Mutex::new(Store::open(&root_db)?)),
        exec_store: Mutex::new(Store::open(&root_db)?.without_autocheckpoint()?),
        checkpoints: checkpoint::Checkpoints::default(),
        shutting_down: AtomicBool::new(false),
        resumable: Mutex::new(Vec::new()),
        startup_reap: s.startup_reap,
        metrics: s.metrics,
        last_reconcile: Mutex::new(Value::Null),
        activated: listening.activated,
        push: push::Hub::default(),
        peers: peers::PeerConnections::default(),
        accept_failures: peers::RateLog::default(),
        usage: Mutex::new(usage::UsageCache::default()),
        // A socket systemd made is systemd's: only one the daemon bound is watched as its own.
        socket_inode: listening.bound.filter(|_| !listening.activated),
        wake: signals.stop_wake.try_clone().map_err(ServeError::Signals)?,
        headless: AtomicBool::new(false),
        freeze: Arc::new(session::Freeze::new().map_err(ServeError::Signals)?),
        gate: Arc::default(),
        asks: ask::Asks::default(),
        upgrade_wake: signals
            .upgrade_wake
            .try_clone()
            .map_err(ServeError::Signals)?,
        program: Mutex::new(s.program),
    })
}

/// The daemon's helper threads: the reconcile pass, housekeeping, the checkpointer. Stopped for
/// a handoff (each finishes its round first) and at the shutdown.
struct Helpers {
    reconciler: Helper,
    housekeeping: Helper,
    checkpointer: std::thread::JoinHandle<()>,
}

impl Helpers {
    fn start(d: &Arc<Daemon>) -> Result<Helpers, ServeError> {
        let store = Store::open(&d.root.db_path())?;
        d.checkpoints.resume();
        let c = d.clone();
        let checkpointer = std::thread::Builder::new()
            .name("checkpoint".into())
            .spawn(move || checkpoint::run(&c.checkpoints, store))
            .expect("spawn thread");
        Ok(Helpers {
            reconciler: Helper::start(d, "reconcile", reconcile_thread(d)),
            housekeeping: Helper::start(d, "housekeeping", Some(housekeeping::run)),
            checkpointer,
        })
    }

    fn stop(self, d: &Daemon) {
        self.reconciler.stop();
        self.housekeeping.stop();
        d.checkpoints.stop();
        let _ = self.checkpointer.join();
    }
}

/// Serves the metrics over HTTP on the bound `--metrics` address, if any.
fn serve_metrics(d: &Arc<Daemon>, listener: Option<std::net::TcpListener>) {
    if let Some(l) = listener {
        let md = d.clone();
        metrics::serve_http(l, move || md.render_metrics());
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
