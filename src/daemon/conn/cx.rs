//! What a connection's request loop (`conn.rs`) and the ops' handlers (one file each in
//! `conn/`) share: the write side of a connection ([`Out`]), a request being handled ([`Cx`]),
//! the error replies ([`OpError`]), and the names every handler uses, so that no handler imports
//! from `conn.rs`.

pub(super) use crate::controller::{LeaseRef, LifecycleError};
pub(super) use crate::daemon::session::{self, Batch, SpawnError};
pub(super) use crate::daemon::state::Daemon;
pub(super) use crate::protocol::Phase;
pub(super) use crate::protocol::{
    self, err_line, item_body, ok_line, parse_request, stream_line, Attach, Attached, Cancel,
    CancelNotice, Cancelled, Close, Detach, EndError, EndReason, Ensure, Ensured, ErrorData,
    Events, Frame, Handles, Hello, LeaseRow, Leases, LineReader, MetricsRequest, MetricsText,
    OpRequest, Ping, Reap, Reaped, SessionEntry, SessionsAnswer, SessionsRequest, StatusRequest,
    StreamItem, Verify,
};
pub(super) use crate::store::StoreError;
pub(super) use leash_core::kind::{Code, HasKind};
pub(super) use leash_core::model::LeaseState;
pub(super) use leash_core::model::SessionRow;
pub(super) use leash_core::plan::ReapOptions;
pub(super) use leash_core::visibility::{visible_rows, Grant};
pub(super) use serde::Serialize;
pub(super) use serde_json::{json, Value};
pub(super) use std::collections::HashMap;
pub(super) use std::os::fd::AsFd;
pub(super) use std::os::unix::net::UnixStream;
pub(super) use std::sync::atomic::{AtomicBool, Ordering};
pub(super) use std::sync::{Arc, Mutex};
pub(super) use std::time::Duration;

/// A client that does not read its replies for this long is dropped: measured from the moment
/// the connection's socket buffer was full (a write could make no progress), not per write
/// call. A per-call timeout (`SO_SNDTIMEO`) restarted with every partial write: an attach's
/// 64 KiB write that half fitted waited twice, and a client that never read was dropped after
/// ~65 s where the protocol says 30 s. `LEASH_CLIENT_STALL_MS` overrides it (tests).
pub(super) const WRITE_TIMEOUT: Duration = Duration::from_secs(30);

/// The environment variable that overrides [`WRITE_TIMEOUT`] (milliseconds, at least 1).
pub const ENV_CLIENT_STALL_MS: &str = "LEASH_CLIENT_STALL_MS";

/// [`WRITE_TIMEOUT`], or its override from the environment (read once).
pub(super) fn stall_deadline() -> Duration {
    static STALL: std::sync::OnceLock<Duration> = std::sync::OnceLock::new();
    *STALL.get_or_init(|| {
        match std::env::var(ENV_CLIENT_STALL_MS)
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
        {
            Some(ms) if ms > 0 => Duration::from_millis(ms),
            _ => WRITE_TIMEOUT,
        }
    })
}

/// An error reply.
pub(super) struct OpError {
    pub(super) code: Code,
    pub(super) message: String,
    pub(super) data: Box<ErrorData>,
}

/// An op's answer: its typed result (see `protocol/reply.rs`), or an error reply.
pub(super) type Reply<T> = Result<T, OpError>;

pub(super) fn fail(code: Code, message: impl Into<String>) -> OpError {
    OpError {
        code,
        message: message.into(),
        data: Box::default(),
    }
}

/// A module error as an error reply: the wire code of its kind (the one table,
/// [`crate::kind`] and [`protocol::CODES`]), its message.
pub(super) fn kind_fail(e: &impl HasKind) -> OpError {
    fail(Code::of(e.kind()), e.to_string())
}

impl From<StoreError> for OpError {
    fn from(e: StoreError) -> OpError {
        kind_fail(&e)
    }
}

impl From<LifecycleError> for OpError {
    fn from(e: LifecycleError) -> OpError {
        kind_fail(&e)
    }
}

impl From<SpawnError> for OpError {
    fn from(e: SpawnError) -> OpError {
        let code = Code::of(e.kind());
        // Whichever way the death was seen (the wrapper's report, the child's exit, or the watch
        // after the start), the client gets the same status and last words.
        let mut message = e.to_string();
        let data = match &e {
            SpawnError::Failed { status, stderr } => {
                // `leash exec`'s own refusal (its JSON error line, last on stderr, with the exit
                // status it left with) is the cause; the other lines are the adapter's.
                match leash_error_line(stderr, *status) {
                    Some((cause, said, rest)) => {
                        message = format!(
                            "{said} (exit status {})",
                            status.map_or("unknown".into(), |c| c.to_string())
                        );
                        ErrorData {
                            cause: Some(cause),
                            exit_status: Some(*status),
                            stderr: Some(rest),
                            ..ErrorData::default()
                        }
                    }
                    None => ErrorData {
                        exit_status: Some(*status),
                        stderr: Some(stderr.clone()),
                        ..ErrorData::default()
                    },
                }
            }
            SpawnError::StartFailed { status, stderr } => ErrorData {
                exit_status: Some(*status),
                stderr: Some(stderr.clone()),
                ..ErrorData::default()
            },
            _ => ErrorData::default(),
        };
        let data = Box::new(data);
        // An exit before the first output line is a start failure, however it was seen: the
        // same code as the stream's `start_failed` end.
        let code = if matches!(e, SpawnError::StartFailed { .. }) {
            Code::StartFailed
        } else {
            code
        };
        OpError {
            code,
            message,
            data,
        }
    }
}

/// `leash exec --error-format json`'s error line, `{"error":{"code","message","exitCode"}}`, when
/// it is the last of `stderr` and names the status the process left with: its code, its message
/// and the lines before it. An adapter's own line of that shape with another status is not one.
pub(super) fn leash_error_line(
    stderr: &[String],
    status: Option<i32>,
) -> Option<(String, String, Vec<String>)> {
    let (last, rest) = stderr.split_last()?;
    let v: Value = serde_json::from_str(last).ok()?;
    let err = v.get("error")?;
    let code = err.get("code")?.as_str()?;
    let message = err.get("message")?.as_str()?;
    if err.get("exitCode")?.as_i64()? != i64::from(status?) {
        return None;
    }
    Some((code.to_string(), message.to_string(), rest.to_vec()))
}

/// The write side of a connection, shared by the request loop and its stream threads.
pub(super) struct Out {
    pub(super) stream: Mutex<Outbound>,
    pub(super) broken: AtomicBool,
    /// This connection's running attaches, for `detach`.
    pub(super) attaches: AttachRegistry,
}

/// The socket a connection writes to, and since when its writes make no progress.
pub(super) struct Outbound {
    pub(super) stream: UnixStream,
    /// Set when a write found the socket buffer full, cleared by the next byte accepted.
    pub(super) stalled_since: Option<std::time::Instant>,
}

impl Out {
    /// Writes whole lines; false once the client is gone, or once it has not read for the stall
    /// deadline ([`stall_deadline`]), counted from when its socket buffer filled and across
    /// writes: the client is then dropped (the socket is shut down, so its request loop ends too).
    pub(super) fn send(&self, bytes: &[u8]) -> bool {
        use nix::errno::Errno;
        use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
        use nix::sys::socket::{send, MsgFlags};
        use std::os::fd::AsRawFd;
        if self.broken.load(Ordering::Relaxed) {
            return false;
        }
        let mut o = self.stream.lock().unwrap_or_else(|p| p.into_inner());
        let deadline = stall_deadline();
        let mut off = 0;
        while off < bytes.len() {
            // MSG_DONTWAIT per call: the descriptor is shared with the blocking reader, so it
            // cannot be made non-blocking itself.
            let flags = MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_NOSIGNAL;
            match send(o.stream.as_raw_fd(), &bytes[off..], flags) {
                Ok(n) => {
                    off += n;
                    o.stalled_since = None;
                }
                Err(Errno::EINTR) => {}
                Err(Errno::EAGAIN) => {
                    let since = *o.stalled_since.get_or_insert_with(std::time::Instant::now);
                    let left = deadline.saturating_sub(since.elapsed());
                    if left.is_zero() {
                        tracing::warn!(
                            stalled_ms = since.elapsed().as_millis() as u64,
                            "dropping a client that stopped reading what it is sent"
                        );
                        let _ = o.stream.shutdown(std::net::Shutdown::Both);
                        self.broken.store(true, Ordering::Relaxed);
                        return false;
                    }
                    let ms = u16::try_from(left.as_millis().max(1)).unwrap_or(u16::MAX);
                    let mut fds = [PollFd::new(o.stream.as_fd(), PollFlags::POLLOUT)];
                    match poll(&mut fds, PollTimeout::from(ms)) {
                        Ok(_) | Err(Errno::EINTR) => {}
                        Err(_) => {
                            self.broken.store(true, Ordering::Relaxed);
                            return false;
                        }
                    }
                }
                Err(_) => {
                    self.broken.store(true, Ordering::Relaxed);
                    return false;
                }
            }
        }
        true
    }

    pub(super) fn reply<T: Serialize>(&self, id: &Value, r: Reply<T>) -> bool {
        match r {
            Ok(v) => self.send(&ok_line(id, &v)),
            Err(e) => self.send(&err_line(id, e.code, &e.message, &e.data)),
        }
    }

    /// True once the client closed its end completely (a half-close, shutdown(SHUT_WR) after
    /// the last request, is not a hang-up: the client may still be reading a stream).
    pub(super) fn hung_up(&self) -> bool {
        use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
        if self.broken.load(Ordering::Relaxed) {
            return true;
        }
        let s = self.stream.lock().unwrap_or_else(|p| p.into_inner());
        let mut fds = [PollFd::new(s.stream.as_fd(), PollFlags::empty())];
        match poll(&mut fds, PollTimeout::ZERO) {
            Ok(_) => fds[0]
                .revents()
                .is_some_and(|r| r.intersects(PollFlags::POLLHUP | PollFlags::POLLERR)),
            Err(_) => false,
        }
    }
}

/// The process at the other end of a connection, as the kernel recorded it when it connected.
pub(super) struct Peer {
    pub(super) pid: i32,
    /// Its pidfs inode (`SO_PEERPIDFD`): that process instance, whatever its pid names later.
    /// `None` on kernels that cannot say (before 6.9).
    pub(super) pidfs_ino: Option<u64>,
}

/// One request being handled: the daemon, the connection's write side, the request's id. Each
/// op's handler is a `Handles<Request>` impl for it, in the op's file.
pub(super) struct Cx<'a> {
    pub(super) d: &'a Arc<Daemon>,
    pub(super) out: &'a Arc<Out>,
    /// Who connected (the `exec` op roots its lease there).
    pub(super) peer: &'a Peer,
    pub(super) id: Value,
    /// The gate passed (for the ops it holds back), until the reply.
    pub(super) passed: Option<crate::daemon::gate::Passed>,
}

/// Where a request's time is measured for the request metrics.
pub(super) enum Timed {
    /// Once its handler returned.
    Here,
    /// Where it replies, off the connection's thread ([`Cx::off_thread`]).
    WhereReplied,
}

impl Cx<'_> {
    /// Replies with the op's result (its request type's [`OpRequest::Reply`]) or its error.
    pub(super) fn answer<T: OpRequest>(self, r: Reply<T::Reply>) -> Timed {
        self.out.reply(&self.id, r);
        Timed::Here
    }

    /// Runs `f` on a thread of its own and replies from there, timed there.
    pub(super) fn off_thread<T: OpRequest>(
        self,
        f: impl FnOnce(&Daemon) -> Reply<T::Reply> + std::marker::Send + 'static,
    ) -> Timed
    where
        T::Reply: 'static,
    {
        let name = T::NAME;
        let (d, out2, id, passed) = (self.d.clone(), self.out.clone(), self.id, self.passed);
        let span = tracing::Span::current();
        let spawned = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                let _in = span.enter();
                let started = std::time::Instant::now();
                let r = f(&d);
                d.metrics.observe_request(name, started.elapsed());
                out2.reply(&id, r);
                drop(passed);
            });
        if let Err(e) = spawned {
            // The closure (and its id) moved into the failed spawn; answer without an id.
            self.out.send(&err_line(
                &Value::Null,
                Code::Internal,
                &format!("cannot start a thread for {name}: {e}"),
                &ErrorData::default(),
            ));
        }
        Timed::WhereReplied
    }
}

/// Why a `send` or `attach` has no session of this daemon to go to: the key runs under a lease
/// someone else started (`leash exec`), or there is no such session here at all.
pub(super) fn not_supervised(d: &Daemon, key: &str) -> OpError {
    match d.store().active_lease_for_session(key) {
        Ok(Some(l)) => OpError {
            code: Code::NotSupervised,
            message: format!(
                "session {key} runs under lease {} (wrapper pid {}) that `leash exec` started, not this daemon: only sessions started through the daemon (ensure) take input or stream output; nothing was sent",
                l.lease_id, l.root_pid
            ),
            data: Box::new(ErrorData {
                lease_id: Some(l.lease_id.clone()),
                root_pid: Some(l.root_pid),
                ..ErrorData::default()
            }),
        },
        _ => fail(
            Code::NotFound,
            format!("session {key} is not supervised by this daemon (start it with ensure; the events of an ended session stay readable with the events op)"),
        ),
    }
}

/// How long a close waits for an ensure in flight to have its session, and how long that ensure
/// then waits for the close: the start's own bound, and a close's longest grace with room.
pub(super) const CLOSE_MEETS_ENSURE: Duration = Duration::from_secs(3_600 + 60);

/// A connection's running attaches by request id, each with the flag that stops it.
#[derive(Default)]
pub(super) struct AttachRegistry {
    running: Mutex<HashMap<String, Vec<Arc<AtomicBool>>>>,
}

impl AttachRegistry {
    pub(super) fn register(&self, id: &Value) -> Arc<AtomicBool> {
        let flag = Arc::new(AtomicBool::new(false));
        self.lock()
            .entry(id.to_string())
            .or_default()
            .push(flag.clone());
        flag
    }

    pub(super) fn unregister(&self, id: &Value, flag: &Arc<AtomicBool>) {
        let mut m = self.lock();
        let key = id.to_string();
        if let Some(v) = m.get_mut(&key) {
            v.retain(|f| !Arc::ptr_eq(f, flag));
            if v.is_empty() {
                m.remove(&key);
            }
        }
    }

    /// Stops every attach of this connection with that request id; each ends with an `end`
    /// item of reason `detached` (within one attach tick).
    pub(super) fn detach(&self, id: &Value) -> Reply<crate::protocol::Detached> {
        // Removed here, not when the stream notices: a second detach is already `not_found`.
        match self.lock().remove(&id.to_string()) {
            Some(flags) => {
                for f in &flags {
                    f.store(true, Ordering::SeqCst);
                }
                Ok(crate::protocol::Detached {
                    attach_id: id.clone(),
                    detached: flags.len(),
                })
            }
            None => Err(fail(
                Code::NotFound,
                format!("no running attach with id {id} on this connection (it ended, or was never started here)"),
            )),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Vec<Arc<AtomicBool>>>> {
        self.running.lock().unwrap_or_else(|p| p.into_inner())
    }
}
