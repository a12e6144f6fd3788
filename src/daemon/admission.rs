//! Admission of `ensure`s, one per session key, and how a `close` of a key meets an ensure of it
//! that is in flight.
//!
//! An ensure takes its key's **slot** before it spawns anything and gives it back when it
//! replies. A second ensure of the key meanwhile **queues** behind it (FIFO, at most
//! [`MAX_QUEUED`] per key, each until its own deadline, `queueTimeoutMs`): once admitted it looks
//! at the key afresh, so it gets the outcome it would have had alone (the session its
//! predecessor started is `running`, `created: false`; a predecessor that failed or was closed
//! left nothing, so it starts a new one). A close that arrives while an ensure holds the slot is
//! served before the queued ensures (it registers on the holder's slot, which is released only
//! once the close finished), so "ensure A, close, ensure B" closes A's session and B starts anew.
//! A queue that is full, or a deadline that passes in the queue, is `conflict`, and the queued
//! ensure started nothing.
//!
//! **A close that arrives while an ensure holds the slot** waits for it and closes what it
//! started: it registers on the slot, waits until the ensure has its session under a lease (or
//! ended without one), and then closes it through the normal close path. The ensure, seeing the
//! close registered, stops watching its adapter, waits for the close to finish, and answers
//! `closed` (not a spawn failure, not `running`): no session survives a close, and neither reply
//! is false. Registering and the ensure's release take the slot's one lock, so a close is either
//! seen by the ensure (it answers `closed`) or comes after its reply (an ordinary close).
//!
//! **Every close of the daemon meets the ensure the same way**, whichever route it takes: the
//! `close` op registers before it looks for the session; an idle close, a shutdown close and a
//! takeover register in the shared close path ([`Admission::close_meets`]) once they marked the
//! session closing. An ensure whose session a close of the daemon began on waits, at its release,
//! for that close's registration, so no ensure answers success for a session a close took (an
//! `initialize` that never came back, say). The ensure's own closes (a start or a handshake that
//! timed out) are its answer and register nothing ([`Ticket::closing_itself`]).

use super::session::Supervised;
use crate::controller::CloseOutcome;
use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// How many ensures of one key may wait behind the one in flight; more are refused (`conflict`).
pub(crate) const MAX_QUEUED: usize = 16;

/// The keys whose `ensure` is in flight, and the ensures queued behind them.
#[derive(Default)]
pub(crate) struct Admission {
    slots: Mutex<HashMap<String, Arc<Slot>>>,
    /// The queued ensures of each key, in arrival order (their ticket numbers).
    queues: Mutex<Queues>,
    /// Signalled whenever a slot is given back or a queued ensure leaves its queue.
    freed: Condvar,
}

#[derive(Default)]
struct Queues {
    next: u64,
    waiting: HashMap<String, std::collections::VecDeque<u64>>,
}

/// Why an ensure was not admitted.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Refused {
    /// [`MAX_QUEUED`] ensures of the key wait already.
    QueueFull,
    /// The deadline passed while the ensure waited in the queue.
    TimedOut,
}

/// One key's ensure in flight.
#[derive(Default)]
pub(crate) struct Slot {
    state: Mutex<SlotState>,
    changed: Condvar,
}

#[derive(Default)]
struct SlotState {
    /// The ensure's session, once its lease and the adapter's start are confirmed.
    session: Option<Arc<Supervised>>,
    /// The ensure replied (or gave up): a close arriving now is an ordinary close.
    released: bool,
    close: CloseState,
    /// The ensure closes its session itself (its start or handshake timed out).
    closing_itself: bool,
}

#[derive(Default, Clone)]
enum CloseState {
    #[default]
    None,
    /// A close waits for (or runs on) the ensure's session.
    Requested,
    /// The close finished; its outcome for the ensure's lease, if it had one.
    Done(Option<CloseOutcome>),
}

/// What an ensure learns when it releases its slot.
pub(crate) enum Release {
    /// No close arrived: the ensure answers as it would alone.
    Alone,
    /// A close arrived while the ensure was in flight and finished with this outcome.
    Closed(Option<CloseOutcome>),
}

impl Admission {
    fn map(&self) -> MutexGuard<'_, HashMap<String, Arc<Slot>>> {
        self.slots.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes `key`'s slot; `None` while another ensure of the key holds it.
    fn try_enter(&self, m: &mut HashMap<String, Arc<Slot>>, key: &str) -> Option<Ticket<'_>> {
        if m.contains_key(key) {
            return None;
        }
        let slot = Arc::new(Slot::default());
        m.insert(key.to_string(), slot.clone());
        Some(Ticket {
            admission: self,
            key: key.to_string(),
            slot,
        })
    }

    /// Takes `key`'s slot, queueing (FIFO) behind the ensures of the key already in flight or
    /// waiting, for at most `limit` (0: refused at once when the slot is taken).
    pub(crate) fn enter(&self, key: &str, limit: Duration) -> Result<Ticket<'_>, Refused> {
        let deadline = Instant::now() + limit;
        // Lock order: `queues`, then `slots` (a released ticket takes `slots` alone, then
        // notifies `freed` with neither held).
        let mut q = self.queues.lock().unwrap_or_else(|p| p.into_inner());
        let nobody_waits = q.waiting.get(key).is_none_or(|w| w.is_empty());
        if nobody_waits {
            if let Some(t) = self.try_enter(&mut self.map(), key) {
                return Ok(t);
            }
        }
        if q.waiting.get(key).map_or(0, |w| w.len()) >= MAX_QUEUED {
            return Err(Refused::QueueFull);
        }
        q.next += 1;
        let me = q.next;
        let line = q.waiting.entry(key.to_string()).or_default();
        line.push_back(me);
        tracing::info!(
            session_key = key,
            position = line.len(),
            "ensure queued behind an ensure of the same key in flight"
        );
        loop {
            let first = q.waiting.get(key).and_then(|w| w.front()) == Some(&me);
            if first {
                if let Some(t) = self.try_enter(&mut self.map(), key) {
                    Self::leave(&mut q, key, me);
                    drop(q);
                    // The next in line may now wait for this ticket's release.
                    self.freed.notify_all();
                    return Ok(t);
                }
            }
            let now = Instant::now();
            if now >= deadline {
                Self::leave(&mut q, key, me);
                drop(q);
                self.freed.notify_all();
                return Err(Refused::TimedOut);
            }
            q = self
                .freed
                .wait_timeout(q, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    fn leave(q: &mut Queues, key: &str, me: u64) {
        if let Some(w) = q.waiting.get_mut(key) {
            w.retain(|t| *t != me);
            if w.is_empty() {
                q.waiting.remove(key);
            }
        }
    }

    /// An ensure of `key` holds its slot.
    pub(crate) fn in_flight(&self, key: &str) -> bool {
        self.map().contains_key(key)
    }

    /// No ensure is in flight.
    pub(crate) fn is_empty(&self) -> bool {
        self.map().is_empty()
    }

    /// A close of `key`: when an ensure of it is in flight, registers on its slot and waits (at
    /// most `limit`) until the ensure has its session or ended without one. The returned
    /// [`PendingClose`] tells the ensure how the close ended (on drop at the latest).
    pub(crate) fn close_arrives(&self, key: &str, limit: Duration) -> Option<PendingClose> {
        let slot = self.map().get(key).cloned()?;
        let deadline = Instant::now() + limit;
        let mut st = slot.lock();
        if st.released {
            return None;
        }
        st.close = CloseState::Requested;
        slot.changed.notify_all();
        while st.session.is_none() && !st.released {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            st = slot
                .changed
                .wait_timeout(st, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        drop(st);
        Some(PendingClose { slot, done: false })
    }

    /// A close that marked `key`'s session closing (the shared close path): when an ensure of
    /// the key is in flight and no close registered on it yet, registers, so the ensure answers
    /// with this close's outcome. Never waits: the session is there already.
    pub(crate) fn close_meets(&self, key: &str) -> Option<PendingClose> {
        let slot = self.map().get(key).cloned()?;
        let mut st = slot.lock();
        if st.released || st.closing_itself || !matches!(st.close, CloseState::None) {
            return None;
        }
        st.close = CloseState::Requested;
        drop(st);
        slot.changed.notify_all();
        Some(PendingClose { slot, done: false })
    }
}

impl Slot {
    fn lock(&self) -> MutexGuard<'_, SlotState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// An ensure's hold on its key's slot; released on drop (or by [`Ticket::release`]).
pub(crate) struct Ticket<'a> {
    admission: &'a Admission,
    key: String,
    slot: Arc<Slot>,
}

impl Ticket<'_> {
    /// The ensure's session is under a lease and its adapter started: a waiting close may go on.
    pub(crate) fn publish(&self, s: &Arc<Supervised>) {
        self.slot.lock().session = Some(s.clone());
        self.slot.changed.notify_all();
    }

    /// A close of the key arrived while this ensure is in flight.
    pub(crate) fn close_requested(&self) -> bool {
        !matches!(self.slot.lock().close, CloseState::None)
    }

    /// The ensure is about to close its own session (its answer says why): that close does not
    /// register as one that met it.
    pub(crate) fn closing_itself(&self) {
        self.slot.lock().closing_itself = true;
    }

    /// Gives the slot back. When a close registered before that, waits (at most `limit`) for it
    /// to finish and says so; a close registering later is an ordinary close.
    pub(crate) fn release(self, limit: Duration) -> Release {
        let deadline = Instant::now() + limit;
        let mut st = self.slot.lock();
        if st.session.is_none() {
            // Nothing was started (the ensure failed): a waiting close goes on as an ordinary
            // one and finds nothing of this ensure to close.
            st.released = true;
            drop(st);
            self.slot.changed.notify_all();
            return Release::Alone;
        }
        let release = loop {
            // A close of the daemon that began on the session registers right after it marked
            // it (the shared close path): wait for it, as for a registered close.
            let marked = st.session.as_ref().is_some_and(|s| s.close_begun());
            match &st.close {
                CloseState::None if st.closing_itself || !marked => break Release::Alone,
                CloseState::None => {}
                CloseState::Done(out) => break Release::Closed(out.clone()),
                CloseState::Requested => {}
            }
            let now = Instant::now();
            if now >= deadline {
                break Release::Closed(None);
            }
            st = self
                .slot
                .changed
                .wait_timeout(st, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        };
        st.released = true;
        drop(st);
        release
    }
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        self.slot.lock().released = true;
        self.slot.changed.notify_all();
        let mut m = self.admission.map();
        if m.get(&self.key).is_some_and(|s| Arc::ptr_eq(s, &self.slot)) {
            m.remove(&self.key);
        }
        drop(m);
        // Taking `queues` before notifying: a queued ensure between its look at the slot and its
        // wait holds that lock, so the wake-up cannot fall between the two.
        drop(
            self.admission
                .queues
                .lock()
                .unwrap_or_else(|p| p.into_inner()),
        );
        self.admission.freed.notify_all();
    }
}

/// A close registered on an ensure's slot; tells the ensure the outcome (on drop at the latest,
/// so an ensure never waits for a close that failed).
pub(crate) struct PendingClose {
    slot: Arc<Slot>,
    done: bool,
}

impl PendingClose {
    /// The ensure's session, if it has one (the close names its lease).
    pub(crate) fn session(&self) -> Option<Arc<Supervised>> {
        self.slot.lock().session.clone()
    }

    /// The close finished with these outcomes: the ensure's lease's one is handed over.
    pub(crate) fn done(mut self, outcomes: Option<&[CloseOutcome]>) {
        let lease = self.session().and_then(|s| s.lease_id().map(str::to_owned));
        let mine = outcomes.and_then(|out| {
            out.iter()
                .find(|o| Some(o.lease_id.as_str()) == lease.as_deref())
                .cloned()
        });
        self.finish(mine);
    }

    fn finish(&mut self, outcome: Option<CloseOutcome>) {
        self.done = true;
        self.slot.lock().close = CloseState::Done(outcome);
        self.slot.changed.notify_all();
    }
}

impl Drop for PendingClose {
    fn drop(&mut self) {
        if !self.done {
            self.finish(None);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_ensure_per_key_and_a_close_after_the_release_is_ordinary() {
        let a = Admission::default();
        let t = a.enter("k", Duration::ZERO).expect("free");
        assert_eq!(
            a.enter("k", Duration::ZERO).err(),
            Some(Refused::TimedOut),
            "a second ensure of the key that will not wait"
        );
        assert!(a.enter("other", Duration::ZERO).is_ok());
        assert!(!t.close_requested());
        assert!(matches!(t.release(Duration::from_secs(1)), Release::Alone));
        assert!(a.is_empty());
        assert!(a.close_arrives("k", Duration::from_secs(1)).is_none());
    }

    #[test]
    fn a_close_waits_for_an_ensure_that_starts_nothing_and_goes_on() {
        let a = Arc::new(Admission::default());
        let t = a.enter("k", Duration::ZERO).unwrap();
        let a2 = a.clone();
        // No session is ever published (the ensure failed): the close waits until the ensure
        // gives up, then goes on as an ordinary close; the ensure keeps its own answer.
        let closer = std::thread::spawn(move || {
            let p = a2
                .close_arrives("k", Duration::from_secs(10))
                .expect("in flight");
            assert!(p.session().is_none());
            p.done(None);
        });
        while !t.close_requested() {
            std::thread::yield_now();
        }
        assert!(matches!(t.release(Duration::from_secs(10)), Release::Alone));
        closer.join().unwrap();
        assert!(a.is_empty());
    }

    #[test]
    fn queued_ensures_are_admitted_in_order_and_the_queue_is_bounded() {
        let a = Arc::new(Admission::default());
        let first = a.enter("k", Duration::ZERO).unwrap();
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut waiters = Vec::new();
        for i in 0..MAX_QUEUED {
            let (a2, order) = (a.clone(), order.clone());
            waiters.push(std::thread::spawn(move || {
                let t = a2.enter("k", Duration::from_secs(60)).expect("admitted");
                order.lock().unwrap().push(i);
                drop(t);
            }));
            // Each is queued before the next arrives, so the arrival order is known.
            while a
                .queues
                .lock()
                .unwrap()
                .waiting
                .get("k")
                .map_or(0, |w| w.len())
                <= i
            {
                std::thread::yield_now();
            }
        }
        assert_eq!(
            a.enter("k", Duration::from_secs(60)).err(),
            Some(Refused::QueueFull)
        );
        drop(first);
        for w in waiters {
            w.join().unwrap();
        }
        assert_eq!(*order.lock().unwrap(), (0..MAX_QUEUED).collect::<Vec<_>>());
        assert!(a.is_empty());
    }

    #[test]
    fn a_queued_ensure_gives_up_at_its_deadline_and_leaves_the_queue() {
        let a = Admission::default();
        let _held = a.enter("k", Duration::ZERO).unwrap();
        assert_eq!(
            a.enter("k", Duration::from_millis(20)).err(),
            Some(Refused::TimedOut)
        );
        assert!(a.queues.lock().unwrap().waiting.is_empty());
    }
}
