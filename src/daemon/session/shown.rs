//! What `status` shows of a session, published whenever the session's state changes, so that
//! `status` never takes a session's `inner` lock.
//!
//! Why: the output reader holds `inner` while it numbers a chunk of up to a block of lines, and
//! it runs niced (see `stdio::lower_reader_priority`). On a host whose CPUs are taken by the
//! adapters themselves, a niced reader preempted while holding the lock keeps it for as long as
//! the scheduler leaves it off the CPU — tens of milliseconds — and a `status` that locked every
//! session in turn met one such reader in most calls (p50 15 ms, p99 over 300 ms with 100 busy
//! sessions). Now every holder of `inner` that changed it publishes a fresh [`Shown`] before
//! letting go ([`Locked`]'s drop), under `inner`, so publications follow the changes in order;
//! `status` clones the last one under a lock held only for a pointer swap.

use super::base::*;
use super::supervised::*;
use std::ops::{Deref, DerefMut};

/// A held `inner` lock that publishes what `status` shows when it is let go, if it was written
/// through (any `&mut` access counts as a change; reads publish nothing).
pub(super) struct Locked<'a> {
    session: &'a Supervised,
    guard: Option<MutexGuard<'a, Inner>>,
    changed: bool,
}

impl<'a> Locked<'a> {
    pub(super) fn new(session: &'a Supervised, guard: MutexGuard<'a, Inner>) -> Locked<'a> {
        Locked {
            session,
            guard: Some(guard),
            changed: false,
        }
    }

    fn publish(&mut self) {
        if !std::mem::take(&mut self.changed) {
            return;
        }
        if let Some(g) = &self.guard {
            let fresh = Arc::new(Shown::of(g));
            let old = std::mem::replace(&mut *self.session.shown_slot(), fresh);
            // The old view is freed after the slot's lock is let go.
            drop(old);
        }
    }

    /// Waits on the session's condition variable (publishing first: a waiter lets the lock go).
    /// Counted in `changed_waiters` while it waits, so that [`Locked::notify_changed`] makes no
    /// wake-up call when nobody waits.
    pub(super) fn wait_timeout(mut self, wait: Duration) -> Locked<'a> {
        self.publish();
        let mut guard = self.guard.take().expect("held until dropped");
        guard.changed_waiters += 1;
        let mut guard = self
            .session
            .changed
            .wait_timeout(guard, wait)
            .unwrap_or_else(|p| p.into_inner())
            .0;
        guard.changed_waiters -= 1;
        Locked::new(self.session, guard)
    }

    /// Lets the lock go (publishing), then wakes whoever waits on the session's condition
    /// variable: no system call when nobody does (the output reader calls this once per read of
    /// the adapter; an attach that keeps up is mostly busy writing, not waiting). A waiter
    /// counts itself under the lock before it waits, so none is missed.
    pub(super) fn notify_changed(self) {
        let session = self.session;
        let waiting = self.changed_waiters > 0;
        drop(self);
        if waiting {
            session.changed.notify_all();
        }
    }
}

impl Locked<'_> {
    /// The state for a change that `status` does not show (attach cursors): no publish.
    pub(super) fn quiet_mut(&mut self) -> &mut Inner {
        self.guard.as_mut().expect("held until dropped")
    }

    /// Waits on the session's `drained` condition (the output reader held back by an attach).
    pub(super) fn wait_drained(mut self, wait: Duration) -> Self {
        self.publish();
        let session = self.session;
        let guard = self.guard.take().expect("held until dropped");
        let guard = session
            .drained
            .wait_timeout(guard, wait)
            .unwrap_or_else(|p| p.into_inner())
            .0;
        Locked::new(session, guard)
    }
}

impl Deref for Locked<'_> {
    type Target = Inner;
    fn deref(&self) -> &Inner {
        self.guard.as_ref().expect("held until dropped")
    }
}

impl DerefMut for Locked<'_> {
    fn deref_mut(&mut self) -> &mut Inner {
        self.changed = true;
        self.guard.as_mut().expect("held until dropped")
    }
}

impl Drop for Locked<'_> {
    fn drop(&mut self) {
        self.publish();
    }
}

impl Supervised {
    pub(super) fn lock(&self) -> Locked<'_> {
        // A panic while holding the lock leaves consistent-enough data (plain counters and
        // buffers); serving the other clients matters more than poisoning.
        Locked::new(self, self.inner.lock().unwrap_or_else(|p| p.into_inner()))
    }

    fn shown_slot(&self) -> MutexGuard<'_, Arc<Shown>> {
        self.shown.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The session's live status, from the last published view: never waits for `inner`.
    pub fn status(&self) -> LiveSession {
        let s = self.shown_slot().clone();
        LiveSession {
            session_key: self.key.clone(),
            lease_id: self.lease_id().map(str::to_owned),
            root_pid: self.lease.get().map(|l| l.root.pid),
            phase: s.phase,
            busy: !s.pending_prompts.is_empty(),
            pending_prompts: s.pending_prompts.clone(),
            acp_session_ids: s.acp_session_ids.clone(),
            acp_sessions: s.acp_sessions.to_vec(),
            created_at: self.created_at,
            idle_ms: s.last_traffic.elapsed().as_millis() as u64,
            output_lines: s.output_lines,
            oldest_seq: s.oldest_seq,
            last_seq: s.last_seq,
            buffered_lines: s.buffered_lines,
            buffered_bytes: s.buffered_bytes,
            attached: s.attached,
            exit_status: s.exit_status,
            output_held: s.output_held.clone(),
            output_dropped: s.output_dropped,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::freeze::Freeze;
    use super::*;

    /// A session with no child behind it (its stdin closed), over a fresh state root.
    fn detached(dir: &Path) -> Supervised {
        let root = StateRoot::open(dir).unwrap();
        let store = Store::open(&root.db_path()).unwrap();
        let limits = Limits {
            lines: 100,
            bytes: 1 << 20,
        };
        let inner = Inner::new(limits, 0);
        Supervised {
            key: "k".into(),
            argv: vec![],
            lease: OnceLock::new(),
            root,
            child_pid: 0,
            created_at: now_ms(),
            item_cap: 1024,
            store: Arc::new(Mutex::new(store)),
            stdin: Mutex::new(StdinPipe::new(None)),
            ops: Mutex::new(()),
            shown: Mutex::new(Arc::new(Shown::of(&inner))),
            inner: Mutex::new(inner),
            changed: Condvar::new(),
            drained: Condvar::new(),
            tracking: AtomicBool::new(false),
            report_failed: AtomicBool::new(false),
            freeze: Arc::new(Freeze::new().unwrap()),
            handed: Mutex::new(HandedIo::default()),
            settling: AtomicBool::new(false),
        }
    }

    #[test]
    fn the_view_follows_every_write_and_only_writes_publish() {
        let dir = std::env::temp_dir().join(format!("leash-shown-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        struct Cleanup(std::path::PathBuf);
        impl Drop for Cleanup {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(&self.0);
            }
        }
        let _cleanup = Cleanup(dir.clone());
        let s = detached(&dir.join("state"));
        assert_eq!(s.status().output_lines, 0);
        {
            let g = s.lock();
            let _ = g.output_lines; // a read
        }
        let before = Arc::as_ptr(&s.shown_slot());
        {
            let g = s.lock();
            let _ = g.replay.last_seq();
        }
        assert_eq!(
            before,
            Arc::as_ptr(&s.shown_slot()),
            "a read publishes nothing"
        );
        s.lock().output_lines += 3;
        assert_eq!(
            s.status().output_lines,
            3,
            "a write is shown once the lock is let go"
        );
        s.attached(1);
        assert_eq!(s.status().attached, 1);
        // A waiter publishes before it lets the lock go.
        let mut g = s.lock();
        g.output_lines = 7;
        let g = g.wait_timeout(Duration::from_millis(1));
        assert_eq!(s.status().output_lines, 7);
        drop(g);
        // While a writer holds `inner`, status answers from the last view.
        let mut g = s.lock();
        g.output_lines = 9;
        assert_eq!(
            s.status().output_lines,
            7,
            "status does not wait for the holder"
        );
        drop(g);
        assert_eq!(s.status().output_lines, 9);
    }
}
