//! The wire-code table: each error code's name on the wire and the [`Kind`] of failure it is.

use crate::kind::Kind;

/// Error codes, as they appear on the wire (`error.code`). Documented in `docs/protocol.md`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    /// The line is not valid UTF-8.
    BadUtf8,
    /// The line is not a JSON object.
    BadJson,
    /// The line is longer than [`super::MAX_LINE`] bytes; it was discarded up to its newline.
    LineTooLong,
    /// A field is missing, unknown, of the wrong type, or has a bad value.
    BadRequest,
    /// `op` names no operation.
    UnknownOp,
    /// No such session or lease.
    NotFound,
    /// The requester may not see that session.
    NotVisible,
    /// The request conflicts with the current state (a lease held by someone else, a session
    /// being started or closed, …).
    Conflict,
    /// The session exists but is not running (closing or ended): nothing was written.
    NotRunning,
    /// The requested `since` fell out of the replay buffer.
    SeqEvicted,
    /// The adapter could not be started.
    SpawnFailed,
    /// The adapter started but exited before its first line of output (whenever that was).
    StartFailed,
    /// `ensure`: a `close` of the key arrived while this ensure was starting it, and closed what
    /// it started.
    Closed,
    /// The peer runs as another user.
    Forbidden,
    /// The daemon is shutting down and takes no new sessions.
    ShuttingDown,
    /// `send`: the adapter did not read its stdin before the send's timeout.
    SendTimeout,
    /// `send`/`attach`: the session runs under a lease this daemon did not start (`leash
    /// exec`): only sessions started with `ensure` take input or stream output.
    NotSupervised,
    /// `ensure` with `initialize`: the adapter did not answer the `initialize` the daemon sent
    /// within `handshakeTimeoutMs`; the session was closed (TERM, grace, KILL).
    HandshakeTimeout,
    /// Anything else (database, I/O); the message says what failed.
    Internal,
}

/// The wire-code table: each code's name on the wire and the [`Kind`] of failure it is (which
/// gives the CLI's exit code through [`crate::kind::KINDS`]). The only place a code is named.
pub const CODES: [(Code, &str, Kind); 19] = [
    (Code::BadUtf8, "bad_utf8", Kind::Usage),
    (Code::BadJson, "bad_json", Kind::Usage),
    (Code::LineTooLong, "line_too_long", Kind::Usage),
    (Code::BadRequest, "bad_request", Kind::Usage),
    (Code::UnknownOp, "unknown_op", Kind::Usage),
    (Code::NotFound, "not_found", Kind::NotFound),
    (Code::NotVisible, "not_visible", Kind::NotVisible),
    (Code::Conflict, "conflict", Kind::Conflict),
    (Code::NotRunning, "not_running", Kind::Conflict),
    (Code::SeqEvicted, "seq_evicted", Kind::Internal),
    (Code::SpawnFailed, "spawn_failed", Kind::SpawnFailed),
    (Code::StartFailed, "start_failed", Kind::SpawnFailed),
    (Code::Closed, "closed", Kind::Conflict),
    (Code::Forbidden, "forbidden", Kind::Internal),
    (Code::ShuttingDown, "shutting_down", Kind::Conflict),
    (Code::SendTimeout, "send_timeout", Kind::Internal),
    // A session `leash exec` started has no stdin the daemon could write to: a conflict with
    // how it runs, not a missing daemon.
    (Code::NotSupervised, "not_supervised", Kind::Conflict),
    // The adapter never became usable: a failed start, as the CLI counts it.
    (
        Code::HandshakeTimeout,
        "handshake_timeout",
        Kind::SpawnFailed,
    ),
    (Code::Internal, "internal", Kind::Internal),
];

impl Code {
    fn row(self) -> &'static (Code, &'static str, Kind) {
        CODES
            .iter()
            .find(|r| r.0 == self)
            .expect("every code has a row in CODES (a unit test checks it)")
    }

    pub fn as_str(self) -> &'static str {
        self.row().1
    }

    pub fn parse(s: &str) -> Option<Code> {
        CODES.iter().find(|r| r.1 == s).map(|r| r.0)
    }

    /// The kind of failure this code reports.
    pub fn kind(self) -> Kind {
        self.row().2
    }

    /// The code a failure of `kind` is sent with: the code whose name is the kind's cause word
    /// (`not_found`, `conflict`, …); `internal` for the kinds only the CLI has (`unverified`,
    /// `daemon_needed`, `dead`).
    pub fn of(kind: Kind) -> Code {
        Code::parse(kind.cause()).unwrap_or(Code::Internal)
    }
}

impl std::fmt::Display for Code {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::daemon::protocol::{err_line, ErrorData};
    use serde_json::Value;

    /// Every variant, through an exhaustive match: a new code fails to compile here until it is
    /// listed, and the round trip then fails until it has a row in [`CODES`].
    fn every_code() -> Vec<Code> {
        let all = [
            Code::BadUtf8,
            Code::BadJson,
            Code::LineTooLong,
            Code::BadRequest,
            Code::UnknownOp,
            Code::NotFound,
            Code::NotVisible,
            Code::Conflict,
            Code::NotRunning,
            Code::SeqEvicted,
            Code::SpawnFailed,
            Code::StartFailed,
            Code::Closed,
            Code::Forbidden,
            Code::ShuttingDown,
            Code::SendTimeout,
            Code::NotSupervised,
            Code::HandshakeTimeout,
            Code::Internal,
        ];
        for c in all {
            match c {
                Code::BadUtf8
                | Code::BadJson
                | Code::LineTooLong
                | Code::BadRequest
                | Code::UnknownOp
                | Code::NotFound
                | Code::NotVisible
                | Code::Conflict
                | Code::NotRunning
                | Code::SeqEvicted
                | Code::SpawnFailed
                | Code::StartFailed
                | Code::Closed
                | Code::Forbidden
                | Code::ShuttingDown
                | Code::SendTimeout
                | Code::NotSupervised
                | Code::HandshakeTimeout
                | Code::Internal => {}
            }
        }
        all.to_vec()
    }

    #[test]
    fn every_code_round_trips() {
        let all = every_code();
        assert_eq!(all.len(), CODES.len());
        let mut names = std::collections::HashSet::new();
        for c in all {
            assert_eq!(CODES.iter().filter(|r| r.0 == c).count(), 1, "{c:?}");
            assert!(names.insert(c.as_str()), "{c:?}: name used twice");
            assert_eq!(Code::parse(c.as_str()), Some(c));
            // Through a reply line and back, as the client reads it.
            let line = err_line(&Value::from(1), c, "m", &ErrorData::default());
            let v: Value = serde_json::from_slice(&line).unwrap();
            assert_eq!(Code::parse(v["error"]["code"].as_str().unwrap()), Some(c));
        }
        assert_eq!(Code::parse("no_such_code"), None);
    }

    #[test]
    fn every_kind_with_a_wire_name_is_sent_with_it() {
        for row in crate::kind::KINDS {
            let c = Code::of(row.kind);
            match Code::parse(row.cause) {
                Some(named) => {
                    assert_eq!(c, named);
                    assert_eq!(c.kind(), row.kind, "{c:?}");
                }
                None => assert_eq!(c, Code::Internal, "{:?}", row.kind),
            }
        }
    }
}
