// Reading the daemon's NDJSON: framing raw socket chunks into lines, and decoding each line.
//
// The connection is read as bytes, not as a decoded string: newlines are found with
// `Buffer#indexOf` (memchr) in the chunk as it came, and each line is decoded on its own (a
// newline byte never occurs inside a multi-byte UTF-8 sequence, so splitting first is safe).
// Decoding the whole chunk to a string first, concatenating it with the previous rest and
// slicing it per line cost a copy and a scan more per byte.
//
// Most lines on a busy connection are stream items of one fixed shape, which the daemon renders
// itself (src/daemon/session/stdio.rs):
//
//     {"id":<id>,"seq":<n>,"type":"output","line":"<text>"}
//
// (and the same with "stderr"). Such an item is built directly — the same object, with the same
// keys in the same order, that `JSON.parse` returns for that line: text without escapes is
// decoded from its bytes as it is (no parser at all), text with escapes (an adapter's JSON-RPC
// line always has some) by parsing its string literal alone. Anything else (an extra field such
// as `lossy` or `truncated`, a reply, another item type, a request id that is not a plain
// integer) goes through `JSON.parse` whole, so what the caller gets never depends on the path.
// One leniency: text without a backslash is not checked for raw control characters, which JSON
// forbids and the daemon never sends (it escapes them).

/** `{"id":` */
const HEAD = bytes('{"id":');
/** `,"seq":` */
const SEQ = bytes(',"seq":');
/** `,"type":"` */
const TYPE = bytes(',"type":"');
/** `output","line":"` / `stderr","line":"` (same length) */
const OUTPUT = bytes('output","line":"');
const STDERR = bytes('stderr","line":"');

function bytes(s) {
  return Uint8Array.from(Buffer.from(s, 'latin1'));
}

/** Whether `b[at..]` starts with `want`. */
function at(b, i, want) {
  if (i + want.length > b.length) return false;
  for (let k = 0; k < want.length; k++) if (b[i + k] !== want[k]) return false;
  return true;
}

/** A non-negative integer of at most 15 digits (exact as a double) at `b[i..]`, or -1. */
function digitsEnd(b, i, end) {
  let k = i;
  while (k < end && k - i <= 15) {
    const c = b[k];
    if (c < 0x30 || c > 0x39) break;
    k++;
  }
  if (k === i || k - i > 15) return -1;
  if (b[i] === 0x30 && k - i > 1) return -1; // a leading zero is not JSON
  return k;
}

function number(b, i, k) {
  let n = 0;
  for (let j = i; j < k; j++) n = n * 10 + (b[j] - 0x30);
  return n;
}

/**
 * Splits a connection's bytes into lines and decodes each. `onMessage(value)` gets every line
 * that parsed as JSON, `onBadLine(text, error)` every line that did not; blank lines are
 * skipped.
 */
export class LineDecoder {
  /** Pieces of a line that has not ended yet (the rest of earlier chunks). */
  #pieces = [];
  #onMessage;
  #onBadLine;
  /** The position of the next backslash in `#bsChunk` at or after `#bsFrom` (or its length). */
  #bsChunk = null;
  #bsFrom = 0;
  #bsAt = 0;

  constructor(onMessage, onBadLine) {
    this.#onMessage = onMessage;
    this.#onBadLine = onBadLine;
  }

  /** Drops a partial line (a new connection starts clean). */
  reset() {
    this.#pieces = [];
    this.#bsChunk = null;
  }

  /** @param {Buffer} chunk */
  push(chunk) {
    let start = 0;
    if (this.#pieces.length > 0) {
      const nl = chunk.indexOf(10);
      if (nl < 0) {
        this.#pieces.push(chunk);
        return;
      }
      this.#pieces.push(chunk.subarray(0, nl));
      const line = Buffer.concat(this.#pieces);
      this.#pieces = [];
      this.#line(line, 0, line.length);
      start = nl + 1;
    }
    let nl;
    while ((nl = chunk.indexOf(10, start)) >= 0) {
      this.#line(chunk, start, nl);
      start = nl + 1;
    }
    if (start < chunk.length) this.#pieces.push(start === 0 ? chunk : chunk.subarray(start));
  }

  #line(b, a, e) {
    if (a === e) return;
    const item = this.#streamItem(b, a, e);
    if (item !== null) {
      this.#onMessage(item);
      return;
    }
    const text = b.toString('utf8', a, e);
    if (text.trim() === '') return;
    let msg;
    try {
      msg = JSON.parse(text);
    } catch (err) {
      this.#onBadLine(text, err);
      return;
    }
    this.#onMessage(msg);
  }

  /** The fast path (see the top of the file): the item, or null to use `JSON.parse`. */
  #streamItem(b, a, e) {
    if (!at(b, a, HEAD)) return null;
    let i = a + HEAD.length;
    const idEnd = digitsEnd(b, i, e);
    if (idEnd < 0) return null;
    const id = number(b, i, idEnd);
    i = idEnd;
    if (!at(b, i, SEQ)) return null;
    i += SEQ.length;
    const seqEnd = digitsEnd(b, i, e);
    if (seqEnd < 0) return null;
    const seq = number(b, i, seqEnd);
    i = seqEnd;
    if (!at(b, i, TYPE)) return null;
    i += TYPE.length;
    let type;
    if (at(b, i, OUTPUT)) type = 'output';
    else if (at(b, i, STDERR)) type = 'stderr';
    else return null;
    i += OUTPUT.length;
    // The item must end with the text's closing quote and the brace (any other field after the
    // text takes the parser). Text without a backslash ends at its first quote and is decoded
    // as it is; text with escapes is the JSON string literal between the quotes, which parses
    // alone exactly when the whole line is this shape (`"a","x":1` does not).
    if (b[e - 1] !== 0x7d || b[e - 2] !== 0x22 || e - 2 < i) return null;
    let line;
    const q = b.indexOf(0x22, i);
    if (q === e - 2 && this.#backslashFrom(b, i) > q) {
      line = b.toString('utf8', i, q);
    } else {
      try {
        line = JSON.parse(b.toString('utf8', i - 1, e - 1));
      } catch {
        return null;
      }
    }
    return { id, seq, type, line };
  }

  /**
   * The first backslash at or after `from` in `b`. Remembered per chunk, so a chunk without
   * escapes is scanned for them once, not once per line to its end.
   */
  #backslashFrom(b, from) {
    if (this.#bsChunk !== b || from < this.#bsFrom || (this.#bsAt < from && this.#bsAt < b.length)) {
      const k = b.indexOf(0x5c, from);
      this.#bsChunk = b;
      this.#bsFrom = from;
      this.#bsAt = k < 0 ? b.length : k;
    }
    return this.#bsAt;
  }
}
