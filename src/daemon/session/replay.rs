//! The replay buffer: every stream item of the session with its seq, bounded by
//! `--replay-lines` and `--replay-bytes` (the newest item is always kept), and how attached
//! readers take items from it by cursor.

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
        }
    }

    /// Appends an item, then drops the oldest while over a bound (never the newest).
    pub(super) fn push(&mut self, seq: i64, body: Arc<str>, stderr: bool) {
        self.bytes += body.len();
        self.items.push_back(Item { seq, body, stderr });
        self.last = seq;
        while (self.items.len() > self.limits.lines || self.bytes > self.limits.bytes)
            && self.items.len() > 1
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

    /// Items with a seq above `cursor` (at most `max`), waiting up to `wait` for new ones.
    pub fn next_batch(&self, cursor: i64, max: usize, wait: Duration) -> Batch {
        let mut g = self.lock();
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
}
