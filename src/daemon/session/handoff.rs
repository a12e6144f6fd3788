//! A session across a handoff (`daemon/upgrade.rs`): what the daemon's memory holds of it,
//! written out by the program that hands over ([`Supervised::handed`], once frozen) and taken
//! up by the next one ([`adopt`]), which starts its readers on the same pipes and its waiter on
//! the same wrapper (a child of the same pid: `execve` keeps the pid). Nothing is signalled or
//! reaped on the way; the lease row stays as it is.

use super::*;
use serde::{Deserialize, Serialize};

/// Where a handed session is in its life. A session starting or being closed by this daemon
/// is never handed over: the handoff waits for those ops to end first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum HandedLife {
    Running,
    /// Closing by someone else (a close that terminated nothing found the lease not open).
    ClosingElsewhere,
    Ended {
        exit_status: Option<i32>,
        ms_ago: u64,
    },
}

/// The descriptors of a handed session, kept open across the exec.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HandedFds {
    pub stdin: Option<RawFd>,
    pub stdout: Option<RawFd>,
    pub stderr: Option<RawFd>,
}

impl HandedFds {
    pub fn all(&self) -> impl Iterator<Item = RawFd> {
        [self.stdin, self.stdout, self.stderr].into_iter().flatten()
    }
}

/// One session in a handoff.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HandedSession {
    pub key: String,
    pub argv: Vec<String>,
    pub child_pid: i32,
    pub created_at: i64,
    pub fds: HandedFds,
    /// The rest of a line to the adapter still owed on its stdin.
    pub stdin_owed: Vec<u8>,
    /// The line each reader held cut (stdout, stderr).
    pub partial: [Partial; 2],
    pub replay: HandedReplay,
    pub last_synced: i64,
    pub life: HandedLife,
    pub pending: BTreeMap<String, PendingPrompt>,
    pub opening: Vec<(String, Option<String>, Option<Value>)>,
    pub acp_sessions: BTreeSet<String>,
    pub acp_setup: BTreeMap<String, Value>,
    pub quiet_ms: u64,
    pub output_lines: u64,
    pub output_dropped: u64,
    pub stderr_tail: Vec<String>,
    pub close_begun: bool,
    pub start_failure: Option<(Option<i32>, Vec<String>)>,
    pub report_failed: bool,
}

impl Supervised {
    /// The session as a handoff carries it, taken while the daemon is frozen (its readers
    /// stopped, its ops drained). `Err` says why it cannot be handed over now.
    pub fn handed(&self) -> Result<HandedSession, String> {
        let (stdin_fd, stdin_owed) = self
            .stdin
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .handed();
        let (fds, partial) = {
            let h = self.handed.lock().unwrap_or_else(|p| p.into_inner());
            (h.fds, h.partial.clone())
        };
        let g = self.lock();
        let life = match &g.life {
            Life::Running => HandedLife::Running,
            Life::Closing { in_flight: false } => HandedLife::ClosingElsewhere,
            Life::Ended { exit_status, at } => HandedLife::Ended {
                exit_status: *exit_status,
                ms_ago: at.elapsed().as_millis() as u64,
            },
            Life::Starting | Life::Closing { in_flight: true } => {
                return Err(format!(
                    "session {} is {:?}: an op on it is still in flight",
                    self.key,
                    g.life.phase()
                ))
            }
        };
        let fd = |f: RawFd| (f >= 0).then_some(f);
        Ok(HandedSession {
            key: self.key.clone(),
            argv: self.argv.clone(),
            child_pid: self.child_pid,
            created_at: self.created_at,
            fds: HandedFds {
                stdin: stdin_fd,
                stdout: fd(fds[Stream::Stdout as usize]),
                stderr: fd(fds[Stream::Stderr as usize]),
            },
            stdin_owed,
            partial,
            replay: g.replay.handed(),
            last_synced: g.seqs.last_synced(),
            life,
            pending: g.pending.clone(),
            opening: g
                .opening
                .iter()
                .map(|(k, (a, s))| (k.clone(), a.clone(), s.clone()))
                .collect(),
            acp_sessions: g.acp_sessions.clone(),
            acp_setup: g.acp_setup.clone(),
            quiet_ms: g.last_traffic.elapsed().as_millis() as u64,
            output_lines: g.output_lines,
            output_dropped: g.output_dropped,
            stderr_tail: g.stderr_tail.iter().cloned().collect(),
            close_begun: g.close_begun,
            start_failure: g
                .start_failure
                .as_ref()
                .map(|f| (f.status, f.stderr.clone())),
            report_failed: self.report_failed(),
        })
    }
}

/// A session taken up from a handoff whose threads have not started yet ([`Adopted::start`]):
/// until then nothing reads its pipes, so a takeover that fails before loses no byte.
pub struct Adopted {
    pub session: Arc<Supervised>,
    pipes: [Option<std::fs::File>; 2],
    partial: [Partial; 2],
    ended: bool,
}

impl Adopted {
    /// Starts the session's readers and, while its wrapper runs, its waiter.
    pub fn start(self, ctl: &Arc<Controller<'static>>) -> Arc<Supervised> {
        super::spawn::start_threads(
            &self.session,
            self.pipes,
            self.partial,
            (!self.ended).then_some(Wrapper::Adopted),
            ctl,
        );
        tracing::info!(session = %self.session.key, pid = self.session.child_pid, "session taken over");
        self.session
    }
}

impl Supervised {
    /// Lets go of the cursor a handoff held for the clients attached before it (see
    /// [`Replay::release_hold`]).
    pub fn release_handoff_hold(&self) {
        self.lock().replay.release_hold();
        self.drained.notify_all();
    }
}

/// Takes up a session a handoff carried: its pipes (descriptors inherited across the exec) and
/// its state; [`Adopted::start`] starts its threads.
pub fn adopt(spec: &SpawnSpec<'_>, h: HandedSession) -> io::Result<Adopted> {
    let take = |fd: Option<RawFd>| fd.map(crate::sys::adopt_handed_fd).transpose();
    let stdin = take(h.fds.stdin)?;
    let stdout = take(h.fds.stdout)?.map(std::fs::File::from);
    let stderr = take(h.fds.stderr)?.map(std::fs::File::from);
    let last = lock_store(spec.store)
        .last_seq(&h.key)
        .map_err(|e| io::Error::other(e.to_string()))?;
    let mut inner = Inner::new(spec.limits, last);
    inner.replay = Replay::adopt(spec.limits, h.replay).map_err(io::Error::other)?;
    inner.seqs = Seqs::adopt(last.max(inner.replay.last_seq()), h.last_synced);
    inner.life = match h.life {
        HandedLife::Running => Life::Running,
        HandedLife::ClosingElsewhere => Life::Closing { in_flight: false },
        HandedLife::Ended {
            exit_status,
            ms_ago,
        } => {
            let now = Instant::now();
            Life::Ended {
                exit_status,
                at: now
                    .checked_sub(Duration::from_millis(ms_ago))
                    .unwrap_or(now),
            }
        }
    };
    let ended = inner.life.is_ended();
    if ended {
        inner.replay.release(true);
    }
    inner.pending = h.pending;
    inner.opening = h.opening.into_iter().map(|(k, a, s)| (k, (a, s))).collect();
    for id in h.acp_sessions {
        let setup = h.acp_setup.get(&id).cloned();
        inner.note_acp_session(id, setup);
    }
    let now = Instant::now();
    inner.last_traffic = now
        .checked_sub(Duration::from_millis(h.quiet_ms))
        .unwrap_or(now);
    inner.output_lines = h.output_lines;
    inner.output_dropped = h.output_dropped;
    inner.stderr_tail = h.stderr_tail.into_iter().collect();
    inner.close_begun = h.close_begun;
    inner.start_failure = h
        .start_failure
        .map(|(status, stderr)| StartFailure { status, stderr });
    let tracking = !inner.pending.is_empty() || !inner.opening.is_empty();
    let shown = Arc::new(super::shown::Shown::of(&inner));
    let session = Arc::new(Supervised {
        key: h.key,
        argv: h.argv,
        lease: OnceLock::new(),
        root: spec.root.clone(),
        child_pid: h.child_pid,
        created_at: h.created_at,
        item_cap: spec
            .limits
            .bytes
            .min(MAX_ADAPTER_LINE)
            .saturating_sub(ITEM_OVERHEAD)
            .max(MIN_ITEM_LINE),
        store: spec.store.clone(),
        stdin: Mutex::new(StdinPipe::adopt(stdin, h.stdin_owed)),
        ops: Mutex::new(()),
        inner: Mutex::new(inner),
        shown: Mutex::new(shown),
        changed: Condvar::new(),
        drained: Condvar::new(),
        tracking: AtomicBool::new(tracking),
        report_failed: AtomicBool::new(h.report_failed),
        freeze: spec.freeze.clone(),
        handed: Mutex::new(HandedIo::default()),
        settling: AtomicBool::new(false),
    });
    session.find_lease();
    Ok(Adopted {
        session,
        pipes: [stdout, stderr],
        partial: h.partial,
        ended,
    })
}
