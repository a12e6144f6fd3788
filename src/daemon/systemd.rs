//! systemd integration of `leash serve`: a listening socket passed by socket activation
//! (`LISTEN_FDS`/`LISTEN_PID`, fd 3) is served instead of binding one, and the service manager
//! hears `READY=1` once the start-up reap is done and requests are accepted, `STOPPING=1` when
//! the shutdown begins. Both protocols go through the `sd-notify` crate (it implements
//! `sd_listen_fds` and `sd_notify` without libsystemd); outside systemd (no `LISTEN_PID`, no
//! `NOTIFY_SOCKET`) everything here is a no-op. Units: `contrib/systemd/`.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, IntoRawFd, RawFd};
use std::os::unix::net::UnixListener;
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum ActivationError {
    #[error("cannot read the sockets systemd passed (LISTEN_FDS): {0}")]
    Env(io::Error),
    #[error("systemd passed {0} sockets; leash serve takes exactly one (ListenStream= once in leash.socket)")]
    Count(usize),
    #[error("fd {fd} passed by systemd is not a listening Unix stream socket ({why}); check leash.socket's ListenStream=")]
    NotUnixStream { fd: RawFd, why: String },
}

/// The socket systemd passed, and its path, if the daemon was socket-activated. The activation
/// variables are removed from the environment (the daemon is still single-threaded here), so
/// the sessions it spawns do not inherit them.
pub fn activated_listener() -> Result<Option<(UnixListener, Option<PathBuf>)>, ActivationError> {
    let fds: Vec<RawFd> = sd_notify::listen_fds()
        .map_err(ActivationError::Env)?
        .collect();
    for var in ["LISTEN_FDS", "LISTEN_PID", "LISTEN_FDNAMES"] {
        // SAFETY-free in this edition, but racy with other threads: serve calls this before it
        // starts any.
        std::env::remove_var(var);
    }
    match fds.len() {
        0 => return Ok(None),
        1 => {}
        n => return Err(ActivationError::Count(n)),
    }
    let fd = fds[0];
    // systemd passed us this descriptor to own; nothing else in the process uses it.
    let owned = crate::sys::adopt_inherited_fd(fd);
    if let Err(e) = check_stream_listener(fd, owned.as_fd()) {
        // Left open, as it was passed: it is not ours to close when we refuse it.
        let _ = owned.into_raw_fd();
        return Err(e);
    }
    let listener = UnixListener::from(owned);
    let path = listener
        .local_addr()
        .ok()
        .and_then(|a| a.as_pathname().map(|p| p.to_path_buf()));
    Ok(Some((listener, path)))
}

/// The pid that called listen() on `l` (for a listening Unix socket, `SO_PEERCRED` reports its
/// creator): under systemd the service manager, which every client then sees as its peer.
pub fn listener_pid(l: &UnixListener) -> Option<i32> {
    nix::sys::socket::getsockopt(l, nix::sys::socket::sockopt::PeerCredentials)
        .ok()
        .map(|c| c.pid())
        .filter(|&p| p > 0)
}

fn check_stream_listener(fd: RawFd, b: BorrowedFd<'_>) -> Result<(), ActivationError> {
    use nix::sys::socket::{
        getsockname, getsockopt, sockopt, AddressFamily, SockType, SockaddrLike, UnixAddr,
    };
    let not = |why: String| ActivationError::NotUnixStream { fd, why };
    let ty = getsockopt(&b, sockopt::SockType).map_err(|e| not(format!("not a socket: {e}")))?;
    if ty != SockType::Stream {
        return Err(not(format!("socket type {ty:?}")));
    }
    let listening = getsockopt(&b, sockopt::AcceptConn).map_err(|e| not(e.to_string()))?;
    if !listening {
        return Err(not("not listening".into()));
    }
    let addr: UnixAddr = getsockname(fd).map_err(|e| not(format!("getsockname: {e}")))?;
    if addr.family() != Some(AddressFamily::Unix) {
        return Err(not("not a Unix socket".into()));
    }
    Ok(())
}

/// The `STATUS=` sent with `READY=1`: what the start-up reap (its summary, as in `status`'s
/// `startupReap`) settled. Built from the reap's result, so the readiness message cannot be
/// sent before the reap is done (`systemctl status leash` shows it).
pub fn ready_status(startup_reap: &crate::protocol::StartupReap) -> String {
    let r = startup_reap;
    format!(
        "serving; start-up reap: closed {}, lost {}, left open {}, expired {}",
        r.closed, r.lost, r.left_open, r.expired
    )
}

/// Tells the service manager the daemon is ready (no-op without `NOTIFY_SOCKET`).
pub fn notify_ready(status: &str) {
    notify(&[
        sd_notify::NotifyState::Ready,
        sd_notify::NotifyState::Status(status),
    ]);
}

/// Tells the service manager the daemon is stopping (no-op without `NOTIFY_SOCKET`).
pub fn notify_stopping() {
    notify(&[
        sd_notify::NotifyState::Stopping,
        sd_notify::NotifyState::Status("closing sessions"),
    ]);
}

fn notify(states: &[sd_notify::NotifyState<'_>]) {
    if let Err(e) = sd_notify::notify(states) {
        tracing::warn!(error = %e, "cannot notify the service manager (NOTIFY_SOCKET)");
    }
}
