//! Starting a session: the `leash exec` child of the daemon with its stdin, stdout and stderr
//! piped and its three threads (stdout reader, stderr reader, waiter), and the wait for the
//! wrapper's report that the lease is committed and the adapter started (or died at once); and
//! taking one up from a handoff (`adopt`), the other way a session starts in a program.

use super::base::*;
use super::freeze::Freeze;
use super::phase::Life;
use super::replay::{HandedReplay, Replay};
use super::seq::Seqs;
use super::stdio::{LineFramer, Stream, ITEM_OVERHEAD, MIN_ITEM_LINE};
use super::supervised::*;
use leash_core::kind::{HasKind, Kind};

#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    #[error("cannot open the state database: {0}")]
    Store(#[from] StoreError),
    #[error("cannot start leash exec ({exe}): {source}")]
    Exec {
        exe: String,
        #[source]
        source: io::Error,
    },
    #[error("session {session_key} already has a live lease {lease_id} that this daemon does not supervise; close it first")]
    Conflict {
        session_key: String,
        lease_id: String,
    },
    #[error("the adapter did not start (exit status {}){}", status.map_or("unknown".into(), |c| c.to_string()), if stderr.is_empty() { String::new() } else { format!(": {}", stderr.join(" | ")) })]
    Failed {
        status: Option<i32>,
        stderr: Vec<String>,
    },
    #[error("the adapter did not start within {0:?}; the session is being closed")]
    Timeout(Duration),
    /// The adapter started and exited before its first line of output (within the ensure's
    /// `waitMs`; after it, the same failure ends the stream: [`StartFailure`]).
    #[error("{}", StartFailure { status: *status, stderr: stderr.clone() })]
    StartFailed {
        status: Option<i32>,
        stderr: Vec<String>,
    },
}

impl HasKind for SpawnError {
    fn kind(&self) -> Kind {
        match self {
            // What the daemon stores was checked at its edge: a store failure here is its own.
            SpawnError::Store(_) => Kind::Internal,
            SpawnError::Conflict { .. } => Kind::Conflict,
            _ => Kind::SpawnFailed,
        }
    }
}

/// Whether the wrapper of a committed lease that exited before the daemon saw its child, and
/// left no report, ran the adapter: when neither place a report goes can take one (each one's
/// filesystem out of space or inodes, or the directory gone), the daemon's own wait for the
/// wrapper tells it by `status`. The wrapper exits 125 (its own failure), 126 or 127 (the command
/// could not be started) when no adapter ran; any other status is the adapter's (its code, or
/// 128+N), and the waiter settles the lease with it. (An adapter that itself exits 125-127 is,
/// without a report, taken for a failed start.)
fn ran_without_report(report: &crate::report::ReportPaths, status: Option<i32>) -> bool {
    let full = |file: &Path| match file.parent().map(nix::sys::statvfs::statvfs) {
        Some(Ok(fs)) => fs.blocks_available() == 0 || fs.files_available() == 0,
        // No directory to write into, or it is gone.
        _ => true,
    };
    status.is_some_and(|code| !(125..=127).contains(&code))
        && report.primary.as_deref().is_none_or(full)
        && full(&report.fallback)
}

/// Everything `spawn` needs from the daemon.
pub struct SpawnSpec<'a> {
    pub root: &'a StateRoot,
    /// The connection every session of the daemon writes its seqs and events through.
    pub store: &'a SharedStore,
    /// The daemon's one controller: the waiter settles the lease through it.
    pub ctl: &'a Arc<crate::controller::Controller<'static>>,
    /// The `leash` binary to run `exec` with.
    pub exe: &'a Path,
    pub daemon_pid: i32,
    pub default_grace_ms: u64,
    pub limits: Limits,
    /// The daemon's freeze for a handoff: the session's readers and waiter heed it.
    pub freeze: &'a Arc<Freeze>,
}

impl SpawnSpec<'_> {
    /// The largest output line a session keeps as one item: the replay buffer's byte limit,
    /// within the adapter-line bound, less an item's own overhead.
    fn item_cap(&self) -> usize {
        self.limits
            .bytes
            .min(MAX_ADAPTER_LINE)
            .saturating_sub(ITEM_OVERHEAD)
            .max(MIN_ITEM_LINE)
    }
}

/// What tells one session from another, fresh (`spawn`) or taken over (`adopt`).
struct Parts {
    key: String,
    argv: Vec<String>,
    child_pid: i32,
    created_at: i64,
    stdin: StdinPipe,
    inner: Inner,
    report_failed: bool,
}

impl Supervised {
    /// A session of this daemon from its parts; it tracks ACP prompts from the start when the
    /// state it takes over has some pending or opening.
    fn assemble(spec: &SpawnSpec<'_>, p: Parts) -> Arc<Supervised> {
        let tracking = !p.inner.pending.is_empty() || !p.inner.opening.is_empty();
        let shown = Arc::new(Shown::of(&p.inner));
        Arc::new(Supervised {
            key: p.key,
            argv: p.argv,
            lease: OnceLock::new(),
            root: spec.root.clone(),
            child_pid: p.child_pid,
            created_at: p.created_at,
            item_cap: spec.item_cap(),
            store: spec.store.clone(),
            stdin: Mutex::new(p.stdin),
            ops: Mutex::new(()),
            inner: Mutex::new(p.inner),
            shown: Mutex::new(shown),
            changed: Condvar::new(),
            drained: Condvar::new(),
            tracking: AtomicBool::new(tracking),
            report_failed: AtomicBool::new(p.report_failed),
            freeze: spec.freeze.clone(),
            handed: Mutex::new(HandedIo::default()),
            settling: AtomicBool::new(false),
        })
    }
}

/// Starts `leash exec` for the request and the threads that serve it. The session is returned
/// in [`Phase::Starting`]; [`Supervised::await_started`] confirms the lease and the adapter.
pub fn spawn(spec: &SpawnSpec<'_>, req: &Ensure) -> Result<Arc<Supervised>, SpawnError> {
    // The process and the session's threads start at the daemon's priority, never at a
    // connection thread's raised one (see `daemon::priority`).
    let _lowered = crate::daemon::priority::lowered();
    let last = lock_store(spec.store).last_seq(&req.session)?;
    let grace = req.grace_ms.unwrap_or(spec.default_grace_ms);
    let mut cmd = Command::new(spec.exe);
    // leash's own failures (an adapter not found, a refused lease) come as its JSON error line,
    // the last stderr line, which the ensure's error reply turns into its `cause`.
    cmd.arg("--state-dir")
        .arg(spec.root.dir())
        .arg("--error-format")
        .arg("json")
        .arg("exec")
        .arg("--owner-pid")
        .arg(spec.daemon_pid.to_string())
        .arg("--session")
        .arg(&req.session)
        .arg("--grace-ms")
        .arg(grace.to_string());
    for (flag, v) in [
        ("--agent", &req.agent),
        ("--owner", &req.owner),
        ("--spawned-by", &req.spawned_by),
        ("--parent", &req.parent),
    ] {
        if let Some(v) = v {
            cmd.arg(flag).arg(v);
        }
    }
    if let Some(m) = req.memory_max {
        cmd.arg("--memory-max").arg(m.to_string());
    }
    if let Some(p) = req.pids_max {
        cmd.arg("--pids-max").arg(p.to_string());
    }
    if let Some(c) = &req.cpu_max {
        cmd.arg("--cpu-max").arg(c);
    }
    // The credential scrub (docs/security.md): `leash exec` applies it to the wrapper's exec, so
    // what `leash exec` itself reads (its LEASH_* settings) is unaffected, and the names this
    // ensure sets in `env` pass whatever the policy removes.
    let policy = crate::envpolicy::EnvPolicy::for_ensure(
        &req.unset_env,
        req.clear_env,
        &req.keep_env,
        req.env.keys(),
    );
    cmd.args(policy.to_args());
    cmd.arg("--").args(&req.argv);
    if let Some(cwd) = &req.cwd {
        cmd.current_dir(cwd);
    }
    cmd.env_remove(crate::state::ENV_STATE_DIR).envs(&req.env);
    // The daemon's containment, whatever the client's environment says: a client may not turn
    // containment off for its session, nor point it at another cgroup root.
    for key in [
        crate::cgroup::ENV_CONTAINMENT,
        crate::cgroup::ENV_CGROUP_ROOT,
    ] {
        match std::env::var_os(key) {
            Some(v) => cmd.env(key, v),
            None => cmd.env_remove(key),
        };
    }
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // Its own group: a Ctrl-C meant for a foreground daemon must reach the daemon alone, which
        // then closes its sessions in order.
        .process_group(0);
    let mut child = cmd.spawn().map_err(|source| SpawnError::Exec {
        exe: spec.exe.display().to_string(),
        source,
    })?;
    let child_pid = child.id() as i32;
    let stdout = std::fs::File::from(OwnedFd::from(child.stdout.take().expect("piped")));
    let stderr = std::fs::File::from(OwnedFd::from(child.stderr.take().expect("piped")));
    let session = Supervised::assemble(
        spec,
        Parts {
            key: req.session.clone(),
            argv: req.argv.clone(),
            child_pid,
            created_at: now_ms(),
            stdin: StdinPipe::new(child.stdin.take()),
            inner: Inner::new(spec.limits, last),
            report_failed: false,
        },
    );
    tracing::info!(session = %req.session, pid = child_pid, argv = crate::logvalue::json(&req.argv), "session spawned");
    start_threads(
        &session,
        [Some(stdout), Some(stderr)],
        [Partial::default(), Partial::default()],
        Some(Wrapper::Spawned(child)),
        spec.ctl,
    );
    Ok(session)
}

/// Starts the reader thread of one of a session's pipes: at a low priority, its fd known to the
/// session (so a handoff can keep it) while `read` runs, and counted by the daemon's freeze;
/// `done` hears once the reader has ended.
fn spawn_reader(
    session: &Arc<Supervised>,
    name: String,
    stream: Stream,
    pipe: std::fs::File,
    read: impl FnOnce(&Supervised, std::fs::File) + Send + 'static,
    done: Option<mpsc::Sender<()>>,
) {
    let s = session.clone();
    s.freeze.reader_started();
    std::thread::Builder::new()
        .name(name)
        .stack_size(crate::daemon::stack::SMALL_STACK)
        .spawn(move || {
            super::stdio::lower_reader_priority();
            s.reader_fd(stream, pipe.as_raw_fd());
            read(&s, pipe);
            s.reader_fd(stream, -1);
            s.freeze.reader_ended();
            if let Some(done) = done {
                let _ = done.send(());
            }
        })
        .expect("spawn thread");
}

/// Starts a session's threads: a reader for each of its open pipes (stdout, stderr; each
/// reader's framer holding `partial`), and, while its wrapper runs, the waiter.
pub(super) fn start_threads(
    session: &Arc<Supervised>,
    pipes: [Option<std::fs::File>; 2],
    partial: [Partial; 2],
    wrapper: Option<Wrapper>,
    ctl: &Arc<crate::controller::Controller<'static>>,
) {
    let [stdout, stderr] = pipes;
    let [out_partial, err_partial] = partial;
    let key = &session.key;

    let (done_tx, done_rx) = mpsc::channel::<()>();
    match stdout {
        Some(stdout) => {
            let framer = LineFramer::restore(MAX_ADAPTER_LINE, out_partial);
            let read = move |s: &Supervised, f| s.read_stdout(f, framer);
            spawn_reader(
                session,
                format!("out:{key}"),
                Stream::Stdout,
                stdout,
                read,
                Some(done_tx),
            );
        }
        None => {
            let _ = done_tx.send(());
        }
    }
    if let Some(stderr) = stderr {
        let framer = LineFramer::restore(MAX_STDERR_LINE, err_partial);
        let read = move |s: &Supervised, f| s.read_stderr(f, framer);
        spawn_reader(
            session,
            format!("err:{key}"),
            Stream::Stderr,
            stderr,
            read,
            None,
        );
    }
    if let Some(wrapper) = wrapper {
        let s = session.clone();
        let ctl = ctl.clone();
        std::thread::Builder::new()
            .name(format!("wait:{key}"))
            .stack_size(WAIT_STACK)
            .spawn(move || s.supervise(wrapper, done_rx, &ctl))
            .expect("spawn thread");
    }
}

impl Supervised {
    /// The pipe a reader reads (`-1`: it ended), for a handoff.
    fn reader_fd(&self, stream: Stream, fd: RawFd) {
        self.handed.lock().unwrap_or_else(|p| p.into_inner()).fds[stream as usize] = fd;
    }

    /// Waits for the lease (committed by `leash exec` before the wrapper runs) and for the
    /// wrapper's report that the adapter started. On failure the reason includes the last lines
    /// the child wrote to stderr.
    pub fn await_started(&self) -> Result<(), SpawnError> {
        let begun = Instant::now();
        let deadline = begun + START_TIMEOUT;
        // The wrapper's report that the command could not be started: its code, and when it was
        // read. The failure is answered once the waiter has settled the lease (the wrapper exits
        // right after that report), so that the lease the answer names is no longer open.
        let mut refused: Option<(i32, Instant)> = None;
        loop {
            self.find_lease();
            if let Some((code, seen)) = refused {
                if seen.elapsed() >= SETTLE_PATIENCE {
                    return Err(self.failure(Some(code)));
                }
            } else if let Some(info) = self.lease.get() {
                let ours = |r: &WrapperReport| r.wrapper_pid == self.child_pid;
                match info.report.read_where(&info.lease_id, ours) {
                    Some((r, fell_back)) => {
                        if fell_back {
                            self.note_report_failure(info, ReportFailure::FellBack);
                        }
                        if r.adapter_pid.is_some() {
                            self.lock().life.started();
                            return Ok(());
                        }
                        if let Some(code) = r.exit_status {
                            refused = Some((code, Instant::now()));
                        }
                    }
                    // No report anywhere, well after the wrapper began: its reports directory
                    // and `run/` are both full. The lease is committed, so the child is the
                    // wrapper (`leash exec` starts no process of its own), and a child of it is
                    // the adapter it started.
                    None if begun.elapsed() >= REPORT_PATIENCE && self.wrapper_has_child() => {
                        self.note_report_failure(info, ReportFailure::Nowhere);
                        self.lock().life.started();
                        return Ok(());
                    }
                    None => {}
                }
            }
            let (phase, status) = {
                let g = self.lock();
                (g.life.phase(), g.life.exit_status())
            };
            if phase == Phase::Ended {
                // The report is removed once folded into the row: an adapter that started and
                // died at once is known started by its row (its end is a start failure, told
                // by the stream, not a failed spawn).
                let started = self.find_lease().is_some_and(|info| {
                    matches!(self.store().lease(&info.lease_id), Ok(Some(l)) if l.adapter_pid.is_some())
                });
                if started {
                    return Ok(());
                }
                if let Some(info) = self.lease.get() {
                    if ran_without_report(&info.report, status) {
                        self.note_report_failure(info, ReportFailure::Nowhere);
                        return Ok(());
                    }
                }
                if self.lease.get().is_none() {
                    // leash exec refused before committing a lease of ours: a live lease of the
                    // session that is not ours is the usual reason.
                    let found = self.store().active_lease_for_session(&self.key);
                    if let Ok(Some(l)) = found {
                        return Err(SpawnError::Conflict {
                            session_key: self.key.clone(),
                            lease_id: l.lease_id,
                        });
                    }
                }
                return Err(self.failure(refused.map(|(code, _)| code).or(status)));
            }
            if Instant::now() >= deadline {
                return Err(SpawnError::Timeout(START_TIMEOUT));
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// The wrapper could not write its report to its reports directory (full, out of inodes,
    /// gone): it wrote it to the state root's `run/`, or nowhere. The session goes on; said once.
    pub(super) fn note_report_failure(&self, info: &LeaseInfo, how: ReportFailure) {
        if self.report_failed.swap(true, AtomicOrdering::Relaxed) {
            return;
        }
        let reports_dir = info
            .report
            .primary
            .as_deref()
            .and_then(std::path::Path::parent)
            .map(|d| d.display().to_string());
        let fallback = info.report.fallback.display();
        match how {
            ReportFailure::FellBack => tracing::warn!(
                session = %self.key,
                lease_id = %info.lease_id,
                reports_dir,
                %fallback,
                "the wrapper could not write its report to the reports directory (full, out of inodes, or gone); it wrote it to the state root's run/ directory"
            ),
            ReportFailure::Nowhere => tracing::warn!(
                session = %self.key,
                lease_id = %info.lease_id,
                reports_dir,
                %fallback,
                "the wrapper could write its report neither to the reports directory nor to the state root's run/ directory (full, out of inodes, or gone); the adapter is known started by the wrapper's child, and its exit status comes from the daemon's wait for the wrapper"
            ),
        }
    }

    /// Whether the wrapper's report could not be written to its reports directory (see
    /// [`Supervised::note_report_failure`]).
    pub fn report_failed(&self) -> bool {
        self.report_failed.load(AtomicOrdering::Relaxed)
    }

    /// Whether the child (the wrapper, once the lease is committed) has a child of its own: read
    /// from `/proc/<pid>/task/<pid>/children`, which holds while the child is unreaped (ours).
    fn wrapper_has_child(&self) -> bool {
        let pid = self.child_pid;
        std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
            .is_ok_and(|c| !c.trim().is_empty())
    }

    /// The session's lease, read from the store (and kept) once `leash exec` committed it.
    pub(super) fn find_lease(&self) -> Option<&LeaseInfo> {
        if self.lease.get().is_none() {
            let found = self.store().latest_lease_for_session(&self.key);
            match found {
                Ok(Some(l)) if l.root_pid == self.child_pid => {
                    let _ = self.lease.set(LeaseInfo {
                        lease_id: l.lease_id.clone(),
                        root: l.root(),
                        report: crate::report::ReportPaths::of(&self.root, &l),
                    });
                    self.sync_events();
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(session = %self.key, error = %e, "cannot read the lease yet")
                }
            }
        }
        self.lease.get()
    }

    /// After the adapter started: waits up to `wait` (the ensure's `waitMs`) for its first line
    /// of output or for its end. An adapter that exits before its first line failed to start
    /// ([`StartFailure`]): within the wait that is the ensure's answer; after it, the stream's.
    /// A close of the daemon that begins meanwhile ends the wait (the close answers for it).
    pub fn await_early_exit(&self, wait: Duration) -> Result<(), SpawnError> {
        let deadline = Instant::now() + wait;
        let mut g = self.lock();
        loop {
            if g.life.is_ended() {
                return match g.start_failure.clone() {
                    Some(f) => Err(SpawnError::StartFailed {
                        status: f.status,
                        stderr: f.stderr,
                    }),
                    None => Ok(()),
                };
            }
            let now = Instant::now();
            if g.output_lines > 0 || g.close_begun || now >= deadline {
                return Ok(());
            }
            g = g.wait_timeout(deadline - now);
        }
    }

    /// The last stderr lines, giving the stderr reader a moment to drain the child's last words.
    pub(super) fn stderr_tail_settled(&self) -> Vec<String> {
        let mut tail = Vec::new();
        for _ in 0..50 {
            tail = self.lock().stderr_tail.iter().cloned().collect();
            if !tail.is_empty() {
                break;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        tail
    }

    pub(super) fn failure(&self, status: Option<i32>) -> SpawnError {
        // The stderr reader may still be draining the child's last words.
        SpawnError::Failed {
            status,
            stderr: self.stderr_tail_settled(),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// A session across a handoff (`daemon/upgrade.rs`): what the daemon's memory holds of it,
// written out by the program that hands over ([`Supervised::handed`], once frozen) and taken
// up by the next one ([`adopt`]), which starts its readers on the same pipes and its waiter on
// the same wrapper (a child of the same pid: `execve` keeps the pid). Nothing is signalled or
// reaped on the way; the lease row stays as it is.

/// Where a handed session is in its life. A session starting or being closed by this daemon
/// is never handed over: the handoff waits for those ops to end first.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
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
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
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
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
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
        start_threads(
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
    let session = Supervised::assemble(
        spec,
        Parts {
            key: h.key,
            argv: h.argv,
            child_pid: h.child_pid,
            created_at: h.created_at,
            stdin: StdinPipe::adopt(stdin, h.stdin_owed),
            inner,
            report_failed: h.report_failed,
        },
    );
    session.find_lease();
    Ok(Adopted {
        session,
        pipes: [stdout, stderr],
        partial: h.partial,
        ended,
    })
}
