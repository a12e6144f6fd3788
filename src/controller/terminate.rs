//! The TERM → grace → KILL engine that `close` and `reap` share. Given batches of planned
//! signals (children first, from the verifier's plan), it SIGTERMs every member of every job,
//! runs all the jobs' graces at once, SIGKILLs the non-root survivors at the end of each grace,
//! gives the root (the wrapper, which exits by itself once its tree is gone and writes the
//! adapter's exit status) [`ROOT_GRACE`] more before it too gets SIGKILL, and then takes a late
//! look for anything of the lease still alive (forked during the grace, re-parented late).
//!
//! It decides nothing about ownership (the plan did) and signals nothing itself: every pin and
//! signal goes through a [`Signaller`], and every deadline runs on a [`Clock`]. Live, those are
//! pidfds and the system clock; the controller simulator (`tests/controller_simulator.rs`)
//! runs the same engine over the recording signaller and a scripted clock and asserts the
//! exact timeline.

use crate::cgroup::Verified;
use crate::proc::ProcessTable;
use crate::signal::{CgroupKillError, Clock, Delivery, Pinned, SignalError, Signaller};
use leash_core::guard::{Caller, Sig};
use leash_core::model::{Lease, LeaseState, ProcessId};
use leash_core::plan::{self, Decision, PlannedSignal, RefusedSignal};
use leash_core::verify::{Expect, MemberRule, Role};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// After SIGKILL (or `cgroup.kill`), how long to wait for the kernel to finish the processes off
/// (or for the cgroup's `populated 0`) before reporting them (it) as stuck.
pub const KILL_WAIT: Duration = Duration::from_secs(5);

/// After its tree got SIGKILL, how long the wrapper gets to reap it and exit on its own (so its
/// report carries the adapter's exit status) before it gets SIGKILL too.
pub const ROOT_GRACE: Duration = Duration::from_secs(1);

/// How long a killed member may stay a zombie in its process group (until its parent reaps it)
/// before the late look counts the group as still populated.
pub const GROUP_SETTLE: Duration = Duration::from_millis(100);

/// One signal sent, and what became of it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SignalRecord {
    pub pid: i32,
    pub start_time: u64,
    pub role: Role,
    pub signal: Sig,
    pub delivery: Delivery,
}

/// One batch member being terminated; `K` is what the caller terminates (a lease, a legacy
/// record) and gets back.
pub struct Job<K> {
    pub kind: K,
    pub session_key: String,
    pub grace: Duration,
    pub planned: Vec<PlannedSignal>,
    pub pins: Vec<(Pinned, Role)>,
    pub signals: Vec<SignalRecord>,
    pub refused: Vec<RefusedSignal>,
    deadline: Instant,
    stage: Stage,
    /// The lease's verified cgroup (path, id, and the per-member check its members passed),
    /// killed at the end of the grace (only if everyone in it then passes the check) and removed.
    pub cgroup: Option<(PathBuf, u64, Option<MemberRule>)>,
}

/// What a job terminates, as its log lines name it.
pub trait Subject {
    /// The lease's id (none for a legacy record).
    fn lease_id(&self) -> Option<&str>;
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// SIGTERM is out; the grace runs.
    Terminating,
    /// Non-root survivors got SIGKILL; the root gets [`ROOT_GRACE`] to exit by itself.
    KillingChildren,
    /// The root got SIGKILL too (the others had theirs when the grace ended).
    Killed,
}

impl<K> Job<K> {
    pub fn new(
        kind: K,
        session_key: String,
        grace_ms: u64,
        planned: Vec<PlannedSignal>,
        refused: Vec<RefusedSignal>,
        now: Instant,
    ) -> Job<K> {
        Job {
            kind,
            session_key,
            grace: Duration::from_millis(grace_ms),
            planned,
            pins: Vec::new(),
            signals: Vec::new(),
            refused,
            // Set when its SIGTERMs are out (run_jobs).
            deadline: now,
            stage: Stage::Terminating,
            cgroup: None,
        }
    }
}

impl<K: Subject> Job<K> {
    /// The span its signals are logged in: `session` and `lease_id` on every line (the JSON log
    /// lifts span fields to the top level).
    fn span(&self) -> tracing::Span {
        let span = tracing::info_span!(
            "terminate",
            session = %self.session_key,
            lease_id = tracing::field::Empty
        );
        if let Some(id) = self.kind.lease_id() {
            span.record("lease_id", id);
        }
        span
    }
}

/// The engine: the process table the pins re-check against, who signals, through what, on
/// which clock.
#[derive(Clone, Copy)]
pub struct Engine<'a> {
    pub table: &'a dyn ProcessTable,
    pub caller: &'a Caller,
    pub signaller: &'a dyn Signaller,
    pub clock: &'a dyn Clock,
}

impl Engine<'_> {
    /// Pins one planned process and sends it `sig`, recording what happened.
    pub fn pin_and_send(
        &self,
        s: &PlannedSignal,
        sig: Sig,
        pins: &mut Vec<(Pinned, Role)>,
        signals: &mut Vec<SignalRecord>,
        refused: &mut Vec<RefusedSignal>,
    ) {
        let id = ProcessId {
            pid: s.pid,
            start_time: s.start_time,
        };
        let sg = self.signaller;
        match sg.pin(self.table, self.caller, id) {
            Ok(Some(p)) => {
                // The plan allows a group signal only to a proven leader whose group held only
                // proven members; the pin re-checks that it still leads it.
                let result = if s.group && p.pgid == p.id.pid {
                    // The verified leader's whole group, including members forked since the
                    // snapshot; then the leader itself (older kernels).
                    // The record says what reached the leader: the group signal did when it was
                    // delivered, even if the leader had exited by the time of the direct send.
                    match sg.send_group(&p, sig, self.caller) {
                        Ok(Delivery::Delivered) => sg.send(&p, sig).map(|_| Delivery::Delivered),
                        Ok(_) | Err(SignalError::GroupUnsupported) => sg.send(&p, sig),
                        Err(e) => Err(e),
                    }
                } else {
                    sg.send(&p, sig)
                };
                match result {
                    Ok(delivery) => {
                        tracing::info!(
                            pid = s.pid,
                            role = crate::logvalue::json(&s.role),
                            signal = sig.name(),
                            delivery = crate::logvalue::json(&delivery),
                            "signalled"
                        );
                        signals.push(SignalRecord {
                            pid: s.pid,
                            start_time: s.start_time,
                            role: s.role,
                            signal: sig,
                            delivery,
                        });
                        pins.push((p, s.role));
                    }
                    Err(e) => refused.push(RefusedSignal {
                        pid: s.pid,
                        reason: e.to_string(),
                    }),
                }
            }
            Ok(None) => {} // already gone
            Err(e) => {
                tracing::warn!(pid = s.pid, error = %e, "not signalled");
                refused.push(RefusedSignal {
                    pid: s.pid,
                    reason: e.to_string(),
                });
            }
        }
    }

    /// SIGTERM every job's members (children first), then wait: when a job's own grace ends,
    /// its surviving non-root members get SIGKILL, and its root (the wrapper, which exits by
    /// itself once its tree is gone, writing the adapter's exit status) gets SIGKILL only if it
    /// is still there [`ROOT_GRACE`] later. All jobs' graces run at the same time.
    pub fn run_jobs<K: Subject>(&self, jobs: &mut [Job<K>]) {
        let sg = self.signaller;
        for j in jobs.iter_mut() {
            let span = j.span();
            let _in = span.enter();
            let planned = std::mem::take(&mut j.planned);
            for s in &planned {
                self.pin_and_send(s, Sig::Term, &mut j.pins, &mut j.signals, &mut j.refused);
            }
            j.planned = planned;
            // Saturating: a grace read from a row is at most an hour, but never panic on one.
            let now = self.clock.now();
            j.deadline = now.checked_add(j.grace).unwrap_or(now);
        }
        loop {
            let now = self.clock.now();
            let mut next: Option<Instant> = None;
            for j in jobs.iter_mut() {
                if j.stage == Stage::Killed || j.pins.iter().all(|(p, _)| sg.exited(p)) {
                    continue;
                }
                let span = j.span();
                let _in = span.enter();
                match j.stage {
                    Stage::Terminating if now >= j.deadline => {
                        self.kill_cgroup(j);
                        self.kill_alive(j, |role| role != Role::Root);
                        j.stage = Stage::KillingChildren;
                        j.deadline = now + ROOT_GRACE;
                    }
                    Stage::KillingChildren if now >= j.deadline => {
                        // The others had theirs when the grace ended; a second SIGKILL to one
                        // that outlived it (uninterruptible sleep) would change nothing.
                        self.kill_alive(j, |role| role == Role::Root);
                        j.stage = Stage::Killed;
                        continue;
                    }
                    _ => {}
                }
                next = Some(next.map_or(j.deadline, |n| n.min(j.deadline)));
            }
            let Some(until) = next else { break };
            let pins: Vec<&Pinned> = jobs
                .iter()
                .filter(|j| j.stage != Stage::Killed)
                .flat_map(|j| j.pins.iter().map(|(p, _)| p))
                .collect();
            // Returns early when they all exit; re-evaluated each round.
            sg.wait(
                &pins,
                until.min(self.clock.now() + Duration::from_millis(100)),
            );
        }
        let killed: Vec<&Pinned> = jobs
            .iter()
            .filter(|j| j.stage != Stage::Terminating)
            .flat_map(|j| j.pins.iter().map(|(p, _)| p))
            .collect();
        sg.wait(&killed, self.clock.now() + KILL_WAIT);
    }

    /// At the end of the grace: `cgroup.kill` takes every member of the verified cgroup at once
    /// (escapees included); the per-process SIGKILLs that follow find them gone.
    fn kill_cgroup<K>(&self, j: &mut Job<K>) {
        let Some((path, id, rule)) = &j.cgroup else {
            return;
        };
        match Verified::open(path, *id) {
            Ok(h) => {
                let alive: Vec<(ProcessId, Role)> = j
                    .pins
                    .iter()
                    .filter(|(p, _)| !self.signaller.exited(p))
                    .map(|(p, role)| (p.id, *role))
                    .collect();
                match self
                    .signaller
                    .kill_cgroup(self.table, self.caller, &h, rule.as_ref())
                {
                    Ok(members) => {
                        // The pinned members it listed got their SIGKILL from it.
                        for (id, role) in alive
                            .into_iter()
                            .filter(|(id, _)| members.contains(&id.pid))
                        {
                            j.signals.push(SignalRecord {
                                pid: id.pid,
                                start_time: id.start_time,
                                role,
                                signal: Sig::Kill,
                                delivery: Delivery::CgroupKill,
                            });
                        }
                    }
                    Err(CgroupKillError::Refused(why)) => {
                        // Each pinned member still gets its own SIGKILL (kill_alive, next).
                        tracing::warn!(cgroup = %path.display(), reason = %why, "cgroup.kill not used");
                    }
                    Err(e) => {
                        tracing::warn!(cgroup = %path.display(), error = %e, "cgroup.kill failed")
                    }
                }
                // No wait here: the kernel queued SIGKILL for every member before the write
                // returned; the jobs' common wait below sees them go.
            }
            Err(e) => tracing::warn!(cgroup = %path.display(), error = %e, "cgroup not killed"),
        }
    }

    /// SIGKILLs the pinned members that are still alive and match `which`.
    fn kill_alive<K>(&self, j: &mut Job<K>, which: impl Fn(Role) -> bool) {
        for (p, role) in &j.pins {
            if !which(*role) || self.signaller.exited(p) {
                continue;
            }
            // Already given SIGKILL by cgroup.kill (pending from the moment the write returned).
            let by_cgroup = j.signals.iter().any(|s| {
                s.delivery == Delivery::CgroupKill
                    && s.pid == p.id.pid
                    && s.start_time == p.id.start_time
            });
            if by_cgroup {
                continue;
            }
            let delivery = self
                .signaller
                .send(p, Sig::Kill)
                .unwrap_or(Delivery::AlreadyGone);
            j.signals.push(SignalRecord {
                pid: p.id.pid,
                start_time: p.id.start_time,
                role: *role,
                signal: Sig::Kill,
                delivery,
            });
        }
    }

    /// True when a process group still has a member, polling until `settle` while it does (a
    /// killed member is a zombie until its parent reaps it).
    pub fn group_has_members(&self, pgid: i32, settle: Instant) -> bool {
        loop {
            if !self.signaller.group_alive(pgid) {
                return false;
            }
            if self.clock.now() >= settle {
                return true;
            }
            self.clock.sleep(Duration::from_millis(2));
        }
    }

    /// The late look after the kills: anything of a lease still alive (forked during the grace,
    /// re-parented late) gets SIGKILL too, after the same verification. A lease with a verified
    /// cgroup needs none: whatever it forked is in the cgroup, which the caller kills and empties,
    /// so no walk of the whole process table is spent on it. `lease_of` names each job's lease
    /// (`None`: not a lease, no look).
    pub fn late_sweep<K: Subject>(
        &self,
        jobs: &mut [Job<K>],
        lease_of: impl Fn(&K) -> Option<&Lease>,
        expect: &Expect<'_>,
    ) {
        let sg = self.signaller;
        // Only a lease of which something may still run takes that look: a member pinned but
        // not seen to exit, or a process group that still has members (a child forked during
        // the grace stays in it). When all are gone the look is skipped: it would read the whole
        // host to find nothing, and a marker carrier that left the group too is `reap`'s (its
        // escapee sweep).
        // A killed member is a zombie for a moment before its parent reaps it, and a zombie
        // still counts in its group: give the groups a short, shared moment to empty.
        let settle = self.clock.now() + GROUP_SETTLE;
        let wanted: Vec<bool> = jobs
            .iter()
            .map(|j| {
                let Some(l) = lease_of(&j.kind).filter(|_| j.cgroup.is_none()) else {
                    return false;
                };
                let pins_left = j.pins.iter().any(|(p, _)| !sg.exited(p));
                let groups: Vec<i32> = l
                    .process_group_id
                    .into_iter()
                    .chain(
                        j.pins
                            .iter()
                            .filter(|(p, r)| *r != Role::Root && p.pgid == p.id.pid)
                            .map(|(p, _)| p.pgid),
                    )
                    .collect();
                pins_left
                    || groups
                        .into_iter()
                        .any(|g| self.group_has_members(g, settle))
            })
            .collect();
        if !wanted.contains(&true) {
            return;
        }
        let snap = self.table.snapshot();
        for (j, wanted) in jobs.iter_mut().zip(wanted) {
            if !wanted {
                continue;
            }
            let Some(lease) = lease_of(&j.kind) else {
                continue;
            };
            let span = j.span();
            let _in = span.enter();
            let lp = plan::plan_lease(lease, expect, snap.as_ref(), self.caller, 0);
            if lp.decision == Decision::Terminate {
                let mut late = Vec::new();
                for s in &lp.signals {
                    self.pin_and_send(s, Sig::Kill, &mut late, &mut j.signals, &mut j.refused);
                }
                let pins: Vec<&Pinned> = late.iter().map(|(p, _)| p).collect();
                sg.wait(&pins, self.clock.now() + KILL_WAIT);
            }
        }
    }

    /// How a terminated lease ends: its state (`lost` when nothing of it was there to signal and
    /// its cgroup had no member, else `closed`) and the reason its row gets. `cgroup` is what
    /// removing its verified cgroup found: the members it had before the kill, and the clause.
    pub fn lease_end<K>(
        &self,
        j: &Job<K>,
        cgroup: Option<(usize, String)>,
    ) -> (LeaseState, String) {
        let survivors: Vec<i32> = j
            .pins
            .iter()
            .filter(|(p, _)| !self.signaller.exited(p))
            .map(|(p, _)| p.id.pid)
            .collect();
        lease_end(j.pins.len(), &j.signals, j.grace, &survivors, cgroup)
    }
}

/// The clause a lease's reason gets when something it signalled outlived SIGKILL (a process in
/// uninterruptible sleep): the one way a lease ends `closed` while a process it pinned, its
/// wrapper perhaps, may still run. `reap` reads such a lease's root again.
pub const SURVIVED_SIGKILL: &str = "still alive after SIGKILL";

/// [`Engine::lease_end`], from the facts alone: `pinned` members were signalled, `survivors`
/// were still alive at the end.
pub fn lease_end(
    pinned: usize,
    signals: &[SignalRecord],
    grace: Duration,
    survivors: &[i32],
    cgroup: Option<(usize, String)>,
) -> (LeaseState, String) {
    // Processes, not signals: the late look may SIGKILL again one that outlived the first.
    let kills = signals
        .iter()
        .filter(|s| {
            s.signal == Sig::Kill
                && matches!(s.delivery, Delivery::Delivered | Delivery::CgroupKill)
        })
        .map(|s| (s.pid, s.start_time))
        .collect::<std::collections::HashSet<_>>()
        .len();
    let mut reason = format!(
        "terminated {pinned} process(es) children first{}",
        if kills > 0 {
            format!(", {kills} needed SIGKILL after {} ms", grace.as_millis())
        } else {
            String::new()
        }
    );
    if !survivors.is_empty() {
        reason.push_str(&format!("; {SURVIVED_SIGKILL}: {survivors:?}"));
    }
    let mut cgroup_members = 0;
    if pinned == 0 {
        reason = "every member had exited before it could be signalled".into();
    }
    if let Some((members, clause)) = cgroup {
        cgroup_members = members;
        reason.push_str(&clause);
    }
    let state = if pinned == 0 && cgroup_members == 0 {
        LeaseState::Lost
    } else {
        LeaseState::Closed
    };
    (state, reason)
}
