//! The one error vocabulary. Every module error says which [`Kind`] of failure it is
//! ([`HasKind`]), and exactly two tables turn a kind into what leaves the process: [`KINDS`] into
//! the `leash` exit code (and the cause word of `--error-format json`), and [`CODES`] into a wire
//! code and back. The CLI's direct path and its
//! daemon path both end in these tables, so the same failure exits with the same code whichever
//! way it went; docs/cli.md's exit-code table is checked against [`KINDS`] by a test.

/// What kind of failure an error is: what a caller can do about it, not where it happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// Anything else: I/O, a corrupt or locked database, a reply that does not parse.
    Internal,
    /// The input is wrong: an unknown flag, a bad value, a malformed request.
    Usage,
    /// The request conflicts with the current state (a lease held by another process, a lease
    /// that is not open, a session that is not running).
    Conflict,
    /// No such lease, session or state directory.
    NotFound,
    /// The requester may not see that session.
    NotVisible,
    /// Ownership could not be verified, so nothing was signalled.
    Unverified,
    /// The operation needs a running daemon and none serves the state root.
    DaemonNeeded,
    /// Ownership is disproven (`leash verify`'s `dead`): an answer, not an error, but one a
    /// gateway branches on by exit code.
    Dead,
    /// `leash exec` (or the daemon's `ensure`) could not start the adapter.
    SpawnFailed,
    /// `leash exec`: the wrapper ran, but the adapter command could not be executed (126).
    AdapterNotExecutable,
    /// `leash exec`: the wrapper ran, but the adapter command was not found (127).
    AdapterNotFound,
}

/// One row of the exit-code table: a kind, the `leash` exit code it leaves with, the cause word
/// of a JSON error line (the protocol's code where the protocol has the kind), and the meaning
/// as docs/cli.md's "Exit codes" table gives it.
#[derive(Debug, Clone, Copy)]
pub struct ExitRow {
    pub kind: Kind,
    pub code: u8,
    pub cause: &'static str,
    pub meaning: &'static str,
}

/// Exit code 0's meaning in docs/cli.md's table (success has no kind).
pub const SUCCESS_MEANING: &str = "success";

/// The exit-code table: the only place a kind becomes an exit code.
pub const KINDS: [ExitRow; 11] = [
    ExitRow {
        kind: Kind::Internal,
        code: exitcode::FAILURE,
        cause: "internal",
        meaning: "error (I/O, corrupt or locked database, …)",
    },
    ExitRow {
        kind: Kind::Usage,
        code: exitcode::USAGE,
        cause: "bad_request",
        meaning: "bad usage",
    },
    ExitRow {
        kind: Kind::Conflict,
        code: exitcode::CONFLICT,
        cause: "conflict",
        meaning: "conflict (the lease is not open; another process is closing it)",
    },
    ExitRow {
        kind: Kind::NotFound,
        code: exitcode::NOT_FOUND,
        cause: "not_found",
        meaning: "no such lease, session or state directory",
    },
    ExitRow {
        kind: Kind::NotVisible,
        code: exitcode::NOT_VISIBLE,
        cause: "not_visible",
        meaning: "the requester may not see that session",
    },
    ExitRow {
        kind: Kind::Unverified,
        code: exitcode::UNVERIFIED,
        cause: "unverified",
        meaning: "ownership could not be verified: nothing was signalled",
    },
    ExitRow {
        kind: Kind::DaemonNeeded,
        code: exitcode::DAEMON_NEEDED,
        cause: "daemon_needed",
        meaning: "the operation needs a running daemon",
    },
    ExitRow {
        kind: Kind::Dead,
        code: exitcode::DEAD,
        cause: "dead",
        meaning: "`leash verify`: ownership disproven (`dead`)",
    },
    ExitRow {
        kind: Kind::SpawnFailed,
        code: exitcode::EXEC_FAILED,
        cause: "spawn_failed",
        meaning: "`leash exec` itself failed, nothing started: bad usage, the session already has a live lease, the database, the wrapper",
    },
    ExitRow {
        kind: Kind::AdapterNotExecutable,
        code: exitcode::ADAPTER_NOT_EXECUTABLE,
        cause: "adapter_not_executable",
        meaning: "`leash exec`: the adapter could not be executed (not executable, permission denied); the lease is `ended` with the reason",
    },
    ExitRow {
        kind: Kind::AdapterNotFound,
        code: exitcode::ADAPTER_NOT_FOUND,
        cause: "adapter_not_found",
        meaning: "`leash exec`: the adapter was not found (not on PATH, no such file); the lease is `ended` with the reason",
    },
];

impl Kind {
    fn row(self) -> &'static ExitRow {
        KINDS
            .iter()
            .find(|r| r.kind == self)
            .expect("every kind has a row in KINDS (a unit test checks it)")
    }

    /// The `leash` exit code of a failure of this kind.
    pub fn exit_code(self) -> u8 {
        self.row().code
    }

    /// The cause word of a JSON error line (`{"error":{"code": …}}`).
    pub fn cause(self) -> &'static str {
        self.row().cause
    }

    /// The kind an exit code stands for (`None` for 0 and for codes no kind has).
    pub fn from_exit_code(code: u8) -> Option<Kind> {
        KINDS.iter().find(|r| r.code == code).map(|r| r.kind)
    }
}

/// A module error that knows which kind of failure it is.
pub trait HasKind: std::fmt::Display {
    fn kind(&self) -> Kind;
}

/// Exit codes of the `leash` binary. They are part of the interface: gateways branch on them.
pub mod exitcode {
    /// Success.
    pub const OK: u8 = 0;
    /// An error that fits no other code (I/O, a corrupt or locked database, ...). The message says
    /// what failed.
    pub const FAILURE: u8 = 1;
    /// Bad usage (unknown flag, missing argument).
    pub const USAGE: u8 = 2;
    /// The request conflicts with the current state: the session already has a live lease, the
    /// lease is not open, or another process holds it for closing.
    pub const CONFLICT: u8 = 3;
    /// No such lease or session.
    pub const NOT_FOUND: u8 = 4;
    /// The requester may not see that session.
    pub const NOT_VISIBLE: u8 = 5;
    /// Ownership could not be verified, so nothing was signalled (the reason is printed and recorded).
    pub const UNVERIFIED: u8 = 6;
    /// The operation needs a running daemon (`leash serve`) and none serves this state root.
    pub const DAEMON_NEEDED: u8 = 7;
    /// `leash verify`: ownership of the lease is disproven (its wrapper is gone, or its pid names
    /// another process now). Do not resume the session.
    pub const DEAD: u8 = 8;
    /// `leash exec` could not start the wrapper (the reason is on stderr). Any other status of
    /// `leash exec` is the adapter's, as the wrapper reports it.
    pub const EXEC_FAILED: u8 = 125;
    /// `leash exec`: the adapter command exists but could not be executed (not executable, a bad
    /// interpreter, permission denied). The lease is recorded `ended` with the reason. As env(1),
    /// timeout(1) and tini.
    pub const ADAPTER_NOT_EXECUTABLE: u8 = 126;
    /// `leash exec`: the adapter command was not found (not on PATH, no such file). The lease is
    /// recorded `ended` with the reason.
    pub const ADAPTER_NOT_FOUND: u8 = 127;
}

/// Error codes, as they appear on the wire (`error.code`). Documented in `docs/protocol.md`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    /// The line is not valid UTF-8.
    BadUtf8,
    /// The line is not a JSON object.
    BadJson,
    /// The line is longer than the protocol's line limit (`protocol::MAX_LINE` in the `leash` crate); it was discarded up to its newline.
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
    /// `ensure` with `initialize`: the adapter did not answer the `initialize` the daemon sent
    /// within `handshakeTimeoutMs`; the session was closed (TERM, grace, KILL).
    HandshakeTimeout,
    /// `send`/`attach`: the session runs under a lease this daemon did not start (`leash
    /// exec`): only sessions started with `ensure` take input or stream output.
    NotSupervised,
    /// Anything else (database, I/O); the message says what failed.
    Internal,
}

/// The wire-code table: each code's name on the wire and the [`Kind`] of failure it is (which
/// gives the CLI's exit code through [`KINDS`]). The only place a code is named.
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
    // The adapter never became usable: a failed start, as the CLI counts it.
    (
        Code::HandshakeTimeout,
        "handshake_timeout",
        Kind::SpawnFailed,
    ),
    // A session `leash exec` started has no stdin the daemon could write to: a conflict with
    // how it runs, not a missing daemon.
    (Code::NotSupervised, "not_supervised", Kind::Conflict),
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
    use std::collections::HashSet;

    /// Every kind, listed through an exhaustive match: a new kind fails to compile here until it
    /// is listed, and the test then fails until it has a row in [`KINDS`].
    fn every_kind() -> Vec<Kind> {
        let all = [
            Kind::Internal,
            Kind::Usage,
            Kind::Conflict,
            Kind::NotFound,
            Kind::NotVisible,
            Kind::Unverified,
            Kind::DaemonNeeded,
            Kind::Dead,
            Kind::SpawnFailed,
            Kind::AdapterNotExecutable,
            Kind::AdapterNotFound,
        ];
        for k in all {
            match k {
                Kind::Internal
                | Kind::Usage
                | Kind::Conflict
                | Kind::NotFound
                | Kind::NotVisible
                | Kind::Unverified
                | Kind::DaemonNeeded
                | Kind::Dead
                | Kind::SpawnFailed
                | Kind::AdapterNotExecutable
                | Kind::AdapterNotFound => {}
            }
        }
        all.to_vec()
    }

    #[test]
    fn every_kind_has_one_distinct_exit_code_and_cause() {
        let kinds = every_kind();
        assert_eq!(kinds.len(), KINDS.len());
        let mut codes = HashSet::new();
        let mut causes = HashSet::new();
        for k in kinds {
            let n = KINDS.iter().filter(|r| r.kind == k).count();
            assert_eq!(n, 1, "{k:?} has {n} rows in KINDS");
            assert!(codes.insert(k.exit_code()), "{k:?}: exit code used twice");
            assert!(causes.insert(k.cause()), "{k:?}: cause used twice");
            assert_ne!(k.exit_code(), exitcode::OK, "{k:?} exits 0");
            assert_eq!(Kind::from_exit_code(k.exit_code()), Some(k));
        }
    }
}
