//! The only code in leash that sends signals, behind one seam: the [`Signaller`] trait.
//!
//! Every signal goes: pin the process → re-read it from the process table and require the
//! verified start time → check the hard refusals → send through that same pin. The live
//! implementation ([`PidfdSignaller`], `pidfd.rs`) pins with `pidfd_open` *before* the re-check,
//! so the check applies to exactly the process that gets the signal: a pid recycled at any point
//! fails the start-time check or the signal goes to the exited original (ESRCH, "already gone"),
//! never to a stranger. The recording implementation ([`RecordingSignaller`], `recording.rs`)
//! runs the same re-check and refusals against a fixture table on a scripted clock, and writes
//! down who got what when, so the TERM → grace → KILL engine (`controller::terminate`) can be
//! tested without a live process.
//!
//! The one signal that is not one process's or one group's, the cgroup kill
//! ([`Signaller::kill_cgroup`], `cgroup.rs`), goes through the same seam: it runs the per-member
//! check of the lease's verified cgroup right before `cgroup.kill` is written, and the
//! freeze–kill–thaw fallback of older kernels pins and re-checks each member it signals. No file
//! outside `signal/` and `sys.rs` names a signalling call (`tests/signals_only_in_signal.rs`).
//!
//! Hard refusals, whatever a lease row says: pid ≤ 1, leash's own pid, the leader of leash's own
//! process group, a group id ≤ 1 or leash's own, and processes of another uid. leash can only send
//! SIGTERM and SIGKILL ([`Sig`]), each SIGTERM followed by a SIGCONT through the same pidfd (a
//! stopped process cannot act on SIGTERM until it runs again, so without it every stopped member
//! would wait out the grace and end in SIGKILL; systemd does the same); no code path can send
//! anything else, nor signal "every process" (pid -1) or "my own group" (pid 0) the way kill(2)
//! could.
//!
//! By concern: `seam.rs` holds what the files share (the traits, [`Pinned`], [`Delivery`], the
//! re-check, the refusals and the errors); `pidfd.rs` the live signaller; `cgroup.rs` the cgroup
//! kill; `recording.rs` the recording signaller; this file declares them and holds [`pin`] and
//! [`send`] for callers without a signaller.

mod cgroup;
mod pidfd;
mod recording;
mod seam;

pub use cgroup::cgroup_kill_allowed;
pub use pidfd::{group_alive, PidfdSignaller};
pub use recording::{Exit, RecordingSignaller, ScriptedClock, SimEvent, SimWhat};
pub use seam::{
    check, CgroupKillError, Clock, CurrentCaller, Delivery, Pinned, SignalError, Signaller,
    SystemClock,
};

use crate::proc::ProcessTable;
use leash_core::guard::{Caller, Sig};
use leash_core::model::ProcessId;

// The live signaller's operations as functions, for callers that hold no signaller (benches).

/// [`PidfdSignaller::pin`].
pub fn pin(
    table: &dyn ProcessTable,
    caller: &Caller,
    id: ProcessId,
) -> Result<Option<Pinned>, SignalError> {
    PidfdSignaller.pin(table, caller, id)
}

/// [`PidfdSignaller::send`].
pub fn send(p: &Pinned, sig: Sig) -> Result<Delivery, SignalError> {
    PidfdSignaller.send(p, sig)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proc::LiveTable;
    use leash_core::guard::{check_group, Refusal};
    use leash_core::model::ProcessInfo;

    fn info(pid: i32, uid: u32) -> ProcessInfo {
        ProcessInfo {
            pid,
            ppid: 1,
            pgid: pid,
            sid: pid,
            uid,
            start_time: 1,
            state: 'S',
            exe: None,
            argv: None,
            env: None,
            pidfs_ino: None,
        }
    }

    const ME: Caller = Caller {
        pid: 500,
        pgid: 400,
        uid: 1000,
    };

    #[test]
    fn hard_refusals() {
        assert!(matches!(
            check(&info(1, 1000), &ME),
            Err(Refusal::PidTooLow { .. })
        ));
        assert!(matches!(
            check(&info(0, 1000), &ME),
            Err(Refusal::PidTooLow { .. })
        ));
        assert!(matches!(
            check(&info(-5, 1000), &ME),
            Err(Refusal::PidTooLow { .. })
        ));
        assert!(matches!(
            check(&info(500, 1000), &ME),
            Err(Refusal::OwnPid { .. })
        ));
        assert!(matches!(
            check(&info(400, 1000), &ME),
            Err(Refusal::OwnGroupLeader { .. })
        ));
        assert!(matches!(
            check(&info(600, 0), &ME),
            Err(Refusal::ForeignUid { .. })
        ));
        assert!(check(&info(600, 1000), &ME).is_ok());
        assert!(check_group(1, &ME).is_err());
        assert!(check_group(0, &ME).is_err());
        assert!(check_group(-1, &ME).is_err());
        assert!(check_group(400, &ME).is_err());
        assert!(check_group(401, &ME).is_ok());
    }

    #[test]
    fn pin_refuses_a_changed_start_time_and_signals_a_verified_child() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = child.id() as i32;
        let table = LiveTable;
        let caller = Caller::current();
        let real = table.process(pid).unwrap().unwrap().id();
        let wrong = ProcessId {
            pid,
            start_time: real.start_time + 1,
        };
        let refused = pin(&table, &caller, wrong);
        assert!(matches!(
            refused,
            Err(SignalError::Refused(Refusal::Changed { .. }))
        ));
        assert!(
            child.try_wait().unwrap().is_none(),
            "refused pin must not signal"
        );
        let p = pin(&table, &caller, real).unwrap().expect("alive");
        assert_eq!(send(&p, Sig::Term).unwrap(), Delivery::Delivered);
        let status = child.wait().unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(libc::SIGTERM));
        // The process is reaped: the pidfd now names a dead process, never a successor.
        assert_eq!(send(&p, Sig::Kill).unwrap(), Delivery::AlreadyGone);
        assert!(PidfdSignaller.exited(&p));
    }

    #[test]
    fn pin_refuses_self() {
        let caller = Caller::current();
        let me = crate::proc::self_id();
        assert!(matches!(
            pin(&LiveTable, &caller, me),
            Err(SignalError::Refused(Refusal::OwnPid { .. }))
        ));
    }

    /// The core names the two signals by their POSIX numbers; they are libc's.
    #[test]
    fn signal_numbers_are_libcs() {
        assert_eq!(Sig::Term.number(), libc::SIGTERM);
        assert_eq!(Sig::Kill.number(), libc::SIGKILL);
    }
}
