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

use super::base::*;

/// One stream item with its text: its seq and its pre-rendered JSON body after the seq
/// (`,"type":…`), which the attach writes behind `{"id":…,"seq":N` ([`Item::write_line`]). The
/// body is a range of a shared text: the output lines of one read of the adapter share one
/// allocation, an event or a stderr line has its own. The buffer itself keeps no `Item`s: it
/// keeps a [`Slot`] per item and each text once ([`Replay`]), so that neither the output reader
/// nor an attach touches a reference count per line.
#[derive(Debug, Clone)]
pub struct Item {
    pub seq: i64,
    text: Arc<str>,
    start: u32,
    end: u32,
    /// A line of the adapter's stderr: streamed only to attaches that asked for them.
    pub stderr: bool,
}

impl Item {
    /// An item whose body after the seq (`,"type":…`) is `rest`, alone in its allocation.
    pub(super) fn single(seq: i64, rest: &str, stderr: bool) -> Item {
        Item::shared(seq, Arc::from(rest), 0..rest.len(), stderr)
    }

    /// An item whose body after the seq is `text[range]`.
    pub(super) fn shared(
        seq: i64,
        text: Arc<str>,
        range: std::ops::Range<usize>,
        stderr: bool,
    ) -> Item {
        debug_assert!(text.is_char_boundary(range.start) && text.is_char_boundary(range.end));
        debug_assert!(text[range.clone()].starts_with(",\"type\":"));
        Item {
            seq,
            start: u32::try_from(range.start).expect("a chunk's text is below 4 GiB"),
            end: u32::try_from(range.end).expect("a chunk's text is below 4 GiB"),
            text,
            stderr,
        }
    }

    /// The body after the seq: `,"type":…`.
    pub fn rest(&self) -> &str {
        &self.text[self.start as usize..self.end as usize]
    }

    /// The whole body as `stream_line` takes it: `"seq":N,"type":…`.
    pub fn body(&self) -> String {
        let mut b = format!("\"seq\":{}", self.seq);
        b.push_str(self.rest());
        b
    }

    /// The encoded size of the body (`"seq":N,"type":…`): what the replay's byte bound counts,
    /// the same as when each item held its whole body (the buffer counts its [`Slot`]s alike).
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        SEQ_KEY.len() + decimal_len(self.seq) + (self.end - self.start) as usize
    }

    /// Appends the item's line for attach `id_json` (the id rendered once per attach):
    /// `{"id":ID,"seq":N,"type":…}` and a newline, byte for byte what
    /// `stream_line_into(buf, id_json, &self.body())` writes.
    pub fn write_line(&self, buf: &mut Vec<u8>, id_json: &str) {
        write_item_line(buf, &line_prefix(id_json), self.seq, self.rest());
    }
}

/// What every item line of attach `id_json` starts with: `{"id":ID,"seq":`. Rendered once per
/// attach ([`Run::write_line`] takes it).
pub fn line_prefix(id_json: &str) -> Vec<u8> {
    let mut p = Vec::with_capacity(id_json.len() + 12);
    p.extend_from_slice(b"{\"id\":");
    p.extend_from_slice(id_json.as_bytes());
    p.push(b',');
    p.extend_from_slice(SEQ_KEY.as_bytes());
    p
}

/// The head of an attach's item lines, `{"id":ID,"seq":N`, kept from line to line: the next
/// seq is counted up in its digits (the stream's seqs mostly follow each other), so that a line
/// costs two copies and no conversion to decimal ([`LineHead::write_line`]).
#[derive(Debug)]
pub struct LineHead {
    /// [`line_prefix`] and the digits of `seq`.
    head: Vec<u8>,
    prefix: usize,
    /// The seq whose digits end `head` (none yet: `None`).
    seq: Option<i64>,
}

impl LineHead {
    /// The head for the attach whose request id is `id_json` (rendered once per attach).
    pub fn new(id_json: &str) -> LineHead {
        let head = line_prefix(id_json);
        LineHead {
            prefix: head.len(),
            head,
            seq: None,
        }
    }

    /// Appends item `slot`'s line, byte for byte what [`Run::write_line`] appends.
    pub fn write_line(&mut self, buf: &mut Vec<u8>, slot: &Slot, rest: &str) {
        self.set(slot.seq);
        buf.extend_from_slice(&self.head);
        buf.extend_from_slice(rest.as_bytes());
        buf.extend_from_slice(b"}\n");
    }

    /// Makes `head` end with the digits of `seq`.
    fn set(&mut self, seq: i64) {
        if self.seq == Some(seq) {
            return;
        }
        if self
            .seq
            .is_some_and(|s| s >= 0 && s.checked_add(1) == Some(seq))
        {
            // Count up in the digits: the last non-9 digit goes up, the 9s after it become 0s;
            // all 9s (99 → 100) renders anew.
            let digits = &mut self.head[self.prefix..];
            if let Some(k) = digits.iter().rposition(|&d| d != b'9') {
                digits[k] += 1;
                digits[k + 1..].fill(b'0');
                self.seq = Some(seq);
                return;
            }
        }
        let mut d = [0u8; 20];
        self.head.truncate(self.prefix);
        self.head.extend_from_slice(decimal(&mut d, seq));
        self.seq = Some(seq);
    }
}

/// Appends `prefix` (see [`line_prefix`]) + N + `rest` + `}` and a newline: an item's line. Four
/// copies and no formatting machinery: the attach runs this once per line.
fn write_item_line(buf: &mut Vec<u8>, prefix: &[u8], seq: i64, rest: &str) {
    let mut digits = [0u8; 20];
    let d = decimal(&mut digits, seq);
    buf.extend_from_slice(prefix);
    buf.extend_from_slice(d);
    buf.extend_from_slice(rest.as_bytes());
    buf.extend_from_slice(b"}\n");
}

/// `n` in decimal, as `format!("{n}")` writes it, in `out` (two digits a step).
fn decimal(out: &mut [u8; 20], n: i64) -> &[u8] {
    const PAIRS: &[u8; 200] = b"0001020304050607080910111213141516171819\
        2021222324252627282930313233343536373839\
        4041424344454647484950515253545556575859\
        6061626364656667686970717273747576777879\
        8081828384858687888990919293949596979899";
    let mut m = n.unsigned_abs();
    let mut i = out.len();
    while m >= 100 {
        let p = (m % 100) as usize * 2;
        m /= 100;
        i -= 2;
        out[i..i + 2].copy_from_slice(&PAIRS[p..p + 2]);
    }
    if m >= 10 {
        let p = m as usize * 2;
        i -= 2;
        out[i..i + 2].copy_from_slice(&PAIRS[p..p + 2]);
    } else {
        i -= 1;
        out[i] = b'0' + m as u8;
    }
    if n < 0 {
        // i64::MIN has 19 digits: there is room for the sign.
        i -= 1;
        out[i] = b'-';
    }
    &out[i..]
}

/// What the buffer keeps of one item: its seq, the serial of the text its body lies in
/// ([`Replay`]'s `texts`) and the body's range there. Plain data: buffering, evicting and handing
/// out a slot costs no reference count.
#[derive(Debug, Clone, Copy)]
pub struct Slot {
    pub seq: i64,
    text: u64,
    start: u32,
    end: u32,
    /// The encoded size of the body (`"seq":N,"type":…`), as an [`Item`]'s: counted once when
    /// the item is buffered, not again when it is evicted (it fits in the slot's padding).
    len: u32,
    /// A line of the adapter's stderr: streamed only to attaches that asked for them.
    pub stderr: bool,
}

impl Slot {
    fn new(seq: i64, text: u64, range: std::ops::Range<usize>, stderr: bool) -> Slot {
        let start = u32::try_from(range.start).expect("a chunk's text is below 4 GiB");
        let end = u32::try_from(range.end).expect("a chunk's text is below 4 GiB");
        Slot {
            seq,
            text,
            start,
            end,
            // A body is below 4 GiB: its range is, and a seq has at most 20 characters.
            len: (SEQ_KEY.len() + decimal_len(seq)) as u32 + (end - start),
            stderr,
        }
    }

    /// The encoded size of the body (`"seq":N,"type":…`), as an [`Item`]'s.
    fn len(&self) -> usize {
        self.len as usize
    }
}

/// A run of items handed to an attach ([`Supervised::next_batch`]): their slots, and the texts
/// they lie in (one reference per text, not per item). Reused from batch to batch.
///
/// [`Supervised::next_batch`]: super::supervised::Supervised::next_batch
#[derive(Debug, Default)]
pub struct Run {
    slots: Vec<Slot>,
    texts: Vec<Arc<str>>,
    /// The serial of `texts[0]`.
    first: u64,
}

impl Run {
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// The seq of the run's last item.
    pub fn last_seq(&self) -> Option<i64> {
        self.slots.last().map(|s| s.seq)
    }

    fn clear(&mut self) {
        self.slots.clear();
        self.texts.clear();
    }

    /// Each item: its slot and its body after the seq.
    pub fn iter(&self) -> impl Iterator<Item = (&Slot, &str)> + '_ {
        self.slots.iter().map(move |s| {
            let text = &self.texts[(s.text - self.first) as usize];
            (s, &text[s.start as usize..s.end as usize])
        })
    }

    /// Appends item `slot`'s line for the attach whose [`line_prefix`] is `prefix`, as
    /// [`Item::write_line`] does.
    pub fn write_line(buf: &mut Vec<u8>, prefix: &[u8], slot: &Slot, rest: &str) {
        write_item_line(buf, prefix, slot.seq, rest);
    }
}

const SEQ_KEY: &str = "\"seq\":";

/// The number of characters of `n` in decimal (no division: `ilog10` is a few instructions).
fn decimal_len(n: i64) -> usize {
    usize::from(n < 0) + 1 + n.unsigned_abs().checked_ilog10().unwrap_or(0) as usize
}

/// What an attached reader gets from [`Supervised::next_batch`].
///
/// [`Supervised::next_batch`]: super::supervised::Supervised::next_batch
#[derive(Debug)]
pub enum Batch {
    /// The run passed to [`Supervised::next_batch`] holds new items.
    ///
    /// [`Supervised::next_batch`]: super::supervised::Supervised::next_batch
    Items,
    /// The session ended and every item up to `last_seq` was handed out.
    Ended {
        last_seq: i64,
        /// The adapter exited before its first line of output (the stream ends `start_failed`).
        start_failed: Option<StartFailure>,
    },
    /// Nothing new within the wait.
    Idle,
    /// The cursor fell out of the buffer.
    Evicted { oldest_seq: i64, last_seq: i64 },
}

/// A replay buffer in a handoff. The items' bodies are not in the JSON document: they travel as
/// raw bytes after it ([`HandedReplay::raw`]), their seqs as runs of consecutive seqs — a
/// buffer of a million short lines is then a few MB to copy, not tens of MB of escaped JSON to
/// encode and parse.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HandedReplay {
    /// The items' seqs as `(first, count)` runs, oldest first.
    pub runs: Vec<(i64, u32)>,
    /// The seqs of the items that are stderr lines.
    pub stderr: Vec<i64>,
    /// Where the bodies are in the handoff's raw part, and how long: first the length of each
    /// body (a little-endian `u32` each), then the bodies one after the other.
    pub raw_at: u64,
    pub raw_len: u64,
    pub evicted_upto: i64,
    pub last: i64,
    /// The slowest live attach's cursor at the handoff: the next program holds the buffer there
    /// for the clients to attach again (see [`Replay::release_hold`]).
    #[serde(default)]
    pub held_cursor: Option<i64>,
    /// The raw part itself (lengths, then bodies), outside the JSON document.
    #[serde(skip)]
    pub raw: Vec<u8>,
}

/// A handed item: its seq, the range of its body in the shared text, whether it is stderr.
type HandedItem = (i64, std::ops::Range<usize>, bool);

impl HandedReplay {
    /// The items, from the runs and the raw part: `(seq, body, stderr)`, the bodies ranges of one
    /// shared text.
    fn items(&self) -> Result<(Arc<str>, Vec<HandedItem>), String> {
        let n: usize = self.runs.iter().map(|r| r.1 as usize).sum();
        let lens_end = n
            .checked_mul(4)
            .filter(|&e| e <= self.raw.len())
            .ok_or("the handed replay buffer is cut short")?;
        let text = std::str::from_utf8(&self.raw[lens_end..])
            .map_err(|e| format!("a handed replay item is not UTF-8: {e}"))?;
        let stderr: std::collections::HashSet<i64> = self.stderr.iter().copied().collect();
        let mut items = Vec::with_capacity(n);
        let mut at = 0usize;
        let mut lens = self.raw[..lens_end].chunks_exact(4);
        for &(first, count) in &self.runs {
            for seq in first..first + count as i64 {
                let len =
                    u32::from_le_bytes(lens.next().expect("counted").try_into().expect("4 bytes"))
                        as usize;
                let end = at + len;
                if end > text.len()
                    || !text.is_char_boundary(at)
                    || !text.is_char_boundary(end)
                    || !text[at..end].starts_with(",\"type\":")
                {
                    return Err(format!("handed replay item {seq} is malformed"));
                }
                items.push((seq, at..end, stderr.contains(&seq)));
                at = end;
            }
        }
        Ok((Arc::from(text), items))
    }
}

/// The buffered items of one session, oldest first, within its [`Limits`]. Seqs only go up:
/// an item is pushed with a seq above every buffered one.
#[derive(Debug)]
pub(super) struct Replay {
    limits: Limits,
    items: VecDeque<Slot>,
    /// The texts the items' bodies lie in, oldest first; `texts[0]` has serial `first_text`.
    /// A text is dropped once no buffered item lies in it. Items' serials never go down: an
    /// output batch whose numbering was interrupted (an event between two seq blocks) registers
    /// its text again.
    texts: VecDeque<Arc<str>>,
    first_text: u64,
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
    /// The reader token holding the cursor the slowest attach had at a handoff, until a client
    /// attaches again ([`Replay::release_hold`]).
    hold: Option<u64>,
}

impl Replay {
    /// An empty buffer after `last` (the session's last stored seq).
    pub(super) fn new(limits: Limits, last: i64) -> Replay {
        Replay {
            limits,
            items: VecDeque::new(),
            texts: VecDeque::new(),
            first_text: 0,
            bytes: 0,
            evicted_upto: 0,
            last,
            readers: HashMap::new(),
            next_reader: 0,
            slowest: None,
            released: false,
            hold: None,
        }
    }

    /// The buffer as a handoff carries it: every item, the highest seq evicted, the last seq,
    /// the cursor to hold for the attaches.
    pub(super) fn handed(&self) -> HandedReplay {
        let mut run = Run::default();
        let _ = self.run_after(self.evicted_upto, usize::MAX, &mut run);
        let mut runs: Vec<(i64, u32)> = Vec::new();
        let mut stderr = Vec::new();
        let mut lens = Vec::with_capacity(run.len() * 4);
        let mut bodies = Vec::with_capacity(self.bytes);
        for (slot, rest) in run.iter() {
            match runs.last_mut() {
                Some((first, count)) if *first + *count as i64 == slot.seq => *count += 1,
                _ => runs.push((slot.seq, 1)),
            }
            if slot.stderr {
                stderr.push(slot.seq);
            }
            lens.extend_from_slice(&(rest.len() as u32).to_le_bytes());
            bodies.extend_from_slice(rest.as_bytes());
        }
        lens.extend_from_slice(&bodies);
        HandedReplay {
            runs,
            stderr,
            raw_at: 0,
            raw_len: lens.len() as u64,
            evicted_upto: self.evicted_upto,
            last: self.last,
            held_cursor: self.slowest,
            raw: lens,
        }
    }

    /// The buffer a handoff carried. The cursor the attaches had is held before the items go
    /// in, so that none a client may still need is evicted before it attaches again.
    pub(super) fn adopt(limits: Limits, h: HandedReplay) -> Result<Replay, String> {
        let mut r = Replay::new(limits, h.last);
        if let Some(cursor) = h.held_cursor {
            r.hold = Some(r.join(cursor));
        }
        let (text, items) = h.items()?;
        for (seq, range, stderr) in items {
            r.push_shared(seq, &text, range, stderr);
        }
        r.evicted_upto = r.evicted_upto.max(h.evicted_upto);
        r.last = h.last;
        Ok(r)
    }

    /// Lets go of the cursor held for the clients of before a handoff: once one attaches again,
    /// or when they were given long enough.
    pub(super) fn release_hold(&mut self) {
        if let Some(token) = self.hold.take() {
            self.leave(token);
        }
    }

    /// Registers a live attach whose cursor is `cursor`; its token for [`Replay::advance`].
    pub(super) fn join(&mut self, cursor: i64) -> u64 {
        self.next_reader += 1;
        self.readers.insert(self.next_reader, cursor);
        // A client attached again after a handoff: it governs from here on.
        if let Some(token) = self.hold.take() {
            self.readers.remove(&token);
        }
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

    /// Whether a live attach governs the buffer and the reader (one is registered and no close
    /// began).
    pub(super) fn governed(&self) -> bool {
        self.slowest.is_some()
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
    pub(super) fn push(&mut self, item: Item) {
        let range = item.start as usize..item.end as usize;
        self.push_shared(item.seq, &item.text, range, item.stderr);
    }

    /// Appends the item whose body after the seq is `text[range]`: the text is registered once
    /// (when it is not the newest text already), the item gets a slot. Then drops the oldest
    /// items while over a bound (never the newest), and the texts no item lies in any more.
    pub(super) fn push_shared(
        &mut self,
        seq: i64,
        text: &Arc<str>,
        range: std::ops::Range<usize>,
        stderr: bool,
    ) {
        debug_assert!(text.is_char_boundary(range.start) && text.is_char_boundary(range.end));
        debug_assert!(text[range.clone()].starts_with(",\"type\":"));
        let serial = self.register(text);
        let slot = Slot::new(seq, serial, range, stderr);
        self.bytes += slot.len();
        self.last = seq;
        self.items.push_back(slot);
        self.evict();
    }

    /// Appends the output items whose bodies after the seq are `text[range]` for each range, with
    /// the consecutive seqs from `first`, then evicts once: the same items, texts and bounds as
    /// [`Replay::push_shared`] of each in turn (what a push evicts is a prefix that a later push
    /// would evict too: the bytes after an item only grow, and the slowest cursor does not move
    /// under the lock), with one registration of the text and one eviction pass per run.
    pub(super) fn push_run(
        &mut self,
        first: i64,
        text: &Arc<str>,
        ranges: impl ExactSizeIterator<Item = std::ops::Range<usize>>,
    ) {
        let n = ranges.len();
        if n == 0 {
            return;
        }
        let serial = self.register(text);
        let mut bytes = 0;
        let mut seq = first;
        self.items.extend(ranges.map(|range| {
            debug_assert!(text[range.clone()].starts_with(",\"type\":"));
            let slot = Slot::new(seq, serial, range, false);
            bytes += slot.len();
            seq += 1;
            slot
        }));
        self.bytes += bytes;
        self.last = first + n as i64 - 1;
        self.evict();
    }

    /// The serial of `text` in `texts`, registered when it is not the newest text already.
    fn register(&mut self, text: &Arc<str>) -> u64 {
        if !self.texts.back().is_some_and(|t| Arc::ptr_eq(t, text)) {
            self.texts.push_back(text.clone());
        }
        self.first_text + self.texts.len() as u64 - 1
    }

    /// Drops the oldest items while over a bound (never the newest, never one the slowest live
    /// attach was not sent), and the texts no item lies in any more.
    fn evict(&mut self) {
        let mut evicted = false;
        while (self.items.len() > self.limits.lines || self.bytes > self.limits.bytes)
            && self.items.len() > 1
            && self
                .slowest
                .is_none_or(|c| self.items.front().is_some_and(|i| i.seq <= c))
        {
            let old = self.items.pop_front().expect("non-empty");
            self.bytes -= old.len();
            self.evicted_upto = old.seq;
            evicted = true;
        }
        if evicted {
            let keep = self.items.front().expect("the newest is kept").text;
            while self.first_text < keep {
                self.texts.pop_front();
                self.first_text += 1;
            }
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
        let mut run = Run::default();
        self.run_after(cursor, max, &mut run)?;
        Ok(run
            .slots
            .iter()
            .map(|s| Item {
                seq: s.seq,
                text: run.texts[(s.text - run.first) as usize].clone(),
                start: s.start,
                end: s.end,
                stderr: s.stderr,
            })
            .collect())
    }

    /// The index of the first item with a seq above `cursor` (`items.len()`: none).
    ///
    /// Seqs go up by one from item to item but where a seq block or an event skipped some, so
    /// the item after `cursor` is at `cursor − oldest + 1` or before it (never after: each item's
    /// seq is at least one above the one before). That guess is checked with the item before it
    /// and taken when it holds: O(1), two reads. A binary search over a buffer of 200,000 items
    /// is 18 reads that each miss the cache, and an attach keeping up with a fast adapter asks
    /// once per few lines: a search per ask takes a quarter of the attach thread's time in `perf`.
    fn first_after(&self, cursor: i64) -> usize {
        let Some(oldest) = self.items.front().map(|i| i.seq) else {
            return 0;
        };
        if cursor < oldest {
            return 0;
        }
        let len = self.items.len();
        // At most `len`: every item at or past it would have a seq above `cursor`.
        let guess = cursor
            .checked_sub(oldest)
            .and_then(|d| usize::try_from(d).ok())
            .map_or(len, |d| d.saturating_add(1))
            .min(len);
        if self.items[guess - 1].seq <= cursor {
            return guess;
        }
        // Gaps: the answer is below the guess.
        self.items.partition_point(|i| i.seq <= cursor)
    }

    /// [`Replay::after`] into `run` (cleared first): the slots are copied, and each text they
    /// lie in is referenced once.
    pub(super) fn run_after(
        &self,
        cursor: i64,
        max: usize,
        run: &mut Run,
    ) -> Result<(), (i64, i64)> {
        run.clear();
        if cursor < self.evicted_upto {
            return Err((self.oldest_seq().unwrap_or(self.last), self.last));
        }
        let start = self.first_after(cursor);
        run.slots
            .extend(self.items.range(start..).take(max).copied());
        if let (Some(first), Some(last)) = (run.slots.first(), run.slots.last()) {
            run.first = first.text;
            let from = (first.text - self.first_text) as usize;
            let to = (last.text - self.first_text) as usize;
            run.texts.extend(self.texts.range(from..=to).cloned());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An item of `units` × 20 bytes as the byte bound counts them (`"seq":N` with a one-digit
    /// seq and the rest).
    fn item(seq: i64, units: usize, stderr: bool) -> Item {
        assert!((0..10).contains(&seq));
        let it = Item::single(
            seq,
            &format!(",\"type\":\"{}\"", "x".repeat(units * 20 - 17)),
            stderr,
        );
        assert_eq!(it.len(), units * 20);
        it
    }

    fn seqs(items: &[Item]) -> Vec<i64> {
        items.iter().map(|i| i.seq).collect()
    }

    /// The first item after a cursor, found from the seqs' arithmetic, is the binary search's
    /// answer for every cursor: consecutive seqs, gaps (a skipped seq block, events), a buffer
    /// whose oldest items were evicted, an empty one, cursors below, inside and above it.
    /// A buffer written out for a handoff and taken up again holds the same items (seqs,
    /// bodies, stderr flags, gaps between runs), the same bounds and last seq, and holds the
    /// slowest attach's cursor until a client attaches again.
    #[test]
    fn a_handed_buffer_comes_back_whole_and_holds_the_attach_cursor() {
        let limits = Limits {
            lines: 1000,
            bytes: 1 << 20,
        };
        let mut r = Replay::new(limits, 0);
        for seq in (1..=5).chain(9..=12) {
            r.push(Item::single(
                seq,
                &format!(",\"type\":\"output\",\"line\":\"l{seq} ü\""),
                seq == 10,
            ));
        }
        let token = r.join(3);
        let h = r.handed();
        assert_eq!(h.runs, vec![(1, 5), (9, 4)]);
        assert_eq!(h.stderr, vec![10]);
        assert_eq!(h.held_cursor, Some(3));
        let mut back = Replay::adopt(limits, h).unwrap();
        let before = r.after(0, usize::MAX).unwrap();
        let after = back.after(0, usize::MAX).unwrap();
        assert_eq!(seqs(&after), seqs(&before));
        for (a, b) in after.iter().zip(&before) {
            assert_eq!((a.rest(), a.stderr), (b.rest(), b.stderr));
        }
        assert_eq!(back.last_seq(), 12);
        assert!(back.governed(), "the attach's cursor is held");
        back.join(12);
        assert!(
            back.hold.is_none(),
            "a client that attaches again ends the hold"
        );
        r.leave(token);
    }

    #[test]
    fn the_item_after_a_cursor_is_found_through_gaps_and_evictions() {
        for (limit, gaps) in [
            (1000, vec![]),
            (1000, vec![5, 6, 40]),
            (25, vec![3, 17, 18, 19, 60]),
            (7, vec![]),
        ] {
            let mut r = Replay::new(
                Limits {
                    lines: limit,
                    bytes: 1 << 30,
                },
                0,
            );
            let check = |r: &Replay| {
                for cursor in -3..130 {
                    assert_eq!(
                        r.first_after(cursor),
                        r.items.partition_point(|i| i.seq <= cursor),
                        "cursor {cursor}, seqs {:?}",
                        r.items.iter().map(|i| i.seq).collect::<Vec<_>>()
                    );
                }
            };
            check(&r);
            let mut seq = 1;
            for _ in 0..80 {
                while gaps.contains(&seq) {
                    seq += 3;
                }
                r.push(Item::single(seq, ",\"type\":\"x\"", false));
                seq += 1;
                check(&r);
            }
        }
    }

    /// An item's line is byte for byte the line of its whole body (`"seq":N,…`) as
    /// `stream_line` renders it, for any seq and id, and its byte count is that body's length.
    #[test]
    fn an_items_line_is_the_line_of_its_whole_body() {
        use crate::protocol::{stream_line, stream_line_into};
        let text: Arc<str> = Arc::from(
            ",\"type\":\"output\",\"line\":\"a\",\"type\":\"output\",\"line\":\"\\\"é\",\"lossy\":true",
        );
        let second = text[1..].find(",\"type\"").unwrap() + 1;
        for seq in [0, 1, 9, 10, 99, 100, 12345, i64::MAX, -1, i64::MIN] {
            for (range, stderr) in [(0..second, false), (second..text.len(), true)] {
                let it = Item::shared(seq, text.clone(), range, stderr);
                assert_eq!(it.len(), it.body().len(), "seq {seq}");
                assert_eq!(it.body(), format!("\"seq\":{seq}{}", it.rest()));
                for id in [Value::from(7), Value::from("a\"b"), Value::Null] {
                    let id_json = serde_json::to_string(&id).unwrap();
                    let mut buf = b"before".to_vec();
                    it.write_line(&mut buf, &id_json);
                    let mut want = b"before".to_vec();
                    stream_line_into(&mut want, &id_json, &it.body());
                    assert_eq!(buf, want);
                    assert_eq!(&buf[6..], &stream_line(&id, &it.body())[..]);
                }
            }
        }
    }

    /// An attach's kept head writes every line as [`Run::write_line`] does, through carries
    /// (9 → 10, 99 → 100, 999,999 → 1,000,000), jumps, repeats, negative seqs and the largest.
    #[test]
    fn a_kept_line_head_writes_the_lines_of_their_seqs() {
        let text: Arc<str> = Arc::from(",\"type\":\"output\",\"line\":\"a\"");
        let mut seqs: Vec<i64> = (0..1200).collect();
        seqs.extend([
            999_998, 999_999, 1_000_000, 1_000_001, 5, 5, 6, 19, 20, -3, -2, -1, 0, 1,
        ]);
        seqs.extend([i64::MAX - 1, i64::MAX, i64::MIN, i64::MIN + 1, 99, 100]);
        for id in ["7", "\"a\\\"b\"", "null"] {
            let mut head = LineHead::new(id);
            let prefix = line_prefix(id);
            let (mut got, mut want) = (Vec::new(), Vec::new());
            for &seq in &seqs {
                let slot = Slot::new(seq, 0, 0..text.len(), false);
                head.write_line(&mut got, &slot, &text);
                Run::write_line(&mut want, &prefix, &slot, &text);
            }
            assert_eq!(
                String::from_utf8(got).unwrap(),
                String::from_utf8(want).unwrap()
            );
        }
    }

    /// The buffer keeps each text once, however many items lie in it, hands an attach one
    /// reference per text (not per item), and lets a text go with the last item in it. An
    /// output batch interrupted by an event registers its text again, so the texts' order
    /// follows the items'.
    #[test]
    fn texts_are_kept_once_and_go_with_their_last_item() {
        let parts = [",\"type\":\"a\"", ",\"type\":\"b\"", ",\"type\":\"c\""];
        let whole: Arc<str> = Arc::from(parts.concat());
        let range = |i: usize| {
            let start: usize = parts[..i].iter().map(|p| p.len()).sum();
            start..start + parts[i].len()
        };
        let mut r = Replay::new(
            Limits {
                lines: 4,
                bytes: 1 << 20,
            },
            0,
        );
        r.push_shared(1, &whole, range(0), false);
        r.push_shared(2, &whole, range(1), false);
        r.push(Item::single(3, ",\"type\":\"event\"", false));
        r.push_shared(4, &whole, range(2), false);
        assert_eq!(
            r.texts.len(),
            3,
            "the batch's text, the event's, the batch's again"
        );
        assert_eq!(Arc::strong_count(&whole), 3);
        let mut run = Run::default();
        r.run_after(1, 10, &mut run).unwrap();
        let got: Vec<(i64, String)> = run.iter().map(|(s, t)| (s.seq, t.to_string())).collect();
        assert_eq!(
            got,
            vec![
                (2, parts[1].to_string()),
                (3, ",\"type\":\"event\"".to_string()),
                (4, parts[2].to_string())
            ]
        );
        assert_eq!(run.texts.len(), 3, "one reference per text of the run");
        assert_eq!(Arc::strong_count(&whole), 5);
        r.run_after(4, 10, &mut run).unwrap();
        assert!(run.is_empty() && run.texts.is_empty());
        // Items 1 and 2 go: the batch's first registration with them.
        r.push(Item::single(5, ",\"type\":\"x\"", false));
        r.push(Item::single(6, ",\"type\":\"x\"", false));
        assert_eq!(r.oldest_seq(), Some(3));
        assert_eq!(Arc::strong_count(&whole), 2);
        r.push(Item::single(7, ",\"type\":\"x\"", false));
        r.push(Item::single(8, ",\"type\":\"x\"", false));
        assert_eq!(r.oldest_seq(), Some(5));
        assert_eq!(Arc::strong_count(&whole), 1, "no item lies in it any more");
        assert_eq!(r.texts.len(), 4);
        assert_eq!(r.after(0, 10).unwrap_err(), (5, 8));
        assert_eq!(seqs(&r.after(4, 10).unwrap()), vec![5, 6, 7, 8]);
    }

    /// A run pushed at once leaves the buffer as pushing its items one by one does: the same
    /// items, bytes, texts and evictions, under either bound, with and without a live reader.
    #[test]
    fn a_run_is_buffered_as_its_items_one_by_one() {
        let body = |i: usize| format!(",\"type\":\"output\",\"line\":\"{}\"", "y".repeat(i % 37));
        for (lines, bytes) in [(5, 1 << 20), (1000, 400), (3, 90), (1000, 1)] {
            for reader in [None, Some(7)] {
                let mut one = Replay::new(Limits { lines, bytes }, 0);
                let mut run = Replay::new(Limits { lines, bytes }, 0);
                for r in [&mut one, &mut run] {
                    if let Some(c) = reader {
                        r.join(c);
                    }
                }
                let mut seq = 1;
                for batch in [1usize, 4, 9, 2, 30, 1] {
                    let parts: Vec<String> = (0..batch).map(|i| body(seq as usize + i)).collect();
                    let text: Arc<str> = Arc::from(parts.concat());
                    let mut ranges = Vec::new();
                    let mut at = 0;
                    for p in &parts {
                        ranges.push(at..at + p.len());
                        at += p.len();
                    }
                    for (k, range) in ranges.iter().enumerate() {
                        one.push_shared(seq + k as i64, &text, range.clone(), false);
                    }
                    run.push_run(seq, &text, ranges.into_iter());
                    seq += batch as i64 + 3;
                    one.push(Item::single(seq - 1, ",\"type\":\"event\"", false));
                    run.push(Item::single(seq - 1, ",\"type\":\"event\"", false));
                    let state = |r: &Replay| {
                        let items: Vec<(i64, u64, usize, String)> = r
                            .items
                            .iter()
                            .map(|s| {
                                let t = &r.texts[(s.text - r.first_text) as usize];
                                (
                                    s.seq,
                                    s.text,
                                    s.len(),
                                    t[s.start as usize..s.end as usize].to_string(),
                                )
                            })
                            .collect();
                        (
                            items,
                            r.bytes,
                            r.evicted_upto,
                            r.last,
                            r.first_text,
                            r.texts.len(),
                        )
                    };
                    assert_eq!(
                        state(&one),
                        state(&run),
                        "bounds {lines}/{bytes}, reader {reader:?}"
                    );
                }
            }
        }
        // Runs across powers of ten count each seq's digits as one by one does.
        for first in [-12, 1, 95, 995, 9_999_990, i64::MAX - 5] {
            let text: Arc<str> = Arc::from(body(1).repeat(5));
            let len = body(1).len();
            let ranges = (0..5).map(|k| k * len..(k + 1) * len);
            let limits = Limits {
                lines: 100,
                bytes: 1 << 20,
            };
            let (mut one, mut run) = (Replay::new(limits, 0), Replay::new(limits, 0));
            for (k, r) in ranges.clone().enumerate() {
                one.push_shared(first + k as i64, &text, r, false);
            }
            run.push_run(first, &text, ranges);
            assert_eq!(one.bytes, run.bytes, "from {first}");
        }
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
            r.push(item(seq, 1, false));
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
                bytes: 200,
            },
            0,
        );
        r.push(item(1, 4, false));
        r.push(item(2, 4, true));
        assert_eq!((r.len(), r.bytes()), (2, 160));
        r.push(item(3, 4, false));
        assert_eq!((r.len(), r.bytes(), r.oldest_seq()), (2, 160, Some(2)));
        assert!(r.after(1, 10).unwrap()[0].stderr, "the stderr flag is kept");
        r.push(item(4, 50, false));
        assert_eq!((r.len(), r.bytes(), r.oldest_seq()), (1, 1000, Some(4)));
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
            r.push(item(seq, 1, false));
        }
        assert_eq!(r.len(), 5, "nothing unsent is evicted");
        assert!(r.behind(), "a full buffer whose oldest item is unsent");
        r.advance(fast, 5);
        assert!(r.behind(), "the slowest governs");
        r.advance(slow, 1);
        assert!(!r.behind(), "the oldest item was sent");
        r.push(item(6, 1, false));
        assert_eq!(
            r.oldest_seq(),
            Some(2),
            "only what every reader was sent goes"
        );
        assert!(r.behind());
        r.leave(slow);
        assert!(!r.behind(), "an attach that ended holds nothing back");
        r.push(item(7, 1, false));
        assert_eq!((r.len(), r.oldest_seq()), (3, Some(5)));
        r.advance(fast, 5);
        let slow = r.join(5);
        r.push(item(8, 1, false));
        assert!(r.behind());
        r.release(true);
        assert!(!r.behind(), "an ended session holds nothing back");
        r.push(item(9, 1, false));
        assert_eq!(r.oldest_seq(), Some(7));
        r.leave(slow);
    }
}
