//! The seqs output lines may take ([`Seqs`]): blocks of [`SEQ_BLOCK`] seqs reserved in the
//! store (`reserve.rs` reserves them and merges events into the stream; see the module docs of
//! `session`).

use super::base::*;

/// The seqs output lines may take: those of the block last reserved in the store, in order,
/// never one beyond it; an event merged into the stream pushes the next one above its own.
#[derive(Debug)]
pub(super) struct Seqs {
    next: i64,
    reserved_upto: i64,
    /// The length of the block last reserved, and when it was asked for.
    block: i64,
    reserved_at: Option<Instant>,
    /// The highest stored event seq merged into the stream.
    last_synced: i64,
}

impl Seqs {
    /// Nothing reserved yet; `last` is the session's last stored seq.
    pub(super) fn new(last: i64) -> Seqs {
        Seqs {
            next: last + 1,
            reserved_upto: last,
            block: SEQ_BLOCK,
            reserved_at: None,
            last_synced: last,
        }
    }

    /// After a handoff: nothing reserved (the next output reserves above `last`, the store's
    /// last seq), the stored events up to `last_synced` already in the stream.
    pub(super) fn adopt(last: i64, last_synced: i64) -> Seqs {
        Seqs {
            last_synced,
            ..Seqs::new(last)
        }
    }

    /// The next reserved seq, or `None` when the block is used up (reserve another).
    pub(super) fn take(&mut self) -> Option<i64> {
        if self.next > self.reserved_upto {
            return None;
        }
        let seq = self.next;
        self.next += 1;
        Some(seq)
    }

    /// Up to `max` more consecutive seqs of the reserved block, as [`Seqs::take`] would give
    /// them one by one: the first and how many (0 when the block is used up).
    pub(super) fn take_run(&mut self, max: usize) -> (i64, usize) {
        let left = usize::try_from(self.reserved_upto - self.next + 1).unwrap_or(0);
        let k = left.min(max);
        let first = self.next;
        self.next += k as i64;
        (first, k)
    }

    /// How many seqs to reserve next, asked at `now`: [`SEQ_BLOCK`], or twice the last block
    /// (up to [`MAX_SEQ_BLOCK`]) when that one was reserved less than [`SEQ_BLOCK_FAST`] ago
    /// and a live attach reads the output (`read`). A flood relayed to a client then costs one
    /// store write per up to 65,536 lines instead of per 1,024; a quiet session keeps small
    /// blocks (what a block leaves unused is skipped, as ever: seqs never repeat or go back).
    /// A flood nobody reads keeps small blocks too: it only fills the replay buffer, and with
    /// large blocks 100 such sessions took the CPU their reader had spent waiting on the store,
    /// and `status` p99 went from ≈ 25 ms to 90–300 ms (docs/benchmarks.md).
    pub(super) fn block_len(&mut self, now: Instant, read: bool) -> i64 {
        self.block = match self.reserved_at {
            Some(at) if read && now.saturating_duration_since(at) < SEQ_BLOCK_FAST => {
                (self.block * 2).min(MAX_SEQ_BLOCK)
            }
            _ => SEQ_BLOCK,
        };
        self.reserved_at = Some(now);
        self.block
    }

    /// The store reserved `len` seqs from `start` (all above the events it returned with them).
    pub(super) fn reserved(&mut self, start: i64, len: i64) {
        self.next = self.next.max(start);
        self.reserved_upto = start + len - 1;
    }

    /// Stored events up to `seq` were read.
    pub(super) fn synced(&mut self, seq: i64) {
        self.last_synced = self.last_synced.max(seq);
    }

    /// An event with this seq went into the stream: output goes above it.
    pub(super) fn skip_past(&mut self, seq: i64) {
        self.next = self.next.max(seq + 1);
    }

    pub(super) fn last_synced(&self) -> i64 {
        self.last_synced
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_grow_while_output_floods_in_and_shrink_when_it_slows() {
        let mut s = Seqs::new(0);
        let t = Instant::now();
        let ms = |n| t + Duration::from_millis(n);
        assert_eq!(s.block_len(t, true), SEQ_BLOCK, "the first block");
        assert_eq!(s.block_len(ms(10), true), 2 * SEQ_BLOCK);
        assert_eq!(s.block_len(ms(20), true), 4 * SEQ_BLOCK);
        for i in 0..10 {
            s.block_len(ms(30 + i), true);
        }
        assert_eq!(
            s.block_len(ms(50), true),
            MAX_SEQ_BLOCK,
            "never past the largest"
        );
        assert_eq!(
            s.block_len(ms(50) + SEQ_BLOCK_FAST, true),
            SEQ_BLOCK,
            "a block that lasted a while: back to the first size"
        );
        assert_eq!(s.block_len(ms(60) + SEQ_BLOCK_FAST, true), 2 * SEQ_BLOCK);
    }

    #[test]
    fn a_flood_nobody_reads_keeps_small_blocks() {
        let mut s = Seqs::new(0);
        let t = Instant::now();
        let ms = |n| t + Duration::from_millis(n);
        for i in 0..10 {
            assert_eq!(s.block_len(ms(i), false), SEQ_BLOCK);
        }
        // An attach comes: the blocks grow from there; it goes: back to the first size.
        assert_eq!(s.block_len(ms(11), true), 2 * SEQ_BLOCK);
        assert_eq!(s.block_len(ms(12), true), 4 * SEQ_BLOCK);
        assert_eq!(s.block_len(ms(13), false), SEQ_BLOCK);
    }

    #[test]
    fn nothing_is_handed_out_before_a_block_is_reserved() {
        let mut s = Seqs::new(12);
        assert_eq!(s.take(), None);
        assert_eq!(s.last_synced(), 12);
    }

    #[test]
    fn seqs_come_from_the_reserved_block_in_order_and_never_beyond_it() {
        let mut s = Seqs::new(0);
        s.reserved(1, 3);
        assert_eq!(
            [s.take(), s.take(), s.take(), s.take()],
            [Some(1), Some(2), Some(3), None]
        );
        // The next block may start higher (events took seqs meanwhile); the rest of the old one
        // is skipped, never reused.
        s.reserved(10, 2);
        assert_eq!([s.take(), s.take(), s.take()], [Some(10), Some(11), None]);
    }

    #[test]
    fn an_event_in_the_stream_pushes_output_above_it_and_seqs_never_go_back() {
        let mut s = Seqs::new(0);
        s.reserved(1, 100);
        assert_eq!(s.take(), Some(1));
        s.synced(5);
        s.skip_past(5);
        assert_eq!(s.take(), Some(6));
        // An older event read late changes nothing.
        s.synced(3);
        s.skip_past(3);
        assert_eq!(s.last_synced(), 5);
        assert_eq!(s.take(), Some(7));
        // A block reserved below where we are does not send seqs back.
        s.reserved(2, 10);
        assert_eq!(s.take(), Some(8));
        let mut last = 8;
        while let Some(n) = s.take() {
            assert!(n > last);
            last = n;
        }
        assert_eq!(last, 11, "the block ends at 2 + 10 - 1");
    }
}
