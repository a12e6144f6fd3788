// `client.attach(session, { since })`: an async iterator over a session's stream items that
// survives disconnects and daemon restarts. It reconnects (the client does, with backoff) and
// reattaches from the last seq it received, dropping any seq it already has, so every item is
// delivered exactly once and in seq order; what it cannot deliver it says with a typed `gap`
// item (items evicted from the daemon's replay buffer, or a session that was restarted under
// another lease while the client was away). The iterator finishes after an `end` item.
//
// Backpressure: the connection is never paused (the daemon drops clients that do not read for
// 30 s). When more than `highWaterMark` items wait for the consumer, the stream detaches and
// ignores what is still in flight; once the consumer has drained to `lowWaterMark` it attaches
// again from its last seq.

import { abortError, ConnectionClosedError } from './errors.js';

export class AttachStream {
  #client;
  #session;
  #opts;
  #cursor;
  #now;
  /** Items waiting for the consumer: `#queue[#head..]` (a head index: `shift()` on a long array
   * copies it). */
  #queue = [];
  #head = 0;
  /** The pending `next()` call's resolve, while the consumer waits for an item. */
  #waiter = null;
  #done = false;
  #error = null;
  #started = false;
  #subscribing = false;
  #gen = 0;
  #id = null;
  #early = null;
  #leaseId = null;
  #attachedOnce = false;
  #paused = false;
  #readyWaiters = [];
  #high;
  #low;

  constructor(client, session, opts = {}) {
    this.#client = client;
    this.#session = session;
    this.#opts = opts;
    this.#now = opts.since === 'now';
    this.#cursor = this.#now ? 0 : (opts.since ?? 0);
    this.#high = opts.highWaterMark ?? 10_000;
    this.#low = opts.lowWaterMark ?? Math.floor(this.#high / 2);
    if (opts.signal) {
      if (opts.signal.aborted) this.#abort();
      else opts.signal.addEventListener('abort', () => this.#abort(), { once: true });
    }
  }

  /** The seq of the last item received (what a reattach continues after). */
  get lastSeq() {
    return this.#cursor;
  }

  /** The current attach request's id on the connection (for `detach`). */
  get attachId() {
    return this.#id;
  }

  get leaseId() {
    return this.#leaseId;
  }

  [Symbol.asyncIterator]() {
    return this;
  }

  /** Starts the stream (if not started) and resolves once the daemon accepted the attach. */
  ready() {
    this.#start();
    if (this.#attachedOnce) return Promise.resolve(this);
    if (this.#error) return Promise.reject(this.#error);
    return new Promise((resolve, reject) => this.#readyWaiters.push({ resolve, reject }));
  }

  /** Items waiting for the consumer. */
  get #queued() {
    return this.#queue.length - this.#head;
  }

  next() {
    this.#start();
    if (this.#queued > 0) return Promise.resolve(this.#take());
    if (this.#done) return this.#end();
    // One promise per wait, not per item: items that arrive while the consumer is busy are
    // taken straight from the queue by the calls that follow.
    return new Promise((resolve, reject) => {
      this.#waiter = () => {
        if (this.#queued > 0) resolve(this.#take());
        else if (this.#done) this.#end().then(resolve, reject);
        else return false;
        return true;
      };
    });
  }

  #take() {
    const value = this.#queue[this.#head];
    this.#queue[this.#head++] = undefined;
    if (this.#head === this.#queue.length) {
      this.#queue = [];
      this.#head = 0;
    } else if (this.#head >= 1024 && this.#head * 2 >= this.#queue.length) {
      this.#queue = this.#queue.slice(this.#head);
      this.#head = 0;
    }
    if (this.#paused && this.#queued <= this.#low) {
      this.#paused = false;
      this.#subscribe();
    }
    return { value, done: false };
  }

  #end() {
    if (this.#error) {
      const e = this.#error;
      this.#error = null;
      return Promise.reject(e);
    }
    return Promise.resolve({ value: undefined, done: true });
  }

  async return() {
    this.#finish(null);
    return { value: undefined, done: true };
  }

  #start() {
    if (this.#started) return;
    this.#started = true;
    this.#client._track(this);
    this.#subscribe();
  }

  #wake() {
    const w = this.#waiter;
    if (w !== null && w()) this.#waiter = null;
  }

  #push(item) {
    if (this.#listener) {
      this.#listener.item(item);
      return;
    }
    this.#queue.push(item);
    this.#wake();
  }

  #listener = null;

  /**
   * Delivers items to callbacks as they arrive instead of through the iterator (no promise per
   * item; used by the ACP channel). `done(error|null)` is called once when the stream finishes.
   * Backpressure does not apply: the callbacks consume synchronously.
   */
  _listen(item, done) {
    this.#listener = { item, done };
    this.#high = Infinity;
    this.#start();
  }

  #abort() {
    this.#finish(abortError(this.#opts.signal, 'attach'));
  }

  #finish(error) {
    if (this.#done) return;
    this.#done = true;
    if (error) this.#error = error;
    const id = this.#id;
    this.#gen++;
    if (id !== null) {
      this.#client._unstream(id);
      if (this.#client.connected && this.#client.supports('detach')) {
        this.#client.detach(id).catch(() => {});
      }
    }
    this.#client._untrack(this);
    if (this.#listener) {
      const l = this.#listener;
      queueMicrotask(() => l.done(error));
    }
    for (const w of this.#readyWaiters.splice(0)) {
      if (error) w.reject(error);
      else w.resolve(this);
    }
    this.#wake();
  }

  async #subscribe() {
    if (this.#done || this.#subscribing || this.#paused) return;
    this.#subscribing = true;
    try {
      for (;;) {
        if (this.#done || this.#paused) return;
        const gen = ++this.#gen;
        this.#early = [];
        const fields = { session: this.#session, since: this.#cursor };
        const clampable = this.#client.supports('attach.sinceClamp');
        if (this.#now && !this.#attachedOnce) {
          if (clampable) fields.since = Number.MAX_SAFE_INTEGER;
          else fields.since = await this.#lastSeqFromStatus();
        }
        if ((this.#opts.stderr ?? true) && this.#client.supports('attach.stderr')) fields.stderr = true;
        let reply;
        try {
          reply = await this.#client._stream('attach', fields, (item) => this.#onItem(gen, item), {
            timeoutMs: this.#opts.timeoutMs,
          });
        } catch (e) {
          if (this.#done) return;
          if (e.code === 'connection_closed') {
            try {
              await this.#client._ready();
            } catch (gone) {
              this.#finish(gone);
              return;
            }
            continue;
          }
          if (gen !== this.#gen) return;
          if (e.code === 'seq_evicted') {
            const oldest = Number(e.data.oldestSeq);
            this.#push({ type: 'gap', reason: 'evicted', afterSeq: this.#cursor, nextSeq: oldest, oldestSeq: oldest, lastSeq: e.data.lastSeq });
            this.#cursor = oldest - 1;
            continue;
          }
          if (e.code === 'not_found' && this.#attachedOnce) {
            // The daemon came back without the session (it was stopped or killed meanwhile).
            this.#push({ type: 'end', reason: 'gone', lastSeq: this.#cursor, message: e.message });
            this.#finish(null);
            return;
          }
          this.#finish(e);
          return;
        }
        if (gen !== this.#gen || this.#done) return;
        const { id, result } = reply;
        this.#id = id;
        if (this.#now && !this.#attachedOnce) this.#cursor = Number(result.since);
        else if (result.clamped) {
          this.#push({ type: 'gap', reason: 'clamped', afterSeq: this.#cursor, lastSeq: result.lastSeq });
          this.#cursor = Number(result.since);
        }
        if (this.#leaseId && result.leaseId && result.leaseId !== this.#leaseId) {
          // Reattached to a new lease of the session: what the old one said after our last
          // seq (if anything) was not received.
          this.#push({ type: 'gap', reason: 'lease_changed', afterSeq: this.#cursor, previousLeaseId: this.#leaseId, leaseId: result.leaseId });
        }
        if (result.leaseId) this.#leaseId = result.leaseId;
        this.#attachedOnce = true;
        for (const w of this.#readyWaiters.splice(0)) w.resolve(this);
        const early = this.#early;
        this.#early = null;
        for (const item of early) this.#accept(item);
        return;
      }
    } finally {
      this.#subscribing = false;
    }
  }

  async #lastSeqFromStatus() {
    const st = await this.#client.status();
    const s = (st?.daemon?.sessions ?? []).find((x) => x.sessionKey === this.#session);
    return s ? Number(s.lastSeq) : 0;
  }

  #onItem(gen, item) {
    if (gen !== this.#gen || this.#done) return;
    if (this.#early) this.#early.push(item);
    else this.#accept(item);
  }

  #accept(item) {
    // The item as the daemon sent it (it keeps the attach request's `id`; copying every item
    // without it would cost more than the field does).
    const rest = item;
    if (rest.type === 'end') {
      this.#client._unstream(this.#id);
      if (rest.reason === 'evicted') {
        const oldest = Number(rest.error?.oldestSeq ?? this.#cursor + 1);
        this.#push({ type: 'gap', reason: 'evicted', afterSeq: this.#cursor, nextSeq: oldest, oldestSeq: oldest, lastSeq: rest.error?.lastSeq });
        this.#cursor = Math.max(this.#cursor, oldest - 1);
        this.#gen++;
        this.#subscribe();
        return;
      }
      if (rest.reason === 'detached') {
        // Detached by someone else on this connection (our own detaches are not listened to):
        // keep streaming.
        this.#gen++;
        this.#subscribe();
        return;
      }
      this.#id = null;
      this.#push(rest);
      this.#finish(null);
      return;
    }
    if (this.#paused) return; // resent after the reattach
    if (typeof rest.seq === 'number') {
      if (rest.seq <= this.#cursor) return; // already delivered
      this.#cursor = rest.seq;
    }
    this.#push(rest);
    if (this.#queued >= this.#high && this.#client.supports('detach')) {
      // Stop listening at once (what is still in flight is dropped: the seq cursor did not move
      // past it) and let the daemon end the stream; next() reattaches once drained.
      const id = this.#id;
      this.#gen++;
      this.#paused = true;
      this.#id = null;
      this.#client._unstream(id);
      this.#client.detach(id).catch(() => {});
    }
  }

  // --- called by the client -------------------------------------------------------------------

  _disconnected() {
    if (this.#done) return;
    this.#gen++;
  }

  _reconnected() {
    if (this.#done || this.#paused) return;
    this.#subscribe();
  }

  _failed(err) {
    this.#finish(err ?? new ConnectionClosedError('the connection closed'));
  }
}
