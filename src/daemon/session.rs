//! A supervised session: one `leash exec` child of the daemon (lease committed, then the wrapper,
//! then the adapter), its stdin writer, a thread reading its stdout into a bounded replay buffer,
//! a thread logging its stderr, and a waiter that settles the lease when the wrapper exits.
//!
//! **Seqs.** Output lines and lifecycle events share one per-session, monotonic seq space, the
//! same one the store's `events` table uses. Output is never written to SQLite line by line: the
//! session reserves blocks of [`SEQ_BLOCK`] seqs in the store (one write per block), and any event
//! recorded meanwhile — by the daemon, by a `Controller`, by another process — gets a seq above
//! the block. Stored events are merged into the stream in seq order whenever a block is reserved
//! and after every lifecycle action, so a client sees every item exactly once, in seq order, and
//! a persisted event has the same seq in the database as in the stream. Seqs may skip (the unused
//! rest of a block); they never repeat or go back, also across daemon restarts.
//!
//! **When the database cannot be written** (disk full, a lock held past the busy timeout) no seq
//! can be reserved, and an output line is never given one that was not: the output thread holds
//! the line and retries (the adapter meets backpressure on its stdout pipe), `status` shows
//! `outputHeld` with the error, and the stream resumes in order once a block is reserved. Seqs
//! handed out are therefore always at or below the store's floor, so later events — and the
//! next lease of the same key — land above everything a client has seen.
//!
//! **Locks.** The store connection is shared by every session of the daemon (one connection, not
//! one per session) behind its own mutex, taken before a session's `inner` lock and never while
//! holding it. `inner` is only ever held for in-memory work, so `status` never waits on a
//! database write.
//!
//! **Busy.** A `session/prompt` JSON-RPC request written to the adapter's stdin marks the session
//! busy until a response with the same id appears on its stdout. The classification is pure
//! ([`classify_outgoing`], [`classify_incoming`]).

use crate::daemon::protocol::Ensure;
pub use crate::daemon::protocol::{LiveSession, PendingPrompt, Phase};
pub use crate::daemon::stdin_pipe::PipeError;
use crate::daemon::stdin_pipe::StdinPipe;
use crate::lease::{now_ms, LeaseState, ProcessId};
use crate::lifecycle::{CloseOutcome, CloseResult, Controller, LeaseRef};
use crate::proc::LiveTable;
use crate::report::WrapperReport;
use crate::state::StateRoot;
use crate::store::{Event, Store, StoreError};
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::io::{self, BufRead, BufReader, Read};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering as AtomicOrdering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

/// Seqs reserved in the store at a time for output lines.
pub const SEQ_BLOCK: i64 = 1024;
/// An adapter line longer than this is cut (and marked `truncated`).
pub const MAX_ADAPTER_LINE: usize = 8 << 20;
/// Stack of the thread that settles the lease when the wrapper exits: it runs a whole close
/// (verification, signals, SQLite), so it gets more than the readers' [`crate::daemon::SMALL_STACK`].
const WAIT_STACK: usize = 1024 * 1024;
/// How many of the adapter's last stderr lines are kept for error messages.
const STDERR_TAIL: usize = 20;
/// A stderr line longer than this is cut (and marked `truncated`).
pub const MAX_STDERR_LINE: usize = 64 * 1024;
/// How long `ensure` waits for the lease and the adapter's start.
const START_TIMEOUT: Duration = Duration::from_secs(20);
/// After the wrapper exits, how long to wait for the rest of its stdout.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the rest of the stdout gets before the lease is settled (see `supervise`).
const QUICK_DRAIN: Duration = Duration::from_millis(200);
/// How many unanswered requests are tracked per session (a bound against a client that never
/// reads responses).
const MAX_TRACKED: usize = 4096;
/// While seqs cannot be reserved, how long the output thread waits between attempts (doubling
/// from [`HOLD_RETRY_MIN`]).
const HOLD_RETRY_MIN: Duration = Duration::from_millis(50);
const HOLD_RETRY_MAX: Duration = Duration::from_secs(1);

/// The daemon's store connection shared by its sessions.
pub type SharedStore = Arc<Mutex<Store>>;

/// Replay buffer bounds. At least the newest item is always kept.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub lines: usize,
    pub bytes: usize,
}

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
    #[error("the adapter exited at once (exit status {}){}", status.map_or("unknown".into(), |c| c.to_string()), last_words(stderr))]
    ExitedAtOnce {
        status: Option<i32>,
        stderr: Vec<String>,
    },
}

fn last_words(stderr: &[String]) -> String {
    if stderr.is_empty() {
        "; it wrote nothing on stderr".into()
    } else {
        format!("; its last stderr lines: {}", stderr.join(" | "))
    }
}

/// Everything `spawn` needs from the daemon.
pub struct SpawnSpec<'a> {
    pub root: &'a StateRoot,
    /// The connection every session of the daemon writes its seqs and events through.
    pub store: &'a SharedStore,
    /// The `leash` binary to run `exec` with.
    pub exe: &'a Path,
    pub daemon_pid: i32,
    pub default_grace_ms: u64,
    pub limits: Limits,
}

#[derive(Debug, Clone)]
pub struct LeaseInfo {
    pub lease_id: String,
    pub root: ProcessId,
}

/// One buffered stream item: its seq and its pre-rendered JSON body (without the request id).
#[derive(Debug, Clone)]
pub struct Item {
    pub seq: i64,
    pub body: Arc<str>,
    /// A line of the adapter's stderr: streamed only to attaches that asked for them.
    pub stderr: bool,
}

/// What an attached reader gets from [`Session::next_batch`].
#[derive(Debug)]
pub enum Batch {
    Items(Vec<Item>),
    /// The session ended and every item up to `last_seq` was handed out.
    Ended {
        last_seq: i64,
    },
    /// Nothing new within the wait.
    Idle,
    /// The cursor fell out of the buffer.
    Evicted {
        oldest_seq: i64,
        last_seq: i64,
    },
}

pub struct Session {
    pub key: String,
    /// The adapter command the session was started with (`ensure` reports `argvMatches`).
    pub argv: Vec<String>,
    lease: OnceLock<LeaseInfo>,
    root: StateRoot,
    child_pid: i32,
    created_at: i64,
    /// The largest encoded `line` of an output item (see [`encode_bounded`]).
    item_cap: usize,
    store: SharedStore,
    stdin: Mutex<StdinPipe>,
    /// Serialises what is written to the adapter and the intents about this session (send,
    /// cancel), so requests about one session apply in order across connections.
    ops: Mutex<()>,
    inner: Mutex<Inner>,
    changed: Condvar,
    /// Set while requests await responses (`pending` or `opening` is not empty), so the output
    /// reader classifies lines only then. Set under `inner` before the request is written;
    /// cleared under `inner` by the reader when both are empty.
    tracking: AtomicBool,
}

struct Inner {
    limits: Limits,
    items: VecDeque<Item>,
    bytes: usize,
    /// The highest seq that was dropped from the buffer.
    evicted_upto: i64,
    next: i64,
    reserved_upto: i64,
    /// The highest stored event seq merged into the stream.
    last_synced: i64,
    last_emitted: i64,
    phase: Phase,
    close_in_flight: bool,
    exit_status: Option<i32>,
    ended_at: Option<Instant>,
    pending: BTreeMap<String, PendingPrompt>,
    /// `session/new` and `session/load` requests awaiting their response (to learn ACP ids).
    opening: HashMap<String, Option<String>>,
    acp_sessions: BTreeSet<String>,
    last_traffic: Instant,
    output_lines: u64,
    attached: usize,
    stderr_tail: VecDeque<String>,
    /// Why output is held (seqs cannot be reserved), while it is.
    held: Option<String>,
    /// Lines that could never be given a seq (the session ended while the store was failing).
    output_dropped: u64,
}

/// Starts `leash exec` for the request and the threads that serve it. The session is returned
/// in [`Phase::Starting`]; [`Session::await_started`] confirms the lease and the adapter.
pub fn spawn(spec: &SpawnSpec<'_>, req: &Ensure) -> Result<Arc<Session>, SpawnError> {
    let last = lock_store(spec.store).last_seq(&req.session)?;
    let grace = req.grace_ms.unwrap_or(spec.default_grace_ms);
    let mut cmd = Command::new(spec.exe);
    cmd.arg("--state-dir")
        .arg(spec.root.dir())
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
    let stdout = child.stdout.take().expect("piped");
    let stderr = child.stderr.take().expect("piped");
    let session = Arc::new(Session {
        key: req.session.clone(),
        argv: req.argv.clone(),
        lease: OnceLock::new(),
        root: spec.root.clone(),
        child_pid,
        created_at: now_ms(),
        item_cap: spec
            .limits
            .bytes
            .min(MAX_ADAPTER_LINE)
            .saturating_sub(ITEM_OVERHEAD)
            .max(MIN_ITEM_LINE),
        store: spec.store.clone(),
        stdin: Mutex::new(StdinPipe::new(child.stdin.take())),
        ops: Mutex::new(()),
        inner: Mutex::new(Inner {
            limits: spec.limits,
            items: VecDeque::new(),
            bytes: 0,
            evicted_upto: 0,
            next: last + 1,
            reserved_upto: last,
            last_synced: last,
            last_emitted: last,
            phase: Phase::Starting,
            close_in_flight: false,
            exit_status: None,
            ended_at: None,
            pending: BTreeMap::new(),
            opening: HashMap::new(),
            acp_sessions: BTreeSet::new(),
            last_traffic: Instant::now(),
            output_lines: 0,
            attached: 0,
            stderr_tail: VecDeque::new(),
            held: None,
            output_dropped: 0,
        }),
        changed: Condvar::new(),
        tracking: AtomicBool::new(false),
    });
    tracing::info!(session = %req.session, pid = child_pid, argv = ?req.argv, "session spawned");

    let (done_tx, done_rx) = mpsc::channel::<()>();
    let s = session.clone();
    std::thread::Builder::new()
        .name(format!("out:{}", req.session))
        .stack_size(crate::daemon::SMALL_STACK)
        .spawn(move || {
            s.read_stdout(stdout);
            let _ = done_tx.send(());
        })
        .expect("spawn thread");
    let s = session.clone();
    std::thread::Builder::new()
        .name(format!("err:{}", req.session))
        .stack_size(crate::daemon::SMALL_STACK)
        .spawn(move || s.read_stderr(stderr))
        .expect("spawn thread");
    let s = session.clone();
    std::thread::Builder::new()
        .name(format!("wait:{}", req.session))
        .stack_size(WAIT_STACK)
        .spawn(move || s.supervise(child, done_rx))
        .expect("spawn thread");
    Ok(session)
}

fn lock_store(store: &SharedStore) -> MutexGuard<'_, Store> {
    store.lock().unwrap_or_else(|p| p.into_inner())
}

impl Session {
    /// The shared store connection. Never taken while holding `inner` (see the module docs).
    fn store(&self) -> MutexGuard<'_, Store> {
        lock_store(&self.store)
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves consistent-enough data (plain counters and
        // buffers); serving the other clients matters more than poisoning.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn lease(&self) -> Option<&LeaseInfo> {
        self.lease.get()
    }

    pub fn lease_id(&self) -> Option<&str> {
        self.lease.get().map(|l| l.lease_id.as_str())
    }

    pub fn phase(&self) -> Phase {
        self.lock().phase
    }

    pub fn busy(&self) -> bool {
        !self.lock().pending.is_empty()
    }

    /// How long ago the last line went either way.
    pub fn idle_for(&self) -> Duration {
        self.lock().last_traffic.elapsed()
    }

    /// When the session ended, if it did.
    pub fn ended_at(&self) -> Option<Instant> {
        self.lock().ended_at
    }

    pub fn last_seq(&self) -> i64 {
        self.lock().last_emitted
    }

    /// Holds the per-session order lock (see the `ops` field).
    pub fn order(&self) -> MutexGuard<'_, ()> {
        self.ops.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The order lock if it can be had within `wait` (a send blocked on a full pipe holds it
    /// for up to its timeout).
    pub fn order_within(&self, wait: Duration) -> Option<MutexGuard<'_, ()>> {
        let deadline = Instant::now() + wait;
        loop {
            match self.ops.try_lock() {
                Ok(g) => return Some(g),
                Err(std::sync::TryLockError::Poisoned(p)) => return Some(p.into_inner()),
                Err(std::sync::TryLockError::WouldBlock) => {}
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Waits for the lease (committed by `leash exec` before the wrapper runs) and for the
    /// wrapper's report that the adapter started. On failure the reason includes the last lines
    /// the child wrote to stderr.
    pub fn await_started(&self) -> Result<(), SpawnError> {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if self.lease.get().is_none() {
                let found = self.store().latest_lease_for_session(&self.key);
                match found {
                    Ok(Some(l)) if l.root_pid == self.child_pid => {
                        let _ = self.lease.set(LeaseInfo {
                            lease_id: l.lease_id.clone(),
                            root: l.root(),
                        });
                        self.sync_events();
                    }
                    Ok(_) => {}
                    Err(e) => {
                        tracing::warn!(session = %self.key, error = %e, "cannot read the lease yet")
                    }
                }
            }
            if let Some(info) = self.lease.get() {
                if let Some(r) = WrapperReport::read(&self.root, &info.lease_id)
                    .filter(|r| r.wrapper_pid == self.child_pid)
                {
                    if r.adapter_pid.is_some() {
                        let mut g = self.lock();
                        if g.phase == Phase::Starting {
                            g.phase = Phase::Running;
                        }
                        return Ok(());
                    }
                    if let Some(code) = r.exit_status {
                        return Err(self.failure(Some(code)));
                    }
                }
            }
            let (phase, status) = {
                let g = self.lock();
                (g.phase, g.exit_status)
            };
            if phase == Phase::Ended {
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
                return Err(self.failure(status));
            }
            if Instant::now() >= deadline {
                return Err(SpawnError::Timeout(START_TIMEOUT));
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// After the adapter started: waits up to `wait` for its first line of output (it is alive
    /// and talking) or for its end. An adapter that dies within the wait — bad config, a missing
    /// dependency — is reported with its exit status and last stderr lines instead of `running`.
    pub fn await_early_exit(&self, wait: Duration) -> Result<(), SpawnError> {
        let deadline = Instant::now() + wait;
        let mut g = self.lock();
        loop {
            if g.phase == Phase::Ended {
                let status = g.exit_status;
                drop(g);
                return Err(SpawnError::ExitedAtOnce {
                    status,
                    stderr: self.stderr_tail_settled(),
                });
            }
            let now = Instant::now();
            if g.output_lines > 0 || now >= deadline {
                return Ok(());
            }
            g = self
                .changed
                .wait_timeout(g, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// The last stderr lines, giving the stderr reader a moment to drain the child's last words.
    fn stderr_tail_settled(&self) -> Vec<String> {
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

    fn failure(&self, status: Option<i32>) -> SpawnError {
        // The stderr reader may still be draining the child's last words.
        SpawnError::Failed {
            status,
            stderr: self.stderr_tail_settled(),
        }
    }

    /// Writes one line (a newline is added) to the adapter's stdin and tracks JSON-RPC requests
    /// in it. Waits at most `timeout` while the adapter does not read (see [`StdinPipe`]).
    pub fn write_line(&self, line: &str, timeout: Duration) -> Result<(), PipeError> {
        // Tracked before the write: a fast adapter may answer before the write call returns,
        // and its response must find the request.
        let tracked = self.track_outgoing(classify_outgoing(line));
        let written = {
            let mut stdin = self.stdin.lock().unwrap_or_else(|p| p.into_inner());
            stdin.write_line(line.as_bytes(), timeout)
        };
        let mut g = self.lock();
        match &written {
            Ok(()) => g.last_traffic = Instant::now(),
            Err(_) => {
                if let Some(key) = tracked {
                    g.pending.remove(&key);
                    g.opening.remove(&key);
                }
            }
        }
        written
    }

    /// Records a request that expects a response; returns its tracking key.
    fn track_outgoing(&self, out: Outgoing) -> Option<String> {
        let mut g = self.lock();
        if !matches!(out, Outgoing::Other) {
            self.tracking.store(true, AtomicOrdering::SeqCst);
        }
        match out {
            Outgoing::Prompt { id, acp_session } => {
                if let Some(a) = &acp_session {
                    g.acp_sessions.insert(a.clone());
                }
                if g.pending.len() >= MAX_TRACKED {
                    return None;
                }
                let key = id.to_string();
                g.pending.insert(
                    key.clone(),
                    PendingPrompt {
                        id,
                        acp_session_id: acp_session,
                        since: now_ms(),
                    },
                );
                Some(key)
            }
            Outgoing::Opens { id, acp_session } => {
                if let Some(a) = &acp_session {
                    g.acp_sessions.insert(a.clone());
                }
                if g.opening.len() >= MAX_TRACKED {
                    return None;
                }
                let key = id.to_string();
                g.opening.insert(key.clone(), acp_session);
                Some(key)
            }
            Outgoing::Other => None,
        }
    }

    /// The ACP session a `cancel` without an explicit id is meant for: the one of the only
    /// unanswered prompt, else the only ACP session seen.
    pub fn infer_acp_session(&self) -> Option<String> {
        let g = self.lock();
        let prompts: BTreeSet<&String> = g
            .pending
            .values()
            .filter_map(|p| p.acp_session_id.as_ref())
            .collect();
        if prompts.len() == 1 {
            return prompts.into_iter().next().cloned();
        }
        if g.acp_sessions.len() == 1 {
            return g.acp_sessions.iter().next().cloned();
        }
        None
    }

    /// Drops the adapter's stdin (it sees EOF).
    pub fn close_stdin(&self) {
        self.stdin.lock().unwrap_or_else(|p| p.into_inner()).close();
    }

    /// Marks the session as closing; false when it is not running (or already closing).
    pub fn begin_close(&self) -> bool {
        let mut g = self.lock();
        if matches!(g.phase, Phase::Starting | Phase::Running) && !g.close_in_flight {
            g.phase = Phase::Closing;
            g.close_in_flight = true;
            true
        } else {
            false
        }
    }

    /// Marks the session closing if it is running, not busy, and quiet for at least `idle`;
    /// returns how long it was quiet. Decided under the order lock, so a prompt being sent
    /// right now is either seen (busy: kept) or comes after the mark (refused: not running).
    pub fn begin_idle_close(&self, idle: Duration) -> Option<Duration> {
        // A send in progress is traffic: not idle.
        let _order = self.ops.try_lock().ok()?;
        let mut g = self.lock();
        let quiet = g.last_traffic.elapsed();
        if g.phase != Phase::Running
            || g.close_in_flight
            || g.is_busy()
            || quiet < idle
            || self.lease.get().is_none()
        {
            return None;
        }
        g.phase = Phase::Closing;
        g.close_in_flight = true;
        Some(quiet)
    }

    /// Marks the session closing for a lease that changed underneath the daemon (see
    /// `notice_changed_leases` in the daemon); false when it ended or a close is in flight.
    pub fn begin_takeover(&self) -> bool {
        let mut g = self.lock();
        if g.phase != Phase::Ended && !g.close_in_flight && self.lease.get().is_some() {
            g.phase = Phase::Closing;
            g.close_in_flight = true;
            true
        } else {
            false
        }
    }

    /// Whether the daemon should look at this session's lease row for changes made by others.
    pub fn watch_lease(&self) -> bool {
        let g = self.lock();
        g.phase != Phase::Ended && !g.close_in_flight && self.lease.get().is_some()
    }

    /// Ends a close begun with [`Session::begin_close`]. When nothing was terminated (ownership
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
            let mut g = self.lock();
            g.close_in_flight = false;
            if !terminated && lease_open && g.phase == Phase::Closing {
                g.phase = Phase::Running;
            }
        }
        if terminated {
            self.close_stdin();
        }
        self.sync_events();
        self.changed.notify_all();
    }

    /// Records a lifecycle event in the store and merges it (with anything recorded before it)
    /// into the stream. Returns its seq.
    pub fn record_event(&self, kind: &str, detail: Option<Value>) -> Result<i64, StoreError> {
        let mut store = self.store();
        let seq = store.record_event(&self.key, self.lease_id(), kind, detail)?;
        self.sync_with(&store);
        drop(store);
        Ok(seq)
    }

    /// Merges events other parties recorded into the stream.
    pub fn sync_events(&self) {
        let store = self.store();
        self.sync_with(&store);
    }

    /// Reads the stored events above what was merged and merges them. The caller holds the
    /// store lock, so two merges never interleave (a later read pushed first would make the
    /// earlier one's events look old); `inner` is held only for the in-memory part.
    fn sync_with(&self, store: &Store) {
        let after = self.lock().last_synced;
        match store.events_since(&self.key, after) {
            Ok(events) if !events.is_empty() => {
                let mut g = self.lock();
                for e in events {
                    g.push_event(e);
                }
                drop(g);
                self.changed.notify_all();
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(session = %self.key, error = %e, "cannot read events"),
        }
    }

    /// Reserves the next block of seqs for output (merging the events stored meanwhile, which
    /// all lie below it). On failure the error is kept for `status` and returned.
    fn reserve_block(&self) -> Result<(), StoreError> {
        let mut store = self.store();
        let after = self.lock().last_synced;
        match store.reserve_seqs(&self.key, SEQ_BLOCK, after) {
            Ok((start, events)) => {
                let mut g = self.lock();
                for e in events {
                    g.push_event(e);
                }
                g.next = g.next.max(start);
                g.reserved_upto = start + SEQ_BLOCK - 1;
                if g.held.take().is_some() {
                    tracing::info!(session = %self.key, "seqs reserved again; output resumes");
                }
                Ok(())
            }
            Err(e) => {
                drop(store);
                let mut g = self.lock();
                if g.held.is_none() {
                    tracing::error!(session = %self.key, error = %e, "cannot reserve seqs in the store; holding the adapter's output until it can");
                }
                g.held = Some(e.to_string());
                Err(e)
            }
        }
    }

    /// A seq for the next output line, with the lock under which it must be pushed (so no
    /// event slips in between): one from a reserved block, never one the store has not
    /// reserved. Waits (holding the line) while the store cannot be written; `None` when the
    /// session ended meanwhile and the line must be dropped.
    fn output_seq(&self) -> Option<(MutexGuard<'_, Inner>, i64)> {
        let mut pause = HOLD_RETRY_MIN;
        loop {
            {
                let mut g = self.lock();
                if g.next <= g.reserved_upto {
                    let seq = g.next;
                    g.next += 1;
                    return Some((g, seq));
                }
            }
            if self.reserve_block().is_err() {
                let mut g = self.lock();
                if g.phase == Phase::Ended {
                    g.output_dropped += 1;
                    return None;
                }
                drop(g);
                std::thread::sleep(pause);
                pause = (pause * 2).min(HOLD_RETRY_MAX);
            }
        }
    }

    /// Where an attach may start: `Err` when `since` fell out of the buffer.
    pub fn check_since(&self, since: i64) -> Result<(Option<i64>, i64), (i64, i64)> {
        let g = self.lock();
        let oldest = g.items.front().map(|i| i.seq);
        if since < g.evicted_upto {
            return Err((oldest.unwrap_or(g.last_emitted), g.last_emitted));
        }
        Ok((oldest, g.last_emitted))
    }

    pub fn attached(&self, delta: isize) {
        let mut g = self.lock();
        g.attached = g.attached.saturating_add_signed(delta);
    }

    /// Items with a seq above `cursor` (at most `max`), waiting up to `wait` for new ones.
    pub fn next_batch(&self, cursor: i64, max: usize, wait: Duration) -> Batch {
        let mut g = self.lock();
        let deadline = Instant::now() + wait;
        loop {
            if cursor < g.evicted_upto {
                return Batch::Evicted {
                    oldest_seq: g.items.front().map_or(g.last_emitted, |i| i.seq),
                    last_seq: g.last_emitted,
                };
            }
            let start = g.items.partition_point(|i| i.seq <= cursor);
            if start < g.items.len() {
                return Batch::Items(g.items.range(start..).take(max).cloned().collect());
            }
            if g.phase == Phase::Ended {
                return Batch::Ended {
                    last_seq: g.last_emitted,
                };
            }
            let now = Instant::now();
            if now >= deadline {
                return Batch::Idle;
            }
            g = self
                .changed
                .wait_timeout(g, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    pub fn status(&self) -> LiveSession {
        let g = self.lock();
        LiveSession {
            session_key: self.key.clone(),
            lease_id: self.lease_id().map(str::to_owned),
            root_pid: self.lease.get().map(|l| l.root.pid),
            phase: g.phase,
            busy: !g.pending.is_empty(),
            pending_prompts: g.pending.values().cloned().collect(),
            acp_session_ids: g.acp_sessions.iter().cloned().collect(),
            created_at: self.created_at,
            idle_ms: g.last_traffic.elapsed().as_millis() as u64,
            output_lines: g.output_lines,
            oldest_seq: g.items.front().map(|i| i.seq),
            last_seq: g.last_emitted,
            buffered_lines: g.items.len(),
            buffered_bytes: g.bytes,
            attached: g.attached,
            exit_status: g.exit_status,
            output_held: g.held.clone(),
            output_dropped: g.output_dropped,
        }
    }

    // -----------------------------------------------------------------------------------------
    // Threads

    /// Reads the adapter's stdout a chunk at a time and numbers every complete line of a chunk
    /// together (see [`Session::push_lines`]): one `read`, one lock and one wake-up of the
    /// attached readers per chunk rather than per line. Reading line by line cost a busy daemon
    /// most of its CPU in futex wakes and small reads. A line cut by the chunk's end waits in the
    /// framer for its rest, so clients see the same lines whatever the chunking.
    fn read_stdout(&self, mut out: impl Read) {
        let mut buf = vec![0u8; READ_CHUNK];
        let mut framer = LineFramer::new(MAX_ADAPTER_LINE);
        let mut batch = OutBatch::default();
        loop {
            let n = match out.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    tracing::warn!(session = %self.key, error = %e, "reading the adapter's stdout failed");
                    break;
                }
            };
            // Loaded after the data arrived: a request is tracked before it is written, so a
            // response in this chunk finds the flag set.
            let tracking = self.tracking.load(AtomicOrdering::SeqCst);
            framer.feed(&buf[..n], |raw, truncated| {
                batch.add(raw, truncated, self.item_cap, tracking)
            });
            if !batch.lines.is_empty() {
                self.push_lines(&mut batch);
            }
        }
        if let Some((raw, truncated)) = framer.finish() {
            let tracking = self.tracking.load(AtomicOrdering::SeqCst);
            batch.add(&raw, truncated, self.item_cap, tracking);
            self.push_lines(&mut batch);
        }
    }

    /// Numbers and buffers a batch of rendered lines in order: under one lock for as many lines
    /// as the reserved block has seqs left, then one wake-up of the attached readers. When the
    /// block runs out the lock is dropped to reserve the next (see [`Session::output_seq`]).
    fn push_lines(&self, batch: &mut OutBatch) {
        let mut scratch = String::new();
        let mut i = 0;
        let total = batch.lines.len();
        while i < total {
            let Some((mut g, mut seq)) = self.output_seq() else {
                // The session ended while the store failed: this line was counted as dropped,
                // and so is the rest of the batch.
                self.lock().output_dropped += (total - i - 1) as u64;
                break;
            };
            g.last_traffic = Instant::now();
            loop {
                let line = &mut batch.lines[i];
                g.output_lines += 1;
                if let Some((key, session_id)) = line.response.take() {
                    g.pending.remove(&key);
                    if let Some(asked) = g.opening.remove(&key) {
                        if let Some(a) = session_id.or(asked) {
                            g.acp_sessions.insert(a);
                        }
                    }
                }
                scratch.clear();
                use std::fmt::Write as _;
                let _ = write!(scratch, "\"seq\":{seq},\"type\":\"output\",\"line\":");
                scratch.push_str(&batch.encoded[line.encoded.clone()]);
                if line.lossy {
                    scratch.push_str(",\"lossy\":true");
                }
                if line.truncated {
                    scratch.push_str(",\"truncated\":true");
                }
                g.push(seq, Arc::from(scratch.as_str()));
                i += 1;
                if i == total || g.next > g.reserved_upto {
                    break;
                }
                seq = g.next;
                g.next += 1;
            }
            if g.pending.is_empty() && g.opening.is_empty() {
                self.tracking.store(false, AtomicOrdering::SeqCst);
            }
            drop(g);
            self.changed.notify_all();
        }
        batch.clear();
    }

    /// Logs each stderr line and streams it as a `stderr` item (same seq space and replay
    /// buffer as output, so its bounds apply); the last lines are kept for error messages.
    fn read_stderr(&self, err: impl Read) {
        let mut r = BufReader::new(err);
        while let Ok(Some((line, truncated))) = read_capped_line(&mut r, MAX_STDERR_LINE) {
            let text = String::from_utf8_lossy(&line).into_owned();
            tracing::info!(session = %self.key, "stderr: {text}");
            // Encoded before any lock is taken; numbered like output (never a seq the store
            // did not reserve; held while it cannot reserve).
            let encoded = serde_json::to_string(&text).expect("strings serialise");
            let Some((mut g, seq)) = self.output_seq() else {
                continue;
            };
            if g.stderr_tail.len() == STDERR_TAIL {
                g.stderr_tail.pop_front();
            }
            let mut body = format!("\"seq\":{seq},\"type\":\"stderr\",\"line\":{encoded}");
            if truncated {
                body.push_str(",\"truncated\":true");
            }
            g.stderr_tail.push_back(text);
            g.push_item(seq, body.into(), true);
            drop(g);
            self.changed.notify_all();
        }
    }

    /// Waits for the wrapper to exit, then settles the lease and ends the stream.
    fn supervise(self: Arc<Self>, mut child: Child, stdout_done: mpsc::Receiver<()>) {
        let status = child.wait();
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
            while g.close_in_flight && Instant::now() < deadline {
                g = self
                    .changed
                    .wait_timeout(g, Duration::from_millis(200))
                    .unwrap_or_else(|p| p.into_inner())
                    .0;
            }
        }
        if let Some(info) = self.lease.get().cloned() {
            self.settle_lease(&info);
        }
        if !drained {
            let _ = stdout_done.recv_timeout(DRAIN_TIMEOUT);
        }
        tracing::info!(session = %self.key, status = ?code, "session ended");
        let detail = json!({ "status": code, "wrapperPid": self.child_pid });
        if let Err(e) = self.record_event("exit", Some(detail)) {
            tracing::error!(session = %self.key, error = %e, "cannot record the exit");
        }
        self.close_stdin();
        let mut g = self.lock();
        g.exit_status = code;
        g.phase = Phase::Ended;
        g.ended_at = Some(Instant::now());
        g.pending.clear();
        drop(g);
        self.changed.notify_all();
    }

    /// The wrapper is gone (we reaped it). Its report turns an open lease `lost` with the exit
    /// status; a lease still open after that lost its wrapper without a report (SIGKILL), so
    /// whatever may remain of its tree is verified and terminated like any close.
    fn settle_lease(&self, info: &LeaseInfo) {
        let table = LiveTable;
        let mut ctl = match Controller::open(self.root.clone(), &table) {
            Ok(c) => c,
            Err(e) => {
                tracing::error!(session = %self.key, error = %e, "cannot settle the lease");
                return;
            }
        };
        if let Err(e) = ctl.refresh() {
            tracing::warn!(session = %self.key, error = %e, "cannot ingest the wrapper's report");
        }
        let still_open = matches!(
            ctl.store().lease(&info.lease_id),
            Ok(Some(l)) if l.state == LeaseState::Open
        );
        if still_open {
            match ctl.close(&[LeaseRef::Id(info.lease_id.clone())], None) {
                Ok(out) => {
                    for o in out {
                        tracing::info!(lease_id = %o.lease_id, result = ?o.result, reason = %o.reason, "lease settled after the wrapper exited");
                    }
                }
                Err(e) => {
                    tracing::warn!(lease_id = %info.lease_id, error = %e, "cannot settle the lease")
                }
            }
        }
        drop(ctl);
        self.sync_events();
    }
}

impl Inner {
    fn is_busy(&self) -> bool {
        !self.pending.is_empty()
    }

    fn push_event(&mut self, e: Event) {
        self.last_synced = self.last_synced.max(e.seq);
        if e.seq <= self.last_emitted {
            return;
        }
        self.next = self.next.max(e.seq + 1);
        let body = format!(
            "\"seq\":{},\"type\":\"event\",\"kind\":{},\"leaseId\":{},\"detail\":{},\"at\":{}",
            e.seq,
            serde_json::to_string(&e.kind).expect("strings serialise"),
            serde_json::to_string(&e.lease_id).expect("strings serialise"),
            e.detail.unwrap_or(Value::Null),
            e.at
        );
        self.push(e.seq, body.into());
    }

    fn push(&mut self, seq: i64, body: Arc<str>) {
        self.push_item(seq, body, false);
    }

    fn push_item(&mut self, seq: i64, body: Arc<str>, stderr: bool) {
        self.bytes += body.len();
        self.items.push_back(Item { seq, body, stderr });
        self.last_emitted = seq;
        while (self.items.len() > self.limits.lines || self.bytes > self.limits.bytes)
            && self.items.len() > 1
        {
            let old = self.items.pop_front().expect("non-empty");
            self.bytes -= old.body.len();
            self.evicted_upto = old.seq;
        }
    }
}

/// Room kept in an output item for everything but the line (`"seq":…,"type":"output","line":`,
/// the `lossy`/`truncated` flags, and the request id a client adds).
const ITEM_OVERHEAD: usize = 160;
/// An item always has room for this much of its line, however small `--replay-bytes` is.
const MIN_ITEM_LINE: usize = 256;

/// How much of the adapter's stdout is read at a time (a pipe holds 64 KiB by default).
const READ_CHUNK: usize = 64 * 1024;

/// One rendered output line of a batch: its encoded JSON string lies in [`OutBatch::encoded`].
struct OutLine {
    encoded: std::ops::Range<usize>,
    lossy: bool,
    truncated: bool,
    /// The id (as its JSON text) and ACP session id of a JSON-RPC response in the line.
    response: Option<(String, Option<String>)>,
}

/// The lines of one read, rendered before any lock is taken: the lossy UTF-8 check, the bounded
/// JSON encoding (into one buffer for the whole batch), and — only while requests await
/// responses — the JSON-RPC classification.
#[derive(Default)]
struct OutBatch {
    encoded: String,
    lines: Vec<OutLine>,
}

impl OutBatch {
    fn add(&mut self, raw: &[u8], truncated: bool, cap: usize, tracking: bool) {
        let text = String::from_utf8_lossy(raw);
        let lossy = matches!(text, std::borrow::Cow::Owned(_));
        let start = self.encoded.len();
        let cut = encode_bounded_into(&mut self.encoded, &text, cap);
        let response = if tracking {
            match classify_incoming(&text) {
                Incoming::Response { id, session_id } => Some((id.to_string(), session_id)),
                Incoming::Other => None,
            }
        } else {
            None
        };
        self.lines.push(OutLine {
            encoded: start..self.encoded.len(),
            lossy,
            truncated: truncated || cut,
            response,
        });
    }

    fn clear(&mut self) {
        self.lines.clear();
        self.encoded.clear();
        // A batch that held one huge line does not keep its buffer.
        if self.encoded.capacity() > 4 * READ_CHUNK {
            self.encoded.shrink_to(READ_CHUNK);
        }
    }
}

/// Splits a byte stream into lines of at most `cap` bytes (the rest of a longer line is
/// discarded and the line marked truncated), whatever the chunks it arrives in. A `\r` before
/// the `\n` is dropped.
struct LineFramer {
    cap: usize,
    /// The start of a line whose newline has not arrived yet.
    partial: Vec<u8>,
    truncated: bool,
    any: bool,
}

impl LineFramer {
    fn new(cap: usize) -> LineFramer {
        LineFramer {
            cap,
            partial: Vec::new(),
            truncated: false,
            any: false,
        }
    }

    /// Calls `line` with every line completed by `chunk`, in order.
    fn feed(&mut self, mut chunk: &[u8], mut line: impl FnMut(&[u8], bool)) {
        while let Some(i) = memchr_newline(chunk) {
            let (head, rest) = (&chunk[..i], &chunk[i + 1..]);
            if !self.any {
                // The whole line is in this chunk: no copy.
                let (kept, cut) = if head.len() > self.cap {
                    (&head[..self.cap], true)
                } else {
                    (head, false)
                };
                line(strip_cr(kept), cut);
            } else {
                self.append(head);
                let truncated = self.truncated;
                line(strip_cr(&self.partial), truncated);
                self.reset();
            }
            chunk = rest;
        }
        if !chunk.is_empty() {
            self.append(chunk);
        }
    }

    fn append(&mut self, bytes: &[u8]) {
        self.any = true;
        let room = self.cap.saturating_sub(self.partial.len());
        if bytes.len() > room {
            self.truncated = true;
        }
        self.partial
            .extend_from_slice(&bytes[..bytes.len().min(room)]);
    }

    fn reset(&mut self) {
        self.partial.clear();
        if self.partial.capacity() > 4 * READ_CHUNK {
            self.partial.shrink_to(READ_CHUNK);
        }
        self.truncated = false;
        self.any = false;
    }

    /// The last line, when the stream ended without a newline after it.
    fn finish(&mut self) -> Option<(Vec<u8>, bool)> {
        if !self.any {
            return None;
        }
        let mut l = std::mem::take(&mut self.partial);
        if l.last() == Some(&b'\r') {
            l.pop();
        }
        let t = self.truncated;
        self.reset();
        Some((l, t))
    }
}

fn memchr_newline(b: &[u8]) -> Option<usize> {
    b.iter().position(|&c| c == b'\n')
}

fn strip_cr(l: &[u8]) -> &[u8] {
    match l.last() {
        Some(b'\r') => &l[..l.len() - 1],
        _ => l,
    }
}

/// The adapter's line as a JSON string of at most `cap` bytes, quotes included, and whether it
/// had to be cut. Bounds are on the *encoded* size: JSON escaping turns a control byte into six
/// bytes (`\u0001`), so a line of 8 MiB could otherwise become an item of 48 MiB. The cut falls
/// on a character boundary.
#[cfg(test)]
fn encode_bounded(text: &str, cap: usize) -> (String, bool) {
    let mut out = String::with_capacity(text.len().min(cap) + 2);
    let cut = encode_bounded_into(&mut out, text, cap);
    (out, cut)
}

/// [`encode_bounded`] appended to `out`; returns whether the line was cut. Escapes as
/// serde_json does (`\"`, `\\`, `\b\f\n\r\t`, other control bytes as `\u00XX`), copying the
/// runs between escapes whole.
fn encode_bounded_into(out: &mut String, text: &str, cap: usize) -> bool {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let budget = cap.saturating_sub(2);
    let bytes = text.as_bytes();
    // The common line needs no escape and fits: one copy. The check has no early exit so that
    // it vectorises (a 1 KiB line is checked in a few dozen instructions).
    let needs_escape = bytes.iter().fold(false, |acc, &b| {
        acc | (b < 0x20) | (b == b'"') | (b == b'\\')
    });
    if !needs_escape && bytes.len() <= budget {
        out.reserve(bytes.len() + 2);
        out.push('"');
        out.push_str(text);
        out.push('"');
        return false;
    }
    let start_len = out.len();
    out.push('"');
    let mut used = 0;
    let mut run = 0; // start of the run of bytes copied as they are
    let mut end = bytes.len();
    for (i, &b) in bytes.iter().enumerate() {
        let n = match b {
            b'"' | b'\\' | b'\n' | b'\r' | b'\t' | 0x08 | 0x0c => 2,
            0..=0x1f => 6,
            _ => 1,
        };
        if used + n > budget {
            // Cut on a character boundary at or before this byte (escaped bytes are ASCII,
            // so everything before the boundary fits).
            let mut j = i;
            while !text.is_char_boundary(j) {
                j -= 1;
            }
            end = j;
            break;
        }
        used += n;
        if n > 1 {
            out.push_str(&text[run..i]);
            match b {
                b'"' => out.push_str("\\\""),
                b'\\' => out.push_str("\\\\"),
                b'\n' => out.push_str("\\n"),
                b'\r' => out.push_str("\\r"),
                b'\t' => out.push_str("\\t"),
                0x08 => out.push_str("\\b"),
                0x0c => out.push_str("\\f"),
                _ => {
                    out.push_str("\\u00");
                    out.push(HEX[(b >> 4) as usize] as char);
                    out.push(HEX[(b & 0xf) as usize] as char);
                }
            }
            run = i + 1;
        }
    }
    // An escaped byte is ASCII, so the run after it starts on a boundary at or before the cut.
    out.push_str(&text[run..end]);
    out.push('"');
    debug_assert!(out.len() - start_len <= cap.max(2));
    end < bytes.len()
}

/// Reads one line of at most `cap` bytes (the rest of a longer line is discarded). `None` at
/// end of stream; a final line without a newline is returned.
fn read_capped_line(r: &mut impl BufRead, cap: usize) -> io::Result<Option<(Vec<u8>, bool)>> {
    let mut line = Vec::new();
    let mut truncated = false;
    let mut any = false;
    loop {
        let buf = match r.fill_buf() {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if buf.is_empty() {
            return Ok(any.then_some((line, truncated)));
        }
        any = true;
        let (chunk, used, done) = match buf.iter().position(|&b| b == b'\n') {
            Some(i) => (&buf[..i], i + 1, true),
            None => (buf, buf.len(), false),
        };
        let room = cap.saturating_sub(line.len());
        if chunk.len() > room {
            truncated = true;
        }
        line.extend_from_slice(&chunk[..chunk.len().min(room)]);
        r.consume(used);
        if done {
            if line.last() == Some(&b'\r') {
                line.pop();
            }
            return Ok(Some((line, truncated)));
        }
    }
}

// ---------------------------------------------------------------------------------------------
// JSON-RPC classification (pure)

/// What a line written to the adapter means for busy tracking.
#[derive(Debug, Clone, PartialEq)]
pub enum Outgoing {
    /// A `session/prompt` request: the session is busy until its response.
    Prompt {
        id: Value,
        acp_session: Option<String>,
    },
    /// A `session/new` or `session/load` request: its response names the ACP session.
    Opens {
        id: Value,
        acp_session: Option<String>,
    },
    Other,
}

/// What a line from the adapter means for busy tracking.
#[derive(Debug, Clone, PartialEq)]
pub enum Incoming {
    /// A response (`result` or `error`, no `method`) to the request with this id.
    Response {
        id: Value,
        session_id: Option<String>,
    },
    Other,
}

pub fn classify_outgoing(line: &str) -> Outgoing {
    if !line.contains("session/") {
        return Outgoing::Other;
    }
    let Ok(Value::Object(m)) = serde_json::from_str::<Value>(line) else {
        return Outgoing::Other;
    };
    // A request has an id; a notification (no id member) gets no response.
    let Some(id) = m.get("id").filter(|v| !v.is_null()).cloned() else {
        return Outgoing::Other;
    };
    let acp_session = m
        .get("params")
        .and_then(|p| p.get("sessionId"))
        .and_then(Value::as_str)
        .map(str::to_owned);
    match m.get("method").and_then(Value::as_str) {
        Some("session/prompt") => Outgoing::Prompt { id, acp_session },
        Some("session/new" | "session/load") => Outgoing::Opens { id, acp_session },
        _ => Outgoing::Other,
    }
}

pub fn classify_incoming(line: &str) -> Incoming {
    if !line.contains("\"id\"") {
        return Incoming::Other;
    }
    let Ok(Value::Object(m)) = serde_json::from_str::<Value>(line) else {
        return Incoming::Other;
    };
    if m.contains_key("method") || !(m.contains_key("result") || m.contains_key("error")) {
        return Incoming::Other;
    }
    let Some(id) = m.get("id").cloned() else {
        return Incoming::Other;
    };
    let session_id = m
        .get("result")
        .and_then(|r| r.get("sessionId"))
        .and_then(Value::as_str)
        .map(str::to_owned);
    Incoming::Response { id, session_id }
}

/// The ACP `session/cancel` notification for one ACP session: no `id`, so no response.
pub fn cancel_notification(acp_session_id: &str) -> String {
    format!(
        "{{\"jsonrpc\":\"2.0\",\"method\":\"session/cancel\",\"params\":{{\"sessionId\":{}}}}}",
        serde_json::to_string(acp_session_id).expect("strings serialise")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompts_and_their_responses_are_recognised() {
        let p = r#"{"jsonrpc":"2.0","id":7,"method":"session/prompt","params":{"sessionId":"a1","prompt":[]}}"#;
        assert_eq!(
            classify_outgoing(p),
            Outgoing::Prompt {
                id: json!(7),
                acp_session: Some("a1".into())
            }
        );
        let notif = r#"{"jsonrpc":"2.0","method":"session/prompt","params":{}}"#;
        assert_eq!(
            classify_outgoing(notif),
            Outgoing::Other,
            "no id: no response expected"
        );
        assert_eq!(
            classify_outgoing(r#"{"jsonrpc":"2.0","id":1,"method":"session/new","params":{}}"#),
            Outgoing::Opens {
                id: json!(1),
                acp_session: None
            }
        );
        assert_eq!(
            classify_outgoing("not json session/prompt"),
            Outgoing::Other
        );
        assert_eq!(
            classify_incoming(r#"{"jsonrpc":"2.0","id":7,"result":{"stopReason":"end_turn"}}"#),
            Incoming::Response {
                id: json!(7),
                session_id: None
            }
        );
        assert_eq!(
            classify_incoming(r#"{"jsonrpc":"2.0","id":1,"result":{"sessionId":"s9"}}"#),
            Incoming::Response {
                id: json!(1),
                session_id: Some("s9".into())
            }
        );
        // The agent's own requests carry a method and an id of the agent's choosing.
        assert_eq!(
            classify_incoming(
                r#"{"jsonrpc":"2.0","id":7,"method":"session/request_permission","params":{}}"#
            ),
            Incoming::Other
        );
        assert_eq!(
            classify_incoming(r#"{"jsonrpc":"2.0","method":"session/update","params":{"id":1}}"#),
            Incoming::Other
        );
        // 7 and "7" are different ids.
        let Incoming::Response { id, .. } =
            classify_incoming(r#"{"jsonrpc":"2.0","id":"7","error":{"code":-1}}"#)
        else {
            panic!()
        };
        assert_ne!(id.to_string(), json!(7).to_string());
    }

    #[test]
    fn cancel_is_a_notification() {
        let line = cancel_notification("se\"ss");
        let v: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(
            v,
            json!({"jsonrpc":"2.0","method":"session/cancel","params":{"sessionId":"se\"ss"}})
        );
        assert!(v.get("id").is_none());
        assert!(!line.contains('\n'));
    }

    #[test]
    fn items_are_bounded_by_their_encoded_size() {
        let controls = "\u{1}".repeat(1000);
        let (enc, cut) = encode_bounded(&controls, 602);
        assert!(cut);
        assert_eq!(enc.len(), 602, "100 escaped bytes of six plus the quotes");
        assert_eq!(
            serde_json::from_str::<String>(&enc).unwrap(),
            "\u{1}".repeat(100)
        );
        let mixed = "aé\"\n\u{7f}✓\u{2}".repeat(50);
        for cap in 2..400 {
            let (enc, cut) = encode_bounded(&mixed, cap);
            assert!(enc.len() <= cap.max(2), "cap {cap}: {}", enc.len());
            let back: String = serde_json::from_str(&enc).unwrap();
            assert!(mixed.starts_with(&back));
            assert_eq!(cut, back.len() < mixed.len());
        }
        let (enc, cut) = encode_bounded("plain", 100);
        assert_eq!((enc.as_str(), cut), ("\"plain\"", false));
    }

    /// The framer gives the same lines as the line-at-a-time reader, however the stream is cut
    /// into chunks: many lines in one chunk, a line across chunks, a `\r\n` split between two
    /// chunks, lines longer than the cap, a last line without a newline.
    #[test]
    fn framed_lines_do_not_depend_on_the_chunking() {
        let mut data = Vec::new();
        for i in 0..300 {
            data.extend_from_slice(format!("line {i}\n").as_bytes());
        }
        data.extend_from_slice(b"crlf\r\n\n\r\n");
        data.extend_from_slice(&[b'z'; 5000]);
        data.extend_from_slice(b"\r\nshort\n");
        data.extend_from_slice(&[b'w'; 100]);
        data.extend_from_slice(b"\nno newline at the end");
        for cap in [1, 7, 64, 4096, 1 << 20] {
            let mut r = BufReader::with_capacity(16, &data[..]);
            let mut want = Vec::new();
            while let Some(l) = read_capped_line(&mut r, cap).unwrap() {
                want.push(l);
            }
            for chunk in [1, 2, 3, 5, 64, 1000, data.len()] {
                let mut f = LineFramer::new(cap);
                let mut got = Vec::new();
                for c in data.chunks(chunk) {
                    f.feed(c, |l, t| got.push((l.to_vec(), t)));
                }
                got.extend(f.finish());
                assert_eq!(got, want, "cap {cap}, chunks of {chunk}");
            }
        }
        let mut f = LineFramer::new(10);
        f.feed(b"", |_, _| panic!("no line"));
        assert_eq!(f.finish(), None, "an empty stream has no last line");
    }

    #[test]
    fn a_batch_renders_each_line_once_into_one_buffer() {
        let mut b = OutBatch::default();
        b.add(b"plain", false, 100, false);
        b.add(b"\xff\"q\"", false, 100, false);
        b.add(&[b'x'; 50], false, 20, false);
        b.add(
            br#"{"jsonrpc":"2.0","id":7,"result":{"sessionId":"a"}}"#,
            true,
            100,
            true,
        );
        let enc = |i: usize| &b.encoded[b.lines[i].encoded.clone()];
        assert_eq!(enc(0), "\"plain\"");
        assert_eq!(enc(1), "\"\u{fffd}\\\"q\\\"\"");
        assert!(b.lines[1].lossy && !b.lines[0].lossy);
        assert_eq!(enc(2).len(), 20);
        assert!(b.lines[2].truncated && b.lines[3].truncated);
        assert_eq!(
            b.lines[3].response,
            Some(("7".to_string(), Some("a".to_string())))
        );
        assert_eq!(b.lines[0].response, None);
        b.clear();
        assert!(b.lines.is_empty() && b.encoded.is_empty());
    }

    #[test]
    fn capped_lines() {
        let data = b"short\nlooooooong\r\nend";
        let mut r = BufReader::with_capacity(3, &data[..]);
        assert_eq!(
            read_capped_line(&mut r, 4).unwrap(),
            Some((b"shor".to_vec(), true))
        );
        assert_eq!(
            read_capped_line(&mut r, 100).unwrap(),
            Some((b"looooooong".to_vec(), false))
        );
        assert_eq!(
            read_capped_line(&mut r, 100).unwrap(),
            Some((b"end".to_vec(), false))
        );
        assert_eq!(read_capped_line(&mut r, 100).unwrap(), None);
    }
}
