//! The recording [`Signaller`]: a host replayed from a fixture table ([`FixtureTable`]) on a
//! scripted clock. It signals nobody. It runs the same pin re-check and hard refusals as the
//! live signaller, writes down every signal (who, which, when, to one process or its group) and
//! every refusal (and why), and lets a script say when each process exits: on SIGTERM after N ms,
//! never on SIGTERM, on SIGKILL (or never: an uninterruptible process), or by itself at a time.
//! It is also the [`ProcessTable`] and the [`Clock`] of that host: a process that has exited by
//! the scripted time is gone from the table (its children re-parented to pid 1), and waiting for
//! exits moves the clock forward to the next exit or the deadline, whichever comes first.

use super::cgroup::cgroup_kill_allowed;
use super::seam::{
    check_group_pin, recheck, CgroupKillError, Clock, Delivery, Handle, Pinned, SignalError,
    Signaller,
};
use crate::cgroup::Verified;
use crate::proc::{FixtureTable, ProcessTable};
use leash_core::guard::{check_pid, Caller, Sig};
use leash_core::model::ProcessId;
use leash_core::model::TableError;
use leash_core::model::{ProcessInfo, Snapshot};
use leash_core::verify::MemberRule;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The state of the scripted host is behind mutexes only so a controller (which may serve many
/// threads) can hold it; a simulation runs on one thread, and a poisoned lock is read as it is.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A clock that moves only when told to (or when the recording signaller waits).
#[derive(Debug)]
pub struct ScriptedClock {
    base: Instant,
    elapsed: Mutex<Duration>,
}

impl Default for ScriptedClock {
    fn default() -> Self {
        ScriptedClock {
            base: Instant::now(),
            elapsed: Mutex::new(Duration::ZERO),
        }
    }
}

impl ScriptedClock {
    /// Milliseconds since the script began.
    pub fn ms(&self) -> u64 {
        lock(&self.elapsed).as_millis() as u64
    }

    fn ms_of(&self, t: Instant) -> u64 {
        t.saturating_duration_since(self.base).as_millis() as u64
    }

    /// Moves the clock to `t` (never backwards).
    fn advance_to(&self, t: Instant) {
        let d = t.saturating_duration_since(self.base);
        let mut elapsed = lock(&self.elapsed);
        if d > *elapsed {
            *elapsed = d;
        }
    }
}

impl Clock for ScriptedClock {
    fn now(&self) -> Instant {
        self.base + *lock(&self.elapsed)
    }
    fn sleep(&self, d: Duration) {
        *lock(&self.elapsed) += d;
    }
}

/// How one process exits, in ms on the scripted clock. The default: at once on SIGTERM. The
/// earliest of the times that apply is when it exits.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Exit {
    /// Exits this long after its first SIGTERM; `null`: ignores SIGTERM.
    #[serde(default = "at_once")]
    pub on_term: Option<u64>,
    /// Exits this long after its first SIGKILL; `null`: never (uninterruptible sleep).
    #[serde(default = "at_once")]
    pub on_kill: Option<u64>,
    /// Exits by itself at this time.
    #[serde(default)]
    pub at: Option<u64>,
    /// Exits once every one of these processes has (a wrapper ends once its tree has gone).
    #[serde(default)]
    pub after: Vec<i32>,
}

fn at_once() -> Option<u64> {
    Some(0)
}

impl Default for Exit {
    fn default() -> Self {
        Exit {
            on_term: Some(0),
            on_kill: Some(0),
            at: None,
            after: Vec::new(),
        }
    }
}

/// One line of the recorded timeline.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SimEvent {
    /// Scripted time, in ms.
    pub at: u64,
    pub pid: i32,
    #[serde(flatten)]
    pub what: SimWhat,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "camelCase")]
pub enum SimWhat {
    /// A signal, to the process or (`group`) to the process group it leads.
    Signal {
        signal: Sig,
        group: bool,
        delivery: Delivery,
        /// For a group signal, the members it reached (as the kernel would: those alive in the
        /// group that the caller may signal).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        members: Vec<i32>,
    },
    /// A pin or a send was refused; nothing was signalled.
    Refused { reason: String },
    /// `cgroup.kill` of a lease's verified cgroup (the event's pid is 0: no one process): SIGKILL
    /// reached every member at once.
    CgroupKill { cgroup: String, members: Vec<i32> },
}

/// What the script has done to one process instance so far.
#[derive(Debug, Default, Clone, Copy)]
struct Received {
    term: Option<u64>,
    kill: Option<u64>,
}

/// A fixture host whose processes exit as scripted, and that records every signal.
#[derive(Debug)]
pub struct RecordingSignaller {
    table: FixtureTable,
    script: HashMap<i32, Exit>,
    clock: ScriptedClock,
    received: Mutex<HashMap<ProcessId, Received>>,
    log: Mutex<Vec<SimEvent>>,
    /// The fixture host's cgroups: path → the pids in it (alive or not, as the script has it).
    cgroups: HashMap<PathBuf, Vec<i32>>,
}

impl RecordingSignaller {
    /// A host replaying `table`; `script` says how each pid exits (absent: at once on SIGTERM).
    pub fn new(table: FixtureTable, script: HashMap<i32, Exit>) -> RecordingSignaller {
        RecordingSignaller {
            table,
            script,
            clock: ScriptedClock::default(),
            received: Mutex::new(HashMap::new()),
            log: Mutex::new(Vec::new()),
            cgroups: HashMap::new(),
        }
    }

    /// Puts `members` in the cgroup at `path` of this host (a cgroup the simulator verified: a
    /// directory it made, standing in for the cgroupfs one). A cgroup kill of it reaches those
    /// still alive; a cgroup it was not told of has none.
    pub fn with_cgroup(mut self, path: PathBuf, members: Vec<i32>) -> RecordingSignaller {
        self.cgroups.insert(path, members);
        self
    }

    /// The processes alive now in the cgroup at `path`.
    fn cgroup_members(&self, path: &std::path::Path) -> Vec<ProcessInfo> {
        let listed = self.cgroups.get(path).cloned().unwrap_or_default();
        self.alive_now()
            .unwrap_or_default()
            .into_iter()
            .filter(|p| listed.contains(&p.pid))
            .collect()
    }

    pub fn clock(&self) -> &ScriptedClock {
        &self.clock
    }

    /// The timeline so far: every signal and refusal, in order.
    pub fn timeline(&self) -> Vec<SimEvent> {
        lock(&self.log).clone()
    }

    /// When the process exited (scripted ms), if it has by now.
    pub fn exited_at(&self, pid: i32) -> Option<u64> {
        let p = self.table.processes.iter().find(|p| p.pid == pid)?;
        self.exit_time(p.id()).filter(|t| *t <= self.clock.ms())
    }

    /// When this instance exits, as far as the script and the signals so far say.
    fn exit_time(&self, id: ProcessId) -> Option<u64> {
        self.exit_time_within(id, self.table.processes.len())
    }

    /// [`Self::exit_time`], following at most `depth` `after` links (a script whose `after`
    /// links form a cycle ends, like every walk).
    fn exit_time_within(&self, id: ProcessId, depth: usize) -> Option<u64> {
        let exit = self.script.get(&id.pid).cloned().unwrap_or_default();
        let got = lock(&self.received).get(&id).copied().unwrap_or_default();
        let on_term = got.term.zip(exit.on_term).map(|(t, d)| t.saturating_add(d));
        let on_kill = got.kill.zip(exit.on_kill).map(|(t, d)| t.saturating_add(d));
        // The last of them to exit, once all of them have an exit time (a pid the table does
        // not list has gone already).
        let after = if exit.after.is_empty() || depth == 0 {
            None
        } else {
            exit.after
                .iter()
                .map(
                    |pid| match self.table.processes.iter().find(|p| p.pid == *pid) {
                        Some(p) => self.exit_time_within(p.id(), depth - 1),
                        None => Some(0),
                    },
                )
                .collect::<Option<Vec<u64>>>()
                .and_then(|t| t.into_iter().max())
        };
        [exit.at, on_term, on_kill, after]
            .into_iter()
            .flatten()
            .min()
    }

    fn is_alive(&self, id: ProcessId) -> bool {
        let listed = self
            .table
            .processes
            .iter()
            .any(|p| p.pid == id.pid && p.start_time == id.start_time);
        listed && self.exit_time(id).is_none_or(|t| t > self.clock.ms())
    }

    /// The processes alive now, children of an exited parent re-parented to pid 1.
    fn alive_now(&self) -> Result<Vec<ProcessInfo>, TableError> {
        if let Some(why) = &self.table.unavailable {
            return Err(TableError::Unavailable(why.clone()));
        }
        let alive: Vec<&ProcessInfo> = self
            .table
            .processes
            .iter()
            .filter(|p| self.is_alive(p.id()))
            .collect();
        Ok(alive
            .iter()
            .map(|p| {
                let mut p = (*p).clone();
                if p.ppid > 1 && !alive.iter().any(|q| q.pid == p.ppid) {
                    p.ppid = 1;
                }
                p
            })
            .collect())
    }

    fn record(&self, pid: i32, what: SimWhat) {
        lock(&self.log).push(SimEvent {
            at: self.clock.ms(),
            pid,
            what,
        });
    }

    /// Delivers `sig` to one instance: the first SIGTERM and the first SIGKILL start its script.
    fn deliver(&self, id: ProcessId, sig: Sig) {
        let now = self.clock.ms();
        let mut received = lock(&self.received);
        let r = received.entry(id).or_default();
        let slot = match sig {
            Sig::Term => &mut r.term,
            Sig::Kill => &mut r.kill,
        };
        slot.get_or_insert(now);
    }

    fn own(&self, p: &Pinned) -> Result<(), SignalError> {
        match p.handle {
            Handle::Recorded => Ok(()),
            Handle::Pidfd(_) => Err(SignalError::Os {
                pid: p.id.pid,
                source: std::io::Error::from_raw_os_error(libc::EBADF),
            }),
        }
    }

    fn refused<T>(&self, pid: i32, r: Result<T, SignalError>) -> Result<T, SignalError> {
        if let Err(e) = &r {
            self.record(
                pid,
                SimWhat::Refused {
                    reason: e.to_string(),
                },
            );
        }
        r
    }
}

impl Signaller for RecordingSignaller {
    fn pin(
        &self,
        table: &dyn ProcessTable,
        caller: &Caller,
        id: ProcessId,
    ) -> Result<Option<Pinned>, SignalError> {
        let r = (|| {
            check_pid(id.pid, caller)?;
            // pidfd_open: any live process with this pid, whichever instance it is.
            if !self.alive_now()?.iter().any(|p| p.pid == id.pid) {
                return Ok(None);
            }
            Ok(recheck(table, caller, id)?.map(|pgid| Pinned {
                id,
                pgid,
                handle: Handle::Recorded,
            }))
        })();
        self.refused(id.pid, r)
    }

    fn send(&self, p: &Pinned, sig: Sig) -> Result<Delivery, SignalError> {
        self.own(p)?;
        let delivery = if self.is_alive(p.id) {
            self.deliver(p.id, sig);
            Delivery::Delivered
        } else {
            Delivery::AlreadyGone
        };
        self.record(
            p.id.pid,
            SimWhat::Signal {
                signal: sig,
                group: false,
                delivery,
                members: Vec::new(),
            },
        );
        Ok(delivery)
    }

    fn send_group(&self, p: &Pinned, sig: Sig, caller: &Caller) -> Result<Delivery, SignalError> {
        self.own(p)?;
        self.refused(p.id.pid, check_group_pin(p, caller))?;
        let mut members = Vec::new();
        let delivery = if self.is_alive(p.id) {
            // kill(2)'s permission rule: an unprivileged caller reaches only its own uid's
            // processes. The caller itself is in the group only if its own group is this one
            // (which the group refusal above has already turned down), whatever a tampered
            // table lists.
            for m in self.alive_now()?.iter().filter(|m| {
                m.pgid == p.pgid
                    && (caller.uid == 0 || m.uid == caller.uid)
                    && (m.pid != caller.pid || caller.pgid == p.pgid)
            }) {
                self.deliver(m.id(), sig);
                members.push(m.pid);
            }
            Delivery::Delivered
        } else {
            Delivery::AlreadyGone
        };
        self.record(
            p.id.pid,
            SimWhat::Signal {
                signal: sig,
                group: true,
                delivery,
                members,
            },
        );
        Ok(delivery)
    }

    fn exited(&self, p: &Pinned) -> bool {
        !self.is_alive(p.id)
    }

    fn wait(&self, pins: &[&Pinned], deadline: Instant) -> Vec<usize> {
        let end = self.clock.ms_of(deadline);
        loop {
            let alive: Vec<usize> = (0..pins.len())
                .filter(|&i| self.is_alive(pins[i].id))
                .collect();
            let now = self.clock.ms();
            if alive.is_empty() || now >= end {
                return alive;
            }
            // The next exit among them, else the deadline.
            let next = alive
                .iter()
                .filter_map(|&i| self.exit_time(pins[i].id))
                .filter(|t| *t > now)
                .min()
                .map_or(end, |t| t.min(end));
            self.clock
                .advance_to(self.clock.base + Duration::from_millis(next));
        }
    }

    fn group_alive(&self, pgid: i32) -> bool {
        pgid > 1
            && self
                .alive_now()
                .is_ok_and(|l| l.iter().any(|p| p.pgid == pgid))
    }

    fn kill_cgroup(
        &self,
        table: &dyn ProcessTable,
        caller: &Caller,
        cg: &Verified,
        rule: Option<&MemberRule>,
    ) -> Result<Vec<i32>, CgroupKillError> {
        self.kill_fixture_cgroup(table, caller, cg, rule)
    }
}

impl RecordingSignaller {
    /// [`Signaller::kill_cgroup`] on the fixture host: the same member check as live, then
    /// SIGKILL to every member still alive (what `cgroup.kill` does), recorded as one event.
    fn kill_fixture_cgroup(
        &self,
        table: &dyn ProcessTable,
        caller: &Caller,
        cg: &Verified,
        rule: Option<&MemberRule>,
    ) -> Result<Vec<i32>, CgroupKillError> {
        let members = self.cgroup_members(cg.path());
        let listed: Vec<i32> = members.iter().map(|p| p.pid).collect();
        if let Err(why) = cgroup_kill_allowed(table, caller, &listed, rule) {
            self.record(
                0,
                SimWhat::Refused {
                    reason: why.clone(),
                },
            );
            return Err(CgroupKillError::Refused(why));
        }
        for m in &members {
            self.deliver(m.id(), Sig::Kill);
        }
        self.record(
            0,
            SimWhat::CgroupKill {
                cgroup: cg.path().display().to_string(),
                members: listed.clone(),
            },
        );
        Ok(listed)
    }
}

impl Clock for RecordingSignaller {
    fn now(&self) -> Instant {
        self.clock.now()
    }
    fn sleep(&self, d: Duration) {
        self.clock.sleep(d)
    }
}

impl ProcessTable for RecordingSignaller {
    fn snapshot(&self) -> Result<Snapshot, TableError> {
        Ok(Snapshot::new(self.alive_now()?))
    }

    fn process(&self, pid: i32) -> Result<Option<ProcessInfo>, TableError> {
        Ok(self.alive_now()?.into_iter().find(|p| p.pid == pid))
    }

    /// A cgroup of this host (see [`RecordingSignaller::with_cgroup`]): its id is the inode of
    /// the stand-in directory (absent when the directory is), its members those still alive.
    fn cgroup(&self, path: &std::path::Path) -> leash_core::model::Observation {
        use std::os::unix::fs::MetadataExt;
        let mut o = leash_core::model::Observation {
            path: path.to_path_buf(),
            ..Default::default()
        };
        let Ok(meta) = std::fs::symlink_metadata(path) else {
            return o;
        };
        o.id = Some(meta.ino());
        o.procs = self.cgroup_members(path).iter().map(|p| p.pid).collect();
        o.populated = !o.procs.is_empty();
        o
    }

    fn cgroup_procs(&self, cg: &Verified) -> Vec<i32> {
        self.cgroup_members(cg.path())
            .iter()
            .map(|p| p.pid)
            .collect()
    }

    fn cgroup_populated(&self, cg: &Verified) -> bool {
        !self.cgroup_members(cg.path()).is_empty()
    }
}
