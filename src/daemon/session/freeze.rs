//! The freeze of a handoff (`daemon/upgrade.rs`): every session's stdout and stderr readers stop
//! at a point where no byte is lost — between two reads, with everything read already numbered
//! and buffered, and a line cut by the last read kept aside ([`Handed`]) — and no waiter reaps
//! a wrapper that exits meanwhile (the zombie is the next program's to reap). A freeze that is
//! lifted (the handoff was refused before the exec) lets every thread go on as if nothing
//! happened; one that is not ends with the exec.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The daemon's one freeze, shared by its sessions.
pub struct Freeze {
    requested: AtomicBool,
    /// Set while a freeze is requested: wakes the readers that wait for their pipe.
    latch: crate::sys::Latch,
    state: Mutex<Counts>,
    changed: Condvar,
}

#[derive(Default)]
struct Counts {
    /// Reader threads running (stdout and stderr of each live session).
    readers: usize,
    /// Of them, those stopped by the freeze.
    parked: usize,
    /// Waiters that reaped their wrapper and have not ended their session yet.
    settling: usize,
}

/// Why a freeze could not be had.
#[derive(Debug, thiserror::Error)]
#[error("{parked} of {readers} session readers stopped and {settling} sessions still settling after {waited:?}")]
pub struct NotFrozen {
    pub readers: usize,
    pub parked: usize,
    pub settling: usize,
    pub waited: Duration,
}

impl Freeze {
    pub fn new() -> std::io::Result<Freeze> {
        Ok(Freeze {
            requested: AtomicBool::new(false),
            latch: crate::sys::Latch::new()?,
            state: Mutex::new(Counts::default()),
            changed: Condvar::new(),
        })
    }

    fn counts(&self) -> MutexGuard<'_, Counts> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn requested(&self) -> bool {
        self.requested.load(Ordering::SeqCst)
    }

    pub(super) fn latch(&self) -> &crate::sys::Latch {
        &self.latch
    }

    /// Asks every reader to stop and waits, up to `within`, until all have and no waiter is
    /// settling a session. On failure the freeze is lifted again.
    pub fn freeze(&self, within: Duration) -> Result<(), NotFrozen> {
        let begun = Instant::now();
        {
            let _g = self.counts();
            self.requested.store(true, Ordering::SeqCst);
        }
        self.latch.set();
        let (g, _) = self
            .changed
            .wait_timeout_while(self.counts(), within.saturating_sub(begun.elapsed()), |c| {
                c.parked != c.readers || c.settling > 0
            })
            .unwrap_or_else(|p| p.into_inner());
        if g.parked == g.readers && g.settling == 0 {
            return Ok(());
        }
        let err = NotFrozen {
            readers: g.readers,
            parked: g.parked,
            settling: g.settling,
            waited: begun.elapsed(),
        };
        drop(g);
        self.thaw();
        Err(err)
    }

    /// Lifts the freeze: every stopped thread goes on.
    pub fn thaw(&self) {
        let _g = self.counts();
        self.requested.store(false, Ordering::SeqCst);
        self.latch.clear();
        self.changed.notify_all();
    }

    /// A reader thread starts (counted until [`Freeze::reader_ended`]).
    pub(super) fn reader_started(&self) {
        self.counts().readers += 1;
    }

    pub(super) fn reader_ended(&self) {
        self.counts().readers -= 1;
        self.changed.notify_all();
    }

    /// Called by a reader between two reads while a freeze is requested: it waits here until
    /// the freeze is lifted (or the process execs).
    pub(super) fn park(&self) {
        let mut g = self.counts();
        g.parked += 1;
        self.changed.notify_all();
        g = self
            .changed
            .wait_while(g, |_| self.requested())
            .unwrap_or_else(|p| p.into_inner());
        g.parked -= 1;
    }

    /// A waiter saw its wrapper exit and is about to reap it: it may unless a freeze is
    /// requested, in which case it waits for the freeze to be lifted first (a handoff leaves the
    /// zombie to the next program).
    pub(super) fn begin_settle(&self) {
        let mut g = self
            .changed
            .wait_while(self.counts(), |_| self.requested())
            .unwrap_or_else(|p| p.into_inner());
        g.settling += 1;
    }

    /// The session whose wrapper was reaped has ended.
    pub(super) fn end_settle(&self) {
        self.counts().settling -= 1;
        self.changed.notify_all();
    }
}
