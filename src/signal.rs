//! The only code in leash that sends signals.
//!
//! Every signal goes: pin the process with `pidfd_open` → re-read it from the process table and
//! require the verified start time → check the hard refusals → `pidfd_send_signal` through that
//! same pidfd. The pidfd is opened *before* the re-check, so the check applies to exactly the
//! process that gets the signal: a pid recycled at any point fails the start-time check or the
//! signal goes to the exited original (ESRCH, "already gone"), never to a stranger.
//!
//! Hard refusals, whatever a lease row says: pid ≤ 1, leash's own pid, the leader of leash's own
//! process group, a group id ≤ 1 or leash's own, and processes of another uid. leash can only send
//! SIGTERM and SIGKILL ([`Sig`]), each SIGTERM followed by a SIGCONT through the same pidfd (a
//! stopped process cannot act on SIGTERM until it runs again, so without it every stopped member
//! would wait out the grace and end in SIGKILL; systemd does the same); no code path can send
//! anything else, nor signal "every process" (pid -1) or "my own group" (pid 0) the way kill(2)
//! could.

use crate::lease::ProcessId;
use crate::proc::{ProcessInfo, ProcessTable, TableError};
use crate::sys;
use std::os::fd::{AsFd, OwnedFd};
use std::time::{Duration, Instant};

use leash_core::guard::check_pid;
pub use leash_core::guard::{check_group, Caller, Refusal, Sig};
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

/// The pure part of the guard (`leash_core::guard`): would leash refuse to signal this process?
pub fn check(target: &ProcessInfo, caller: &Caller) -> Result<(), Refusal> {
    leash_core::guard::check_process(target.pid, target.uid, caller)
}

/// A verified process, held by a pidfd.
#[derive(Debug)]
pub struct Pinned {
    pub id: ProcessId,
    pub pgid: i32,
    fd: OwnedFd,
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

/// Pins `id` for signalling. `Ok(None)` when the process has already gone.
pub fn pin(
    table: &dyn ProcessTable,
    caller: &Caller,
    id: ProcessId,
) -> Result<Option<Pinned>, SignalError> {
    check_pid(id.pid, caller)?;
    let fd = match sys::pidfd_open(id.pid) {
        Ok(fd) => fd,
        Err(e) if e.raw_os_error() == Some(libc::ESRCH) => return Ok(None),
        Err(e) => {
            return Err(SignalError::Os {
                pid: id.pid,
                source: e,
            })
        }
    };
    // Only `stat` and the uid: the checks below need nothing else (issue 16).
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
    Ok(Some(Pinned {
        id,
        pgid: info.pgid,
        fd,
    }))
}

/// Sends `sig` to the pinned process (SIGTERM is followed by SIGCONT, see the module header).
pub fn send(p: &Pinned, sig: Sig) -> Result<Delivery, SignalError> {
    match sys::pidfd_send_signal(p.fd.as_fd(), sig.number(), false) {
        Ok(()) => {
            wake_after_term(p, sig, false);
            tracing::debug!(
                pid = p.id.pid,
                start_time = p.id.start_time,
                signal = sig.name(),
                "signal sent"
            );
            Ok(Delivery::Delivered)
        }
        Err(e) if e.raw_os_error() == Some(libc::ESRCH) => Ok(Delivery::AlreadyGone),
        Err(e) => Err(SignalError::Os {
            pid: p.id.pid,
            source: e,
        }),
    }
}

/// Sends `sig` to the whole process group led by the pinned process (which must lead it).
pub fn send_group(p: &Pinned, sig: Sig, caller: &Caller) -> Result<Delivery, SignalError> {
    if p.pgid != p.id.pid {
        return Err(Refusal::Group { pgid: p.pgid }.into());
    }
    check_group(p.pgid, caller)?;
    match sys::pidfd_send_signal(p.fd.as_fd(), sig.number(), true) {
        Ok(()) => {
            wake_after_term(p, sig, true);
            Ok(Delivery::Delivered)
        }
        Err(e) if e.raw_os_error() == Some(libc::ESRCH) => Ok(Delivery::AlreadyGone),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Err(SignalError::GroupUnsupported),
        Err(e) => Err(SignalError::Os {
            pid: p.id.pid,
            source: e,
        }),
    }
}

/// After a SIGTERM, a SIGCONT to the same target (process or group), through the same pidfd: a
/// SIGSTOPped process would otherwise sit on its SIGTERM until the grace ends in SIGKILL. Its
/// failure changes nothing (the SIGTERM is out; the SIGKILL after the grace still comes).
fn wake_after_term(p: &Pinned, sig: Sig, group: bool) {
    if sig != Sig::Term {
        return;
    }
    if let Err(e) = sys::pidfd_send_signal(p.fd.as_fd(), libc::SIGCONT, group) {
        tracing::debug!(pid = p.id.pid, group, error = %e, "SIGCONT after SIGTERM not delivered");
    }
}

/// True when the pinned process has exited.
pub fn exited(p: &Pinned) -> bool {
    !sys::poll_exited(&[p.fd.as_fd()], Duration::ZERO).is_empty()
}

/// Waits until every pinned process has exited or the deadline passes; returns the indices of
/// those still alive.
pub fn wait_all(pins: &[&Pinned], deadline: Instant) -> Vec<usize> {
    let mut alive: Vec<usize> = (0..pins.len()).collect();
    loop {
        alive.retain(|&i| !exited(pins[i]));
        let now = Instant::now();
        if alive.is_empty() || now >= deadline {
            return alive;
        }
        let fds: Vec<_> = alive.iter().map(|&i| pins[i].fd.as_fd()).collect();
        // poll returns as soon as any one exits; loop to re-check the rest.
        let slice = (deadline - now).min(Duration::from_millis(250));
        sys::poll_exited(&fds, slice);
    }
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
        assert!(exited(&p));
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
