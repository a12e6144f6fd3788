//! `reap`: the startup reap. Plans from one snapshot (this gateway's open and closing leases
//! whose owner is gone, legacy records, closed leases' escapees, stray cgroups): read from the
//! leases down when every lease is contained (their roots, owners and the members their cgroups
//! list), else from one pass over the host. It claims and terminates the orphans like
//! `close`, sweeps the escapees of closed and lost leases by their markers, handles legacy
//! records (`legacy.rs`), expires old leases and sweeps stray cgroups. `plan_reap` alone is the
//! dry run.

use super::base::*;
use super::close::{CloseOutcome, CloseResult};
use super::legacy::LegacyOutcome;
use crate::controller::terminate;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReapReport {
    pub leases: Vec<CloseOutcome>,
    pub legacy: Vec<LegacyOutcome>,
    /// Leases left alone, with the reason (live sessions, closed by another process).
    pub skipped: Vec<(String, String)>,
    pub expired: usize,
    pub bad_rows: Vec<String>,
    /// Stray cgroups swept (containment).
    #[serde(default)]
    pub cgroups: Vec<SweptCgroup>,
    /// Escapees of closed and lost leases terminated (their leases stay as they were).
    #[serde(default)]
    pub escapees: Vec<CloseOutcome>,
}

/// A stray cgroup and what the sweep did with it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SweptCgroup {
    pub path: String,
    pub id: u64,
    /// `removed`, `left` (not verified, too young, or populated), or `failed`.
    pub result: String,
    pub reason: String,
    /// What a populated stray held: reported, never signalled.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub processes: Vec<plan::StrayProcess>,
}

/// A reap plan and what `reap` reuses of its making.
struct Planned {
    plan: ReapPlan,
    /// The host-wide pass, if the plan took one (one pass per reap; handed back, not kept, so
    /// concurrent reaps on one controller never share it).
    scan: Option<Result<Snapshot, TableError>>,
    /// The rows the plan was made from: where the expired leases' reports are.
    rows: Vec<Result<Lease, String>>,
}

/// How old (by its lease id's timestamp) a cgroup without a lease must be before the sweep takes
/// it: `leash exec` makes the directory just before it commits the lease, and it cannot wait
/// longer than the database's busy timeout for that commit.
fn stray_min_age_ms() -> i64 {
    (crate::store::busy_timeout().as_millis() as i64).saturating_mul(2) + 1_000
}

/// Logs what the sweep did with one stray: at INFO (WARN when it holds processes) the first
/// time, at DEBUG when the last sweep reported the same (`first` false).
fn report_stray(c: &SweptCgroup, first: bool) {
    let cgroup_id = c.id;
    if c.processes.is_empty() {
        if first {
            tracing::info!(cgroup = %c.path, cgroup_id, result = %c.result, reason = %c.reason, "stray cgroup");
        } else {
            tracing::debug!(cgroup = %c.path, cgroup_id, result = %c.result, reason = %c.reason, "stray cgroup, as reported before");
        }
        return;
    }
    let pids = c
        .processes
        .iter()
        .map(|p| p.pid.to_string())
        .collect::<Vec<_>>()
        .join(" ");
    if first {
        let commands = c
            .processes
            .iter()
            .map(|p| p.command.as_deref().unwrap_or("?"))
            .collect::<Vec<_>>()
            .join("; ");
        tracing::warn!(cgroup = %c.path, cgroup_id, result = %c.result, %pids, %commands, reason = %c.reason, "populated stray cgroup left alone");
    } else {
        tracing::debug!(cgroup = %c.path, cgroup_id, result = %c.result, %pids, reason = %c.reason, "populated stray cgroup left alone, as reported before");
    }
}

/// Removes an empty stray (never writes `cgroup.kill`: what is in a stray is not leash's, see
/// [`plan::settle_stray`]); a populated one is left (and reported: [`report_stray`]).
fn sweep_one(s: plan::StrayCgroup) -> SweptCgroup {
    let (result, reason) = match s.action {
        CgroupAction::Remove => {
            // rmdir: the kernel refuses it (EBUSY) if a process was moved in since the look.
            let r = Verified::open(std::path::Path::new(&s.path), s.id).and_then(|h| h.remove());
            match r {
                Ok(()) => ("removed", s.reason),
                Err(e) => ("failed", format!("{}; {e}", s.reason)),
            }
        }
        CgroupAction::KillAndRemove | CgroupAction::Leave | CgroupAction::None => {
            ("left", s.reason)
        }
    };
    SweptCgroup {
        path: s.path,
        id: s.id,
        result: result.into(),
        reason,
        processes: s.processes,
    }
}

impl<'t> Controller<'t> {
    /// Repairs the active rows that do not read (see [`Controller::resolve_or_repair`]) before
    /// a reap plans; those whose evidence does not read stay in the plan's bad rows.
    fn repair_active_rows(&self) -> Result<(), StoreError> {
        let bad: Vec<String> = self
            .store()
            .leases(&[LeaseState::Open, LeaseState::Closing])?
            .into_iter()
            .filter_map(|r| match r {
                Err(StoreError::BadRow { lease_id, .. }) => Some(lease_id),
                _ => None,
            })
            .collect();
        for id in bad {
            if let Err(e) = self.store().repair_lease(&id) {
                tracing::warn!(lease_id = %id, error = %e, "unreadable lease row left alone");
            }
        }
        Ok(())
    }

    /// The reap plan, computed from one snapshot. Changes nothing, signals nothing.
    pub fn plan_reap(&self, opts: &ReapOptions) -> Result<ReapPlan, StoreError> {
        Ok(self.plan_reap_with_scan(opts)?.plan)
    }

    /// [`Controller::plan_reap`], with what `reap` reuses of its making ([`Planned`]).
    fn plan_reap_with_scan(&self, opts: &ReapOptions) -> Result<Planned, StoreError> {
        let (leases, legacy) = {
            let mut store = self.store();
            let leases: Vec<Result<Lease, String>> = store
                .leases(&[])?
                .into_iter()
                .map(|r| r.map_err(|e| e.to_string()))
                .collect();
            (leases, crate::legacy::records(&mut store, true)?)
        };
        let active: Vec<&Lease> = leases
            .iter()
            .filter_map(|l| l.as_ref().ok())
            .filter(|l| l.state.is_active())
            .collect();
        let obs = self.observe_cgroups(&active);
        let (snap, host) = match self.reap_read_down(&leases, &legacy, &active, &obs) {
            Some(snap) => (snap, false),
            None => (self.reap_scan(&leases, &legacy), true),
        };
        let snap = snap.map(|s| self.with_cgroups(s, obs));
        // Legacy records are verified against what the host shows of leash's own leases: their
        // processes carry the same markers, and are never a record's.
        let snap = if legacy.is_empty() {
            snap
        } else {
            snap.map(|mut s| {
                s.set_leash_seen(self.leash_seen(&leases));
                s
            })
        };
        let plan = self.plan_reap_from(&leases, &legacy, snap.as_ref(), opts);
        Ok(Planned {
            plan,
            scan: host.then_some(snap),
            rows: leases,
        })
    }

    /// Whether this lease's processes are all in its cgroup: containment is on, and the row
    /// names a cgroup where this gateway puts them, with its id. Its escapees can then be only
    /// there (a process cannot leave its cgroup), never somewhere in the host.
    fn is_contained(&self, l: &Lease, root: Option<&std::path::Path>) -> bool {
        root.is_some_and(|root| {
            l.cgroup_id.is_some()
                && l.cgroup_path
                    .as_deref()
                    .is_some_and(|p| std::path::Path::new(p) == root.join(&l.lease_id))
        })
    }

    /// Reap's snapshot read from its leases down, without the host, when that is
    /// enough: every lease of this gateway contained (a closed or lost one's escapees can only
    /// be in its cgroup, which is read if it still exists), no legacy record, and no active
    /// lease that needs the whole table by [`Controller::read_down`]'s rule (a wrapper gone
    /// with no verified cgroup, or its process group left behind). It holds the active leases'
    /// roots and their cgroups' members (added by [`Controller::with_cgroups`]), every active
    /// row's recorded root, adapter, owner and claimant, and of the terminal rows only those
    /// that can still hold a process of ours ([`Controller::terminal_may_hold`]): what is in
    /// such a lease's cgroup, its root and its adapter. The retained history (closed, lost and
    /// ended leases are kept for days) costs no `/proc` read. `None`: the host-wide pass is
    /// needed.
    fn reap_read_down(
        &self,
        leases: &[Result<Lease, String>],
        legacy: &[LegacyRecord],
        active: &[&Lease],
        obs: &[leash_core::model::Observation],
    ) -> Option<Result<Snapshot, TableError>> {
        let root = self.cgroup_root();
        let root = root.as_deref();
        let rows: Vec<&Lease> = leases.iter().filter_map(|l| l.as_ref().ok()).collect();
        let ours = |l: &Lease| l.gateway_instance_id == self.gateway;
        if !legacy.is_empty()
            || rows
                .iter()
                .any(|l| ours(l) && !l.state.is_active() && !self.is_contained(l, root))
        {
            return None;
        }
        // The lease cgroups that still exist: one listing of this gateway's directory, not a
        // look per retained row.
        let dirs: std::collections::HashSet<String> = root
            .map(|r| cgroup::children(r).into_iter().map(|(n, _)| n).collect())
            .unwrap_or_default();
        let read = || -> Result<Option<Snapshot>, TableError> {
            let roots = active
                .iter()
                .map(|l| self.table.process(l.root_pid))
                .collect::<Result<Vec<_>, _>>()?;
            let Some(mut list) = self.read_down(active, roots, obs)? else {
                return Ok(None);
            };
            let mut seen: std::collections::HashSet<i32> = list.iter().map(|p| p.pid).collect();
            let mut named: Vec<i32> = Vec::new();
            for l in &rows {
                if l.state.is_active() {
                    named.push(l.root_pid);
                    named.extend(l.adapter_pid);
                    named.push(l.owner_pid);
                    named.extend(l.claimed_by.map(|c| c.pid));
                } else if ours(l) {
                    let cgroup_left = dirs.contains(&l.lease_id);
                    if !Self::terminal_may_hold(l, cgroup_left) {
                        continue;
                    }
                    named.push(l.root_pid);
                    named.extend(l.adapter_pid);
                    if cgroup_left {
                        let path = std::path::PathBuf::from(l.cgroup_path.as_deref().unwrap_or(""));
                        named.extend(self.table.cgroup(&path).procs);
                    }
                }
            }
            for pid in named {
                if pid > 0 && seen.insert(pid) {
                    list.extend(self.table.process(pid)?);
                }
            }
            Ok(Some(Snapshot::new(list)))
        };
        read().transpose()
    }

    /// Whether a contained lease of this gateway that has ended (closed, lost, ended) can still
    /// hold a process of ours, so that reap reads its root, adapter and cgroup members and looks
    /// for its escapees there:
    /// - its cgroup still exists (`cgroup_left`): whatever it holds may carry the markers, and
    ///   its wrapper, which stays outside it, may still run, since nothing removes a lease's
    ///   cgroup while the lease's wrapper runs (the wrapper removes it last, as it exits; close
    ///   removes it only after the root was seen gone or killed; the stray sweep leaves it while
    ///   the root runs);
    /// - or its root outlived the close's SIGKILL ([`terminate::SURVIVED_SIGKILL`] in its
    ///   reason: a process in uninterruptible sleep).
    ///
    /// Every other way to a terminal state saw the root gone first: `ended` only once the wrapper
    /// is no longer alive, `lost` only when nothing of the lease was alive (or the wrapper could
    /// not be exec'd), `closed` only after every pinned process, the root included, was seen to
    /// exit. So such a row, without its cgroup, can hold nothing: the days of retained history
    /// cost reap no read at all. (A process that moved itself out of its lease's cgroup
    /// and out of its wrapper's tree is not looked for: docs/security.md.)
    fn terminal_may_hold(l: &Lease, cgroup_left: bool) -> bool {
        cgroup_left
            || (l.state == LeaseState::Closed
                && l.state_reason
                    .as_deref()
                    .is_some_and(|r| r.contains(terminate::SURVIVED_SIGKILL)))
    }

    /// Reap's one pass over the host, shared by every lease, when its leases alone
    /// do not name every process it may need ([`Controller::reap_read_down`]): `stat` and uid of
    /// every process, and the costly fields (exe, cmdline, environ) only where they can matter —
    /// the processes of the caller's uid (the only ones leash may signal, so the only possible
    /// members and marker carriers), the recorded roots and adapters of the active leases and
    /// of the terminal ones that can still hold a process of ours
    /// ([`Controller::terminal_may_hold`]), and the legacy pids. The retained history's recorded
    /// pids (reused by now, by anyone) cost no read: what is left of such a lease carries its
    /// markers and runs as the caller, and so is read all the same.
    fn reap_scan(
        &self,
        leases: &[Result<Lease, String>],
        legacy: &[LegacyRecord],
    ) -> Result<Snapshot, TableError> {
        let root = self.cgroup_root();
        let dirs: std::collections::HashSet<String> = root
            .as_deref()
            .map(|r| cgroup::children(r).into_iter().map(|(n, _)| n).collect())
            .unwrap_or_default();
        let mut named = std::collections::HashSet::new();
        for l in leases.iter().filter_map(|l| l.as_ref().ok()) {
            let may_hold = l.state.is_active()
                || (l.gateway_instance_id == self.gateway
                    && Self::terminal_may_hold(l, dirs.contains(&l.lease_id)));
            if may_hold {
                named.insert(l.root_pid);
                named.extend(l.adapter_pid);
            }
        }
        named.extend(legacy.iter().map(|r| r.pid));
        let uid = self.caller.uid;
        self.table
            .scan(&|p: &leash_core::model::ProcessInfo| p.uid == uid || named.contains(&p.pid))
    }

    fn plan_reap_from(
        &self,
        leases: &[Result<Lease, String>],
        legacy: &[LegacyRecord],
        snap: Result<&Snapshot, &TableError>,
        opts: &ReapOptions,
    ) -> ReapPlan {
        let gateway = self.gateway.clone();
        let wrapper_root = self.wrapper_root();
        let cgroup_root = self.cgroup_root();
        let expect = Expect {
            gateway_instance_id: &gateway,
            wrapper_root: &wrapper_root,
            cgroup_root: cgroup_root.as_deref(),
        };
        let mut plan = plan::plan_reap(leases, legacy, &expect, snap, &self.caller, opts);
        if let Some(root) = &cgroup_root {
            plan.stray_cgroups = self.strays(root, leases, opts.now_ms);
        }
        plan
    }

    /// The strays under this gateway's cgroup root, each settled by a look at what is in it
    /// now ([`plan::settle_strays`]): the dry run and the sweep say the same.
    fn strays(
        &self,
        root: &std::path::Path,
        leases: &[Result<Lease, String>],
        now_ms: i64,
    ) -> Vec<plan::StrayCgroup> {
        let command = |pid: i32| {
            let p = self.table.process(pid).ok().flatten()?;
            Some(match p.argv {
                Some(a) if !a.is_empty() => a.join(" "),
                _ => p.exe.unwrap_or_else(|| "?".into()),
            })
        };
        let strays = plan::plan_strays(
            root,
            &cgroup::children(root),
            leases,
            now_ms,
            stray_min_age_ms(),
        );
        let observe = |path: &str| self.table.cgroup(std::path::Path::new(path));
        let wrapper_may_run = |l: &Lease| {
            matches!(
                self.table.liveness(l.root(), l.root_pidfs_ino),
                Ok(proc::Liveness::Alive) | Err(_)
            )
        };
        plan::settle_strays(strays, leases, observe, command, wrapper_may_run)
    }

    /// Sweeps the stray cgroups under this gateway's cgroup root: those of closed, lost or
    /// expired leases, or of none (a crash between mkdir and commit). Each is verified (a
    /// directory directly under this gateway's root, named for a lease id, with the id seen when
    /// it was listed), killed, and removed. Nothing happens when containment is not on.
    pub fn sweep_stray_cgroups(&self, now_ms: i64) -> Result<Vec<SweptCgroup>, StoreError> {
        let Some(root) = self.cgroup_root() else {
            return Ok(Vec::new());
        };
        // Only the rows the directories there are named for (the sweep looks at nothing else):
        // one lookup per cgroup left, not a read of the retained history.
        let mut leases: Vec<Result<Lease, String>> = Vec::new();
        for (name, _) in cgroup::children(&root) {
            match self.store().lease(&name) {
                Ok(Some(l)) => leases.push(Ok(l)),
                Ok(None) => {}
                Err(e @ StoreError::BadRow { .. }) => leases.push(Err(e.to_string())),
                Err(e) => return Err(e),
            }
        }
        let swept = self.sweep_stray_cgroups_among(&leases, now_ms);
        self.release_stale_hold(&root);
        Ok(swept)
    }

    /// A daemon holds its gateway's directory while it serves (`daemon-hold`, see
    /// `cgroup::hold_gateway_dir`) and removes the hold when it stops; one that was killed leaves
    /// it. With no daemon serving the state root, the hold is removed here, and the directory too
    /// when nothing else is in it, as a stopping daemon would have. (A daemon starting meanwhile
    /// makes its hold again at its next session's start at the latest: `create_lease_cgroup`
    /// makes a vanished gateway directory again.)
    fn release_stale_hold(&self, gateway_root: &std::path::Path) {
        let hold = gateway_root.join(leash_core::model::GATEWAY_HOLD);
        if hold.is_symlink() || !hold.is_dir() || self.root.daemon_serves() {
            return;
        }
        tracing::info!(hold = %hold.display(), "no daemon serves the state root: removing the hold a killed daemon left on its gateway's cgroup directory");
        cgroup::release_gateway_dir(gateway_root);
        cgroup::remove_gateway_dir_if_empty(gateway_root);
    }

    /// [`Controller::sweep_stray_cgroups`] against lease rows the caller has just read.
    pub fn sweep_stray_cgroups_among(
        &self,
        leases: &[Result<Lease, String>],
        now_ms: i64,
    ) -> Vec<SweptCgroup> {
        let Some(root) = self.cgroup_root() else {
            return Vec::new();
        };
        let swept: Vec<SweptCgroup> = self
            .strays(&root, leases, now_ms)
            .into_iter()
            .map(sweep_one)
            .collect();
        let mut reported = self
            .strays_reported
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        // Only this sweep's strays are remembered: one that went and comes back is new.
        let before = std::mem::take(&mut *reported);
        for c in &swept {
            let key = (c.path.clone(), c.id, c.result.clone());
            report_stray(c, !before.contains(&key));
            reported.insert(key);
        }
        swept
    }

    /// Startup reap: orphaned leases (owner gone) are verified and terminated or marked lost,
    /// legacy records handled fail-safe, old closed/lost leases expired.
    pub fn reap(&self, opts: &ReapOptions) -> Result<ReapReport, LifecycleError> {
        self.ingest_reports_marking_ended_lost()?;
        self.repair_active_rows()?;
        let Planned { plan, scan, rows } = self.plan_reap_with_scan(opts)?;
        let mut report = ReapReport {
            leases: Vec::new(),
            legacy: Vec::new(),
            skipped: Vec::new(),
            expired: 0,
            bad_rows: plan.bad_rows.clone(),
            cgroups: Vec::new(),
            escapees: Vec::new(),
        };
        let mut candidates = Vec::new();
        for lp in &plan.leases {
            match &lp.decision {
                Decision::Skip { reason } => {
                    report.skipped.push((lp.lease_id.clone(), reason.clone()))
                }
                _ => candidates.push(lp.lease_id.as_str()),
            }
        }
        let ((claimed, lost_race), _held) = self.claim_all(&candidates)?;
        report.skipped.extend(lost_race);
        // The plan's snapshot predates the claims: terminate_leases reads the evidence again
        // from each lease down (live roots, cgroups), so what is signalled is judged by what is
        // alive once the leases are ours; only where that needs the whole host does it reuse the
        // plan's one pass instead of a second one (every signal re-checks its process anyway).
        let scan = scan.and_then(Result::ok);
        report.leases = self.terminate_leases_with(claimed, opts.grace_ms, scan.as_ref())?;
        report.escapees = self.reap_escapees(&plan)?;
        report.legacy = self.reap_legacy(&plan, opts.grace_ms)?;
        // The rows go with the expiry: their reports are found from the rows the plan read.
        let expiring: std::collections::HashSet<&str> =
            plan.expire.iter().map(String::as_str).collect();
        let mut files = report::ReportFiles::default();
        let reports: Vec<report::ReportPaths> = rows
            .iter()
            .flatten()
            .filter(|l| expiring.contains(l.lease_id.as_str()))
            .map(|l| files.of(&self.root, l))
            .collect();
        report.expired = self.store().expire(opts.now_ms - opts.retention_ms)?;
        for paths in &reports {
            paths.remove();
        }
        // After the leases: a cgroup whose lease was just closed is already gone, and one whose
        // lease just expired is swept now.
        report.cgroups = self.sweep_stray_cgroups(opts.now_ms)?;
        Ok(report)
    }

    /// Terminates the verified escapees of closed and lost leases the reap plan found (their
    /// markers in the one pass), without reopening the leases; each gets an `escapees` event.
    fn reap_escapees(&self, plan: &ReapPlan) -> Result<Vec<CloseOutcome>, StoreError> {
        let mut jobs = Vec::new();
        for lp in &plan.escapees {
            let Some(lease) = self.store().lease(&lp.lease_id)? else {
                continue;
            };
            jobs.push(Job::new(
                JobKind::Lease(lease),
                lp.session_key.clone(),
                lp.grace_ms,
                lp.signals.clone(),
                lp.refused.clone(),
                self.clock.now(),
            ));
        }
        if jobs.is_empty() {
            return Ok(Vec::new());
        }
        self.engine().run_jobs(&mut jobs);
        let mut out = Vec::new();
        for j in jobs {
            let JobKind::Lease(lease) = j.kind else {
                continue;
            };
            let reason = format!(
                "terminated {} escaped process(es) carrying the {} lease's markers",
                j.pins.len(),
                lease.state
            );
            let detail = serde_json::json!({"reason": reason, "pids": j.pins.iter().map(|(p, _)| p.id.pid).collect::<Vec<_>>()});
            self.store().record_event(
                &lease.session_key,
                Some(&lease.lease_id),
                "escapees",
                Some(detail),
            )?;
            tracing::info!(lease_id = %lease.lease_id, processes = j.pins.len(), "escapees reaped");
            out.push(CloseOutcome {
                exit_status: lease.exit_status,
                lease_id: lease.lease_id,
                session_key: lease.session_key,
                result: CloseResult::Closed,
                reason,
                signals: j.signals,
                refused: j.refused,
            });
        }
        Ok(out)
    }
}
