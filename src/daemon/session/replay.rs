//! The replay buffer: every stream item of the session with its seq, bounded by
//! `--replay-lines` and `--replay-bytes` (the newest item is always kept), and how attached
//! readers take items from it by cursor.
//!
//! **Backpressure.** Every live attach registers its cursor here (the seq it has been sent up
//! to). An item that the slowest live attach has not been sent yet is never evicted, and the
//! output reader does not read the adapter's stdout while the buffer is full and its oldest item
//! is still unsent to that attach ([`Replay::behind`]): the kernel pipe fills and the adapter
//! blocks in `write`, as behind a pipe. The buffer may exceed its bounds by the one chunk read
//! before the reader stops. An attach stops governing when it ends (its client was dropped for
//! not reading past the stall deadline, detached, hung up) and, for the rest of the stream, once
//! a close began ([`Replay::release`]), so that a close never waits on a client.

use super::*;

/// One buffered stream item: its seq and its pre-rendered JSON body (without the request id).
#[derive(Debug, Clone)]
pub struct Item {
    pub seq: i64,
    pub body: Arc<str>,
    /// A line of the adapter's stderr: streamed only to attaches that asked for them.
    pub stderr: bool,
}

/// What an attached reader gets from [`Supervised::next_batch`].
#[derive(Debug)]
pub enum Batch {
    Items(Vec<Item>),
    /// The session ended and every item up to `last_seq` was handed out.
    Ended {
        last_seq: i64,
        /// The adapter exited before its first line of output (the stream ends `start_failed`).
        start_failed: Option<super::StartFailure>,
    },
    /// Nothing new within the wait.
    Idle,
    /// The cursor fell out of the buffer.
    Evicted {
        oldest_seq: i64,
        last_seq: i64,
    },
}

/// The buffered items of one session, oldest first, within its [`Limits`]. Seqs only go up:
/// an item is pushed with a seq above every buffered one.
#[derive(Debug)]
pub(super) struct Replay {
    limits: Limits,
    items: VecDeque<Item>,
    bytes: usize,
    /// The highest seq that was dropped from the buffer.
    evicted_upto: i64,
    /// The newest item's seq (the session's last seq before any item).
    last: i64,
    /// The cursors of the live attaches, by token (see the module docs).
    readers: HashMap<u64, i64>,
    next_reader: u64,
    /// The lowest of `readers` (none: nothing holds the buffer), while not released.
    slowest: Option<i64>,
    /// A close began: attaches no longer hold the buffer or the reader back.
    released: bool,
}

impl Replay {
    /// An empty buffer after `last` (the session's last stored seq).
    pub(super) fn new(limits: Limits, last: i64) -> Replay {
        Replay {
            limits,
            items: VecDeque::new(),
            bytes: 0,
            evicted_upto: 0,
            last,
            readers: HashMap::new(),
            next_reader: 0,
            slowest: None,
            released: false,
        }
    }

    /// Registers a live attach whose cursor is `cursor`; its token for [`Replay::advance`].
    pub(super) fn join(&mut self, cursor: i64) -> u64 {
        self.next_reader += 1;
        self.readers.insert(self.next_reader, cursor);
        self.recompute();
        self.next_reader
    }

    /// The attach `token` has been sent everything up to `cursor`.
    pub(super) fn advance(&mut self, token: u64, cursor: i64) {
        if let Some(c) = self.readers.get_mut(&token) {
            if *c != cursor {
                *c = cursor;
                self.recompute();
            }
        }
    }

    /// The attach `token` ended: it no longer holds anything back.
    pub(super) fn leave(&mut self, token: u64) {
        self.readers.remove(&token);
        self.recompute();
    }

    /// While `released`, no attach holds the buffer or the reader back (the session ended).
    pub(super) fn release(&mut self, released: bool) {
        self.released = released;
        self.recompute();
    }

    fn recompute(&mut self) {
        self.slowest = if self.released {
            None
        } else {
            self.readers.values().copied().min()
        };
    }

    /// Whether the output reader must wait: the buffer is at a bound and its oldest item has
    /// not been sent to the slowest live attach yet.
    pub(super) fn behind(&self) -> bool {
        let Some(slowest) = self.slowest else {
            return false;
        };
        let full = self.items.len() >= self.limits.lines || self.bytes >= self.limits.bytes;
        full && self.oldest_seq().is_some_and(|o| o > slowest)
    }

    /// Appends an item, then drops the oldest while over a bound (never the newest).
    pub(super) fn push(&mut self, seq: i64, body: Arc<str>, stderr: bool) {
        self.bytes += body.len();
        self.items.push_back(Item { seq, body, stderr });
        self.last = seq;
        while (self.items.len() > self.limits.lines || self.bytes > self.limits.bytes)
            && self.items.len() > 1
            && self
                .slowest
                .is_none_or(|c| self.items.front().is_some_and(|i| i.seq <= c))
        {
            let old = self.items.pop_front().expect("non-empty");
            self.bytes -= old.body.len();
            self.evicted_upto = old.seq;
        }
    }

    /// The newest seq handed out.
    pub(super) fn last_seq(&self) -> i64 {
        self.last
    }

    /// The oldest buffered seq.
    pub(super) fn oldest_seq(&self) -> Option<i64> {
        self.items.front().map(|i| i.seq)
    }

    pub(super) fn len(&self) -> usize {
        self.items.len()
    }

    pub(super) fn bytes(&self) -> usize {
        self.bytes
    }

    /// Where a reader that has seen `since` may start: `Ok((oldest, last))`, or
    /// `Err((oldest, last))` when items after `since` were dropped.
    pub(super) fn check_since(&self, since: i64) -> Result<(Option<i64>, i64), (i64, i64)> {
        let oldest = self.oldest_seq();
        if since < self.evicted_upto {
            return Err((oldest.unwrap_or(self.last), self.last));
        }
        Ok((oldest, self.last))
    }

    /// Up to `max` items with a seq above `cursor` (none yet: empty), or `Err((oldest, last))`
    /// when the cursor fell out of the buffer.
    pub(super) fn after(&self, cursor: i64, max: usize) -> Result<Vec<Item>, (i64, i64)> {
        if cursor < self.evicted_upto {
            return Err((self.oldest_seq().unwrap_or(self.last), self.last));
        }
        let start = self.items.partition_point(|i| i.seq <= cursor);
        Ok(self.items.range(start..).take(max).cloned().collect())
    }
}

impl Inner {
    pub(super) fn push_event(&mut self, e: Event) {
        self.seqs.synced(e.seq);
        if e.seq <= self.replay.last_seq() {
            return;
        }
        self.seqs.skip_past(e.seq);
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

    pub(super) fn push(&mut self, seq: i64, body: Arc<str>) {
        self.push_item(seq, body, false);
    }

    pub(super) fn push_item(&mut self, seq: i64, body: Arc<str>, stderr: bool) {
        self.replay.push(seq, body, stderr);
    }
}

impl Supervised {
    /// Where an attach may start: `Err` when `since` fell out of the buffer.
    pub fn check_since(&self, since: i64) -> Result<(Option<i64>, i64), (i64, i64)> {
        self.lock().replay.check_since(since)
    }

    /// Registers a live attach at `cursor` (see the module docs); its token for
    /// [`Supervised::next_batch`] and [`Supervised::leave`].
    pub fn join(&self, cursor: i64) -> u64 {
        let mut g = self.lock();
        g.attached += 1;
        g.replay.join(cursor)
    }

    /// The attach `token` ended: the output reader is woken, it may no longer be held back.
    pub fn leave(&self, token: u64) {
        {
            let mut g = self.lock();
            g.attached = g.attached.saturating_sub(1);
            g.replay.leave(token);
        }
        self.drained.notify_all();
    }

    /// Items with a seq above `cursor` (at most `max`), waiting up to `wait` for new ones.
    /// `cursor` is what attach `token` has been sent: the output reader, held back by it, is
    /// woken once it is no longer.
    pub fn next_batch(&self, token: u64, cursor: i64, max: usize, wait: Duration) -> Batch {
        let mut g = self.lock();
        {
            // Not shown in status: no publish per batch.
            let inner = g.quiet_mut();
            inner.replay.advance(token, cursor);
            if inner.reader_waiting && !inner.replay.behind() {
                self.drained.notify_all();
            }
        }
        let deadline = Instant::now() + wait;
        loop {
            match g.replay.after(cursor, max) {
                Err((oldest_seq, last_seq)) => {
                    return Batch::Evicted {
                        oldest_seq,
                        last_seq,
                    }
                }
                Ok(items) if !items.is_empty() => return Batch::Items(items),
                Ok(_) => {}
            }
            if g.life.is_ended() {
                return Batch::Ended {
                    last_seq: g.replay.last_seq(),
                    start_failed: g.start_failure.clone(),
                };
            }
            let now = Instant::now();
            if now >= deadline {
                return Batch::Idle;
            }
            g = g.wait_timeout(deadline - now);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(n: usize) -> Arc<str> {
        Arc::from("x".repeat(n).as_str())
    }

    fn seqs(items: &[Item]) -> Vec<i64> {
        items.iter().map(|i| i.seq).collect()
    }

    #[test]
    fn an_empty_buffer_starts_after_the_stored_seqs() {
        let r = Replay::new(
            Limits {
                lines: 3,
                bytes: 100,
            },
            40,
        );
        assert_eq!(r.last_seq(), 40);
        assert_eq!(r.oldest_seq(), None);
        assert_eq!(r.check_since(0), Ok((None, 40)));
        assert_eq!(r.after(0, 10).unwrap().len(), 0);
    }

    #[test]
    fn the_oldest_items_go_first_by_count_and_the_cursor_says_when_it_fell_out() {
        let mut r = Replay::new(
            Limits {
                lines: 3,
                bytes: 1000,
            },
            0,
        );
        for seq in [1, 2, 5, 6, 7] {
            r.push(seq, body(1), false);
        }
        assert_eq!((r.len(), r.oldest_seq(), r.last_seq()), (3, Some(5), 7));
        assert_eq!(
            r.after(0, 10).unwrap_err(),
            (5, 7),
            "items 1 and 2 are gone"
        );
        // A reader that saw 2 (the last dropped) misses nothing: seqs 3 and 4 never existed.
        assert_eq!(seqs(&r.after(2, 10).unwrap()), vec![5, 6, 7]);
        assert_eq!(seqs(&r.after(5, 1).unwrap()), vec![6]);
        assert!(r.after(7, 10).unwrap().is_empty());
        assert_eq!(r.check_since(1), Err((5, 7)));
        assert_eq!(r.check_since(2), Ok((Some(5), 7)));
    }

    #[test]
    fn bytes_bound_the_buffer_but_the_newest_item_is_always_kept() {
        let mut r = Replay::new(
            Limits {
                lines: 100,
                bytes: 10,
            },
            0,
        );
        r.push(1, body(4), false);
        r.push(2, body(4), true);
        assert_eq!((r.len(), r.bytes()), (2, 8));
        r.push(3, body(4), false);
        assert_eq!((r.len(), r.bytes(), r.oldest_seq()), (2, 8, Some(2)));
        assert!(r.after(1, 10).unwrap()[0].stderr, "the stderr flag is kept");
        r.push(4, body(50), false);
        assert_eq!((r.len(), r.bytes(), r.oldest_seq()), (1, 50, Some(4)));
        assert_eq!(r.check_since(3), Ok((Some(4), 4)));
    }

    #[test]
    fn a_live_reader_keeps_what_it_was_not_sent_and_holds_the_reader_back() {
        let mut r = Replay::new(
            Limits {
                lines: 3,
                bytes: 1000,
            },
            0,
        );
        let slow = r.join(0);
        let fast = r.join(0);
        for seq in 1..=5 {
            r.push(seq, body(1), false);
        }
        assert_eq!(r.len(), 5, "nothing unsent is evicted");
        assert!(r.behind(), "a full buffer whose oldest item is unsent");
        r.advance(fast, 5);
        assert!(r.behind(), "the slowest governs");
        r.advance(slow, 1);
        assert!(!r.behind(), "the oldest item was sent");
        r.push(6, body(1), false);
        assert_eq!(
            r.oldest_seq(),
            Some(2),
            "only what every reader was sent goes"
        );
        assert!(r.behind());
        r.leave(slow);
        assert!(!r.behind(), "an attach that ended holds nothing back");
        r.push(7, body(1), false);
        assert_eq!((r.len(), r.oldest_seq()), (3, Some(5)));
        r.advance(fast, 5);
        let slow = r.join(5);
        r.push(8, body(1), false);
        assert!(r.behind());
        r.release(true);
        assert!(!r.behind(), "an ended session holds nothing back");
        r.push(9, body(1), false);
        assert_eq!(r.oldest_seq(), Some(7));
        r.leave(slow);
    }
}
