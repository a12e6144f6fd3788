//! `ensure`: spawn a session's adapter under a lease, or answer with the running one; one
//! ensure of a key at a time (`admission`), a stored spec for `ensure {session}`, and after a
//! start the early-exit watch and the stored spec.

use super::cx::*;
use crate::daemon::session::Supervised;
use crate::daemon::spec;

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
        Err(crate::daemon::admission::Refused::QueueFull) => {
            return Err(fail(
                Code::Conflict,
                format!(
                    "session {} is being started by another request and {} more ensures of it wait already; ensure it again once one has answered",
                    e.session,
                    crate::daemon::admission::MAX_QUEUED
                ),
            ))
        }
        Err(crate::daemon::admission::Refused::TimedOut) => {
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
    let result = with_spec(d, e).and_then(|e| start(d, &e, &ticket));
    // A close that arrived while this ensure was in flight closed what it started: the ensure
    // says so (after the close finished), whatever it saw of the adapter meanwhile.
    match ticket.release(CLOSE_MEETS_ENSURE) {
        crate::daemon::admission::Release::Closed(outcome) => {
            closed_in_flight(&e.session, outcome, result)
        }
        crate::daemon::admission::Release::Alone => result,
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
                tracing::warn!(session_key = %e.session, running = crate::logvalue::json(&s.argv), asked = crate::logvalue::json(&e.argv), "ensure found the session running another argv");
            }
            on_running(d, e);
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
    ticket: &crate::daemon::admission::Ticket<'_>,
) -> Reply<Ensured> {
    if let Some(cwd) = &e.cwd {
        if !std::path::Path::new(cwd).is_dir() {
            return Err(fail(
                Code::BadRequest,
                format!("ensure: cwd {cwd} is not a directory"),
            ));
        }
    }
    let spec = d.spawn_spec();
    let s = session::spawn(&spec, e)?;
    d.metrics.wrapper_starts.inc();
    d.sessions().insert(e.session.clone(), s.clone());
    let started = s.await_started();
    if s.report_failed() {
        d.metrics.report_write_failures.inc();
    }
    if let Err(err) = started {
        if matches!(err, SpawnError::Timeout(_)) {
            if let Some(id) = s.lease_id() {
                ticket.closing_itself();
                let _ = d.close(&[LeaseRef::Id(id.to_string())], None, "start timed out");
            }
        }
        let mut op: OpError = err.into();
        // The lease leash exec committed (and recorded ended with the reason), when it got that
        // far: a gateway looks it up as it would after `leash exec`.
        if op.data.lease_id.is_none() {
            op.data.lease_id = s.lease_id().map(str::to_string);
        }
        return Err(op);
    }
    // Under a lease, adapter started: a close waiting for this ensure goes on now.
    ticket.publish(&s);
    if ticket.close_requested() {
        // The reply is the close's (see `ensure`); the adapter is not watched any more.
        return Ok(describe(&s, true, true));
    }
    let initialize = handshake(d, e, &s, ticket)?;
    after_start(d, e, &s)?;
    let mut r = describe(&s, true, true);
    r.initialize = initialize;
    // The answer is the start's: the adapter was started. What it did after (an exit before
    // its first line is the stream's `start_failed` end) is not raced into the reply.
    if !matches!(r.phase, Phase::Closing) {
        r.phase = Phase::Running;
    }
    Ok(r)
}

/// `ensure {session}` (no argv): the stored spec, with the request's per-call fields.
fn with_spec(d: &Daemon, e: &Ensure) -> Result<Ensure, OpError> {
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
fn after_start(d: &Daemon, e: &Ensure, s: &Supervised) -> Result<(), OpError> {
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
fn on_running(d: &Daemon, e: &Ensure) {
    if !e.persist_spec {
        if let Err(err) = spec::forget(&mut d.writer(), &e.session) {
            tracing::warn!(session_key = %e.session, error = %err, "cannot delete the session's stored spec");
        }
    }
}

/// `ensure` with `initialize` (the handshake deadline): once the adapter started,
/// the daemon sends it `initialize` and waits for the response within `handshakeTimeoutMs`. The
/// response is the reply's `initialize`. None in time: the session is closed (TERM, the grace,
/// KILL) and ended before the ensure answers `handshake_timeout` with the adapter's last stderr
/// lines, so a retry starts afresh and no process is left per retry. An adapter that closed
/// its stdin or died first fails the same way (it will never answer); a close that began
/// meanwhile answers for the ensure (`closed`).
fn handshake(
    d: &Daemon,
    e: &Ensure,
    s: &Supervised,
    ticket: &crate::daemon::admission::Ticket<'_>,
) -> Result<Option<Value>, OpError> {
    use crate::daemon::session::HandshakeFailure;
    let Some(params) = &e.initialize else {
        return Ok(None);
    };
    let ms = e
        .handshake_timeout_ms
        .unwrap_or(leash_core::limits::DEFAULT_HANDSHAKE_TIMEOUT_MS);
    let why = match s.handshake(params, Duration::from_millis(ms)) {
        Ok(response) => return Ok(Some(response)),
        // A close of the daemon took the session: it met this ensure (see `admission`), whose
        // release answers with its outcome.
        Err(HandshakeFailure::Ended) if s.close_begun() || s.phase() != Phase::Ended => {
            return Ok(None)
        }
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
    // This close is the answer's; it does not meet the ensure as another's would.
    ticket.closing_itself();
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
        data: Box::new(ErrorData {
            lease_id: lease,
            stderr: Some(stderr),
            ..Default::default()
        }),
    })
}

impl Handles<Box<Ensure>> for Cx<'_> {
    type Done = Timed;

    fn handle(self, e: Box<Ensure>) -> Timed {
        let ensured = ensure(self.d, &e);
        self.answer::<Box<Ensure>>(ensured)
    }
}
