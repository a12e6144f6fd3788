//! The handshake deadline (`ensure` with `initialize`): the daemon writes the ACP `initialize`
//! request to a new adapter itself and waits, at most `handshakeTimeoutMs`, for its response.
//! The request is tracked like a `session/new` (in `opening`), so the output reader needs no
//! hook of its own: the response's removal from `opening` (under the session's lock, with the
//! line pushed into the replay buffer in the same hold) says it came, and the line is then read
//! back from the replay buffer.

use super::base::*;
use super::replay;
use super::supervised::*;

/// The JSON-RPC id of the daemon's `initialize`: a string no client of the Node library uses
/// (theirs start with `lc`), one per adapter process (each session runs one handshake).
pub const HANDSHAKE_ID: &str = "leash-handshake";

/// How a handshake ended without a response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HandshakeFailure {
    /// No response within the deadline; the adapter runs on (the caller closes it).
    TimedOut,
    /// The adapter's stdin could not be written (it closed it, or never read it).
    Write(String),
    /// The session ended, or a close began, before the response: the end or the close answers.
    Ended,
}

impl Supervised {
    /// Writes `initialize` with these params and waits at most `deadline` for its response;
    /// returns the response object as the adapter wrote it.
    pub fn handshake(&self, params: &Value, deadline: Duration) -> Result<Value, HandshakeFailure> {
        let id = Value::String(HANDSHAKE_ID.into());
        let key = id.to_string();
        let line = json!({"jsonrpc": "2.0", "id": id, "method": "initialize", "params": params})
            .to_string();
        let until = Instant::now() + deadline;
        let from = {
            let mut g = self.lock();
            // Tracked before the write: a fast adapter may answer before the write returns.
            self.tracking.store(true, AtomicOrdering::SeqCst);
            g.opening.insert(key.clone(), (None, None));
            g.replay.last_seq()
        };
        let written = {
            let _order = self.order();
            self.write_line(&line, deadline)
        };
        if let Err(e) = written {
            self.lock().opening.remove(&key);
            return Err(HandshakeFailure::Write(e.to_string()));
        }
        let mut g = self.lock();
        loop {
            if !g.opening.contains_key(&key) {
                return Ok(response_after(&g.replay, from, &id).unwrap_or(Value::Null));
            }
            if g.life.is_ended() || g.close_begun {
                g.opening.remove(&key);
                return Err(HandshakeFailure::Ended);
            }
            let now = Instant::now();
            if now >= until {
                g.opening.remove(&key);
                return Err(HandshakeFailure::TimedOut);
            }
            g = g.wait_timeout(until - now);
        }
    }

    /// The adapter's last stderr lines (for the handshake's error).
    pub fn stderr_tail(&self) -> Vec<String> {
        self.stderr_tail_settled()
    }
}

/// The response with this id among the output items above `from` (`None` when it fell out of the
/// replay buffer already, behind a flood of output).
fn response_after(replay: &replay::Replay, from: i64, id: &Value) -> Option<Value> {
    let items = replay.after(from, usize::MAX).ok()?;
    items.iter().filter(|i| !i.stderr).find_map(|i| {
        let item: Value = serde_json::from_str(&format!("{{{}}}", i.body())).ok()?;
        let line = item.get("line")?.as_str()?;
        let msg: Value = serde_json::from_str(line).ok()?;
        (msg.get("id") == Some(id) && msg.get("method").is_none()).then_some(msg)
    })
}
