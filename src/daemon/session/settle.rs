//! Closing and settling: the phase transitions of a close (requested, idle, taken over from a
//! dead closer, a lease changed underneath), the waiter that collects the wrapper's exit, and the
//! settlement of the lease when it is gone.

use super::base::*;
use super::supervised::*;

impl Supervised {
    /// Marks the session as closing; false when it is not running (or already closing).
    pub fn begin_close(&self) -> bool {
        let mut g = self.lock();
        let begun = g.life.begin_close();
        g.close_begun |= begun;
        begun
    }

    /// A close of this daemon began on the session (whatever became of it).
    pub fn close_begun(&self) -> bool {
        self.lock().close_begun
    }

    /// Marks the session closing if it is running, not busy, and quiet for at least `idle`;
    /// returns how long it was quiet. Decided under the order lock, so a prompt being sent
    /// right now is either seen (busy: kept) or comes after the mark (refused: not running).
    pub fn begin_idle_close(&self, idle: Duration) -> Option<Duration> {
        // A send in progress is traffic: not idle.
        let _order = self.ops.try_lock().ok()?;
        let mut g = self.lock();
        let quiet = g.last_traffic.elapsed();
        if g.is_busy() || quiet < idle || self.lease.get().is_none() {
            return None;
        }
        let begun = g.life.begin_idle_close();
        g.close_begun |= begun;
        begun.then_some(quiet)
    }

    /// Marks the session closing for a lease that changed underneath the daemon (see
    /// `notice_changed_leases` in the daemon); false when it ended or a close is in flight.
    pub fn begin_takeover(&self) -> bool {
        if self.lease.get().is_none() {
            return false;
        }
        let mut g = self.lock();
        let begun = g.life.begin_takeover();
        g.close_begun |= begun;
        begun
    }

    /// Whether the daemon should look at this session's lease row for changes made by others.
    pub fn watch_lease(&self) -> bool {
        self.lease.get().is_some() && self.lock().life.watchable()
    }

    /// Ends a close begun with [`Supervised::begin_close`]. When nothing was terminated (ownership
    /// unverified, a conflict, an error) the session is running again — unless its lease is no
    /// longer open (someone else is closing it): then it stays closing and takes no input.
    pub fn end_close(&self, outcome: Option<&CloseOutcome>) {
        let terminated = matches!(
            outcome.map(|o| o.result),
            Some(CloseResult::Closed | CloseResult::Lost)
        );
        let lease_open = terminated
            || self.lease_id().is_none_or(
                |id| !matches!(self.store().lease(id), Ok(Some(l)) if l.state != LeaseState::Open),
            );
        {
            self.lock().life.end_close(!terminated && lease_open);
        }
        if terminated {
            self.close_stdin();
        }
        self.sync_events();
        self.changed.notify_all();
    }

    /// Waits (at most `limit`) while the session is being closed, e.g. for the close that an
    /// ensure queued behind; returns its phase after.
    pub fn wait_while_closing(&self, limit: Duration) -> Phase {
        let deadline = Instant::now() + limit;
        let mut g = self.lock();
        while g.life.phase() == Phase::Closing {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            g = g.wait_timeout(deadline - now);
        }
        g.life.phase()
    }

    /// Waits for the wrapper to exit, then settles the lease and ends the stream.
    pub(super) fn supervise(
        self: Arc<Self>,
        wrapper: Wrapper,
        stdout_done: mpsc::Receiver<()>,
        ctl: &Controller<'_>,
    ) {
        let status = self.wait_wrapper(wrapper);
        let exited = status.as_ref().ok().and_then(|s| s.code());
        let code = match &status {
            Ok(s) => s.code().or_else(|| s.signal().map(|n| 128 + n)),
            Err(e) => {
                tracing::error!(session = %self.key, error = %e, "cannot wait for the wrapper");
                None
            }
        };
        // Output written before the exit comes before the exit event. But members of the tree
        // that outlived the wrapper (a SIGKILLed wrapper forwards nothing) keep the pipe open:
        // the daemon, the wrapper's parent, knows at once, so it settles the lease first — its
        // tree is terminated within the session's grace — and only then waits for the rest.
        let drained = stdout_done.recv_timeout(QUICK_DRAIN).is_ok();
        {
            // A close in flight settles the lease itself; let it finish first so its events
            // precede the exit.
            let mut g = self.lock();
            let deadline = Instant::now() + Duration::from_secs(120);
            while g.life.close_in_flight() && Instant::now() < deadline {
                g = g.wait_timeout(Duration::from_millis(200));
            }
        }
        // An adapter that died at once may be gone before `ensure` read its lease: find it here,
        // so that its lease is settled all the same.
        if let Some(info) = self.find_lease().cloned() {
            self.settle_lease(&info, ctl, exited);
        }
        if !drained {
            let _ = stdout_done.recv_timeout(DRAIN_TIMEOUT);
        }
        // Every stdout line is read by now: an adapter that started and wrote none before it
        // exited, with no close of ours ending it, failed to start, whenever that was.
        let start_failure = self.start_failure(code);
        if let Some(f) = &start_failure {
            tracing::warn!(session = %self.key, status = code, "{f}");
            let detail = json!({ "status": f.status, "stderr": f.stderr });
            if let Err(e) = self.record_event("start_failed", Some(detail)) {
                tracing::error!(session = %self.key, error = %e, "cannot record the start failure");
            }
        }
        tracing::info!(session = %self.key, lease_id = self.find_lease().map(|i| i.lease_id.as_str()), status = code, "session ended");

        let detail = json!({ "status": code, "wrapperPid": self.child_pid });
        if let Err(e) = self.record_event("exit", Some(detail)) {
            tracing::error!(session = %self.key, error = %e, "cannot record the exit");
        }
        self.close_stdin();
        let mut g = self.lock();
        g.life.end(code);
        g.start_failure = start_failure;
        g.pending.clear();
        // Attaches hold the reader back no longer: whatever the adapter still wrote goes to the
        // buffer, and a reader waiting on a client that stopped reading sees the end.
        g.replay.release(true);
        drop(g);
        self.settling.store(false, AtomicOrdering::SeqCst);
        self.freeze.end_settle();
        self.changed.notify_all();
        self.drained.notify_all();
    }

    /// Waits for the wrapper to exit and reaps it — unless a freeze for a handoff is on: then
    /// the zombie is left for the next program (the exit is seen without reaping first), and
    /// reaped here only once the freeze is lifted.
    fn wait_wrapper(&self, wrapper: Wrapper) -> io::Result<std::process::ExitStatus> {
        if let Err(e) = crate::sys::wait_exited_unreaped(self.child_pid) {
            tracing::warn!(session = %self.key, error = %e, "cannot wait for the wrapper's exit without reaping it");
        }
        self.freeze.begin_settle();
        self.settling.store(true, AtomicOrdering::SeqCst);
        match wrapper {
            Wrapper::Spawned(mut child) => child.wait(),
            Wrapper::Adopted => crate::sys::reap(self.child_pid),
        }
    }

    /// The start failure of a session whose wrapper exited with `code`: the adapter was started
    /// (its lease row has its pid, from the wrapper's report), it wrote no line of output, and
    /// no close of this daemon began. `None` otherwise.
    fn start_failure(&self, code: Option<i32>) -> Option<StartFailure> {
        {
            let g = self.lock();
            if g.close_begun || g.output_lines > 0 {
                return None;
            }
        }
        let info = self.find_lease()?;
        let row = self.store().lease(&info.lease_id).ok().flatten()?;
        row.adapter_pid?;
        Some(StartFailure {
            status: code,
            stderr: self.stderr_tail_settled(),
        })
    }

    /// The wrapper is gone (we reaped it). Its report turns an open lease `ended` with the exit
    /// status; a lease still open after that lost its wrapper without a report (SIGKILL), so
    /// whatever may remain of its tree is verified and terminated like any close.
    ///
    /// `exited`: the wrapper's exit code when it exited by itself (not killed by a signal), as
    /// the daemon's wait for it says. A wrapper exits by itself only once its tree is gone, as
    /// its report's end record says; where no end record could be written (its reports
    /// directory and `run/` full), the wait's code is the lease's exit status.
    pub(super) fn settle_lease(&self, info: &LeaseInfo, ctl: &Controller<'_>, exited: Option<i32>) {
        let slot = SETTLES.enter();
        // Whether the report went to `run/` is seen before it is folded in and removed (an
        // adapter that died at once is settled before its `ensure` reads the report).
        let ours = |r: &WrapperReport| r.wrapper_pid == self.child_pid;
        let report = info.report.read_where(&info.lease_id, ours);
        if let Some((_, true)) = report {
            self.note_report_failure(info, ReportFailure::FellBack);
        }
        if let Err(e) = ctl.ingest_reports_marking_ended_lost() {
            tracing::warn!(session = %self.key, error = %e, "cannot ingest the wrapper's report");
        }
        let mut still_open = matches!(
            ctl.store().lease(&info.lease_id),
            Ok(Some(l)) if l.state == LeaseState::Open
        );
        let reported_end = report.is_some_and(|(r, _)| r.exit_status.is_some());
        if let (true, false, Some(code)) = (still_open, reported_end, exited) {
            still_open = !self.end_by_wait(info, ctl, code);
        }
        if still_open {
            match ctl.close(&[LeaseRef::Id(info.lease_id.clone())], None) {
                Ok(out) => {
                    for o in out {
                        tracing::info!(lease_id = %o.lease_id, result = crate::logvalue::json(&o.result), reason = %o.reason, "lease settled after the wrapper exited");
                    }
                }
                Err(e) => {
                    tracing::warn!(lease_id = %info.lease_id, error = %e, "cannot settle the lease")
                }
            }
        }
        drop(slot);
        self.sync_events();
    }
}

impl Supervised {
    /// Ends the open lease `ended` with the exit status of the daemon's wait for its wrapper,
    /// which exited by itself without a report of its end. Returns whether it did.
    fn end_by_wait(&self, info: &LeaseInfo, ctl: &Controller<'_>, code: i32) -> bool {
        self.note_report_failure(info, ReportFailure::Nowhere);
        let reason = format!(
            "the wrapper exited with status {code}, the adapter's (its report could not be \
             written; the status is the daemon's wait for the wrapper)"
        );
        let mut store = ctl.store();
        let update = crate::store::ReportUpdate {
            exit_status: Some(code),
            ..Default::default()
        };
        let ended = store.apply_report(&info.lease_id, &update).and_then(|_| {
            store.transition(
                &info.lease_id,
                LeaseState::Open,
                LeaseState::Ended,
                None,
                &reason,
            )
        });
        drop(store);
        match ended {
            Ok(true) => {
                info.report.remove();
                tracing::info!(lease_id = %info.lease_id, status = code, "lease ended by the daemon's wait for its wrapper");
                true
            }
            Ok(false) => false,
            Err(e) => {
                tracing::warn!(lease_id = %info.lease_id, error = %e, "cannot record the wrapper's exit");
                false
            }
        }
    }
}

/// How many leases the daemon settles at once (see [`SettleGate`]).
const MAX_CONCURRENT_SETTLES: usize = 4;

/// The daemon's settles of leases whose wrapper exited, at most [`MAX_CONCURRENT_SETTLES`] at a
/// time. Each settle runs through the daemon's one controller (no connection of its own) and may
/// run a whole close (verification, signals, the grace period; a wrapper that died with its tree
/// still around makes it read the whole process table). When many wrappers die at once — or a
/// loaded host makes each settle slow — their waiters would otherwise all hold a close's buffers
/// together, and the daemon's memory would follow that peak and keep it, because freed heap stays
/// with the allocator (so the last settle out trims it). The others wait their turn.
struct SettleGate {
    running: Mutex<usize>,
    freed: Condvar,
}

static SETTLES: SettleGate = SettleGate {
    running: Mutex::new(0),
    freed: Condvar::new(),
};

/// A place among the running settles, given back on drop.
pub(crate) struct SettleSlot(&'static SettleGate);

/// Waits for a place among the daemon's settles (see [`SettleGate`]): for the daemon's own
/// closes of sessions it did not start closing on a client's request (a lease taken over after it
/// changed underneath), which would otherwise fan out in the same bursts.
pub(crate) fn settle_slot() -> SettleSlot {
    SETTLES.enter()
}

impl SettleGate {
    fn enter(&'static self) -> SettleSlot {
        let mut n = self.running.lock().unwrap_or_else(|p| p.into_inner());
        while *n >= MAX_CONCURRENT_SETTLES {
            n = self.freed.wait(n).unwrap_or_else(|p| p.into_inner());
        }
        *n += 1;
        SettleSlot(self)
    }
}

impl Drop for SettleSlot {
    fn drop(&mut self) {
        let left = {
            let mut n = self.0.running.lock().unwrap_or_else(|p| p.into_inner());
            *n -= 1;
            *n
        };
        self.0.freed.notify_one();
        // The last settle of a burst hands the freed heap back, so the daemon's footprint
        // follows its sessions and not the largest burst it ever saw.
        if left == 0 {
            crate::sys::release_free_heap();
        }
    }
}
