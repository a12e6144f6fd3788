//! The WAL's checkpoints, off the `exec` path. The connection `leash exec`'s leases
//! are committed through ([`Daemon::exec_store`]) does not checkpoint: SQLite's automatic
//! checkpoint runs inside the commit that crosses the WAL's bound, with four `fsync`s, and that
//! commit's reply — one session start in about ten — waited 2–3 ms for them. Instead every few
//! commits nudge this thread, which checkpoints on its own connection without holding up any
//! writer (`PASSIVE`, [`Store::checkpoint_if_due`]). The daemon's other connections keep their
//! automatic checkpoint; the WAL is truncated when the last connection closes, as before.

use crate::store::Store;
use std::sync::atomic::Ordering;
use std::sync::{Mutex, MutexGuard};

/// Commits between two nudges: with ≈ 12 frames a commit, the bound of 128 frames is crossed
/// about every second nudge.
const COMMITS_PER_NUDGE: u32 = 8;

/// What the exec path tells the checkpointer.
#[derive(Default)]
pub(super) struct Checkpoints {
    commits: std::sync::atomic::AtomicU32,
    due: Mutex<Due>,
    wake: std::sync::Condvar,
}

#[derive(Default)]
struct Due {
    nudged: bool,
    stop: bool,
}

impl Checkpoints {
    /// A lease was committed through the exec connection: every [`COMMITS_PER_NUDGE`]th wakes
    /// the checkpointer (one futex wake; the commit itself never waits for it).
    pub(super) fn committed(&self) {
        let n = self.commits.fetch_add(1, Ordering::Relaxed) + 1;
        if n % COMMITS_PER_NUDGE == 0 {
            self.due().nudged = true;
            self.wake.notify_one();
        }
    }

    fn due(&self) -> MutexGuard<'_, Due> {
        self.due.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Lets a checkpointer run again after [`Checkpoints::stop`] (a handoff that did not happen).
    pub(super) fn resume(&self) {
        self.due().stop = false;
    }

    /// Ends the checkpointer's wait (the daemon stops).
    pub(super) fn stop(&self) {
        self.due().stop = true;
        self.wake.notify_one();
    }
}

/// The checkpointer thread: a connection of its own (`store`), a checkpoint when nudged and due.
pub(super) fn run(checkpoints: &Checkpoints, store: Store) {
    loop {
        {
            let mut due = checkpoints.due();
            while !due.nudged && !due.stop {
                due = checkpoints
                    .wake
                    .wait(due)
                    .unwrap_or_else(|p| p.into_inner());
            }
            if due.stop {
                return;
            }
            due.nudged = false;
        }
        store.checkpoint_if_due();
    }
}
