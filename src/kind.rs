//! The one error vocabulary. Every module error says which [`Kind`] of failure it is
//! ([`HasKind`]), and exactly two tables turn a kind into what leaves the process: [`KINDS`] into
//! the `leash` exit code (and the cause word of `--error-format json`), and the protocol's code
//! table (`daemon::protocol::CODES`) into a wire code and back. The CLI's direct path and its
//! daemon path both end in these tables, so the same failure exits with the same code whichever
//! way it went; README.md's exit-code table is checked against [`KINDS`] by a test.

use crate::exitcode;

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
/// as README.md's "Exit codes" table gives it.
#[derive(Debug, Clone, Copy)]
pub struct ExitRow {
    pub kind: Kind,
    pub code: u8,
    pub cause: &'static str,
    pub meaning: &'static str,
}

/// Exit code 0's meaning in README.md's table (success has no kind).
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

/// A visibility or a2a rule that does not parse is bad usage.
impl HasKind for leash_core::visibility::PolicyError {
    fn kind(&self) -> Kind {
        Kind::Usage
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
