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

mod cgroup;
mod pidfd;
mod recording;

pub use cgroup::{cgroup_kill_allowed, CgroupKillError};
pub use pidfd::{group_alive, PidfdSignaller};
pub use recording::{Exit, RecordingSignaller, ScriptedClock, SimEvent, SimWhat};

use crate::cgroup::Verified;
use crate::proc::ProcessTable;
use leash_core::kind::{HasKind, Kind};
use leash_core::model::ProcessId;
use leash_core::model::ProcessInfo;
use leash_core::model::TableError;
use leash_core::verify::MemberRule;
use std::os::fd::OwnedFd;
use std::time::{Duration, Instant};

use leash_core::guard::{check_group, Caller, Refusal, Sig};
use serde::{Deserialize, Serialize};

/// The current process as a [`Caller`]: `Caller::current()` (the type lives in the pure core,
/// which cannot ask the kernel who it is).
pub trait CurrentCaller {
    fn current() -> Self;
}

impl CurrentCaller for Caller {
    fn current() -> Caller {
        Caller {
            pid: nix::unistd::getpid().as_raw(),
            pgid: nix::unistd::getpgrp().as_raw(),
            uid: nix::unistd::geteuid().as_raw(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SignalError {
    #[error("refused: {0}")]
    Refused(#[from] Refusal),
    #[error(transparent)]
    Table(#[from] TableError),
    #[error("cannot signal pid {pid}: {source}")]
    Os {
        pid: i32,
        #[source]
        source: std::io::Error,
    },
    #[error("process group signalling through a pidfd needs Linux >= 6.9")]
    GroupUnsupported,
}

impl HasKind for SignalError {
    /// A refusal, or a table that could not be re-read, leaves the process unsignalled because
    /// it could not be verified; a failing syscall is internal.
    fn kind(&self) -> Kind {
        match self {
            SignalError::Refused(_) | SignalError::Table(_) => Kind::Unverified,
            SignalError::Os { .. } | SignalError::GroupUnsupported => Kind::Internal,
        }
    }
}

/// The pure part of the guard (`leash_core::guard`): would leash refuse to signal this process?
pub fn check(target: &ProcessInfo, caller: &Caller) -> Result<(), Refusal> {
    leash_core::guard::check_process(target.pid, target.uid, caller)
}

/// A verified process, held by its signaller's handle (a pidfd, live).
#[derive(Debug)]
pub struct Pinned {
    pub id: ProcessId,
    pub pgid: i32,
    handle: Handle,
}

/// What a pin holds: each signaller accepts only its own kind.
#[derive(Debug)]
enum Handle {
    Pidfd(OwnedFd),
    /// A pin of the recording signaller: the instance id is all it needs.
    Recorded,
}

/// What happened to a signal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Delivery {
    Delivered,
    /// ESRCH: the process had already exited. Not an error: the goal is that it is gone.
    AlreadyGone,
    /// SIGKILL by the kernel through `cgroup.kill` of the lease's verified cgroup, which took
    /// this (pinned, alive, listed) member with every other one at once.
    CgroupKill,
}

/// The seam between deciding to signal and signalling: what the TERM → grace → KILL engine needs
/// of the machine, and nothing more. [`PidfdSignaller`] is the only implementation that reaches
/// the kernel.
pub trait Signaller {
    /// Pins `id` for signalling, after the re-check against `table` and the hard refusals.
    /// `Ok(None)` when the process has already gone.
    fn pin(
        &self,
        table: &dyn ProcessTable,
        caller: &Caller,
        id: ProcessId,
    ) -> Result<Option<Pinned>, SignalError>;

    /// Sends `sig` to the pinned process (SIGTERM is followed by SIGCONT, see the module header).
    fn send(&self, p: &Pinned, sig: Sig) -> Result<Delivery, SignalError>;

    /// Sends `sig` to the whole process group led by the pinned process (which must lead it).
    fn send_group(&self, p: &Pinned, sig: Sig, caller: &Caller) -> Result<Delivery, SignalError>;

    /// True when the pinned process has exited.
    fn exited(&self, p: &Pinned) -> bool;

    /// Waits until every pinned process has exited or the deadline (on the signaller's clock)
    /// passes; returns the indices of those still alive.
    fn wait(&self, pins: &[&Pinned], deadline: Instant) -> Vec<usize>;

    /// True when the process group `pgid` still has a member, zombies included (`kill(-pgid, 0)`
    /// live: it sends nothing). `false` for pgid ≤ 1.
    fn group_alive(&self, pgid: i32) -> bool;

    /// SIGKILLs every member of the verified cgroup `cg` at once, once every live process in it
    /// passes `rule` (read right before the kill; see [`cgroup_kill_allowed`]): `cgroup.kill`,
    /// or on kernels before 5.14 freeze, a pinned and re-checked SIGKILL per member, thaw.
    /// Returns the members listed when it was killed.
    fn kill_cgroup(
        &self,
        table: &dyn ProcessTable,
        caller: &Caller,
        cg: &Verified,
        rule: Option<&MemberRule>,
    ) -> Result<Vec<i32>, CgroupKillError>;
}

/// The time the engine's graces run on: the system's, or a scripted one in the simulator.
pub trait Clock {
    fn now(&self) -> Instant;
    fn sleep(&self, d: Duration);
}

/// The real clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Instant {
        Instant::now()
    }
    fn sleep(&self, d: Duration) {
        std::thread::sleep(d)
    }
}

/// The re-check every pin makes once it holds its handle: the process read again (`stat` and
/// uid only) must be the verified instance (same start time), not a zombie, and not a
/// hard refusal. Returns its process group, or `None` when it has gone.
fn recheck(
    table: &dyn ProcessTable,
    caller: &Caller,
    id: ProcessId,
) -> Result<Option<i32>, SignalError> {
    let Some(info) = table.process_stat(id.pid)? else {
        return Ok(None);
    };
    if info.start_time != id.start_time {
        return Err(Refusal::Changed {
            pid: id.pid,
            found: info.start_time,
            expected: id.start_time,
        }
        .into());
    }
    if info.state == 'Z' {
        return Ok(None);
    }
    check(&info, caller)?;
    Ok(Some(info.pgid))
}

/// The refusal a group signal meets before it is sent: the pin must lead its group, and the
/// group must not be ≤ 1 or leash's own.
fn check_group_pin(p: &Pinned, caller: &Caller) -> Result<(), SignalError> {
    if p.pgid != p.id.pid {
        return Err(Refusal::Group { pgid: p.pgid }.into());
    }
    check_group(p.pgid, caller)?;
    Ok(())
}

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
