//! Exit codes: [`Failure`], an error with the exit code and the cause its [`Kind`] maps to; the
//! exit code of a batch of closes and of a reap; and the exit-code table `--help` prints.

use crate::controller::CloseResult;
use leash_core::kind::exitcode;
use leash_core::kind::{HasKind, Kind};

const EXIT_CODES: &str = "\
Exit codes:
  0    success
  1    error (I/O, corrupt or locked database, ...): the message says what failed
  2    bad usage
  3    conflict: the lease is not open, or another process is closing it
  4    no such lease, session or state directory
  5    the requester may not see that session
  6    ownership could not be verified: nothing was signalled (the reason is printed and recorded)
  7    the operation needs a running daemon (leash serve)
  8    leash verify: ownership disproven (dead)
  125  leash exec itself failed (bad usage, the session already has a live lease, the database,
       the wrapper): nothing was started
  126  leash exec: the adapter could not be executed (not executable); the lease is ended
  127  leash exec: the adapter was not found (not on PATH); the lease is ended
       Any other status of leash exec is the adapter's (its code, or 128+N for signal N).

Errors: one line on stderr, `leash: MESSAGE`. With --json or --error-format json, one JSON line
instead, {\"error\":{\"code\":\"conflict\",\"message\":\"...\",\"exitCode\":125}}, whose code is one
of the daemon's error codes:";

/// The exit codes and the error line, as `leash --help` and leash(1) show them, with every error
/// code of the daemon's table ([`leash_core::kind::CODES`]).
pub(super) fn exit_codes_help() -> String {
    let codes: Vec<&str> = leash_core::kind::CODES
        .iter()
        .map(|(_, name, _)| *name)
        .collect();
    format!("{EXIT_CODES}\n  {}.", codes.join(", "))
}

/// An error with the exit code it maps to and its cause in the protocol's words (`code` of an
/// error reply: `not_found`, `conflict`, ...), for `--error-format json`. Both come from its
/// [`Kind`] through the one exit-code table ([`leash_core::kind::KINDS`]); a daemon's error keeps the
/// daemon's more specific code as its cause.
#[derive(Debug)]
pub struct Failure {
    pub code: u8,
    pub message: String,
    pub cause: String,
}

impl Failure {
    pub fn new(kind: Kind, message: impl Into<String>) -> Failure {
        Failure {
            code: kind.exit_code(),
            message: message.into(),
            cause: kind.cause().to_string(),
        }
    }

    /// The same failure with a more specific cause.
    pub fn with_cause(mut self, cause: impl Into<String>) -> Failure {
        self.cause = cause.into();
        self
    }

    /// The same failure as a failure of `leash exec` itself: exit 125 whatever its kind (so it
    /// never collides with an adapter's status), the cause kept.
    pub fn of_exec(mut self) -> Failure {
        self.code = Kind::SpawnFailed.exit_code();
        self
    }

    /// The JSON error line: `{"error":{"code","message","exitCode"}}`, like the daemon's error
    /// replies.
    pub fn to_json(&self) -> String {
        serde_json::json!({"error": {
            "code": self.cause,
            "message": self.message,
            "exitCode": self.code,
        }})
        .to_string()
    }
}

/// Every module error becomes a failure of its kind, with its message.
impl<E: HasKind> From<E> for Failure {
    fn from(e: E) -> Failure {
        Failure::new(e.kind(), e.to_string())
    }
}

/// The exit code of a batch of closes: the worst outcome's (a lease left open because it could
/// not be verified is 6, one another process holds is 3, closed or lost is 0). The direct path
/// and the daemon path both end here.
pub(crate) fn close_exit_code(outcomes: &[crate::controller::CloseOutcome]) -> u8 {
    outcomes
        .iter()
        .map(|o| match o.result {
            CloseResult::Closed | CloseResult::Lost => exitcode::OK,
            CloseResult::LeftOpen => Kind::Unverified.exit_code(),
            CloseResult::Conflict => Kind::Conflict.exit_code(),
        })
        .max()
        .unwrap_or(exitcode::OK)
}

/// A reap that left a lease open because it could not verify it exits 6, so a gateway's startup
/// script can tell "nothing to do" from "something needs a look".
pub(crate) fn reap_exit_code(report: &crate::controller::ReapReport) -> u8 {
    let unverified = report
        .leases
        .iter()
        .any(|o| o.result == CloseResult::LeftOpen);
    if unverified {
        Kind::Unverified.exit_code()
    } else {
        exitcode::OK
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The daemon path and the direct path exit alike: a daemon's error reply (read by the
    /// client, or wrapped by `sessions send`) exits with its wire code's kind. Before the one
    /// table, `sessions send` exited 1 for `not_visible` and `bad_request`, and the thin client
    /// 1 for `not_supervised`.
    #[test]
    fn a_daemon_error_exits_with_its_codes_kind() {
        use crate::client::ClientError;
        use leash_core::kind::CODES;
        for (code, name, kind) in CODES {
            let remote = || ClientError::Remote {
                code: name.to_string(),
                message: "m".into(),
                data: Default::default(),
            };
            assert_eq!(Failure::from(remote()).code, kind.exit_code(), "{code:?}");
            let wrapped = crate::client::session_input::undelivered("k", remote());
            assert_eq!(Failure::from(wrapped).code, kind.exit_code(), "{code:?}");
        }
        assert_eq!(
            Failure::from(ClientError::Closed).code,
            exitcode::FAILURE,
            "a broken connection is internal"
        );
    }
}
