//! The live [`Signaller`]: pidfds. The only code in leash that calls the signalling syscalls
//! (`pidfd_open`, `pidfd_send_signal`, and `kill(-pgid, 0)` in [`group_alive`], which sends
//! nothing) and writes `cgroup.kill` (`super::cgroup`). A pin is a pidfd opened *before* the
//! re-check, so what was checked is exactly what gets the signal.

use super::seam::{
    check_group_pin, recheck, CgroupKillError, Delivery, Handle, Pinned, SignalError, Signaller,
};
use crate::cgroup::Verified;
use crate::proc::ProcessTable;
use crate::sys;
use leash_core::guard::{check_pid, Caller, Sig};
use leash_core::model::ProcessId;
use leash_core::verify::MemberRule;
use std::os::fd::{AsFd, BorrowedFd};
use std::time::{Duration, Instant};

/// Signals through pidfds (Linux >= 5.3; group signals >= 6.9, the leader alone before).
#[derive(Debug, Clone, Copy, Default)]
pub struct PidfdSignaller;

/// The pidfd of a live pin; a pin of another signaller is not a process here.
fn fd(p: &Pinned) -> Result<BorrowedFd<'_>, SignalError> {
    match &p.handle {
        Handle::Pidfd(fd) => Ok(fd.as_fd()),
        Handle::Recorded => Err(SignalError::Os {
            pid: p.id.pid,
            source: std::io::Error::from_raw_os_error(libc::EBADF),
        }),
    }
}

impl Signaller for PidfdSignaller {
    fn pin(
        &self,
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
        Ok(recheck(table, caller, id)?.map(|pgid| Pinned {
            id,
            pgid,
            handle: Handle::Pidfd(fd),
        }))
    }

    fn send(&self, p: &Pinned, sig: Sig) -> Result<Delivery, SignalError> {
        match sys::pidfd_send_signal(fd(p)?, sig.number(), false) {
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

    fn send_group(&self, p: &Pinned, sig: Sig, caller: &Caller) -> Result<Delivery, SignalError> {
        check_group_pin(p, caller)?;
        match sys::pidfd_send_signal(fd(p)?, sig.number(), true) {
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

    fn exited(&self, p: &Pinned) -> bool {
        match fd(p) {
            Ok(fd) => !sys::poll_exited(&[fd], Duration::ZERO).is_empty(),
            // Not a process of this signaller: nothing of it can be waited for here.
            Err(_) => true,
        }
    }

    fn wait(&self, pins: &[&Pinned], deadline: Instant) -> Vec<usize> {
        let mut alive: Vec<usize> = (0..pins.len()).collect();
        loop {
            alive.retain(|&i| !self.exited(pins[i]));
            let now = Instant::now();
            if alive.is_empty() || now >= deadline {
                return alive;
            }
            let fds: Vec<_> = alive.iter().filter_map(|&i| fd(pins[i]).ok()).collect();
            // poll returns as soon as any one exits; loop to re-check the rest.
            let slice = (deadline - now).min(Duration::from_millis(250));
            sys::poll_exited(&fds, slice);
        }
    }

    fn group_alive(&self, pgid: i32) -> bool {
        group_alive(pgid)
    }

    fn kill_cgroup(
        &self,
        table: &dyn ProcessTable,
        caller: &Caller,
        cg: &Verified,
        rule: Option<&MemberRule>,
    ) -> Result<Vec<i32>, CgroupKillError> {
        super::cgroup::kill_live(self, table, caller, cg, rule)
    }
}

/// After a SIGTERM, a SIGCONT to the same target (process or group), through the same pidfd: a
/// SIGSTOPped process would otherwise sit on its SIGTERM until the grace ends in SIGKILL. Its
/// failure changes nothing (the SIGTERM is out; the SIGKILL after the grace still comes).
fn wake_after_term(p: &Pinned, sig: Sig, group: bool) {
    if sig != Sig::Term {
        return;
    }
    let Ok(fd) = fd(p) else { return };
    if let Err(e) = sys::pidfd_send_signal(fd, libc::SIGCONT, group) {
        tracing::debug!(pid = p.id.pid, group, error = %e, "SIGCONT after SIGTERM not delivered");
    }
}

/// True when a process group still has a member, zombies included: `kill(-pgid, 0)`, which
/// sends nothing (signal 0 only asks the kernel whether the group exists and may be signalled).
/// One syscall, whatever the host's process count. `false` for pgid ≤ 1.
pub fn group_alive(pgid: i32) -> bool {
    pgid > 1
        && match nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pgid), None) {
            Ok(()) => true,
            Err(e) => e != nix::errno::Errno::ESRCH,
        }
}
