//! `close`: claims the named leases, verifies each live tree against its lease, and runs them
//! through the TERM → grace → KILL engine together (their graces at once); then kills and
//! removes their verified cgroups (one wait for all) and records how each ended. `reap` closes
//! its orphans through the same `terminate_leases_with`.

use super::base::*;
use crate::signal::CgroupKillError;
use leash_core::verify::MemberRule;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum CloseResult {
    /// Verified and terminated.
    Closed,
    /// Nothing of it was alive.
    Lost,
    /// Ownership could not be proven: nothing signalled, the lease is open again.
    LeftOpen,
    /// Another process holds it, or it is not in a closable state.
    Conflict,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CloseOutcome {
    pub lease_id: String,
    pub session_key: String,
    pub result: CloseResult,
    pub reason: String,
    pub signals: Vec<SignalRecord>,
    pub refused: Vec<RefusedSignal>,
    pub exit_status: Option<i32>,
}

/// Kills, waits for and removes many cgroups at once: every populated one is killed first, then
/// all are waited for together (one deadline), then each is removed; a cgroup that could not be
/// opened as the lease's or killed is left, with the reason in its clause. Returns, per cgroup in order, the
/// members it had before the kill and the clause its lease's reason gets.
fn remove_cgroups(
    engine: &Engine<'_>,
    list: &[(PathBuf, u64, Option<MemberRule>)],
) -> Vec<(usize, String)> {
    let started = Instant::now();
    let mut out: Vec<(usize, String)> = Vec::with_capacity(list.len());
    let mut open: Vec<Option<Verified>> = Vec::with_capacity(list.len());
    for (path, id, rule) in list {
        if !path.exists() {
            out.push((0, format!("; cgroup {} already removed", path.display())));
            open.push(None);
            continue;
        }
        match Verified::open(path, *id) {
            Ok(h) => {
                let members = engine.table.cgroup_procs(&h).len();
                if members > 0 || engine.table.cgroup_populated(&h) {
                    // cgroup.kill takes everyone in it: only when each is proven the lease's.
                    match engine.signaller.kill_cgroup(
                        engine.table,
                        engine.caller,
                        &h,
                        rule.as_ref(),
                    ) {
                        Ok(_) => {}
                        Err(CgroupKillError::Refused(why)) => {
                            tracing::warn!(cgroup = %path.display(), reason = %why, "cgroup not killed");
                            out.push((0, format!("; cgroup {} left: {why}", path.display())));
                            open.push(None);
                            continue;
                        }
                        Err(e) => {
                            tracing::warn!(cgroup = %path.display(), error = %e, "cgroup not removed");
                            out.push((members, format!("; {e}")));
                            open.push(None);
                            continue;
                        }
                    }
                }
                out.push((members, String::new()));
                open.push(Some(h));
            }
            Err(e) => {
                tracing::warn!(cgroup = %path.display(), error = %e, "cgroup not removed");
                out.push((0, format!("; {e}")));
                open.push(None);
            }
        }
    }
    let deadline = started + super::terminate::KILL_WAIT;
    loop {
        let busy = open
            .iter()
            .flatten()
            .any(|h| engine.table.cgroup_populated(h));
        if !busy || Instant::now() >= deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    for (((path, _, _), h), (members, clause)) in list.iter().zip(open).zip(out.iter_mut()) {
        let Some(h) = h else { continue };
        if engine.table.cgroup_populated(&h) {
            let e = cgroup::CgroupError::Stuck {
                path: path.clone(),
                waited_ms: started.elapsed().as_millis(),
            };
            tracing::warn!(cgroup = %path.display(), error = %e, "cgroup not removed");
            *clause = format!("; {e}");
            continue;
        }
        *clause = match h.remove() {
            Ok(()) if *members == 0 => format!("; cgroup {} removed", path.display()),
            Ok(()) => format!(
                "; cgroup.kill took {members} remaining member(s) of {} and it was removed",
                path.display()
            ),
            Err(e) => {
                tracing::warn!(cgroup = %path.display(), error = %e, "cgroup not removed");
                format!("; {e}")
            }
        };
    }
    out
}

/// Kills what is left in a verified cgroup, waits until it is empty and removes it
/// ([`remove_cgroups`] for one); returns the clause the lease's reason gets.
fn remove_cgroup(
    engine: &Engine<'_>,
    path: &std::path::Path,
    id: u64,
    rule: Option<MemberRule>,
) -> String {
    let mut out = remove_cgroups(engine, &[(path.to_path_buf(), id, rule)]);
    out.pop().map(|(_, clause)| clause).unwrap_or_default()
}

/// Whether the process read at a lease's root pid is its live root (same start time, not a
/// zombie).
fn root_alive(l: &Lease, at_root: &Option<leash_core::model::ProcessInfo>) -> bool {
    at_root
        .as_ref()
        .is_some_and(|p| p.start_time == l.root_start_time && p.state != 'Z')
}

impl<'t> Controller<'t> {
    /// Closes the named leases, their grace periods running concurrently.
    pub fn close(
        &self,
        refs: &[LeaseRef],
        grace_override: Option<u64>,
    ) -> Result<Vec<CloseOutcome>, LifecycleError> {
        self.ingest_reports_marking_ended_lost()?;
        let mut leases = Vec::new();
        for r in refs {
            leases.push(self.resolve_or_repair(r)?);
        }
        let ids: Vec<&str> = leases.iter().map(|l| l.lease_id.as_str()).collect();
        let ((claimed, lost_race), _held) = self.claim_all(&ids)?;
        let mut outcomes: Vec<CloseOutcome> = lost_race
            .into_iter()
            .filter_map(|(id, reason)| {
                leases
                    .iter()
                    .find(|l| l.lease_id == id)
                    .map(|l| conflict(l, reason))
            })
            .collect();
        outcomes.extend(self.terminate_leases(claimed, grace_override)?);
        Ok(outcomes)
    }

    /// A snapshot that covers the given leases, read from each lease down, never from the host
    /// when it can be helped: a lease with a verified cgroup is its live root plus the
    /// members `cgroup.procs` lists (whatever forked, re-parented or left the group, it cannot
    /// leave the cgroup: no tree walk); a lease with a live root is its subtree (a live wrapper is
    /// a subreaper, so its whole tree hangs below it). Only a lease whose wrapper is gone and
    /// that has no cgroup, or whose recorded process group still has members (every one of them
    /// is judged, and a refusal reported, as before), needs the whole table (escapees are found
    /// by their markers), and so does a batch of more than 64 uncontained leases (one pass is
    /// cheaper then).
    fn snapshot_for(
        &self,
        leases: &[&Lease],
        scan: Option<&Snapshot>,
    ) -> Result<Snapshot, TableError> {
        let obs = self.observe_cgroups(leases);
        // Reap hands in its one pass: reused as it is when the batch is large (without a read
        // per lease), or when a root is gone (its escapees are looked for by their markers
        // anyway).
        if let Some(all) = scan {
            if leases.len() > 64 {
                return Ok(self.with_cgroups(all.clone(), obs));
            }
        }
        // Whatever runs at each root pid, read once: our wrapper or not, verification says "the
        // pid was reused" only if it sees the stranger.
        let roots = leases
            .iter()
            .map(|l| self.table.process(l.root_pid))
            .collect::<Result<Vec<_>, _>>()?;
        if let Some(all) = scan {
            if leases.iter().zip(&roots).any(|(l, r)| !root_alive(l, r)) {
                return Ok(self.with_cgroups(all.clone(), obs));
            }
        }
        // (With reap's pass every root was alive and the batch small: it was returned above
        // otherwise.)
        match self.read_down(leases, roots, &obs)? {
            Some(list) => Ok(self.with_cgroups(Snapshot::new(list), obs)),
            None => {
                let all = self.table.snapshot()?;
                Ok(self.with_cgroups(all, obs))
            }
        }
    }

    /// The processes that cover `leases` read from each lease down (`roots`: what runs at each
    /// root pid, read once): a lease with a verified cgroup (`obs`) is its root plus the members
    /// [`Controller::with_cgroups`] adds from `cgroup.procs`, unless its root is gone and its
    /// recorded group still has members; a lease with a live root is its subtree. `None` when
    /// one of them needs the whole table (its wrapper gone and no verified cgroup, or a group
    /// left behind), or when more than 64 trees would be walked (one pass is cheaper then).
    pub(super) fn read_down(
        &self,
        leases: &[&Lease],
        roots: Vec<Option<leash_core::model::ProcessInfo>>,
        obs: &[leash_core::model::Observation],
    ) -> Result<Option<Vec<leash_core::model::ProcessInfo>>, TableError> {
        let contained = |l: &Lease| {
            obs.iter().any(|o| {
                l.cgroup_path.as_deref() == o.path.to_str()
                    && o.error.is_none()
                    && o.id.is_some()
                    && o.id == l.cgroup_id
            })
        };
        let mut list = Vec::new();
        let mut walks = Vec::new();
        for (l, at_root) in leases.iter().zip(roots) {
            let alive = root_alive(l, &at_root);
            let group_left = || {
                l.process_group_id
                    .is_some_and(|g| self.engine().group_has_members(g, self.clock.now()))
            };
            if contained(l) && (alive || !group_left()) {
                list.extend(at_root);
            } else if alive {
                walks.push(l.root_pid);
            } else {
                return Ok(None);
            }
        }
        if walks.len() > 64 {
            return Ok(None);
        }
        let mut seen = std::collections::HashSet::new();
        list.retain(|p| seen.insert(p.pid));
        for pid in walks {
            for p in self.table.subtree(pid)?.iter() {
                if seen.insert(p.pid) {
                    list.push(p.clone());
                }
            }
        }
        Ok(Some(list))
    }

    /// Verifies and terminates claimed (`closing`) leases; every lease ends closed, lost, or
    /// open again with the reason.
    fn terminate_leases(
        &self,
        claimed: Vec<Lease>,
        grace_override: Option<u64>,
    ) -> Result<Vec<CloseOutcome>, StoreError> {
        self.terminate_leases_with(claimed, grace_override, None)
    }

    /// [`Controller::terminate_leases`], given a whole-host snapshot just taken (reap's one
    /// pass) to use where a lease needs one.
    pub(super) fn terminate_leases_with(
        &self,
        claimed: Vec<Lease>,
        grace_override: Option<u64>,
        scan: Option<&Snapshot>,
    ) -> Result<Vec<CloseOutcome>, StoreError> {
        if claimed.is_empty() {
            return Ok(Vec::new());
        }
        let (gateway, wrapper_root, cgroup_root) = self.expect_parts();
        let expect = Expect {
            gateway_instance_id: &gateway,
            wrapper_root: &wrapper_root,
            cgroup_root: cgroup_root.as_deref(),
        };
        let refs: Vec<&Lease> = claimed.iter().collect();
        let snap = self.snapshot_for(&refs, scan);
        let had_cgroups = claimed.iter().any(|l| l.cgroup_path.is_some());
        let mut finishes = Vec::new();
        let mut jobs = Vec::new();
        for lease in claimed {
            let grace = grace_override.unwrap_or(lease.grace_ms);
            let lp = plan::plan_lease(&lease, &expect, snap.as_ref(), &self.caller, grace);
            let cg = lp.cgroup.as_ref().and_then(|c| match c.action {
                CgroupAction::KillAndRemove | CgroupAction::Remove => {
                    Some((PathBuf::from(&c.path), c.id, c.rule.clone()))
                }
                CgroupAction::None | CgroupAction::Leave => None,
            });
            match lp.decision {
                Decision::Terminate => {
                    let key = lease.session_key.clone();
                    let mut job = Job::new(
                        JobKind::Lease(lease),
                        key,
                        grace,
                        lp.signals,
                        lp.refused,
                        self.clock.now(),
                    );
                    job.cgroup = cg;
                    jobs.push(job);
                }
                Decision::MarkLost { mut reason } => {
                    if let Some((path, id, rule)) = cg {
                        reason.push_str(&remove_cgroup(&self.engine(), &path, id, rule));
                    }
                    finishes.push(Finish {
                        lease,
                        to: LeaseState::Lost,
                        reason,
                        signals: Vec::new(),
                        refused: Vec::new(),
                    })
                }
                Decision::Leave { reason } | Decision::Skip { reason } => finishes.push(Finish {
                    lease,
                    to: LeaseState::Open,
                    reason,
                    signals: Vec::new(),
                    // The refusals are the evidence for leaving it open: report them.
                    refused: lp.refused,
                }),
            }
        }
        self.engine().run_jobs(&mut jobs);
        // A second look after the kills (leases without a verified cgroup; see the engine).
        self.engine().late_sweep(
            &mut jobs,
            |k| match k {
                JobKind::Lease(l) => Some(l),
                JobKind::Legacy(_) => None,
            },
            &expect,
        );
        // The verified cgroups: all killed first, then one wait for all of them to empty, then
        // each removed; never a wait per cgroup in turn.
        let cgroups: Vec<(PathBuf, u64, Option<MemberRule>)> =
            jobs.iter().filter_map(|j| j.cgroup.clone()).collect();
        let mut removed = remove_cgroups(&self.engine(), &cgroups).into_iter();
        for j in jobs {
            if !matches!(j.kind, JobKind::Lease(_)) {
                continue;
            }
            let cg = j
                .cgroup
                .is_some()
                .then(|| removed.next().unwrap_or_default());
            let (state, reason) = self.engine().lease_end(&j, cg);
            let JobKind::Lease(lease) = j.kind else {
                continue;
            };
            finishes.push(Finish {
                lease,
                to: state,
                reason,
                signals: j.signals,
                refused: j.refused,
            });
        }
        // The gateway's directory goes with its last lease cgroup, as when a wrapper removes the
        // last one itself: `rmdir` fails while another lease's cgroup is in it, and `leash exec`
        // makes it again for the next lease.
        if let (true, Some(gw)) = (had_cgroups, cgroup_root.as_deref()) {
            cgroup::remove_gateway_dir_if_empty(gw);
        }
        self.finish_all(finishes)
    }

    /// Records how each claimed lease ended (one transaction for all of them), folding in the
    /// wrapper's report where there is one.
    fn finish_all(&self, finishes: Vec<Finish>) -> Result<Vec<CloseOutcome>, StoreError> {
        // One database step: the reports and the transitions under one hold of the store.
        let mut store = self.store();
        let mut reports = Vec::with_capacity(finishes.len());
        for f in &finishes {
            let lease = &f.lease;
            let report = WrapperReport::read_for(&self.root, lease);
            if let Some(r) = &report {
                match r.apply(&mut store, &lease.lease_id) {
                    // The exit status is still in the answer; the report stays for the next look.
                    Err(e) if e.is_disk_full() => {
                        tracing::warn!(lease_id = %lease.lease_id, error = %e, "the wrapper's report cannot be recorded (disk full)")
                    }
                    other => {
                        other?;
                    }
                }
            }
            reports.push(report);
        }
        let transitions: Vec<Transition<'_>> = finishes
            .iter()
            .map(|f| Transition {
                lease_id: &f.lease.lease_id,
                from: LeaseState::Closing,
                to: f.to,
                reason: &f.reason,
            })
            .collect();
        // On a full disk (the store's reserve given back and still no room) the close happened
        // all the same: its answer says so, and what could not be recorded (the row stays
        // `closing`, claimed by this process, and a later close or reap on a disk with room
        // takes the stale claim over and records it).
        let (changed, unrecorded) = match store.transition_many(&transitions, Some(self.me)) {
            Ok(changed) => (changed, None),
            Err(e) if e.is_disk_full() => (vec![true; transitions.len()], Some(e.to_string())),
            Err(e) => return Err(e),
        };
        drop(store);
        let mut outcomes = Vec::with_capacity(finishes.len());
        for ((f, changed), report) in finishes.into_iter().zip(changed).zip(reports) {
            let signalled = f.signals.iter().any(|s| s.delivery == Delivery::Delivered);
            let result = match (changed, f.to) {
                // What this close did is the answer: signals sent are never a "conflict", even
                // when the row was settled by someone else meanwhile.
                (false, LeaseState::Closed) if signalled => CloseResult::Closed,
                (false, _) => CloseResult::Conflict,
                (true, LeaseState::Closed) => CloseResult::Closed,
                (true, LeaseState::Lost) => CloseResult::Lost,
                (true, _) => CloseResult::LeftOpen,
            };
            // Read or not (none, or one naming another wrapper), a settled lease's report
            // files go: nothing reads them again. A close whose end could not be recorded keeps
            // them for the close that records it.
            if changed && unrecorded.is_none() && f.to.is_terminal() {
                report::remove_report(&self.root, &f.lease);
            }
            tracing::info!(lease_id = %f.lease.lease_id, session = %f.lease.session_key, result = crate::logvalue::json(&result), reason = %f.reason, "close finished");
            outcomes.push(CloseOutcome {
                exit_status: report.and_then(|r| r.exit_status).or(f.lease.exit_status),
                lease_id: f.lease.lease_id,
                session_key: f.lease.session_key,
                result,
                reason: if let Some(e) = &unrecorded {
                    format!(
                        "{}; not recorded: {e} (the row stays closing until a close or reap on a disk with room records it)",
                        f.reason
                    )
                } else if changed {
                    f.reason
                } else if signalled {
                    format!(
                        "{}; the lease row was settled by another process meanwhile",
                        f.reason
                    )
                } else {
                    "lease changed hands during the close".into()
                },
                signals: f.signals,
                refused: f.refused,
            });
        }
        Ok(outcomes)
    }
}

fn conflict(lease: &Lease, reason: String) -> CloseOutcome {
    CloseOutcome {
        lease_id: lease.lease_id.clone(),
        session_key: lease.session_key.clone(),
        result: CloseResult::Conflict,
        reason,
        signals: Vec::new(),
        refused: Vec::new(),
        exit_status: lease.exit_status,
    }
}
