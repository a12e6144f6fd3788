//! How attached readers take items from the session's replay buffer (`replay.rs`) by cursor,
//! and how stored events enter it.

use super::base::*;
use super::replay::{Batch, Item, Run};
use super::supervised::*;

impl Inner {
    pub(super) fn push_event(&mut self, e: Event) {
        self.seqs.synced(e.seq);
        if e.seq <= self.replay.last_seq() {
            return;
        }
        self.seqs.skip_past(e.seq);
        let rest = format!(
            ",\"type\":\"event\",\"kind\":{},\"leaseId\":{},\"detail\":{},\"at\":{}",
            serde_json::to_string(&e.kind).expect("strings serialise"),
            serde_json::to_string(&e.lease_id).expect("strings serialise"),
            e.detail.unwrap_or(Value::Null),
            e.at
        );
        self.push(Item::single(e.seq, &rest, false));
    }

    pub(super) fn push(&mut self, item: Item) {
        self.replay.push(item);
    }
}

impl Supervised {
    /// Where an attach may start: `Err` when `since` fell out of the buffer.
    pub fn check_since(&self, since: i64) -> Result<(Option<i64>, i64), (i64, i64)> {
        self.lock().replay.check_since(since)
    }

    /// Registers a live attach at `cursor` (see the module docs of `replay`); its token for
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
    /// New items go into `run` ([`Batch::Items`]).
    pub fn next_batch(
        &self,
        token: u64,
        cursor: i64,
        max: usize,
        wait: Duration,
        run: &mut Run,
    ) -> Batch {
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
            match g.replay.run_after(cursor, max, run) {
                Err((oldest_seq, last_seq)) => {
                    return Batch::Evicted {
                        oldest_seq,
                        last_seq,
                    }
                }
                Ok(()) if !run.is_empty() => return Batch::Items,
                Ok(()) => {}
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
