//! The adapter's stdio: lines written to its stdin (through the session's [`StdinPipe`]), its
//! stdout read a chunk at a time, framed into lines, rendered once into stream items bounded by
//! their encoded size and numbered together, and its stderr logged and streamed.

use super::base::*;
use super::busy::{classify_incoming, classify_outgoing, Incoming};
use super::replay::Item;
use super::supervised::*;

impl Supervised {
    /// Writes one line (a newline is added) to the adapter's stdin and tracks JSON-RPC requests
    /// in it. Waits at most `timeout` while the adapter does not read (see [`StdinPipe`]).
    pub fn write_line(&self, line: &str, timeout: Duration) -> Result<(), PipeError> {
        // Tracked before the write: a fast adapter may answer before the write call returns,
        // and its response must find the request.
        let tracked = self.track_outgoing(classify_outgoing(line));
        let written = {
            let mut stdin = self.stdin.lock().unwrap_or_else(|p| p.into_inner());
            stdin.write_line(line.as_bytes(), timeout)
        };
        let mut g = self.lock();
        match &written {
            Ok(()) => g.last_traffic = Instant::now(),
            Err(_) => {
                if let Some(key) = tracked {
                    g.pending.remove(&key);
                    g.opening.remove(&key);
                }
            }
        }
        written
    }

    /// Drops the adapter's stdin (it sees EOF).
    pub fn close_stdin(&self) {
        self.stdin.lock().unwrap_or_else(|p| p.into_inner()).close();
    }

    // -----------------------------------------------------------------------------------------
    // Threads

    /// Reads the adapter's stdout a chunk at a time and numbers every complete line of a chunk
    /// together (see [`Supervised::push_lines`]): one `read`, one lock and one wake-up of the
    /// attached readers per chunk rather than per line. Reading line by line cost a busy daemon
    /// most of its CPU in futex wakes and small reads. A line cut by the chunk's end waits in the
    /// framer for its rest, so clients see the same lines whatever the chunking.
    ///
    /// The pipe is read non-blocking, and a read that finds it empty waits for it or for a
    /// freeze ([`Freeze`]): between two reads, with every line read so far buffered and the cut
    /// one in the framer, the reader stops for a handoff, which takes the framer's bytes along.
    pub(super) fn read_stdout(&self, mut out: std::fs::File, mut framer: LineFramer) {
        // A quiet adapter's reads are small: its buffer grows to a full chunk only once a read
        // fills it, so an idle session does not hold (and, on reused heap, touch) 64 KiB.
        let mut buf = vec![0u8; FIRST_READ];
        let mut batch = OutBatch::default();
        let mut priority = ReaderPriority::default();
        set_nonblocking(&out);
        loop {
            let attached = self.hold_while_behind();
            if self.parked_for_freeze(Stream::Stdout, &framer) {
                continue;
            }
            priority.follow(attached);
            let n = match self.read_some(&mut out, &mut buf) {
                Ok(Some(0)) => break,
                Ok(Some(n)) => n,
                Ok(None) => continue,
                Err(e) => {
                    tracing::warn!(session = %self.key, error = %e, "reading the adapter's stdout failed");
                    break;
                }
            };
            // Loaded after the data arrived: a request is tracked before it is written, so a
            // response in this chunk finds the flag set.
            let tracking = self.tracking.load(AtomicOrdering::SeqCst);
            // The chunk is checked for UTF-8 once, not line by line (a call per line cost ~145
            // instructions a 100-byte line): its lines within the valid part come as `&str`.
            let chunk = &buf[..n];
            let valid = match std::str::from_utf8(chunk) {
                Ok(s) => s,
                // A character cut by the chunk's end, or bytes that are not UTF-8: the part
                // before is valid, the lines after it are checked one by one as before.
                Err(e) => std::str::from_utf8(&chunk[..e.valid_up_to()]).unwrap_or_default(),
            };
            framer.feed_checked(chunk, valid, |raw, text, truncated| {
                batch.add_checked(raw, text, truncated, self.item_cap, tracking)
            });
            if !batch.lines.is_empty() {
                self.push_lines(&mut batch);
            }
            if n == buf.len() && buf.len() < READ_CHUNK {
                buf.resize(READ_CHUNK, 0);
            }
        }
        if let Some((raw, truncated)) = framer.finish() {
            let tracking = self.tracking.load(AtomicOrdering::SeqCst);
            batch.add(&raw, truncated, self.item_cap, tracking);
            self.push_lines(&mut batch);
        }
    }

    /// Waits, before the next read of the adapter's stdout, while the slowest live attach has not
    /// been sent the oldest item of a full buffer (see `replay.rs`): the adapter then blocks in
    /// `write` on its full pipe, as behind a pipe. One lock per chunk, no publish when not held.
    /// Returns whether a live attach governs the output (see [`ReaderPriority`]).
    fn hold_while_behind(&self) -> bool {
        let mut g = self.lock();
        if !g.replay.behind() {
            return g.replay.governed();
        }
        while g.replay.behind() && !g.life.is_ended() && !self.freeze.requested() {
            g.quiet_mut().reader_waiting = true;
            g = g.wait_drained(HOLD_TICK);
        }
        g.quiet_mut().reader_waiting = false;
        g.replay.governed()
    }

    /// Numbers and buffers a batch of rendered lines in order: under one lock for as many lines
    /// as the reserved block has seqs left, then one wake-up of the attached readers. When the
    /// block runs out the lock is dropped to reserve the next (see [`Supervised::output_seq`]).
    pub(super) fn push_lines(&self, batch: &mut OutBatch) {
        // The batch's rendered items become one shared text: one allocation and one copy per
        // read of the adapter, made before the lock; under it each line only gets its seq and
        // its place in the buffer.
        let text: Arc<str> = Arc::from(batch.rendered.as_str());
        let mut i = 0;
        let total = batch.lines.len();
        while i < total {
            let Some((mut g, seq)) = self.output_seq() else {
                // The session ended while the store failed: this line was counted as dropped,
                // and so is the rest of the batch.
                self.lock().output_dropped += (total - i - 1) as u64;
                break;
            };
            // One deref for the run (it marks the session's shown state changed once).
            let inner: &mut Inner = &mut g;
            inner.last_traffic = Instant::now();
            // This line takes `seq`, the next lines the rest of the block, as far as it goes.
            let (_, more) = inner.seqs.take_run(total - i - 1);
            let run = &mut batch.lines[i..i + 1 + more];
            inner.output_lines += run.len() as u64;
            for line in run.iter_mut() {
                if let Some((key, session_id)) = line.response.take() {
                    inner.pending.remove(&key);
                    if let Some((asked, setup)) = inner.opening.remove(&key) {
                        if let Some(a) = session_id.or(asked) {
                            inner.note_acp_session(a, setup);
                        }
                    }
                }
            }
            inner
                .replay
                .push_run(seq, &text, run.iter().map(|l| l.rendered.clone()));
            i += run.len();
            if inner.pending.is_empty() && inner.opening.is_empty() {
                self.tracking.store(false, AtomicOrdering::SeqCst);
            }
            g.notify_changed();
        }
        batch.clear();
    }

    /// Between two reads: stops this reader while a freeze is asked for (unless its session's
    /// waiter is settling); true when it stopped (read again after).
    fn parked_for_freeze(&self, stream: Stream, framer: &LineFramer) -> bool {
        if self.freeze.requested() && !self.settling.load(AtomicOrdering::SeqCst) {
            self.park_reader(stream, framer);
            return true;
        }
        false
    }

    /// One read of a non-blocking pipe: `Some(n)` bytes read (0: the writers are gone), `None`
    /// to read again (interrupted, or it waited until the pipe is readable or a freeze is
    /// asked for).
    fn read_some(&self, pipe: &mut std::fs::File, buf: &mut [u8]) -> io::Result<Option<usize>> {
        match pipe.read(buf) {
            Ok(n) => Ok(Some(n)),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(None),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                crate::sys::wait_readable_or(pipe.as_fd(), self.freeze.latch());
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// Logs each stderr line and streams it as a `stderr` item (same seq space and replay
    /// buffer as output, so its bounds apply); the last lines are kept for error messages.
    /// Read as stdout is (non-blocking, stopped by a freeze between two reads).
    pub(super) fn read_stderr(&self, mut err: std::fs::File, mut framer: LineFramer) {
        let mut buf = vec![0u8; FIRST_READ];
        set_nonblocking(&err);
        loop {
            if self.parked_for_freeze(Stream::Stderr, &framer) {
                continue;
            }
            let n = match self.read_some(&mut err, &mut buf) {
                Ok(Some(0)) | Err(_) => break,
                Ok(Some(n)) => n,
                Ok(None) => continue,
            };
            framer.feed_checked(&buf[..n], "", |line, _, truncated| {
                self.stderr_line(line, truncated)
            });
        }
        if let Some((line, truncated)) = framer.finish() {
            self.stderr_line(&line, truncated);
        }
    }

    /// One line of the adapter's stderr: logged, kept in the tail, streamed.
    fn stderr_line(&self, line: &[u8], truncated: bool) {
        {
            let text = String::from_utf8_lossy(line).into_owned();
            tracing::info!(session = %self.key, "stderr: {text}");
            // Encoded before any lock is taken; numbered like output (never a seq the store
            // did not reserve; held while it cannot reserve).
            let encoded = serde_json::to_string(&text).expect("strings serialise");
            {
                // Kept for the error messages before the line waits for a seq: on a full disk
                // the line is held, and a failed start still says why.
                let mut g = self.lock();
                if g.stderr_tail.len() == STDERR_TAIL {
                    g.stderr_tail.pop_front();
                }
                g.stderr_tail.push_back(text);
            }
            let Some((mut g, seq)) = self.output_seq() else {
                return;
            };
            let mut rest = format!(",\"type\":\"stderr\",\"line\":{encoded}");
            if truncated {
                rest.push_str(",\"truncated\":true");
            }
            g.push(Item::single(seq, &rest, true));
            g.notify_changed();
        }
    }
}

/// The adapter's two output streams.
#[derive(Debug, Clone, Copy)]
pub(super) enum Stream {
    Stdout,
    Stderr,
}

/// Our read end of a pipe, non-blocking (the adapter's write end is another open file).
fn set_nonblocking(f: &std::fs::File) {
    if let Err(e) = crate::sys::set_nonblocking(f.as_fd()) {
        tracing::warn!(error = %e, "cannot make an adapter's output pipe non-blocking");
    }
}

impl Supervised {
    /// A reader stops for a freeze: what its framer holds is kept for the handoff, and it waits
    /// until the freeze is lifted.
    fn park_reader(&self, stream: Stream, framer: &LineFramer) {
        {
            let mut handed = self.handed.lock().unwrap_or_else(|p| p.into_inner());
            handed.partial[stream as usize] = framer.snapshot();
        }
        self.freeze.park();
    }
}

/// Room kept in an output item for everything but the line (`"seq":…,"type":"output","line":`,
/// the `lossy`/`truncated` flags, and the request id a client adds).
pub(super) const ITEM_OVERHEAD: usize = 160;

/// An item always has room for this much of its line, however small `--replay-bytes` is.
pub(super) const MIN_ITEM_LINE: usize = 256;

/// How much of the adapter's stdout is read at a time (a pipe holds 64 KiB by default).
pub(super) const READ_CHUNK: usize = 64 * 1024;
/// How often an output reader held back by an attach looks again without being woken (it is
/// woken when the attach advances or ends, a close begins or the session ends).
const HOLD_TICK: Duration = Duration::from_millis(250);

/// The stdout buffer until a read fills it (see [`Supervised::read_stdout`]).
const FIRST_READ: usize = 4 * 1024;

/// The nice value of the threads that read the adapters' stdout and stderr, unless
/// `LEASH_OUTPUT_NICE` says otherwise (0 keeps the daemon's own).
const DEFAULT_OUTPUT_NICE: i32 = 10;

/// The nice value for output readers: `LEASH_OUTPUT_NICE` (0–19) when it holds one, else
/// [`DEFAULT_OUTPUT_NICE`]. Read once.
fn output_nice() -> i32 {
    static NICE: std::sync::OnceLock<i32> = std::sync::OnceLock::new();
    *NICE.get_or_init(|| match std::env::var("LEASH_OUTPUT_NICE") {
        Err(_) => DEFAULT_OUTPUT_NICE,
        Ok(v) => match v.trim().parse::<i32>() {
            Ok(n) if (0..=19).contains(&n) => n,
            _ => {
                tracing::warn!(value = %v, default = DEFAULT_OUTPUT_NICE, "LEASH_OUTPUT_NICE is not a number from 0 to 19; using the default");
                DEFAULT_OUTPUT_NICE
            }
        },
    })
}

/// Runs the calling output reader below the daemon's other threads. When adapters print
/// faster than the host can take, a hundred readers at the daemon's priority would queue every
/// request (`status`, `ping`, `send`) behind them on the CPU; niced, they yield to the control
/// plane, and an adapter that outpaces its reader meets backpressure on its full stdout pipe.
/// Output is still read, in order, with every line numbered as before. The stdout reader leaves
/// this priority while a live attach reads its session ([`ReaderPriority`]).
pub(super) fn lower_reader_priority() {
    let base = crate::sys::thread_nice().ok();
    BASE_NICE.with(|b| b.set(base));
    let nice = output_nice();
    if nice == 0 {
        return;
    }
    if let Err(e) = crate::sys::set_thread_nice(nice) {
        tracing::debug!(error = %e, "cannot lower the output reader's priority");
    }
}

thread_local! {
    /// The output reader's nice value before [`lower_reader_priority`] (the daemon's own).
    static BASE_NICE: std::cell::Cell<Option<i32>> = const { std::cell::Cell::new(None) };
}

/// Set once raising an output reader was refused (no `CAP_SYS_NICE` and an `RLIMIT_NICE` that
/// does not allow it): no reader tries again.
static RAISE_REFUSED: AtomicBool = AtomicBool::new(false);

/// The stdout reader's priority follows its session's readers. While a live attach reads the
/// stream (and so governs the output, see `replay.rs`), the reader runs at the daemon's own
/// priority, which is the adapter's (sessions start at it): the writer and the reader of the
/// adapter's stdout are then scheduled alike, as a pipe's two ends are, and the output reaches
/// the client at the pace of a pipe, not at the pace a niced thread is given on a busy host
/// (measured at load 12: the niced reader spent 5.7 s waiting for a CPU against 0.4 s running,
/// and relayed at 0.1× the pipe). Not above it: a reader raised to the connection threads'
/// priority took the CPU from the adapter each time a few lines arrived, and read them in small
/// pieces (14,000 reads per million lines against 2,800 at the adapter's
/// priority, 0.21 against 0.14 µs of CPU a line, and 0.4× against 0.7× a pipe on a quiet host).
/// With no live attach it runs niced again ([`lower_reader_priority`]): unread output yields to
/// the control plane, as before. One `setpriority` per change, none per read.
#[derive(Default)]
pub(super) struct ReaderPriority {
    attached: bool,
}

impl ReaderPriority {
    pub(super) fn follow(&mut self, attached: bool) {
        if attached == self.attached {
            return;
        }
        self.attached = attached;
        let Some(base) = BASE_NICE.with(|b| b.get()) else {
            return;
        };
        let idle = match output_nice() {
            0 => base,
            n => n,
        };
        if !attached {
            if let Err(e) = crate::sys::set_thread_nice(idle) {
                tracing::debug!(error = %e, "cannot lower the output reader's priority again");
            }
            return;
        }
        if RAISE_REFUSED.load(AtomicOrdering::Relaxed) {
            return;
        }
        if base >= idle || crate::sys::set_thread_nice(base).is_ok() {
            return;
        }
        if !RAISE_REFUSED.swap(true, AtomicOrdering::Relaxed) {
            tracing::info!("cannot raise an attached session's output reader above its niced priority (needs CAP_SYS_NICE or RLIMIT_NICE); attached output is read at nice {idle}");
        }
    }
}

/// One rendered output line of a batch: its item's body after the seq
/// (`,"type":"output","line":…` and its flags) lies in [`OutBatch::rendered`].
pub(super) struct OutLine {
    rendered: std::ops::Range<usize>,
    /// The id (as its JSON text) and ACP session id of a JSON-RPC response in the line.
    response: Option<(String, Option<String>)>,
}

/// The lines of one read, rendered before any lock is taken: the lossy UTF-8 check, the bounded
/// JSON encoding and the flags, each line's item body after its seq into one buffer for the
/// whole batch, and — only while requests await responses — the JSON-RPC classification.
#[derive(Default)]
pub(super) struct OutBatch {
    rendered: String,
    lines: Vec<OutLine>,
}

/// What every output item's body has between its seq and its line.
const OUTPUT_HEAD: &str = ",\"type\":\"output\",\"line\":";

impl OutBatch {
    pub(super) fn add(&mut self, raw: &[u8], truncated: bool, cap: usize, tracking: bool) {
        self.add_checked(raw, None, truncated, cap, tracking);
    }

    /// [`OutBatch::add`] of a line that is known to be UTF-8 when `checked` holds it as text.
    pub(super) fn add_checked(
        &mut self,
        raw: &[u8],
        checked: Option<&str>,
        truncated: bool,
        cap: usize,
        tracking: bool,
    ) {
        debug_assert!(checked.is_none_or(|t| t.as_bytes() == raw));
        // `str::from_utf8` checks ASCII a word at a time; `from_utf8_lossy` walks the line byte
        // by byte even when it is valid (a third of the output thread's time on 1 KiB lines in
        // `perf`), so it only runs on a line that is not UTF-8.
        let text = match checked.map(Ok).unwrap_or_else(|| std::str::from_utf8(raw)) {
            Ok(s) => std::borrow::Cow::Borrowed(s),
            Err(_) => String::from_utf8_lossy(raw),
        };
        let lossy = matches!(text, std::borrow::Cow::Owned(_));
        let start = self.rendered.len();
        self.rendered.push_str(OUTPUT_HEAD);
        let cut = encode_bounded_into(&mut self.rendered, &text, cap);
        if lossy {
            self.rendered.push_str(",\"lossy\":true");
        }
        if truncated || cut {
            self.rendered.push_str(",\"truncated\":true");
        }
        let response = if tracking {
            match classify_incoming(&text) {
                Incoming::Response { id, session_id } => Some((id.to_string(), session_id)),
                Incoming::Other => None,
            }
        } else {
            None
        };
        self.lines.push(OutLine {
            rendered: start..self.rendered.len(),
            response,
        });
    }

    pub(super) fn clear(&mut self) {
        self.lines.clear();
        self.rendered.clear();
        // A batch that held one huge line does not keep its buffer.
        if self.rendered.capacity() > 4 * READ_CHUNK {
            self.rendered.shrink_to(READ_CHUNK);
        }
    }
}

/// Splits a byte stream into lines of at most `cap` bytes (the rest of a longer line is
/// discarded and the line marked truncated), whatever the chunks it arrives in. A `\r` before
/// the `\n` is dropped.
pub(super) struct LineFramer {
    cap: usize,
    /// The start of a line whose newline has not arrived yet.
    partial: Vec<u8>,
    truncated: bool,
    any: bool,
}

impl LineFramer {
    pub(super) fn new(cap: usize) -> LineFramer {
        LineFramer {
            cap,
            partial: Vec::new(),
            truncated: false,
            any: false,
        }
    }

    /// Calls `line` with every line completed by `chunk`, in order.
    #[cfg(test)]
    pub(super) fn feed(&mut self, chunk: &[u8], mut line: impl FnMut(&[u8], bool)) {
        self.feed_checked(chunk, "", |l, _, t| line(l, t));
    }

    /// [`LineFramer::feed`] of a chunk whose first `valid.len()` bytes are `valid` (checked
    /// UTF-8): a line that lies whole in that part comes with its text, any other with `None`.
    pub(super) fn feed_checked(
        &mut self,
        mut chunk: &[u8],
        valid: &str,
        mut line: impl FnMut(&[u8], Option<&str>, bool),
    ) {
        debug_assert!(chunk.starts_with(valid.as_bytes()));
        // Where `chunk` starts in the chunk as it was given.
        let mut at = 0;
        while let Some(i) = memchr_newline(chunk) {
            let (head, rest) = (&chunk[..i], &chunk[i + 1..]);
            if !self.any {
                // The whole line is in this chunk: no copy.
                let (kept, cut) = if head.len() > self.cap {
                    (&head[..self.cap], true)
                } else {
                    (head, false)
                };
                let kept = strip_cr(kept);
                // `None` past the valid part or when the cap cut a character.
                let text = valid.get(at..at + kept.len());
                line(kept, text, cut);
            } else {
                self.append(head);
                let truncated = self.truncated;
                line(strip_cr(&self.partial), None, truncated);
                self.reset();
            }
            at += i + 1;
            chunk = rest;
        }
        if !chunk.is_empty() {
            self.append(chunk);
        }
    }

    pub(super) fn append(&mut self, bytes: &[u8]) {
        self.any = true;
        let room = self.cap.saturating_sub(self.partial.len());
        if bytes.len() > room {
            self.truncated = true;
        }
        self.partial
            .extend_from_slice(&bytes[..bytes.len().min(room)]);
    }

    pub(super) fn reset(&mut self) {
        self.partial.clear();
        if self.partial.capacity() > 4 * READ_CHUNK {
            self.partial.shrink_to(READ_CHUNK);
        }
        self.truncated = false;
        self.any = false;
    }

    /// What the framer holds of a line whose newline has not come yet, for a handoff.
    pub(super) fn snapshot(&self) -> Partial {
        Partial {
            bytes: self.partial.clone(),
            truncated: self.truncated,
            any: self.any,
        }
    }

    /// A framer that holds `p` (see [`LineFramer::snapshot`]).
    pub(super) fn restore(cap: usize, p: Partial) -> LineFramer {
        LineFramer {
            partial: p.bytes,
            truncated: p.truncated,
            any: p.any,
            ..LineFramer::new(cap)
        }
    }

    /// The last line, when the stream ended without a newline after it.
    pub(super) fn finish(&mut self) -> Option<(Vec<u8>, bool)> {
        if !self.any {
            return None;
        }
        let mut l = std::mem::take(&mut self.partial);
        if l.last() == Some(&b'\r') {
            l.pop();
        }
        let t = self.truncated;
        self.reset();
        Some((l, t))
    }
}

pub(super) fn memchr_newline(b: &[u8]) -> Option<usize> {
    memchr::memchr(b'\n', b)
}

pub(super) fn strip_cr(l: &[u8]) -> &[u8] {
    match l.last() {
        Some(b'\r') => &l[..l.len() - 1],
        _ => l,
    }
}

/// The adapter's line as a JSON string of at most `cap` bytes, quotes included, and whether it
/// had to be cut. Bounds are on the *encoded* size: JSON escaping turns a control byte into six
/// bytes (`\u0001`), so a line of 8 MiB could otherwise become an item of 48 MiB. The cut falls
/// on a character boundary.
#[cfg(test)]
pub(super) fn encode_bounded(text: &str, cap: usize) -> (String, bool) {
    let mut out = String::with_capacity(text.len().min(cap) + 2);
    let cut = encode_bounded_into(&mut out, text, cap);
    (out, cut)
}

/// [`encode_bounded`] appended to `out`; returns whether the line was cut. The encoding is
/// serde_json's; a line whose encoding is over `cap` is cut to the longest prefix, on a
/// character boundary, whose encoding fits.
pub(super) fn encode_bounded_into(out: &mut String, text: &str, cap: usize) -> bool {
    let cap = cap.max(2);
    let start = out.len();
    push_json_string(out, text);
    if out.len() - start <= cap {
        return false;
    }
    out.truncate(start);
    // The encoding grows with the prefix, and never is shorter than it: a binary search over
    // the cuts up to `cap` bytes finds the longest that fits (`lo` fits, `hi` does not).
    let fits = |out: &mut String, end: usize| {
        push_json_string(out, &text[..end]);
        let n = out.len() - start;
        out.truncate(start);
        n <= cap
    };
    let (mut lo, mut hi) = (0, text.len().min(cap - 1));
    while !text.is_char_boundary(hi) {
        hi -= 1;
    }
    if fits(out, hi) {
        lo = hi;
    }
    while lo < hi {
        let Some(mid) = (lo + (hi - lo) / 2..hi)
            .chain(lo + 1..hi)
            .find(|&i| i > lo && text.is_char_boundary(i))
        else {
            break;
        };
        if fits(out, mid) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    push_json_string(out, &text[..lo]);
    true
}

/// Appends `text` as a JSON string, as serde_json writes it.
fn push_json_string(out: &mut String, text: &str) {
    serde_json::to_writer(AppendUtf8(out), text).expect("a str is always serialisable");
}

/// `io::Write` onto a `String`. serde_json writes a string as the runs between its escapes and
/// the escapes themselves (ASCII), each cut on a character boundary, so every write is UTF-8;
/// one that is not is refused, and nothing of it is appended.
struct AppendUtf8<'a>(&'a mut String);

impl std::io::Write for AppendUtf8<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let text = std::str::from_utf8(buf)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
        self.0.push_str(text);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Reads one line of at most `cap` bytes (the rest of a longer line is discarded). `None` at
/// end of stream; a final line without a newline is returned. The reference the
/// [`LineFramer`] is checked against.
#[cfg(test)]
pub(super) fn read_capped_line(
    r: &mut impl BufRead,
    cap: usize,
) -> io::Result<Option<(Vec<u8>, bool)>> {
    let mut line = Vec::new();
    let mut truncated = false;
    let mut any = false;
    loop {
        let buf = match r.fill_buf() {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if buf.is_empty() {
            return Ok(any.then_some((line, truncated)));
        }
        any = true;
        let (chunk, used, done) = match buf.iter().position(|&b| b == b'\n') {
            Some(i) => (&buf[..i], i + 1, true),
            None => (buf, buf.len(), false),
        };
        let room = cap.saturating_sub(line.len());
        if chunk.len() > room {
            truncated = true;
        }
        line.extend_from_slice(&chunk[..chunk.len().min(room)]);
        r.consume(used);
        if done {
            if line.last() == Some(&b'\r') {
                line.pop();
            }
            return Ok(Some((line, truncated)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    pub(super) fn items_are_bounded_by_their_encoded_size() {
        let controls = "\u{1}".repeat(1000);
        let (enc, cut) = encode_bounded(&controls, 602);
        assert!(cut);
        assert_eq!(enc.len(), 602, "100 escaped bytes of six plus the quotes");
        assert_eq!(
            serde_json::from_str::<String>(&enc).unwrap(),
            "\u{1}".repeat(100)
        );
        let mixed = "aé\"\n\u{7f}✓\u{2}".repeat(50);
        for cap in 2..400 {
            let (enc, cut) = encode_bounded(&mixed, cap);
            assert!(enc.len() <= cap.max(2), "cap {cap}: {}", enc.len());
            let back: String = serde_json::from_str(&enc).unwrap();
            assert!(mixed.starts_with(&back));
            assert_eq!(cut, back.len() < mixed.len());
        }
        let (enc, cut) = encode_bounded("plain", 100);
        assert_eq!((enc.as_str(), cut), ("\"plain\"", false));
        // Lines with escapes that fit whole are encoded as serde_json encodes them, and every
        // byte value is escaped alike (the counted path and the budgeted path).
        let all: String = (0u8..0x80).map(char::from).collect();
        let json_rpc = r#"{"jsonrpc":"2.0","method":"session/update","params":{"text":"a\\b\n"}}"#;
        for line in [all.as_str(), json_rpc, "\"", "\\", "\u{1f}x\u{7f}é✓\t"] {
            let want = serde_json::to_string(line).unwrap();
            assert_eq!(
                encode_bounded(line, want.len()),
                (want.clone(), false),
                "{line:?}"
            );
            assert_eq!(
                encode_bounded(line, 1 << 20),
                (want.clone(), false),
                "{line:?}"
            );
            let (cut_enc, cut) = encode_bounded(line, want.len() - 1);
            assert!(
                cut && want.starts_with(&cut_enc[..cut_enc.len() - 1]),
                "{line:?}"
            );
        }
    }

    proptest::proptest! {
        /// Any text, any cap: the item's line is serde_json's encoding of the longest prefix
        /// (cut on a character boundary) whose encoding fits the cap, the whole text when it fits.
        #[test]
        fn a_bounded_line_is_serde_jsons_encoding_of_the_longest_prefix_that_fits(
            text in "(?s).{0,80}|[\\x00-\\x7f]{0,80}",
            cap in 2usize..120,
        ) {
            let (enc, cut) = encode_bounded(&text, cap);
            let back: String = serde_json::from_str(&enc).unwrap();
            proptest::prop_assert!(text.starts_with(&back));
            proptest::prop_assert_eq!(&enc, &serde_json::to_string(&back).unwrap());
            proptest::prop_assert!(enc.len() <= cap);
            proptest::prop_assert_eq!(cut, back.len() < text.len());
            if let Some(c) = text[back.len()..].chars().next() {
                let longer = &text[..back.len() + c.len_utf8()];
                proptest::prop_assert!(serde_json::to_string(longer).unwrap().len() > cap);
            }
        }
    }

    /// The framer gives the same lines as the line-at-a-time reader, however the stream is cut
    /// into chunks: many lines in one chunk, a line across chunks, a `\r\n` split between two
    /// chunks, lines longer than the cap, a last line without a newline.
    #[test]
    pub(super) fn framed_lines_do_not_depend_on_the_chunking() {
        let mut data = Vec::new();
        for i in 0..300 {
            data.extend_from_slice(format!("line {i}\n").as_bytes());
        }
        data.extend_from_slice(b"crlf\r\n\n\r\n");
        data.extend_from_slice(&[b'z'; 5000]);
        data.extend_from_slice(b"\r\nshort\n");
        data.extend_from_slice(&[b'w'; 100]);
        data.extend_from_slice(b"\nno newline at the end");
        for cap in [1, 7, 64, 4096, 1 << 20] {
            let mut r = BufReader::with_capacity(16, &data[..]);
            let mut want = Vec::new();
            while let Some(l) = read_capped_line(&mut r, cap).unwrap() {
                want.push(l);
            }
            for chunk in [1, 2, 3, 5, 64, 1000, data.len()] {
                let mut f = LineFramer::new(cap);
                let mut got = Vec::new();
                for c in data.chunks(chunk) {
                    f.feed(c, |l, t| got.push((l.to_vec(), t)));
                }
                got.extend(f.finish());
                assert_eq!(got, want, "cap {cap}, chunks of {chunk}");
            }
        }
        let mut f = LineFramer::new(10);
        f.feed(b"", |_, _| panic!("no line"));
        assert_eq!(f.finish(), None, "an empty stream has no last line");
    }

    /// Lines checked for UTF-8 a chunk at a time render as lines checked one by one: plain,
    /// multi-byte characters cut by a chunk's end or by the cap, bytes that are not UTF-8.
    #[test]
    pub(super) fn a_chunk_checked_once_renders_as_its_lines_checked_one_by_one() {
        let mut data = Vec::new();
        for i in 0..50 {
            data.extend_from_slice(format!("line {i} é✓\"q\"\n").as_bytes());
        }
        data.extend_from_slice(b"bad \xff\xfe byte\r\n\xe2\x9c\n");
        data.extend_from_slice("✓".repeat(40).as_bytes());
        data.extend_from_slice(b"\nend");
        for cap in [5, 7, 64, 1 << 20] {
            for chunk in [1, 2, 3, 5, 7, 64, 1000, data.len()] {
                let (mut one, mut checked) = (OutBatch::default(), OutBatch::default());
                let (mut f1, mut f2) = (LineFramer::new(cap), LineFramer::new(cap));
                for c in data.chunks(chunk) {
                    f1.feed(c, |l, t| one.add(l, t, cap + 30, false));
                    let valid = match std::str::from_utf8(c) {
                        Ok(s) => s,
                        Err(e) => std::str::from_utf8(&c[..e.valid_up_to()]).unwrap(),
                    };
                    f2.feed_checked(c, valid, |l, text, t| {
                        checked.add_checked(l, text, t, cap + 30, false)
                    });
                }
                assert_eq!(
                    one.rendered, checked.rendered,
                    "cap {cap}, chunks of {chunk}"
                );
                let ranges = |b: &OutBatch| {
                    b.lines
                        .iter()
                        .map(|l| l.rendered.clone())
                        .collect::<Vec<_>>()
                };
                assert_eq!(ranges(&one), ranges(&checked));
            }
        }
    }

    #[test]
    pub(super) fn a_batch_renders_each_line_once_into_one_buffer() {
        let mut b = OutBatch::default();
        b.add(b"plain", false, 100, false);
        b.add(b"\xff\"q\"", false, 100, false);
        b.add(&[b'x'; 50], false, 20, false);
        b.add(
            br#"{"jsonrpc":"2.0","id":7,"result":{"sessionId":"a"}}"#,
            true,
            100,
            true,
        );
        let rest = |i: usize| &b.rendered[b.lines[i].rendered.clone()];
        assert_eq!(rest(0), r#","type":"output","line":"plain""#);
        assert_eq!(
            rest(1),
            ",\"type\":\"output\",\"line\":\"\u{fffd}\\\"q\\\"\",\"lossy\":true"
        );
        assert_eq!(
            rest(2),
            format!(
                r#","type":"output","line":"{}","truncated":true"#,
                "x".repeat(18)
            )
        );
        assert!(rest(3).ends_with(r#"}","truncated":true"#));
        assert_eq!(
            b.lines[3].response,
            Some(("7".to_string(), Some("a".to_string())))
        );
        assert_eq!(b.lines[0].response, None);
        // Each body, behind its seq and an id, is the line clients have always been sent: the
        // output item's fields in their order, the line as serde_json encodes it.
        let text: Arc<str> = Arc::from(b.rendered.as_str());
        let wants = [
            (r#"{"id":3,"seq":41,"type":"output","line":"plain"}"#.to_string()),
            (format!(
                r#"{{"id":3,"seq":42,"type":"output","line":{},"lossy":true}}"#,
                serde_json::to_string("\u{fffd}\"q\"").unwrap()
            )),
            (format!(
                r#"{{"id":3,"seq":43,"type":"output","line":"{}","truncated":true}}"#,
                "x".repeat(18)
            )),
        ];
        for (i, want) in wants.iter().enumerate() {
            let it = Item::shared(
                41 + i as i64,
                text.clone(),
                b.lines[i].rendered.clone(),
                false,
            );
            let mut line = Vec::new();
            it.write_line(&mut line, "3");
            assert_eq!(String::from_utf8(line).unwrap(), format!("{want}\n"));
        }
        b.clear();
        assert!(b.lines.is_empty() && b.rendered.is_empty());
    }

    #[test]
    pub(super) fn capped_lines() {
        let data = b"short\nlooooooong\r\nend";
        let mut r = BufReader::with_capacity(3, &data[..]);
        assert_eq!(
            read_capped_line(&mut r, 4).unwrap(),
            Some((b"shor".to_vec(), true))
        );
        assert_eq!(
            read_capped_line(&mut r, 100).unwrap(),
            Some((b"looooooong".to_vec(), false))
        );
        assert_eq!(
            read_capped_line(&mut r, 100).unwrap(),
            Some((b"end".to_vec(), false))
        );
        assert_eq!(read_capped_line(&mut r, 100).unwrap(), None);
    }
}
