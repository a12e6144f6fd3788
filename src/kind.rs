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

// Each module error's kind, in one place (so a module's own file need not know the vocabulary,
// and the mapping cannot differ between the CLI and the daemon).

impl HasKind for crate::store::StoreError {
    fn kind(&self) -> Kind {
        use crate::store::StoreError;
        match self {
            StoreError::SessionBusy { .. } => Kind::Conflict,
            StoreError::Unstorable { .. } => Kind::Usage,
            _ => Kind::Internal,
        }
    }
}

impl HasKind for crate::state::StateError {
    fn kind(&self) -> Kind {
        use crate::state::StateError;
        match self {
            StateError::Missing(_) => Kind::NotFound,
            StateError::Relative(_) => Kind::Usage,
            _ => Kind::Internal,
        }
    }
}

impl HasKind for crate::lifecycle::LifecycleError {
    fn kind(&self) -> Kind {
        use crate::lifecycle::LifecycleError;
        match self {
            LifecycleError::Store(e) => e.kind(),
            LifecycleError::NoLease(_) | LifecycleError::NoActiveLease(_) => Kind::NotFound,
            LifecycleError::NotOpen { .. } => Kind::Conflict,
        }
    }
}

impl HasKind for crate::controller::verify::VerifyError {
    fn kind(&self) -> Kind {
        use crate::controller::verify::VerifyError;
        match self {
            VerifyError::Store(e) => e.kind(),
            VerifyError::NoLease(_) | VerifyError::NoSession(_) => Kind::NotFound,
        }
    }
}

impl HasKind for crate::controller::EventsError {
    fn kind(&self) -> Kind {
        use crate::controller::EventsError;
        match self {
            EventsError::NoSession(_) => Kind::NotFound,
            EventsError::Store(e) => e.kind(),
        }
    }
}

impl HasKind for crate::sessions::SessionsError {
    fn kind(&self) -> Kind {
        use crate::sessions::SessionsError;
        match self {
            SessionsError::NotFound(_) => Kind::NotFound,
            SessionsError::NotVisible { .. } => Kind::NotVisible,
            SessionsError::DaemonNeeded { .. } => Kind::DaemonNeeded,
            SessionsError::MultiLine => Kind::Usage,
            SessionsError::Remote { code, .. } => code
                .as_deref()
                .and_then(crate::daemon::protocol::Code::parse)
                .map_or(Kind::Internal, |c| c.kind()),
            SessionsError::Store(e) => e.kind(),
        }
    }
}

impl HasKind for crate::daemon::client::ClientError {
    /// A daemon's error reply has the kind of its wire code; a connection that failed or a reply
    /// that does not parse is internal.
    fn kind(&self) -> Kind {
        self.code().map_or(Kind::Internal, |c| c.kind())
    }
}

impl HasKind for crate::daemon::ServeError {
    fn kind(&self) -> Kind {
        use crate::daemon::ServeError;
        match self {
            ServeError::AlreadyRunning { .. }
            | ServeError::SocketInUse(_)
            | ServeError::Metrics { .. } => Kind::Conflict,
            _ => Kind::Internal,
        }
    }
}

impl HasKind for crate::daemon::session::SpawnError {
    fn kind(&self) -> Kind {
        use crate::daemon::session::SpawnError;
        match self {
            // What the daemon stores was checked at its edge: a store failure here is its own.
            SpawnError::Store(_) => Kind::Internal,
            SpawnError::Conflict { .. } => Kind::Conflict,
            _ => Kind::SpawnFailed,
        }
    }
}

impl HasKind for crate::controller::exec::ExecError {
    /// The cause of a failed `leash exec` (it exits 125 whatever the kind).
    fn kind(&self) -> Kind {
        use crate::controller::exec::ExecError;
        use crate::store::StoreError;
        match self {
            ExecError::SessionLive { .. } => Kind::Conflict,
            ExecError::BadInput(_)
            | ExecError::BadEnv(_)
            | ExecError::NoCommand
            | ExecError::BadLeaseId(_) => Kind::Usage,
            ExecError::LeaseIdTaken(_) => Kind::Conflict,
            ExecError::Store(StoreError::Unstorable { .. }) => Kind::Usage,
            ExecError::Store(_) | ExecError::State(_) => Kind::Internal,
            ExecError::Install(_)
            | ExecError::NoParent(_)
            | ExecError::OwnerGone { .. }
            | ExecError::Exec { .. }
            | ExecError::Cgroup(_) => Kind::SpawnFailed,
        }
    }
}

impl HasKind for crate::legacy::LegacyError {
    /// A file that cannot be read or parsed is bad input to `legacy import` — but it always
    /// exited 1, and gateways may branch on that, so every legacy error stays internal.
    fn kind(&self) -> Kind {
        Kind::Internal
    }
}

/// A bad value at an edge (a duration, a grace, a key) is bad usage.
impl HasKind for crate::limits::ValueError {
    fn kind(&self) -> Kind {
        Kind::Usage
    }
}

/// A visibility or a2a rule that does not parse is bad usage.
impl HasKind for crate::visibility::PolicyError {
    fn kind(&self) -> Kind {
        Kind::Usage
    }
}

/// A stored command that does not split is bad input.
impl HasKind for crate::legacy::TokenError {
    fn kind(&self) -> Kind {
        Kind::Usage
    }
}

/// A process table that cannot be read: nothing can be verified, so nothing is signalled.
impl HasKind for crate::proc::TableError {
    fn kind(&self) -> Kind {
        Kind::Unverified
    }
}

impl HasKind for crate::signal::SignalError {
    /// A refusal, or a table that could not be re-read, leaves the process unsignalled because
    /// it could not be verified; a failing syscall is internal.
    fn kind(&self) -> Kind {
        use crate::signal::SignalError;
        match self {
            SignalError::Refused(_) | SignalError::Table(_) => Kind::Unverified,
            SignalError::Os { .. } | SignalError::GroupUnsupported => Kind::Internal,
        }
    }
}

impl HasKind for crate::cgroup::CgroupError {
    /// A limit asked for without containment, or one the kernel does not take, is bad usage; a
    /// cgroup that is not the lease's is unverified; the rest is the machine's.
    fn kind(&self) -> Kind {
        use crate::cgroup::CgroupError;
        match self {
            CgroupError::LimitWithoutContainment { .. } | CgroupError::BadLimit { .. } => {
                Kind::Usage
            }
            CgroupError::NotVerified { .. } => Kind::Unverified,
            _ => Kind::Internal,
        }
    }
}

impl HasKind for crate::install::InstallError {
    fn kind(&self) -> Kind {
        Kind::Internal
    }
}

impl HasKind for crate::mcp::McpError {
    /// stdin or stdout of `leash mcp` failed.
    fn kind(&self) -> Kind {
        Kind::Internal
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

    /// The daemon path and the direct path exit alike: a daemon's error reply (read by the
    /// client, or wrapped by `sessions send`) exits with its wire code's kind. Before the one
    /// table, `sessions send` exited 1 for `not_visible` and `bad_request`, and the thin client
    /// 1 for `not_supervised`.
    #[test]
    fn a_daemon_error_exits_with_its_codes_kind() {
        use crate::cli::Failure;
        use crate::daemon::client::ClientError;
        use crate::daemon::protocol::CODES;
        for (code, name, kind) in CODES {
            let remote = || ClientError::Remote {
                code: name.to_string(),
                message: "m".into(),
                data: Default::default(),
            };
            assert_eq!(Failure::from(remote()).code, kind.exit_code(), "{code:?}");
            let wrapped = crate::daemon::session_input::undelivered("k", remote());
            assert_eq!(Failure::from(wrapped).code, kind.exit_code(), "{code:?}");
        }
        assert_eq!(
            Failure::from(ClientError::Closed).code,
            exitcode::FAILURE,
            "a broken connection is internal"
        );
    }
}
