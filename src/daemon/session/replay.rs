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

impl Inner {
    pub(super) fn push_event(&mut self, e: Event) {
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

    pub(super) fn push(&mut self, seq: i64, body: Arc<str>) {
        self.push_item(seq, body, false);
    }

    pub(super) fn push_item(&mut self, seq: i64, body: Arc<str>, stderr: bool) {
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

impl Session {
    /// Where an attach may start: `Err` when `since` fell out of the buffer.
    pub fn check_since(&self, since: i64) -> Result<(Option<i64>, i64), (i64, i64)> {
        let g = self.lock();
        let oldest = g.items.front().map(|i| i.seq);
        if since < g.evicted_upto {
            return Err((oldest.unwrap_or(g.last_emitted), g.last_emitted));
        }
        Ok((oldest, g.last_emitted))
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
}
