//! `send`: one line to the adapter's stdin.

use super::cx::*;
use crate::controller::session_input::Sent;
use crate::daemon::stdin_pipe::PipeError;

/// A write to the adapter's stdin that failed, as an error reply.
pub(super) fn write_failed(key: &str, e: PipeError) -> OpError {
    match e {
        PipeError::TimedOut { written, total, .. } => OpError {
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

impl Handles<protocol::Send> for Cx<'_> {
    type Done = Timed;

    fn handle(self, s: protocol::Send) -> Timed {
        let timeout = Duration::from_millis(s.timeout_ms.unwrap_or(protocol::SEND_TIMEOUT_MS));
        let sent = send(self.d, &s.session, &s.line, timeout);
        self.answer::<protocol::Send>(sent)
    }
}
