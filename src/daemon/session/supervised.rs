//! The session itself ([`Supervised`]), its state behind the lock ([`Inner`]) and what `status`
//! shows of it ([`Shown`]); the files above it add its behaviour, one concern each.

use super::base::*;
use super::freeze::Freeze;
use super::phase::Life;
use super::replay::Replay;
use super::seq::Seqs;

/// The daemon's supervised child: one session's `leash exec` child and everything the daemon
/// holds for it (named apart from the session rows of the store and `crate::controller::sessions`, which are
/// the sessions' records, not running children).
pub struct Supervised {
    pub key: String,
    /// The adapter command the session was started with (`ensure` reports `argvMatches`).
    pub argv: Vec<String>,
    pub(super) lease: OnceLock<LeaseInfo>,
    pub(super) root: StateRoot,
    pub(super) child_pid: i32,
    pub(super) created_at: i64,
    /// The largest encoded `line` of an output item (see [`encode_bounded`]).
    pub(super) item_cap: usize,
    pub(super) store: SharedStore,
    pub(super) stdin: Mutex<StdinPipe>,
    /// Serialises what is written to the adapter and the intents about this session (send,
    /// cancel), so requests about one session apply in order across connections.
    pub(super) ops: Mutex<()>,
    pub(super) inner: Mutex<Inner>,
    /// What `status` shows, published by every writer of `inner` as it lets go (`shown.rs`).
    pub(super) shown: Mutex<Arc<Shown>>,
    pub(super) changed: Condvar,
    /// Signalled when the output reader, held back by the slowest live attach, may read again
    /// (that attach advanced or ended, a close began, the session ended).
    pub(super) drained: Condvar,
    /// Set while requests await responses (`pending` or `opening` is not empty), so the output
    /// reader classifies lines only then. Set under `inner` before the request is written;
    /// cleared under `inner` by the reader when both are empty.
    pub(super) tracking: AtomicBool,
    /// Set once the wrapper's report was found in the state root's `run/` instead of the row's
    /// reports directory, or nowhere: the wrapper could not write it there (said once in the
    /// log, counted by the `ensure` that started the session).
    pub(super) report_failed: AtomicBool,
    /// The daemon's freeze for a handoff (`freeze.rs`).
    pub(super) freeze: Arc<Freeze>,
    /// What the readers leave for a handoff: their pipes and the lines they hold cut.
    pub(super) handed: Mutex<HandedIo>,
    /// The waiter reaped the wrapper and has not ended the session yet: its readers drain the
    /// pipes to the end instead of stopping for a freeze (the waiter waits for them).
    pub(super) settling: AtomicBool,
}

/// A session's pipes as its reader threads hold them (`-1`: no reader), and the line each
/// reader's framer held when it stopped for a freeze (indexed by [`Stream`]).
#[derive(Debug)]
pub(super) struct HandedIo {
    pub(super) fds: [RawFd; 2],
    pub(super) partial: [Partial; 2],
}

impl Default for HandedIo {
    fn default() -> HandedIo {
        HandedIo {
            fds: [-1, -1],
            partial: Default::default(),
        }
    }
}

/// The wrapper a waiter waits for: spawned by this program, or by the program before an exec
/// of the same process (a handoff), which this one reaps by its pid.
pub(super) enum Wrapper {
    Spawned(Child),
    Adopted,
}

pub(super) struct Inner {
    /// The stream items a reader can still get (`replay.rs`).
    pub(super) replay: Replay,
    /// The seqs output may take (`seq.rs`).
    pub(super) seqs: Seqs,
    /// Where the session is in its life (`phase.rs`).
    pub(super) life: Life,
    pub(super) pending: BTreeMap<String, PendingPrompt>,
    /// `session/new` and `session/load` requests awaiting their response (to learn ACP ids).
    /// With the ACP session a `session/load` names and the request's `cwd` and `mcpServers`.
    pub(super) opening: HashMap<String, (Option<String>, Option<Value>)>,
    pub(super) acp_sessions: BTreeSet<String>,
    /// The `cwd` and `mcpServers` each ACP session was last opened with (`session/new` or
    /// `session/load`), by ACP session id: shown in `status` and kept for resumption.
    pub(super) acp_setup: BTreeMap<String, Value>,
    /// `acp_sessions` with their setup as `status` shows them, rebuilt only when one is learnt
    /// (the view is published on every change of the session, output included).
    pub(super) acp_view: Arc<Vec<Value>>,
    pub(super) last_traffic: Instant,
    pub(super) output_lines: u64,
    pub(super) attached: usize,
    /// The output reader waits on `drained` (see `replay.rs`).
    pub(super) reader_waiting: bool,
    /// Threads waiting on `changed` ([`shown::Locked::wait_timeout`]).
    pub(super) changed_waiters: usize,
    pub(super) stderr_tail: VecDeque<String>,
    /// Why output is held (seqs cannot be reserved), while it is.
    pub(super) held: Option<String>,
    /// Lines that could never be given a seq (the session ended while the store was failing).
    pub(super) output_dropped: u64,
    /// A close of this daemon (requested, idle, shutdown, a takeover) began: an end that follows
    /// is the close's, never a start failure.
    pub(super) close_begun: bool,
    /// Set at the end: the adapter exited before its first line of output and no close ended it.
    pub(super) start_failure: Option<StartFailure>,
}

impl Inner {
    /// Records an ACP session the adapter opened (and what it was opened with, when known).
    pub(super) fn note_acp_session(&mut self, id: String, setup: Option<Value>) {
        let mut changed = self.acp_sessions.insert(id.clone());
        if let Some(setup) = setup {
            changed |= self.acp_setup.get(&id) != Some(&setup);
            self.acp_setup.insert(id, setup);
        }
        if changed {
            let view = self
                .acp_sessions
                .iter()
                .map(|id| {
                    let mut entry = serde_json::Map::new();
                    entry.insert("sessionId".into(), Value::String(id.clone()));
                    if let Some(Value::Object(setup)) = self.acp_setup.get(id) {
                        entry.extend(setup.clone());
                    }
                    Value::Object(entry)
                })
                .collect();
            self.acp_view = Arc::new(view);
        }
    }

    /// A session that has not started yet, whose store holds seqs up to `last`.
    pub(super) fn new(limits: Limits, last: i64) -> Inner {
        Inner {
            replay: Replay::new(limits, last),
            seqs: Seqs::new(last),
            life: Life::Starting,
            pending: BTreeMap::new(),
            opening: HashMap::new(),
            acp_sessions: BTreeSet::new(),
            acp_setup: BTreeMap::new(),
            acp_view: Arc::new(Vec::new()),
            last_traffic: Instant::now(),
            output_lines: 0,
            attached: 0,
            reader_waiting: false,
            changed_waiters: 0,
            stderr_tail: VecDeque::new(),
            held: None,
            output_dropped: 0,
            close_begun: false,
            start_failure: None,
        }
    }
}

/// The part of a session's live status that changes with its state (the rest — key, lease,
/// creation time — is fixed once set). Built from `Inner` by [`Shown::of`].
#[derive(Debug, Clone)]
pub(super) struct Shown {
    pub(super) phase: Phase,
    pub(super) pending_prompts: Vec<PendingPrompt>,
    pub(super) acp_session_ids: Vec<String>,
    pub(super) acp_sessions: Arc<Vec<Value>>,
    pub(super) last_traffic: Instant,
    pub(super) output_lines: u64,
    pub(super) oldest_seq: Option<i64>,
    pub(super) last_seq: i64,
    pub(super) buffered_lines: usize,
    pub(super) buffered_bytes: usize,
    pub(super) attached: usize,
    pub(super) exit_status: Option<i32>,
    pub(super) output_held: Option<String>,
    pub(super) output_dropped: u64,
}

impl Shown {
    pub(super) fn of(g: &Inner) -> Shown {
        Shown {
            phase: g.life.phase(),
            pending_prompts: g.pending.values().cloned().collect(),
            acp_session_ids: g.acp_sessions.iter().cloned().collect(),
            acp_sessions: g.acp_view.clone(),
            last_traffic: g.last_traffic,
            output_lines: g.output_lines,
            oldest_seq: g.replay.oldest_seq(),
            last_seq: g.replay.last_seq(),
            buffered_lines: g.replay.len(),
            buffered_bytes: g.replay.bytes(),
            attached: g.attached,
            exit_status: g.life.exit_status(),
            output_held: g.held.clone(),
            output_dropped: g.output_dropped,
        }
    }
}

impl Supervised {
    /// The shared store connection. Never taken while holding `inner` (see the module docs of
    /// `session`).
    pub(super) fn store(&self) -> MutexGuard<'_, Store> {
        lock_store(&self.store)
    }

    pub fn lease(&self) -> Option<&LeaseInfo> {
        self.lease.get()
    }

    pub fn lease_id(&self) -> Option<&str> {
        self.lease.get().map(|l| l.lease_id.as_str())
    }

    pub fn phase(&self) -> Phase {
        self.lock().life.phase()
    }

    pub fn busy(&self) -> bool {
        !self.lock().pending.is_empty()
    }

    /// When the session ended, if it did.
    pub fn ended_at(&self) -> Option<Instant> {
        self.lock().life.ended_at()
    }

    pub fn last_seq(&self) -> i64 {
        self.lock().replay.last_seq()
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

    pub fn attached(&self, delta: isize) {
        let mut g = self.lock();
        g.attached = g.attached.saturating_add_signed(delta);
    }
}
