//! What the daemon starts with ([`Start`]): from its own start-up steps ([`start_fresh`]), or
//! taken over from the program that handed over to this one (`upgrade.rs`).

use super::state::{ProgramInfo, ServeConfig, ServeError};
use super::{lock, metrics, shutdown, socket, startup, systemd};
use crate::controller::Controller;
use crate::proc::LiveTable;
use crate::protocol;
use crate::state::StateRoot;
use crate::store::Store;
use serde_json::Value;
use std::path::PathBuf;

/// What the daemon starts with: from its own start-up steps ([`start_fresh`]), or taken over
/// from the program that handed over to this one (`upgrade::take_over`).
pub(super) struct Start {
    pub(super) state: StartState,
    pub(super) lock: nix::fcntl::Flock<std::fs::File>,
    pub(super) listening: socket::Listening,
    pub(super) metrics_listener: Option<std::net::TcpListener>,
    /// The busy sessions a previous daemon recorded when it stopped (fresh start only).
    pub(super) resumable: Vec<Value>,
}

/// The part of a [`Start`] that goes into the [`Daemon`].
pub(super) struct StartState {
    pub(super) ctl: Controller<'static>,
    pub(super) store: Store,
    pub(super) containment: crate::cgroup::Containment,
    pub(super) startup_reap: protocol::StartupReap,
    pub(super) metrics: metrics::Metrics,
    pub(super) started_at: i64,
    pub(super) socket: PathBuf,
    pub(super) program: ProgramInfo,
}

/// The start-up of a daemon that takes over from no one: the lock, the start-up reap, the
/// daemon's leaf cgroup, the busy sessions of the last daemon, the socket, the lock's naming.
pub(super) fn start_fresh(root: &StateRoot, cfg: &mut ServeConfig) -> Result<Start, ServeError> {
    let socket = socket::requested_path(root, cfg)?;
    let activated = systemd::activated_listener()?;
    let socket = socket::activated_path(&activated).unwrap_or(socket);
    let lock = lock::lock_state_root(root, &socket)?;
    let metrics_listener = bind_metrics(cfg)?;
    let metrics = metrics::Metrics::new();
    // The daemon's one controller, from the start-up reap to the shutdown.
    let ctl = Controller::open(root.clone(), &LiveTable)?;
    let startup_reap = startup::startup_reap(&ctl, cfg, &metrics)?;
    let (ctl, mut store, containment) = contain(root, ctl)?;
    let resumable = shutdown::take_interrupted(&mut store)?;
    let listening = socket::listen(&socket, activated)?;
    let started_at = lock::name_the_daemon(&lock, &socket, listening.listener_pid);
    let program = ProgramInfo {
        serving_since: started_at,
        upgrade_program: default_program(cfg)?,
        ..Default::default()
    };
    Ok(Start {
        state: StartState {
            ctl,
            store,
            containment,
            startup_reap,
            metrics,
            started_at,
            socket,
            program,
        },
        lock,
        listening,
        metrics_listener,
        resumable,
    })
}

/// The daemon's store and its leaf cgroup under the gateway's directory (held while it
/// serves); every verb of the controller from here on sees the containment resolved there.
pub(super) fn contain(
    root: &StateRoot,
    ctl: Controller<'static>,
) -> Result<(Controller<'static>, Store, crate::cgroup::Containment), ServeError> {
    let store = Store::open(&root.db_path())?;
    let containment = startup::enter_containment(store.gateway_instance_id());
    startup::hold_gateway_dir(&containment);
    let ctl = ctl.with_resolved_containment(containment.clone());
    Ok((ctl, store, containment))
}

/// Binds the `--metrics` address, before the start-up reap so a taken address fails the start
/// at once. Port 0 picks a free port: `status` reports the one bound.
pub(super) fn bind_metrics(
    cfg: &mut ServeConfig,
) -> Result<Option<std::net::TcpListener>, ServeError> {
    let Some(addr) = cfg.metrics else {
        return Ok(None);
    };
    let l =
        std::net::TcpListener::bind(addr).map_err(|source| ServeError::Metrics { addr, source })?;
    cfg.metrics = l.local_addr().ok().or(cfg.metrics);
    Ok(Some(l))
}

/// The program an upgrade execs: `--upgrade-program`, else the path this program was started
/// from (a package upgrade or `cargo install` replaces the file there).
pub(super) fn default_program(cfg: &ServeConfig) -> Result<PathBuf, ServeError> {
    match &cfg.upgrade_program {
        Some(p) => Ok(p.clone()),
        None => std::env::current_exe().map_err(|source| ServeError::Io {
            path: PathBuf::from("/proc/self/exe"),
            source,
        }),
    }
}
