//! `leash verify --session KEY | --lease ID [--json]`: what a gateway runs before it resumes a
//! stored session. It answers `owned`, `dead` or `unavailable` with the evidence, exits with the
//! answer's code, and never signals. Through the daemon when one serves the state root (the
//! `verify` op), else on the database and `/proc` directly; the answer is the same
//! ([`crate::controller::verify`]).

use super::exit::Failure;
use crate::controller::LeaseRef;
use clap::Args;
use leash_core::answer::{Answer, VerifyReport};
use leash_core::kind::Kind;

pub(super) const VERIFY_ABOUT: &str = "Tell whether a lease's process is still alive and \
verifiably this lease's (owned), ownership is disproven (dead: its wrapper is gone, or its pid \
now names another process), or nothing can be proven (unavailable: the process table could not \
be read). Prints the evidence. Reads only: never signals, never changes the lease. A session key \
names its active lease, else its most recent one.";

pub(super) const VERIFY_CODES: &str = "\
Exit codes:
  0    owned: alive and verified; safe to resume
  8    dead: ownership disproven; start a new session instead
  6    unavailable: the process table could not be read; nothing is proven either way
  4    no such lease or session
  1    error (I/O, database)";

#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("target").required(true).args(["session", "lease", "lease_pos"])))]
pub struct VerifyArgs {
    /// The session's active lease (else its most recent one)
    #[arg(long, value_name = "KEY")]
    pub session: Option<String>,
    /// Lease id (the same as LEASE)
    #[arg(long, value_name = "ID")]
    pub lease: Option<String>,
    /// Lease id (or give --lease ID, or --session)
    #[arg(value_name = "LEASE")]
    pub lease_pos: Option<String>,
    /// Print JSON
    #[arg(long)]
    pub json: bool,
}

impl VerifyArgs {
    fn target(&self) -> LeaseRef {
        match (
            self.lease.as_ref().or(self.lease_pos.as_ref()),
            &self.session,
        ) {
            (Some(id), _) => LeaseRef::Id(id.clone()),
            (None, Some(k)) => LeaseRef::Session(k.clone()),
            (None, None) => unreachable!("clap requires one"),
        }
    }
}

pub(super) fn run(b: &mut dyn super::backend::Backend, a: &VerifyArgs) -> Result<u8, Failure> {
    let report = b.verify(&a.target())?;
    print(&report, a.json);
    Ok(exit_code(report.answer))
}

/// The documented exit code of `leash verify` for an answer: rendering the controller's typed
/// answer is the CLI's decision, so the controller never sees an exit code.
fn exit_code(answer: Answer) -> u8 {
    match answer {
        Answer::Owned => leash_core::kind::exitcode::OK,
        Answer::Dead => Kind::Dead.exit_code(),
        Answer::Unavailable => Kind::Unverified.exit_code(),
    }
}

pub(super) fn print(r: &VerifyReport, json: bool) {
    if json {
        super::output::print_json(r);
        return;
    }
    let meaning = match r.answer {
        Answer::Owned => "alive and verified: safe to resume",
        Answer::Dead => "ownership disproven: do not resume",
        Answer::Unavailable => "cannot tell: the process table could not be read",
    };
    outln!("{}  ({meaning})", r.answer.as_str());
    outln!(
        "lease {}  session {}  state {}  root pid {} (start time {})  owner pid {}",
        r.lease_id,
        r.session_key,
        r.state,
        r.root_pid,
        r.root_start_time,
        r.owner_pid
    );
    for e in &r.evidence {
        outln!("  - {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use leash_core::kind::exitcode;

    #[test]
    fn each_answer_exits_with_its_documented_code() {
        assert_eq!(exit_code(Answer::Owned), 0);
        assert_eq!(exit_code(Answer::Dead), exitcode::DEAD);
        assert_eq!(exit_code(Answer::Unavailable), exitcode::UNVERIFIED);
    }
}
