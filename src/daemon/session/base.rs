//! What the files of `session/` share, below everything else of the folder: the constants,
//! the small types of a session (its bounds, its lease, a failed start, a cut line), and the
//! names every file uses. `supervised.rs` holds the session itself, on top of this and of the
//! data types of `phase.rs`, `seq.rs` and `replay.rs`.

pub(super) use crate::controller::{CloseOutcome, CloseResult, Controller, LeaseRef};
pub(super) use crate::daemon::stdin_pipe::{PipeError, StdinPipe};
pub(super) use crate::lease::now_ms;
pub(super) use crate::protocol::Ensure;
pub(super) use crate::protocol::{LiveSession, PendingPrompt, Phase};
pub(super) use crate::report::WrapperReport;
pub(super) use crate::state::StateRoot;
pub(super) use crate::store::{Event, Store, StoreError};
pub(super) use leash_core::model::{LeaseState, ProcessId};
pub(super) use serde_json::{json, Value};
pub(super) use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
pub(super) use std::io::{self, Read};
pub(super) use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
pub(super) use std::os::unix::process::{CommandExt, ExitStatusExt};
pub(super) use std::path::Path;
pub(super) use std::process::{Child, Command, Stdio};
pub(super) use std::sync::atomic::{AtomicBool, Ordering as AtomicOrdering};
pub(super) use std::sync::mpsc;
pub(super) use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
pub(super) use std::time::{Duration, Instant};

/// Seqs reserved in the store at a time for output lines, at first and whenever output is slow.
pub const SEQ_BLOCK: i64 = 1024;

/// The largest block of seqs reserved at a time: while an adapter prints so fast that a block
/// runs out within [`SEQ_BLOCK_FAST`] of its reservation, and a live attach reads it, each
/// block doubles up to this (see [`Seqs::block_len`](super::seq::Seqs::block_len)). At 1,024
/// lines a block, a flood of 3 M lines/s cost the output reader some 3,000 SQLite write
/// transactions a second.
pub const MAX_SEQ_BLOCK: i64 = 64 * SEQ_BLOCK;

/// A block used up within this of its reservation makes the next one twice as large.
pub(super) const SEQ_BLOCK_FAST: Duration = Duration::from_secs(1);

/// An adapter line longer than this is cut (and marked `truncated`).
pub const MAX_ADAPTER_LINE: usize = 8 << 20;

/// Stack of the thread that settles the lease when the wrapper exits: it runs a whole close
/// (verification, signals, SQLite), so it gets more than the readers' [`crate::daemon::stack::SMALL_STACK`].
pub(super) const WAIT_STACK: usize = 1024 * 1024;

/// How many of the adapter's last stderr lines are kept for error messages.
pub(super) const STDERR_TAIL: usize = 20;

/// A stderr line longer than this is cut (and marked `truncated`).
pub const MAX_STDERR_LINE: usize = 64 * 1024;

/// How long `ensure` waits for the lease and the adapter's start.
pub(super) const START_TIMEOUT: Duration = Duration::from_secs(20);

/// How long an `ensure` waits for the wrapper's report before it takes a child of the wrapper as
/// the adapter started without one (its reports directory and `run/` both full). A report comes
/// within milliseconds when it can be written at all.
pub(super) const REPORT_PATIENCE: Duration = Duration::from_secs(1);
/// How long an ensure whose adapter could not be started waits, after the wrapper said so, for
/// the wrapper's exit and the lease's settling before it answers all the same.
pub(super) const SETTLE_PATIENCE: Duration = Duration::from_secs(2);

/// Where the wrapper's report went when its reports directory could not take it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReportFailure {
    /// To the state root's `run/`.
    FellBack,
    /// Nowhere: `run/` could not take it either.
    Nowhere,
}

/// After the wrapper exits, how long to wait for the rest of its stdout.
pub(super) const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

/// How long the rest of the stdout gets before the lease is settled (see `supervise`).
pub(super) const QUICK_DRAIN: Duration = Duration::from_millis(200);

/// How many unanswered requests are tracked per session (a bound against a client that never
/// reads responses).
pub(super) const MAX_TRACKED: usize = 4096;

/// While seqs cannot be reserved, how long the output thread waits between attempts (doubling
/// from [`HOLD_RETRY_MIN`]).
pub(super) const HOLD_RETRY_MIN: Duration = Duration::from_millis(50);

pub(super) const HOLD_RETRY_MAX: Duration = Duration::from_secs(1);

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

/// An adapter that was started and exited before its first line of output, with no close of
/// the daemon ending it: its start failed, whenever the exit came. Reported the same way by an
/// `ensure` that was still waiting (`start_failed`) and by the stream's end (`start_failed`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StartFailure {
    pub status: Option<i32>,
    pub stderr: Vec<String>,
}

impl std::fmt::Display for StartFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the adapter exited before its first line of output (exit status {}){}",
            self.status.map_or("unknown".into(), |c| c.to_string()),
            last_words(&self.stderr)
        )
    }
}

pub(super) fn last_words(stderr: &[String]) -> String {
    if stderr.is_empty() {
        "; it wrote nothing on stderr".into()
    } else {
        format!("; its last stderr lines: {}", stderr.join(" | "))
    }
}

/// A line cut by a read's end, as a reader's framer holds it (see
/// [`LineFramer::snapshot`](super::stdio::LineFramer::snapshot)).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Partial {
    pub bytes: Vec<u8>,
    pub truncated: bool,
    pub any: bool,
}

pub(super) fn lock_store(store: &SharedStore) -> MutexGuard<'_, Store> {
    store.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
pub(super) use std::io::{BufRead, BufReader};
