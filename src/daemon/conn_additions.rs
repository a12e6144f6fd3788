//! The protocol additions of a connection (issue 13), beside the original operations in
//! `conn.rs`: `hello` (version, features, lifecycle pushes), `ping`, `detach` and the registry
//! of a connection's attaches it works on, and the two steps `ensure` gained — resolving a
//! stored spec for `ensure {session}`, and after a start, watching the adapter for an early death
//! and storing (or forgetting) its spec.

use super::super::protocol::{
    item_body, Code, Detached, Ensure, Hello, Pong, Resumable, StreamItem, Welcome, OPS,
    PROTOCOL_VERSION,
};
use super::super::session::Supervised;
use super::super::{spec, Daemon};
use super::{fail, OpError, Out, Reply};
use serde_json::Value;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What `hello` announces beyond the original protocol; a client checks these instead of
/// comparing versions. Ops are listed separately (`ops`), so ops added later need no entry here.
pub const FEATURES: &[&str] = &[
    "ping",
    "detach",
    "attach.sinceClamp",
    "attach.stderr",
    "ensure.wait",
    "ensure.argvMatches",
    "ensure.storedSpec",
    "events.resumable",
    // An exit before the adapter's first output line ends the stream `start_failed`.
    "attach.startFailed",
    // A close that meets an ensure in flight closes what it started; the ensure says `closed`.
    "ensure.closedInFlight",
    // `initialize` and `handshakeTimeoutMs`: the daemon sends the handshake (`handshake_timeout`).
    "ensure.handshake",
];

pub(super) fn ping() -> Pong {
    Pong {
        at: crate::lease::now_ms(),
        pong: true,
    }
}

pub(super) fn hello(d: &Arc<Daemon>, out: &Arc<Out>, id: &Value, h: &Hello) {
    tracing::debug!(
        client = h.client.as_deref(),
        protocol = h.protocol,
        events = h.events,
        "hello"
    );
    let result = Welcome {
        daemon_pid: d.me.pid,
        events: h.events,
        features: FEATURES.iter().map(|f| f.to_string()).collect(),
        ops: OPS.iter().map(|o| o.to_string()).collect(),
        protocol: PROTOCOL_VERSION,
        version: env!("CARGO_PKG_VERSION").into(),
    };
    if !out.reply(id, Ok(result)) || !h.events {
        return;
    }
    let initial: Vec<String> = d
        .resumable
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .map(|entry| resumable_item(d, entry))
        .map(|item| item_body(&item))
        .collect();
    let weak = Arc::downgrade(out);
    d.push.subscribe(
        id.clone(),
        Box::new(move |line| weak.upgrade().is_some_and(|o| o.send(line))),
        &initial,
    );
}

/// A resumable entry as a push item, with whether `ensure {session}` can re-spawn it from a
/// stored spec, and the env names it must then give values for.
fn resumable_item(d: &Daemon, entry: &Resumable) -> StreamItem {
    let stored = spec::load(&d.store(), &entry.session_key).ok().flatten();
    StreamItem::Resumable {
        has_spec: stored.is_some(),
        needs_env: stored.map(|s| s.env_names).unwrap_or_default(),
        entry: entry.clone(),
    }
}

/// `ensure {session}` (no argv): the stored spec, with the request's per-call fields.
pub(super) fn with_spec(d: &Daemon, e: &Ensure) -> Result<Ensure, OpError> {
    if !e.wants_stored_spec() {
        return Ok(e.clone());
    }
    match spec::load(&d.store(), &e.session)? {
        Some(s) => s.into_request(e).map_err(|missing| {
            fail(
                Code::BadRequest,
                format!(
                    "session {}'s stored spec keeps the names of its env but not their values (it was ensured without persistEnv); give \"env\" with {}, or ensure it with argv again",
                    e.session,
                    missing.join(", ")
                ),
            )
        }),
        None => Err(fail(
            Code::NotFound,
            format!(
                "session {} has no stored spec (it was never ensured with persistSpec, or with persistSpec: false); give \"argv\"",
                e.session
            ),
        )),
    }
}

/// After the wrapper reported the adapter's start: watch it for an early death, then store (or
/// forget) its spec and take it off the resumable list.
pub(super) fn after_start(d: &Daemon, e: &Ensure, s: &Supervised) -> Result<(), OpError> {
    // `waitMs` is checked at the edge (at most `limits::MAX_ENSURE_WAIT_MS`). Without a wait
    // nothing is watched at all: the answer is the start's, never a race with the adapter's
    // exit (that is the stream's `start_failed`).
    let wait = e.wait_ms.map_or(d.cfg.ensure_wait, Duration::from_millis);
    if !wait.is_zero() {
        if let Err(err) = s.await_early_exit(wait) {
            tracing::warn!(session_key = %e.session, error = %err, "adapter died during ensure");
            return Err(err.into());
        }
    }
    let stored = if e.persist_spec {
        spec::protect(&d.root);
        spec::save(&mut d.writer(), &e.session, &spec::Spec::of(e))
    } else {
        spec::forget(&mut d.writer(), &e.session)
    };
    if let Err(err) = stored {
        tracing::warn!(session_key = %e.session, error = %err, "cannot store the session's spec");
    }
    let was_resumable = {
        let mut list = d.resumable.lock().unwrap_or_else(|p| p.into_inner());
        let before = list.len();
        list.retain(|r| r.session_key != e.session);
        list.len() != before
    };
    if was_resumable {
        d.push.publish(&item_body(&StreamItem::Resumed {
            lease_id: s.lease_id().map(str::to_owned),
            session_key: e.session.clone(),
        }));
    }
    Ok(())
}

/// An ensure that found its session running: `persistSpec: false` still means "keep no spec",
/// so a spec stored by an earlier ensure is deleted now, not at the next start.
pub(super) fn on_running(d: &Daemon, e: &Ensure) {
    if !e.persist_spec {
        if let Err(err) = spec::forget(&mut d.writer(), &e.session) {
            tracing::warn!(session_key = %e.session, error = %err, "cannot delete the session's stored spec");
        }
    }
}

/// `close` with `discardPersistentState`: the stored specs and resumable entries of the sessions
/// named (by key, or by a lease the close settled) are deleted, whatever the close answered:
/// the caller wants nothing of them kept, and a session that is not running has only these left.
pub(super) fn discard_persistent_state(
    d: &Daemon,
    refs: &[crate::controller::LeaseRef],
    closed: Option<&Vec<crate::controller::CloseOutcome>>,
) {
    let mut keys: Vec<String> = refs
        .iter()
        .filter_map(|r| match r {
            crate::controller::LeaseRef::Session(k) => Some(k.clone()),
            crate::controller::LeaseRef::Id(_) => None,
        })
        .collect();
    keys.extend(closed.into_iter().flatten().map(|o| o.session_key.clone()));
    keys.sort();
    keys.dedup();
    for k in &keys {
        if let Err(err) = spec::forget(&mut d.writer(), k) {
            tracing::warn!(session_key = %k, error = %err, "cannot delete the session's stored spec");
        }
    }
    d.resumable
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .retain(|r| !keys.contains(&r.session_key));
}

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
    pub(super) fn detach(&self, id: &Value) -> Reply<Detached> {
        // Removed here, not when the stream notices: a second detach is already `not_found`.
        match self.lock().remove(&id.to_string()) {
            Some(flags) => {
                for f in &flags {
                    f.store(true, Ordering::SeqCst);
                }
                Ok(Detached {
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

/// `ensure` with `initialize` (the handshake deadline, issue 23.2): once the adapter started,
/// the daemon sends it `initialize` and waits for the response within `handshakeTimeoutMs`. The
/// response is the reply's `initialize`. None in time: the session is closed (TERM, the grace,
/// KILL) and ended before the ensure answers `handshake_timeout` with the adapter's last stderr
/// lines, so a retry starts afresh and no process is left per retry. An adapter that closed
/// its stdin or died first fails the same way (it will never answer); a close that began
/// meanwhile answers for the ensure (`closed`).
pub(super) fn handshake(d: &Daemon, e: &Ensure, s: &Supervised) -> Result<Option<Value>, OpError> {
    use super::super::session::HandshakeFailure;
    let Some(params) = &e.initialize else {
        return Ok(None);
    };
    let ms = e
        .handshake_timeout_ms
        .unwrap_or(crate::limits::DEFAULT_HANDSHAKE_TIMEOUT_MS);
    let why = match s.handshake(params, Duration::from_millis(ms)) {
        Ok(response) => return Ok(Some(response)),
        Err(HandshakeFailure::Ended) if s.phase() != super::Phase::Ended => return Ok(None),
        Err(HandshakeFailure::Ended) => {
            // An exit before its first line is the start's failure, as without a handshake.
            s.await_early_exit(Duration::ZERO)?;
            "the adapter ended before it answered".to_string()
        }
        Err(HandshakeFailure::TimedOut) => format!("no response within {ms} ms"),
        Err(HandshakeFailure::Write(err)) => format!("initialize could not be written ({err})"),
    };
    let lease = s.lease_id().map(str::to_owned);
    tracing::warn!(session_key = %e.session, lease_id = lease.as_deref(), reason = %why, "handshake failed; closing the session");
    let closed = match &lease {
        Some(id) => d
            .close(
                &[crate::controller::LeaseRef::Id(id.clone())],
                None,
                "handshake timeout",
            )
            .map(|out| {
                out.iter()
                    .map(|o| format!("{:?}", o.result).to_lowercase())
                    .collect::<Vec<_>>()
                    .join(", ")
            })
            .unwrap_or_else(|err| format!("close failed: {err}")),
        None => "no lease".into(),
    };
    // Ended (the wrapper reaped) before the answer: an ensure right after starts afresh.
    s.wait_while_closing(Duration::from_secs(30));
    let stderr = s.stderr_tail();
    Err(OpError {
        code: Code::HandshakeTimeout,
        message: format!(
            "session {}: the adapter did not answer initialize ({why}); the session was closed ({closed}){}",
            e.session,
            if stderr.is_empty() {
                String::new()
            } else {
                format!("; its last stderr lines: {}", stderr.join(" | "))
            }
        ),
        data: Box::new(super::super::protocol::ErrorData {
            lease_id: lease,
            stderr: Some(stderr),
            ..Default::default()
        }),
    })
}
