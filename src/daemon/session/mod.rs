//! A supervised session: one `leash exec` child of the daemon (lease committed, then the wrapper,
//! then the adapter), its stdin writer, a thread reading its stdout into a bounded replay buffer,
//! a thread logging its stderr, and a waiter that settles the lease when the wrapper exits.
//!
//! **Seqs.** Output lines and lifecycle events share one per-session, monotonic seq space, the
//! same one the store's `events` table uses. Output is never written to SQLite line by line: the
//! session reserves blocks of [`SEQ_BLOCK`] seqs in the store (one write per block; larger blocks,
//! up to [`MAX_SEQ_BLOCK`], while output floods in to a live attach), and any event
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
//! holding it. `inner` is only ever held for in-memory work, and `status` does not take it at
//! all: every writer of `inner` publishes what `status` shows as it lets go (`shown.rs`), so a
//! niced output reader preempted while holding `inner` delays no health check.
//!
//! **Busy.** A `session/prompt` JSON-RPC request written to the adapter's stdin marks the session
//! busy until a response with the same id appears on its stdout. The classification is pure
//! ([`classify_outgoing`], [`classify_incoming`]).

mod busy;
mod freeze;
mod handshake;
mod phase;
mod replay;
mod seq;
mod settle;
mod shown;
mod spawn;
mod stdio;

pub use busy::{cancel_notification, classify_incoming, classify_outgoing, Incoming, Outgoing};
pub use freeze::{Freeze, NotFrozen};
pub use handshake::{HandshakeFailure, HANDSHAKE_ID};
use phase::Life;
pub use replay::HandedReplay;
use replay::Replay;
pub use replay::{line_prefix, Batch, Item, LineHead, Run, Slot};
use seq::Seqs;
pub(crate) use settle::settle_slot;
pub use spawn::{adopt, Adopted, HandedFds, HandedLife, HandedSession};
pub use spawn::{spawn, SpawnError, SpawnSpec, StartFailure};
pub use stdio::Partial;
use stdio::*;

use crate::controller::{CloseOutcome, CloseResult, Controller, LeaseRef};
use crate::daemon::stdin_pipe::{PipeError, StdinPipe};
use crate::lease::now_ms;
use crate::protocol::Ensure;
use crate::protocol::{LiveSession, PendingPrompt, Phase};
use crate::report::WrapperReport;
use crate::state::StateRoot;
use crate::store::{Event, Store, StoreError};
use leash_core::model::{LeaseState, ProcessId};
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::io::{self, Read};
#[cfg(test)]
use std::io::{BufRead, BufReader};
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering as AtomicOrdering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

/// Seqs reserved in the store at a time for output lines, at first and whenever output is slow.
pub const SEQ_BLOCK: i64 = 1024;

/// The largest block of seqs reserved at a time: while an adapter prints so fast that a block
/// runs out within [`SEQ_BLOCK_FAST`] of its reservation, and a live attach reads it, each
/// block doubles up to this (see
/// [`seq::Seqs::block_len`]). At 1,024 lines a block, a flood of 3 M lines/s cost the output
/// reader some 3,000 SQLite write transactions a second.
pub const MAX_SEQ_BLOCK: i64 = 64 * SEQ_BLOCK;

/// A block used up within this of its reservation makes the next one twice as large.
const SEQ_BLOCK_FAST: Duration = Duration::from_secs(1);

/// An adapter line longer than this is cut (and marked `truncated`).
pub const MAX_ADAPTER_LINE: usize = 8 << 20;

/// Stack of the thread that settles the lease when the wrapper exits: it runs a whole close
/// (verification, signals, SQLite), so it gets more than the readers' [`crate::daemon::stack::SMALL_STACK`].
const WAIT_STACK: usize = 1024 * 1024;

/// How many of the adapter's last stderr lines are kept for error messages.
const STDERR_TAIL: usize = 20;

/// A stderr line longer than this is cut (and marked `truncated`).
pub const MAX_STDERR_LINE: usize = 64 * 1024;

/// How long `ensure` waits for the lease and the adapter's start.
const START_TIMEOUT: Duration = Duration::from_secs(20);

/// How long an `ensure` waits for the wrapper's report before it takes a child of the wrapper as
/// the adapter started without one (its reports directory and `run/` both full). A report comes
/// within milliseconds when it can be written at all.
const REPORT_PATIENCE: Duration = Duration::from_secs(1);

/// Where the wrapper's report went when its reports directory could not take it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReportFailure {
    /// To the state root's `run/`.
    FellBack,
    /// Nowhere: `run/` could not take it either.
    Nowhere,
}

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

#[derive(Debug, Clone)]
pub struct LeaseInfo {
    pub lease_id: String,
    pub root: ProcessId,
    /// Where its wrapper's report is: the file in the row's reports directory, and the state
    /// root's `run/` file the wrapper falls back to when that one cannot take a record.
    pub report: crate::report::ReportPaths,
}

/// The daemon's supervised child: one session's `leash exec` child and everything the daemon
/// holds for it (named apart from the session rows of the store and `crate::controller::sessions`, which are
/// the sessions' records, not running children).
pub struct Supervised {
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
    /// What `status` shows, published by every writer of `inner` as it lets go (`shown.rs`).
    shown: Mutex<Arc<shown::Shown>>,
    changed: Condvar,
    /// Signalled when the output reader, held back by the slowest live attach, may read again
    /// (that attach advanced or ended, a close began, the session ended).
    drained: Condvar,
    /// Set while requests await responses (`pending` or `opening` is not empty), so the output
    /// reader classifies lines only then. Set under `inner` before the request is written;
    /// cleared under `inner` by the reader when both are empty.
    tracking: AtomicBool,
    /// Set once the wrapper's report was found in the state root's `run/` instead of the row's
    /// reports directory, or nowhere: the wrapper could not write it there (said once in the
    /// log, counted by the `ensure` that started the session).
    report_failed: AtomicBool,
    /// The daemon's freeze for a handoff (`freeze.rs`).
    freeze: Arc<Freeze>,
    /// What the readers leave for a handoff: their pipes and the lines they hold cut.
    handed: Mutex<HandedIo>,
    /// The waiter reaped the wrapper and has not ended the session yet: its readers drain the
    /// pipes to the end instead of stopping for a freeze (the waiter waits for them).
    settling: AtomicBool,
}

/// A session's pipes as its reader threads hold them (`-1`: no reader), and the line each
/// reader's framer held when it stopped for a freeze (indexed by [`Stream`]).
#[derive(Debug)]
pub(super) struct HandedIo {
    fds: [RawFd; 2],
    partial: [Partial; 2],
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

struct Inner {
    /// The stream items a reader can still get (`replay.rs`).
    replay: Replay,
    /// The seqs output may take (`seq.rs`).
    seqs: Seqs,
    /// Where the session is in its life (`phase.rs`).
    life: Life,
    pending: BTreeMap<String, PendingPrompt>,
    /// `session/new` and `session/load` requests awaiting their response (to learn ACP ids).
    /// With the ACP session a `session/load` names and the request's `cwd` and `mcpServers`.
    opening: HashMap<String, (Option<String>, Option<Value>)>,
    acp_sessions: BTreeSet<String>,
    /// The `cwd` and `mcpServers` each ACP session was last opened with (`session/new` or
    /// `session/load`), by ACP session id: shown in `status` and kept for resumption.
    acp_setup: BTreeMap<String, Value>,
    /// `acp_sessions` with their setup as `status` shows them, rebuilt only when one is learnt
    /// (the view is published on every change of the session, output included).
    acp_view: Arc<Vec<Value>>,
    last_traffic: Instant,
    output_lines: u64,
    attached: usize,
    /// The output reader waits on `drained` (see `replay.rs`).
    reader_waiting: bool,
    /// Threads waiting on `changed` ([`shown::Locked::wait_timeout`]).
    changed_waiters: usize,
    stderr_tail: VecDeque<String>,
    /// Why output is held (seqs cannot be reserved), while it is.
    held: Option<String>,
    /// Lines that could never be given a seq (the session ended while the store was failing).
    output_dropped: u64,
    /// A close of this daemon (requested, idle, shutdown, a takeover) began: an end that follows
    /// is the close's, never a start failure.
    close_begun: bool,
    /// Set at the end: the adapter exited before its first line of output and no close ended it.
    start_failure: Option<StartFailure>,
}

impl Inner {
    /// Records an ACP session the adapter opened (and what it was opened with, when known).
    fn note_acp_session(&mut self, id: String, setup: Option<Value>) {
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
    fn new(limits: Limits, last: i64) -> Inner {
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

fn lock_store(store: &SharedStore) -> MutexGuard<'_, Store> {
    store.lock().unwrap_or_else(|p| p.into_inner())
}

impl Supervised {
    /// The shared store connection. Never taken while holding `inner` (see the module docs).
    fn store(&self) -> MutexGuard<'_, Store> {
        lock_store(&self.store)
    }

    fn lock(&self) -> shown::Locked<'_> {
        // A panic while holding the lock leaves consistent-enough data (plain counters and
        // buffers); serving the other clients matters more than poisoning.
        shown::Locked::new(self, self.inner.lock().unwrap_or_else(|p| p.into_inner()))
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
