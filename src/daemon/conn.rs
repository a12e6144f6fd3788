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
//!
//! Each request is parsed against the table of ops (`protocol/mod.rs`) and handed to its op's
//! handler ([`Cx`], a `Handles<Request>` impl in the op's own file under `conn/`).

use cx::*;
use leash_core::kind::Code;
use serde_json::Value;
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

// One handler per op, each in its own file (a child module, so it shares this one's private
// types); the table of ops is `protocol/mod.rs`.
mod attach;
mod cancel;
mod close;
mod cx;
mod detach;
mod ensure;
mod events;
mod exec;
mod hello;
mod leases;
mod metrics;
mod ping;
mod reap;
mod send;
mod sessions;
mod status;
mod upgrade;
mod verify;

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
    let peer = match check_peer(&stream) {
        Ok(p) => p,
        Err(msg) => {
            tracing::warn!("{msg}");
            out.send(&err_line(
                &Value::Null,
                Code::Forbidden,
                &msg,
                &ErrorData::default(),
            ));
            return;
        }
    };
    // One process may hold only so many connections: the descriptors are everyone's.
    let _slot = match d.peers.admit(peer.pid) {
        Ok(slot) => slot,
        Err(msg) => {
            out.send(&err_line(
                &Value::Null,
                Code::Conflict,
                &msg,
                &ErrorData::default(),
            ));
            return;
        }
    };
    // Above the adapters for the connection's life (see `priority`).
    super::priority::raise();
    let mut reader = LineReader::new(stream, protocol::MAX_LINE);
    loop {
        match reader.next_frame() {
            Ok(Some(Frame::Line(line))) => {
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue; // blank lines (a human at socat) are ignored
                }
                handle(&d, &out, &peer, &line);
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
fn check_peer(stream: &UnixStream) -> Result<Peer, String> {
    use nix::sys::socket::{getsockopt, sockopt::PeerCredentials};
    let ours = nix::unistd::geteuid().as_raw();
    match getsockopt(stream, PeerCredentials) {
        Ok(c) if c.uid() == ours => Ok(Peer {
            pid: c.pid(),
            pidfs_ino: crate::proc::peer_pidfs_ino(stream.as_fd()),
        }),
        Ok(c) => Err(format!(
            "peer pid {} runs as uid {}, not as the daemon's uid {ours}: refused",
            c.pid(),
            c.uid()
        )),
        Err(e) => Err(format!("cannot read the peer's credentials: {e}; refused")),
    }
}

fn handle(d: &Arc<Daemon>, out: &Arc<Out>, peer: &Peer, line: &[u8]) {
    let req = match parse_request(line) {
        Ok(r) => r,
        Err(e) => {
            out.send(&err_line(&e.id, e.code, &e.message, &ErrorData::default()));
            return;
        }
    };
    let started = std::time::Instant::now();
    let op_name = req.op.name();
    // Every line logged while this request runs (a close's signals included, also off this
    // thread: see off_thread) names its op; the JSON log lifts it to the top level.
    let span = tracing::info_span!("request", op = op_name);
    let _in = span.enter();
    tracing::debug!(
        id = crate::logvalue::json(&req.id),
        request = crate::logvalue::json_line(line),
        "request"
    );
    // The ops that change something pass the gate a handoff closes (`gate.rs`).
    let passed = if super::gate::GATED.contains(&op_name) {
        match d.gate.pass() {
            Some(p) => Some(p),
            None => {
                out.send(&err_line(
                    &req.id,
                    Code::ShuttingDown,
                    "the daemon is handing over to a new program of itself (an upgrade): nothing was done; retry in a moment",
                    &ErrorData::default(),
                ));
                return;
            }
        }
    } else {
        None
    };
    let cx = Cx {
        d,
        out,
        peer,
        id: req.id,
        passed,
    };
    // Long ops (close, reap) are timed where they reply, in off_thread.
    if let Timed::Here = req.op.dispatch(cx) {
        d.metrics.observe_request(op_name, started.elapsed());
    }
}
