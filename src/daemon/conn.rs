//! One client connection: the peer's uid is checked, then requests are read line by line and
//! answered in order. Malformed lines get an error reply and the connection carries on.
//!
//! Requests that take long run off the connection's thread so the connection keeps serving:
//! `close` and `reap` (grace periods) reply when done, and each `attach` streams from its own
//! thread until the session ends or the client hangs up. All of them write through one
//! [`Out`], a line at a time, so replies and stream items never interleave within a line; they
//! can interleave between lines, and clients match them by `id`. A client that vanishes only
//! ends its own streams: sessions never wait for clients (an attach reads from the session's
//! replay buffer, and a reader that falls behind the buffer is told so instead of slowing the
//! adapter down).

use super::protocol::{
    self, err_line, item_body, ok_line, parse_request, stream_line, Attach,
    Attached, CancelNotice, Cancelled, Code, EndError, EndReason, Ensured, ErrorData, Frame,
    LeaseRow, LineReader, MetricsText, Op, Sent, SessionEntry, StreamItem,
};
use super::session::{self, Batch, Phase, SpawnError, SpawnSpec};
use super::Daemon;
use crate::controller::{LeaseRef, LifecycleError};
use crate::kind::HasKind;
use crate::lease::LeaseState;
use crate::plan::ReapOptions;
use crate::store::{SessionRow, StoreError};
use leash_core::visibility::{visible_rows, Grant};
use serde::Serialize;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

// hello, ping, detach, the attach registry, stored specs and the early-exit wait of `ensure`:
// kept in their own file (a child module, so it shares this one's private types).
#[path = "conn_additions.rs"]
mod additions;
use additions::AttachRegistry;

/// A client that does not read its replies for this long is dropped: measured from the moment
/// the connection's socket buffer was full (a write could make no progress), not per write
/// call. A per-call timeout (`SO_SNDTIMEO`) restarted with every partial write: an attach's
/// 64 KiB write that half fitted waited twice, and a client that never read was dropped after
/// ~65 s where the protocol says 30 s. `LEASH_CLIENT_STALL_MS` overrides it (tests).
const WRITE_TIMEOUT: Duration = Duration::from_secs(30);

/// The environment variable that overrides [`WRITE_TIMEOUT`] (milliseconds, at least 1).
pub const ENV_CLIENT_STALL_MS: &str = "LEASH_CLIENT_STALL_MS";

/// [`WRITE_TIMEOUT`], or its override from the environment (read once).
fn stall_deadline() -> Duration {
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
/// How often an idle attach checks whether its client is still there.
const ATTACH_TICK: Duration = Duration::from_millis(250);
/// Stream items written per batch.
const ATTACH_BATCH: usize = 1024;
/// An attach writes its buffer once it holds this much, not once per batch: a batch of 1,024
/// items of 1 KiB filled a 1 MiB buffer, past the CPU's cache, and the kernel's copy of it into
/// the socket read it back from memory (the attach thread's largest cost in `perf`). A write
/// of 64 KiB is still one syscall per few hundred short lines, and replies on the same
/// connection wait behind one such write at most.
const ATTACH_WRITE: usize = 64 * 1024;
/// The write buffer an attach keeps between writes (one that grew past four times this, for
/// long lines, is given back).
const ATTACH_BUF: usize = 128 * 1024;
/// How long `cancel` waits for a send in progress, and then for its notification to be written.
const CANCEL_WAIT: Duration = Duration::from_secs(1);

/// An error reply.
struct OpError {
    code: Code,
    message: String,
    data: Box<ErrorData>,
}

/// An op's answer: its typed result (see `protocol/reply.rs`), or an error reply.
type Reply<T> = Result<T, OpError>;

fn fail(code: Code, message: impl Into<String>) -> OpError {
    OpError {
        code,
        message: message.into(),
        data: Box::default(),
    }
}

/// A module error as an error reply: the wire code of its kind (the one table,
/// [`crate::kind`] and [`protocol::CODES`]), its message.
fn kind_fail(e: &impl HasKind) -> OpError {
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
        let data = match &e {
            SpawnError::Failed { status, stderr } | SpawnError::StartFailed { status, stderr } => {
                ErrorData {
                    exit_status: Some(*status),
                    stderr: Some(stderr.clone()),
                    ..ErrorData::default()
                }
            }
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
            message: e.to_string(),
            data,
        }
    }
}

/// The write side of a connection, shared by the request loop and its stream threads.
struct Out {
    stream: Mutex<Outbound>,
    broken: AtomicBool,
    /// This connection's running attaches, for `detach`.
    attaches: AttachRegistry,
}

/// The socket a connection writes to, and since when its writes make no progress.
struct Outbound {
    stream: UnixStream,
    /// Set when a write found the socket buffer full, cleared by the next byte accepted.
    stalled_since: Option<std::time::Instant>,
}

impl Out {
    /// Writes whole lines; false once the client is gone, or once it has not read for the stall
    /// deadline ([`stall_deadline`]), counted from when its socket buffer filled and across
    /// writes: the client is then dropped (the socket is shut down, so its request loop ends too).
    fn send(&self, bytes: &[u8]) -> bool {
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

    fn reply<T: Serialize>(&self, id: &Value, r: Reply<T>) -> bool {
        match r {
            Ok(v) => self.send(&ok_line(id, &v)),
            Err(e) => self.send(&err_line(id, e.code, &e.message, &e.data)),
        }
    }

    /// True once the client closed its end completely (a half-close, shutdown(SHUT_WR) after
    /// the last request, is not a hang-up: the client may still be reading a stream).
    fn hung_up(&self) -> bool {
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

pub(super) fn serve_connection(d: Arc<Daemon>, stream: UnixStream) {
    let write = match stream.try_clone() {
        Ok(w) => w,
        Err(e) => {
            tracing::warn!(error = %e, "cannot serve a connection");
            return;
        }
    };
    let out = Arc::new(Out {
        stream: Mutex::new(Outbound {
            stream: write,
            stalled_since: None,
        }),
        broken: AtomicBool::new(false),
        attaches: AttachRegistry::default(),
    });
    if let Err(msg) = check_peer(&stream) {
        tracing::warn!("{msg}");
        out.send(&err_line(
            &Value::Null,
            Code::Forbidden,
            &msg,
            &ErrorData::default(),
        ));
        return;
    }
    // Above the adapters for the connection's life (see `priority`).
    super::priority::raise();
    let mut reader = LineReader::new(stream, protocol::MAX_LINE);
    loop {
        match reader.next_frame() {
            Ok(Some(Frame::Line(line))) => {
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue; // blank lines (a human at socat) are ignored
                }
                handle(&d, &out, &line);
            }
            Ok(Some(Frame::TooLong)) => {
                let msg = format!(
                    "request line exceeds {} bytes; it was discarded",
                    protocol::MAX_LINE
                );
                out.send(&err_line(
                    &Value::Null,
                    Code::LineTooLong,
                    &msg,
                    &ErrorData::default(),
                ));
            }
            Ok(None) => break,
            Err(e) => {
                tracing::debug!(error = %e, "connection read failed");
                break;
            }
        }
        if out.broken.load(Ordering::Relaxed) {
            break;
        }
    }
}

/// Only the daemon's own user may talk to it (the socket is 0600 as well; root bypasses modes,
/// the peer check does not).
fn check_peer(stream: &UnixStream) -> Result<(), String> {
    use nix::sys::socket::{getsockopt, sockopt::PeerCredentials};
    let ours = nix::unistd::geteuid().as_raw();
    match getsockopt(stream, PeerCredentials) {
        Ok(c) if c.uid() == ours => Ok(()),
        Ok(c) => Err(format!(
            "peer pid {} runs as uid {}, not as the daemon's uid {ours}: refused",
            c.pid(),
            c.uid()
        )),
        Err(e) => Err(format!("cannot read the peer's credentials: {e}; refused")),
    }
}

fn handle(d: &Arc<Daemon>, out: &Arc<Out>, line: &[u8]) {
    let req = match parse_request(line) {
        Ok(r) => r,
        Err(e) => {
            out.send(&err_line(&e.id, e.code, &e.message, &ErrorData::default()));
            return;
        }
    };
    let id = req.id;
    let started = std::time::Instant::now();
    let op_name = req.op.name();
    // Every line logged while this request runs (a close's signals included, also off this
    // thread: see off_thread) names its op; the JSON log lifts it to the top level.
    let span = tracing::info_span!("request", op = op_name);
    let _in = span.enter();
    tracing::debug!(
        id = crate::cli::logging::json(&id),
        request = crate::cli::logging::json_line(line),
        "request"
    );
    match req.op {
        Op::Status => {
            out.reply(&id, d.status().map_err(OpError::from));
        }
        Op::Ensure(e) => {
            out.reply(&id, ensure(d, &e));
        }
        Op::Send(s) => {
            let timeout = Duration::from_millis(s.timeout_ms.unwrap_or(protocol::SEND_TIMEOUT_MS));
            out.reply(&id, send(d, &s.session, &s.line, timeout));
        }
        Op::Attach(a) => attach(d, out, id, a),
        Op::Cancel(c) => {
            out.reply(&id, cancel(d, &c.target, c.acp_session_id));
        }
        Op::Close(c) => {
            let refs = c.targets;
            off_thread(d, out, id, "close", move |d| {
                // Ensures of these keys in flight are waited for, and what they start is
                // closed with the rest (see `admission`).
                let pending = meet_ensures(d, &refs);
                let why = c.reason.as_deref().unwrap_or("requested");
                let out = d.close(&refs, c.grace_ms, why);
                if c.discard_persistent_state {
                    additions::discard_persistent_state(d, &refs, out.as_ref().ok());
                }
                for p in pending {
                    p.done(out.as_deref().ok());
                }
                Ok(out?)
            });
        }
        Op::Reap(r) => off_thread(d, out, id, "reap", move |d| reap(d, &r)),
        Op::Leases(l) => {
            out.reply(&id, leases(d, l.state.as_deref()));
        }
        Op::Sessions(q) => {
            out.reply(&id, sessions(d, &q));
        }
        Op::Hello(h) => additions::hello(d, out, &id, &h),
        Op::Ping => {
            out.reply(&id, Ok(additions::ping()));
        }
        Op::Detach(x) => {
            out.reply(&id, out.attaches.detach(&x.attach_id));
        }
        Op::Events(e) => {
            out.reply(&id, events(d, &e));
        }
        Op::Verify(t) => {
            out.reply(&id, verify(d, &t));
        }
        Op::Metrics => {
            let text = super::metrics::render(d);
            out.reply(
                &id,
                Ok(MetricsText {
                    content_type: "application/openmetrics-text; version=1.0.0".into(),
                    text,
                }),
            );
        }
    }
    // Long ops (close, reap) are timed where they reply, in off_thread.
    if !matches!(op_name, "close" | "reap") {
        d.metrics.observe_request(op_name, started.elapsed());
    }
}

/// The ensures in flight of the keys a close names (a lease id by its row's session key): each
/// is waited for until it has its session (see [`super::admission`]).
fn meet_ensures(d: &Daemon, refs: &[LeaseRef]) -> Vec<super::admission::PendingClose> {
    let mut keys: Vec<String> = Vec::new();
    for r in refs {
        let key = match r {
            LeaseRef::Session(k) => Some(k.clone()),
            LeaseRef::Id(id) => d.store().lease(id).ok().flatten().map(|l| l.session_key),
        };
        if let Some(k) = key.filter(|k| !keys.contains(k)) {
            keys.push(k);
        }
    }
    keys.iter()
        .filter_map(|k| d.admission.close_arrives(k, CLOSE_MEETS_ENSURE))
        .collect()
}

/// `leash verify` in the daemon: reads only, never signals.
fn verify(d: &Daemon, t: &LeaseRef) -> Reply<crate::controller::verify::VerifyReport> {
    use crate::controller::verify::VerifyError;
    match d.ctl.verify(t) {
        Ok(r) => Ok(r),
        Err(e @ (VerifyError::NoLease(_) | VerifyError::NoSession(_))) => {
            Err(fail(Code::NotFound, e.to_string()))
        }
        Err(VerifyError::Store(e)) => Err(e.into()),
    }
}

fn off_thread<T: Serialize + 'static>(
    d: &Arc<Daemon>,
    out: &Arc<Out>,
    id: Value,
    name: &'static str,
    f: impl FnOnce(&Daemon) -> Reply<T> + Send + 'static,
) {
    let (d, out2) = (d.clone(), out.clone());
    let op_name = name;
    let span = tracing::Span::current();
    let spawned = std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            let _in = span.enter();
            let started = std::time::Instant::now();
            let r = f(&d);
            d.metrics.observe_request(op_name, started.elapsed());
            out2.reply(&id, r);
        });
    if let Err(e) = spawned {
        // The closure (and its id) moved into the failed spawn; answer without an id.
        out.send(&err_line(
            &Value::Null,
            Code::Internal,
            &format!("cannot start a thread for {name}: {e}"),
            &ErrorData::default(),
        ));
    }
}

/// Why a `send` or `attach` has no session of this daemon to go to: the key runs under a lease
/// someone else started (`leash exec`), or there is no such session here at all.
fn not_supervised(d: &Daemon, key: &str) -> OpError {
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

/// `events`: a session's persisted events above `since` (the controller's `events`);
/// `not_found` for a key that names nothing (as `attach` and `send` answer).
fn events(d: &Daemon, e: &protocol::Events) -> Reply<Vec<crate::store::Event>> {
    d.ctl.events(&e.session, e.since).map_err(|e| kind_fail(&e))
}

fn describe(s: &session::Supervised, created: bool, argv_matches: bool) -> Ensured {
    let st = s.status();
    Ensured {
        argv_matches,
        created,
        last_seq: st.last_seq,
        lease_id: st.lease_id,
        phase: st.phase,
        root_pid: st.root_pid,
        session_key: s.key.clone(),
        initialize: None,
    }
}

fn ensure(d: &Arc<Daemon>, e: &protocol::Ensure) -> Reply<Ensured> {
    if d.is_shutting_down() {
        return Err(fail(
            Code::ShuttingDown,
            "the daemon is shutting down and starts no sessions",
        ));
    }
    // While an ensure of the key is in flight, its session (starting, perhaps about to fail or
    // be closed) is not this ensure's answer: it queues and answers from what that ensure left.
    // A session being closed is answered once admitted: the close may be one that an ensure in
    // flight is waiting for, and this ensure then queues behind both.
    if !d.admission.in_flight(&e.session) {
        if let Some(found) = existing(d, e, false) {
            return found;
        }
    }
    // The key's admission slot (see `admission`): one ensure of a key at a time, the others
    // queued behind it until their own deadline.
    let limit = Duration::from_millis(e.queue_timeout_ms.unwrap_or(DEFAULT_QUEUE_TIMEOUT_MS));
    let ticket = match d.admission.enter(&e.session, limit) {
        Ok(t) => t,
        Err(super::admission::Refused::QueueFull) => {
            return Err(fail(
                Code::Conflict,
                format!(
                    "session {} is being started by another request and {} more ensures of it wait already; ensure it again once one has answered",
                    e.session,
                    super::admission::MAX_QUEUED
                ),
            ))
        }
        Err(super::admission::Refused::TimedOut) => {
            return Err(fail(
                Code::Conflict,
                format!(
                    "session {} is being started by another request that did not answer within this ensure's queueTimeoutMs ({} ms); nothing was started: ensure it again",
                    e.session,
                    limit.as_millis()
                ),
            ))
        }
    };
    // Admitted after a wait: what the predecessor left decides, as if this ensure came alone. A
    // close under way (the one an ensure before this one met, or an ordinary one) is let finish
    // within this ensure's queue deadline, so the ensure starts afresh after it.
    if let Some(s) = d.session(&e.session) {
        s.wait_while_closing(limit);
    }
    if let Some(found) = existing(d, e, true) {
        return found;
    }
    // Checked again once admitted: shutdown sets the flag, then waits for the admissions to
    // drain, so a session is either refused here or seen (and closed) by the shutdown.
    if d.is_shutting_down() {
        return Err(fail(
            Code::ShuttingDown,
            "the daemon is shutting down and starts no sessions",
        ));
    }
    let result = additions::with_spec(d, e).and_then(|e| start(d, &e, &ticket));
    // A close that arrived while this ensure was in flight closed what it started: the ensure
    // says so (after the close finished), whatever it saw of the adapter meanwhile.
    match ticket.release(CLOSE_MEETS_ENSURE) {
        super::admission::Release::Closed(outcome) => closed_in_flight(&e.session, outcome, result),
        super::admission::Release::Alone => result,
    }
}

/// How long a queued ensure waits for its key's slot when it gives no `queueTimeoutMs`: a
/// predecessor's `waitMs` (at most a minute) with room.
const DEFAULT_QUEUE_TIMEOUT_MS: u64 = 120_000;

/// The session of the key this ensure asks for, when it is there to answer from: running or
/// starting (`created: false`), or closing (`conflict`, when `closing_answers`). `None`: none,
/// or ended.
fn existing(
    d: &Arc<Daemon>,
    e: &protocol::Ensure,
    closing_answers: bool,
) -> Option<Reply<Ensured>> {
    let s = d.session(&e.session)?;
    match s.phase() {
        Phase::Starting | Phase::Running => {
            let matches = e.wants_stored_spec() || s.argv == e.argv;
            if !matches {
                tracing::warn!(session_key = %e.session, running = crate::cli::logging::json(&s.argv), asked = crate::cli::logging::json(&e.argv), "ensure found the session running another argv");
            }
            additions::on_running(d, e);
            Some(Ok(describe(&s, false, matches)))
        }
        Phase::Closing if !closing_answers => None,
        Phase::Closing => Some(Err(fail(
            Code::Conflict,
            format!(
                "session {} is being closed; ensure it again once it has ended",
                e.session
            ),
        ))),
        Phase::Ended => None,
    }
}

/// How long a close waits for an ensure in flight to have its session, and how long that ensure
/// then waits for the close: the start's own bound, and a close's longest grace with room.
const CLOSE_MEETS_ENSURE: Duration = Duration::from_secs(3_600 + 60);

/// The reply of an ensure whose session a close ended while the ensure was in flight: `closed`,
/// unless the close terminated nothing (ownership unverified: the session runs on).
fn closed_in_flight(
    key: &str,
    outcome: Option<crate::controller::CloseOutcome>,
    result: Reply<Ensured>,
) -> Reply<Ensured> {
    use crate::controller::CloseResult;
    match &outcome {
        Some(o) if !matches!(o.result, CloseResult::Closed | CloseResult::Lost) => result,
        _ => Err(OpError {
            code: Code::Closed,
            message: format!(
                "session {key} was closed by a close request that arrived while this ensure was starting it ({}); nothing of it runs: ensure it again to start a new one",
                outcome.as_ref().map_or("the close did not report on its lease".to_string(), |o| format!("lease {}: {:?}", o.lease_id, o.result).to_lowercase())
            ),
            data: Box::new(ErrorData {
                lease_id: outcome.map(|o| o.lease_id),
                ..ErrorData::default()
            }),
        }),
    }
}

fn start(
    d: &Arc<Daemon>,
    e: &protocol::Ensure,
    ticket: &super::admission::Ticket<'_>,
) -> Reply<Ensured> {
    if let Some(cwd) = &e.cwd {
        if !std::path::Path::new(cwd).is_dir() {
            return Err(fail(
                Code::BadRequest,
                format!("ensure: cwd {cwd} is not a directory"),
            ));
        }
    }
    let spec = SpawnSpec {
        root: &d.root,
        store: &d.session_store,
        ctl: &d.ctl,
        exe: &d.exe,
        daemon_pid: d.me.pid,
        default_grace_ms: d.cfg.default_grace_ms,
        limits: d.cfg.replay,
    };
    let s = session::spawn(&spec, e)?;
    d.metrics.wrapper_starts.inc();
    d.sessions().insert(e.session.clone(), s.clone());
    if let Err(err) = s.await_started() {
        if matches!(err, SpawnError::Timeout(_)) {
            if let Some(id) = s.lease_id() {
                let _ = d.close(&[LeaseRef::Id(id.to_string())], None, "start timed out");
            }
        }
        return Err(err.into());
    }
    // Under a lease, adapter started: a close waiting for this ensure goes on now.
    ticket.publish(&s);
    if ticket.close_requested() {
        // The reply is the close's (see `ensure`); the adapter is not watched any more.
        return Ok(describe(&s, true, true));
    }
    let initialize = additions::handshake(d, e, &s)?;
    additions::after_start(d, e, &s)?;
    let mut r = describe(&s, true, true);
    r.initialize = initialize;
    // The answer is the start's: the adapter was started. What it did after (an exit before
    // its first line is the stream's `start_failed` end) is not raced into the reply.
    if !matches!(r.phase, Phase::Closing) {
        r.phase = Phase::Running;
    }
    Ok(r)
}

/// A write to the adapter's stdin that failed, as an error reply.
fn write_failed(key: &str, e: session::PipeError) -> OpError {
    match e {
        session::PipeError::TimedOut { written, total, .. } => OpError {
            code: Code::SendTimeout,
            message: format!("session {key}: {e}"),
            data: Box::new(ErrorData {
                bytes: Some(total as u64),
                bytes_written: Some(written as u64),
                ..ErrorData::default()
            }),
        },
        e => fail(
            Code::NotRunning,
            format!("cannot write to session {key}'s adapter: {e}"),
        ),
    }
}

fn send(d: &Daemon, key: &str, line: &str, timeout: Duration) -> Reply<Sent> {
    let s = d.session(key).ok_or_else(|| not_supervised(d, key))?;
    // The timeout covers the wait behind an earlier send as well.
    let started = std::time::Instant::now();
    let Some(_order) = s.order_within(timeout) else {
        return Err(OpError {
            code: Code::SendTimeout,
            message: format!(
                "session {key}: an earlier send is still blocked on the adapter's stdin after {timeout:?}; nothing written"
            ),
            data: Box::new(ErrorData {
                bytes: Some(line.len() as u64 + 1),
                bytes_written: Some(0),
                ..ErrorData::default()
            }),
        });
    };
    let timeout = timeout
        .saturating_sub(started.elapsed())
        .max(Duration::from_millis(1));
    match s.phase() {
        Phase::Starting | Phase::Running => {}
        p => {
            return Err(fail(
                Code::NotRunning,
                format!("session {key} is {p:?}; nothing written").to_lowercase(),
            ))
        }
    }
    s.write_line(line, timeout)
        .map_err(|e| write_failed(key, e))?;
    Ok(Sent {
        busy: s.busy(),
        bytes: line.len() + 1,
        session_key: key.to_string(),
    })
}

fn attach(d: &Arc<Daemon>, out: &Arc<Out>, id: Value, mut a: Attach) {
    let Some(s) = d.session(&a.session) else {
        out.reply::<Attached>(&id, Err(not_supervised(d, &a.session)));
        return;
    };
    match s.check_since(a.since) {
        Err((oldest, last)) => {
            let e = OpError {
                code: Code::SeqEvicted,
                message: format!(
                    "seq {} fell out of session {}'s replay buffer (oldest buffered seq {oldest}); attach with since >= {} or read persisted events with the events op",
                    a.since + 1,
                    a.session,
                    oldest - 1
                ),
                data: Box::new(ErrorData {
                    last_seq: Some(last),
                    oldest_seq: Some(oldest),
                    ..ErrorData::default()
                }),
            };
            out.reply::<Attached>(&id, Err(e));
            return;
        }
        Ok((oldest, last)) => {
            // A since above the last seq (a client's seq from another state root, or a bug)
            // would otherwise stall the stream until the seqs caught up: start at the last seq
            // instead and say so.
            let clamped = a.since > last;
            let since = a.since.min(last);
            let ok = Attached {
                clamped,
                last_seq: last,
                lease_id: s.lease_id().map(str::to_owned),
                oldest_seq: oldest,
                phase: s.phase(),
                requested_since: clamped.then_some(a.since),
                session_key: s.key.clone(),
                since,
            };
            a.since = since;
            if !out.reply(&id, Ok(ok)) {
                return;
            }
        }
    }
    let out = out.clone();
    let stop = out.attaches.register(&id);
    let spawned = std::thread::Builder::new()
        .name(format!("attach:{}", a.session))
        .stack_size(super::SMALL_STACK)
        .spawn(move || {
            // Live from here until the stream ends: its cursor holds the adapter back (see
            // docs/protocol.md, backpressure).
            let token = s.join(a.since);
            stream(&s, token, &out, &id, &a, &stop);
            out.attaches.unregister(&id, &stop);
            s.leave(token);
        });
    if let Err(e) = spawned {
        tracing::error!(error = %e, "cannot start an attach thread");
    }
}

/// Streams items above `since` until the session ends, the client goes, or the client falls
/// out of the buffer.
fn stream(
    s: &session::Supervised,
    token: u64,
    out: &Out,
    id: &Value,
    a: &Attach,
    stop: &AtomicBool,
) {
    let mut cursor = a.since;
    let id_json = serde_json::to_string(id).expect("JSON values serialise");
    // One write buffer for the whole attach: a fresh one per batch grew by doubling past the
    // allocator's mmap threshold, so every batch paid an mmap, page faults and an munmap.
    let mut buf = Vec::new();
    loop {
        if stop.load(Ordering::SeqCst) {
            let body = item_body(&StreamItem::End {
                error: None,
                last_seq: cursor,
                reason: EndReason::Detached,
            });
            out.send(&stream_line(id, &body));
            return;
        }
        match s.next_batch(token, cursor, ATTACH_BATCH, ATTACH_TICK) {
            // Detached while waiting: nothing more goes out on this attach.
            _ if stop.load(Ordering::SeqCst) => continue,
            Batch::Items(items) => {
                buf.clear();
                if buf.capacity() > 4 * ATTACH_BUF {
                    buf.shrink_to(ATTACH_BUF);
                }
                for it in items.iter().filter(|it| a.stderr || !it.stderr) {
                    it.write_line(&mut buf, &id_json);
                    if buf.len() >= ATTACH_WRITE {
                        if !out.send(&buf) {
                            return;
                        }
                        buf.clear();
                    }
                }
                if !buf.is_empty() && !out.send(&buf) {
                    return;
                }
                cursor = items.last().map_or(cursor, |i| i.seq);
            }
            Batch::Idle => {
                if out.hung_up() {
                    return;
                }
            }
            Batch::Ended {
                last_seq,
                start_failed,
            } => {
                let body = item_body(&match start_failed {
                    // The same words and fields as an ensure's `start_failed`.
                    Some(f) => StreamItem::End {
                        error: Some(EndError {
                            code: Code::StartFailed.as_str().into(),
                            last_seq,
                            message: f.to_string(),
                            oldest_seq: s.status().oldest_seq.unwrap_or(last_seq),
                            exit_status: Some(f.status),
                            stderr: Some(f.stderr.clone()),
                        }),
                        last_seq,
                        reason: EndReason::StartFailed,
                    },
                    None => StreamItem::End {
                        error: None,
                        last_seq,
                        reason: EndReason::Ended,
                    },
                });
                out.send(&stream_line(id, &body));
                return;
            }
            Batch::Evicted {
                oldest_seq,
                last_seq,
            } => {
                let body = item_body(&StreamItem::End {
                    error: Some(EndError {
                        code: Code::SeqEvicted.as_str().into(),
                        last_seq,
                        message: format!("the client fell behind: seq {} fell out of the replay buffer; attach again", cursor + 1),
                        oldest_seq,
                        exit_status: None,
                        stderr: None,
                    }),
                    last_seq: cursor,
                    reason: EndReason::Evicted,
                });
                out.send(&stream_line(id, &body));
                return;
            }
        }
    }
}

fn cancel(d: &Daemon, target: &LeaseRef, acp: Option<String>) -> Reply<Cancelled> {
    let supervised = match target {
        LeaseRef::Session(k) => d.session(k),
        LeaseRef::Id(id) => d.session_by_lease(id),
    };
    let cancelled = |outcome, acp_session_id, notified, supervised, reason| Cancelled {
        outcome,
        notice: Some(CancelNotice {
            acp_session_id,
            notified,
            reason,
            supervised,
        }),
    };
    let Some(s) = supervised.filter(|s| s.phase() != Phase::Ended) else {
        // Not one of ours: record the intent only, as `leash cancel` does without a daemon.
        let detail = json!({"acpSessionId": acp, "notified": false});
        let out = d.ctl.cancel(target, Some(detail))?;
        return Ok(cancelled(out, acp, false, Some(false), None));
    };
    // A send blocked on an adapter that does not read holds the order lock for up to its
    // timeout: cancel, the no-signal way to stop a turn, does not queue behind it. It records
    // the intent and says the notification could not be written.
    let order = s.order_within(CANCEL_WAIT);
    if !matches!(s.phase(), Phase::Running | Phase::Starting) {
        return Err(fail(
            Code::NotRunning,
            format!("session {} is being closed; nothing written", s.key),
        ));
    }
    let Some(lease_id) = s.lease_id().map(str::to_owned) else {
        return Err(fail(
            Code::NotRunning,
            format!("session {} is still starting; nothing written", s.key),
        ));
    };
    let Some(acp) = acp.or_else(|| s.infer_acp_session()) else {
        // No single ACP session to notify: the intent is recorded all the same, as without a
        // daemon (`leash cancel` answers the same either way); `notified: false` says why not.
        let detail = json!({"acpSessionId": null, "notified": false});
        let out = d.ctl.cancel(&LeaseRef::Id(lease_id), Some(detail));
        s.sync_events();
        return Ok(cancelled(out?, None, false, Some(true), None));
    };
    let not_written = match order {
        None => Some("a send to the adapter is blocked (it does not read its stdin)".to_string()),
        Some(_) => match s.write_line(&session::cancel_notification(&acp), CANCEL_WAIT) {
            Ok(()) => None,
            Err(e @ session::PipeError::TimedOut { .. }) => Some(e.to_string()),
            Err(e) => return Err(write_failed(&s.key, e)),
        },
    };
    if let Some(why) = not_written {
        let detail = json!({"acpSessionId": acp, "notified": false, "reason": why});
        let outcome = d.ctl.cancel(&LeaseRef::Id(lease_id), Some(detail));
        s.sync_events();
        let reason = format!("the cancel was recorded but not written to the adapter: {why}");
        return Ok(cancelled(outcome?, Some(acp), false, None, Some(reason)));
    }
    let detail = json!({"acpSessionId": acp, "notified": true});
    let outcome = d.ctl.cancel(&LeaseRef::Id(lease_id), Some(detail));
    s.sync_events();
    Ok(cancelled(outcome?, Some(acp), true, Some(true), None))
}

/// `reap`: the plan of a dry run, or the report.
#[derive(Serialize)]
#[serde(untagged)]
enum Reaped {
    Plan(crate::plan::ReapPlan),
    Report(crate::controller::ReapReport),
}

fn reap(d: &Daemon, r: &protocol::Reap) -> Reply<Reaped> {
    let ctl = &d.ctl;
    let opts = ReapOptions {
        include_live: r.include_live,
        retention_ms: r
            .retention_ms
            .unwrap_or_else(crate::limits::default_retention_ms)
            .min(i64::MAX as u64) as i64,
        now_ms: crate::lease::now_ms(),
        grace_ms: r.grace_ms,
    };
    if r.dry_run {
        return Ok(Reaped::Plan(ctl.plan_reap(&opts)?));
    }
    let report = ctl.reap(&opts)?;
    d.metrics.record_outcomes(&report.leases, true);
    for s in d.all_sessions() {
        s.sync_events();
    }
    Ok(Reaped::Report(report))
}

fn leases(d: &Daemon, state: Option<&str>) -> Reply<Vec<LeaseRow>> {
    let states: Vec<LeaseState> = state.and_then(|s| s.parse().ok()).into_iter().collect();
    // As `leash leases` runs it: the wrappers' reports folded in first.
    let rows = d.ctl.leases(&states)?;
    Ok(rows.into_iter().map(LeaseRow::from).collect())
}

/// `sessions`: the plain rows, or the answer to a query.
#[derive(Serialize)]
#[serde(untagged)]
enum SessionsAnswer {
    Rows(Vec<SessionEntry>),
    List(crate::controller::sessions::Listing),
    History(crate::controller::sessions::History),
    Status(Box<crate::controller::sessions::SessionStatus>),
}

fn sessions(d: &Daemon, q: &protocol::SessionsRequest) -> Reply<SessionsAnswer> {
    if let (Some(query), Some(requester)) = (&q.query, &q.requester) {
        return session_query(d, query, requester, &q.scope);
    }
    let rows = d.store().sessions()?;
    let mut live: HashMap<String, protocol::LiveSession> = d
        .all_sessions()
        .iter()
        .map(|s| (s.key.clone(), s.status()))
        .collect();
    // The one visibility check of leash (`leash_core::visibility`), as `leash sessions list` runs it;
    // without a requester, every row (an operator's view).
    let visible: Vec<(&SessionRow, Option<Grant>)> = match &q.requester {
        Some(req) => visible_rows(&rows, req, &q.scope)
            .into_iter()
            .map(|(r, g)| (r, Some(g)))
            .collect(),
        None => rows.iter().map(|r| (r, None)).collect(),
    };
    let out = visible
        .into_iter()
        .map(|(row, grant)| SessionEntry {
            live: live.remove(&row.session_key),
            row: row.clone(),
            visible_as: grant,
        })
        .collect();
    Ok(SessionsAnswer::Rows(out))
}

/// `leash sessions list|history|status` asked of the daemon: the CLI's own operations (the same
/// visibility gate, the same JSON), run here so that the thin client goes through the daemon.
fn session_query(
    d: &Daemon,
    query: &protocol::SessionQuery,
    requester: &str,
    scope: &leash_core::visibility::Scope,
) -> Reply<SessionsAnswer> {
    use crate::controller::sessions::View;
    use protocol::SessionQuery;
    let s = &d.ctl;
    let view = View::new(requester, scope.clone());
    let answer = match query {
        SessionQuery::List => s.list(&view).map(SessionsAnswer::List),
        SessionQuery::History(k) => s.history(&view, k).map(SessionsAnswer::History),
        SessionQuery::Status(k) => s
            .status(&view, k)
            .map(|st| SessionsAnswer::Status(Box::new(st))),
    };
    answer.map_err(|e| kind_fail(&e))
}
