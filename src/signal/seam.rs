//! The seam every signal passes, as all of `signal/` sees it: the [`Signaller`] and [`Clock`]
//! traits, a pinned process ([`Pinned`]) and what happened to its signal ([`Delivery`]), the
//! re-check every pin makes and the hard refusals ([`check`]), and the errors.

use crate::cgroup::{CgroupError, Verified};
use crate::proc::ProcessTable;
use leash_core::guard::{check_group, Caller, Refusal, Sig};
use leash_core::kind::{HasKind, Kind};
use leash_core::model::ProcessId;
use leash_core::model::ProcessInfo;
use leash_core::model::TableError;
use leash_core::verify::MemberRule;
use serde::{Deserialize, Serialize};
use std::os::fd::OwnedFd;
use std::time::{Duration, Instant};

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
    pub(super) handle: Handle,
}

/// What a pin holds: each signaller accepts only its own kind.
#[derive(Debug)]
pub(super) enum Handle {
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
pub(super) fn recheck(
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
pub(super) fn check_group_pin(p: &Pinned, caller: &Caller) -> Result<(), SignalError> {
    if p.pgid != p.id.pid {
        return Err(Refusal::Group { pgid: p.pgid }.into());
    }
    check_group(p.pgid, caller)?;
    Ok(())
}

/// Why a cgroup was not killed.
#[derive(Debug, thiserror::Error)]
pub enum CgroupKillError {
    /// Not every process in it passed the member check: nobody was killed as a group (the proven
    /// members still get their own signals).
    #[error("{0}")]
    Refused(String),
    #[error(transparent)]
    Cgroup(#[from] CgroupError),
}
