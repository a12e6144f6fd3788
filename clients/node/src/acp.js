// `client.acp(session)`: JSON-RPC 2.0 with the session's agent, over `send` (client → agent) and
// the attach stream (agent → client). `request` resolves with the response whose id matches;
// ids are unique per channel (a random prefix and a counter), so a response that arrives after
// its request was aborted or timed out is never handed to another request (it is emitted as
// `stray`). Agent-to-client requests (`session/request_permission`, `fs/*`) are emitted as
// `request` and answered with `respond`/`respondError`; notifications (`session/update`) as
// `notification`. The adapter's stderr lines, lifecycle events and gaps are emitted as well.

import { EventEmitter } from 'node:events';
import { randomBytes } from 'node:crypto';
import { abortError, AcpError, HandshakeTimeoutError, LeashAbortError, LeashTimeoutError, NotRunningError } from './errors.js';

/** How many of the adapter's last stderr lines a channel keeps (for HandshakeTimeoutError). */
const STDERR_TAIL = 20;

export class AcpChannel extends EventEmitter {
  #client;
  #session;
  #stream = null;
  #prefix = `lc${randomBytes(4).toString('hex')}-`;
  #n = 0;
  #pending = new Map();
  #closed = false;
  /** `handshakeTimeoutMs` of `open`: the deadline of the channel's first request, until it is sent. */
  #handshakeMs = 0;
  #stderrTail = [];
  /** The attach's `end` item once the session ended. */
  ended = null;

  static async open(client, session, opts = {}) {
    const ch = new AcpChannel(client, session);
    await ch.#start(opts);
    return ch;
  }

  constructor(client, session) {
    super();
    this.#client = client;
    this.#session = session;
  }

  get session() {
    return this.#session;
  }

  get stream() {
    return this.#stream;
  }

  async #start(opts) {
    const hs = opts.handshakeTimeoutMs;
    if (hs !== undefined && !(Number.isInteger(hs) && hs > 0)) {
      throw new TypeError(`acp: handshakeTimeoutMs must be a positive integer (ms), not ${JSON.stringify(hs)}`);
    }
    this.#handshakeMs = hs ?? 0;
    this.#stream = this.#client.attach(this.#session, {
      since: opts.since ?? 'now',
      stderr: true,
      highWaterMark: opts.highWaterMark,
    });
    this.#stream._listen(
      (item) => this.#onItem(item),
      (err) => this.#shut(err ?? new NotRunningError(`session ${this.#session}'s stream ended before the response came`)),
    );
    await this.#stream.ready();
  }

  #onItem(item) {
    switch (item.type) {
      case 'output':
        return this.#onLine(item);
      case 'stderr':
        this.#stderrTail.push(item.line);
        if (this.#stderrTail.length > STDERR_TAIL) this.#stderrTail.shift();
        return this.emit('stderr', item.line, item);
      case 'event':
        return this.emit('event', item);
      case 'gap':
        return this.emit('gap', item);
      case 'end':
        this.ended = item;
        return this.emit('end', item);
      default:
        return this.emit('item', item);
    }
  }

  #onLine(item) {
    let msg;
    try {
      msg = JSON.parse(item.line);
    } catch {
      return this.emit('line', item.line, item);
    }
    if (!msg || typeof msg !== 'object' || Array.isArray(msg)) return this.emit('line', item.line, item);
    if (typeof msg.method === 'string') {
      if (msg.id !== undefined && msg.id !== null) {
        if (this.listenerCount('request') === 0) {
          this.respondError(msg.id, -32601, `method not found: ${msg.method}`).catch(() => {});
        } else {
          this.emit('request', msg, item);
        }
      } else {
        this.emit('notification', msg, item);
      }
      return;
    }
    if ('id' in msg && ('result' in msg || 'error' in msg)) {
      const key = JSON.stringify(msg.id);
      const p = this.#pending.get(key);
      if (!p) return this.emit('stray', msg, item);
      this.#pending.delete(key);
      p.cleanup();
      if ('error' in msg && msg.error) {
        const e = msg.error;
        p.reject(new AcpError(`${p.method}: ${e.message ?? 'error'}`, { rpcCode: e.code, data: { rpcError: e } }));
      } else p.resolve(msg.result);
      return;
    }
    this.emit('line', item.line, item);
  }

  /**
   * Sends a request and resolves with its result (rejects with AcpError on an error response).
   * @param {string} method
   * @param {unknown} [params]
   * @param {{ signal?: AbortSignal, timeoutMs?: number }} [opts]
   */
  request(method, params, opts = {}) {
    if (this.#closed) return Promise.reject(new NotRunningError(`the ACP channel of ${this.#session} is closed`));
    const id = `${this.#prefix}${++this.#n}`;
    const key = JSON.stringify(id);
    const msg = { jsonrpc: '2.0', id, method };
    if (params !== undefined) msg.params = params;
    // The handshake deadline (`handshakeTimeoutMs`): the first request of the channel.
    const handshake = this.#handshakeMs;
    this.#handshakeMs = 0;
    if (handshake > 0) return this.#handshake(method, msg, handshake, opts);
    return new Promise((resolve, reject) => {
      let timer = null;
      const signal = opts.signal;
      const onAbort = () => {
        this.#pending.delete(key);
        cleanup();
        reject(abortError(signal, `${method} aborted`));
      };
      const cleanup = () => {
        if (timer) clearTimeout(timer);
        signal?.removeEventListener('abort', onAbort);
      };
      if (signal?.aborted) return onAbort();
      signal?.addEventListener('abort', onAbort, { once: true });
      if (opts.timeoutMs > 0) {
        timer = setTimeout(() => {
          this.#pending.delete(key);
          cleanup();
          reject(new LeashTimeoutError(`${method}: no response within ${opts.timeoutMs} ms`));
        }, opts.timeoutMs);
      }
      this.#pending.set(key, { resolve, reject, cleanup, method });
      // Not aborted with the request: the caller stops waiting, the line still goes out whole
      // (a response that comes anyway is emitted as `stray`).
      this.#client.send(this.#session, JSON.stringify(msg)).catch((e) => {
        if (this.#pending.delete(key)) {
          cleanup();
          reject(e);
        }
      });
    });
  }

  /**
   * The first request under the handshake deadline: no response within `ms` closes the session
   * (TERM, grace, KILL, waited for until it ended) and rejects with HandshakeTimeoutError
   * carrying the adapter's last stderr lines.
   */
  async #handshake(method, msg, ms, opts) {
    const key = JSON.stringify(msg.id);
    const timeoutMs = opts.timeoutMs > 0 ? Math.min(opts.timeoutMs, ms) : ms;
    try {
      return await this.request(method, msg.params, { ...opts, timeoutMs });
    } catch (e) {
      if (!(e instanceof LeashTimeoutError) || opts.timeoutMs > 0 && opts.timeoutMs < ms) throw e;
      this.#pending.delete(key);
      const session = this.#session;
      const outcomes = await this.#client.close({ session, reason: 'handshake timeout' }).catch((err) => err);
      const st = async () => (await this.#client.status()).daemon.sessions.find((s) => s.sessionKey === session);
      const deadline = Date.now() + 30_000;
      for (;;) {
        const s = await st().catch(() => null);
        if (!s || s.phase === 'ended' || Date.now() > deadline) break;
        await new Promise((r) => setTimeout(r, 20));
      }
      const stderr = [...this.#stderrTail];
      const closed = Array.isArray(outcomes) ? outcomes : [];
      this.close();
      throw new HandshakeTimeoutError(
        `${method}: session ${session}'s adapter did not answer within ${ms} ms; the session was closed${stderr.length ? `; its last stderr lines: ${stderr.join(' | ')}` : ''}`,
        { cause: e, data: { session, stderr, leaseId: closed[0]?.leaseId, outcomes: closed, closeError: Array.isArray(outcomes) ? undefined : outcomes } },
      );
    }
  }

  /** Sends a notification (no id: no response). */
  async notify(method, params, opts) {
    const msg = { jsonrpc: '2.0', method };
    if (params !== undefined) msg.params = params;
    await this.#client.send(this.#session, JSON.stringify(msg), opts);
  }

  /** Cancels the running turn of an ACP session (`session/cancel` notification). */
  cancel(sessionId, opts) {
    return this.notify('session/cancel', { sessionId }, opts);
  }

  async respond(id, result, opts) {
    await this.#client.send(this.#session, JSON.stringify({ jsonrpc: '2.0', id, result }), opts);
  }

  async respondError(id, code, message, data, opts) {
    const error = { code, message };
    if (data !== undefined) error.data = data;
    await this.#client.send(this.#session, JSON.stringify({ jsonrpc: '2.0', id, error }), opts);
  }

  /** Number of requests waiting for their response. */
  get pendingCount() {
    return this.#pending.size;
  }

  #shut(err) {
    if (this.#closed && this.#pending.size === 0) return;
    this.#closed = true;
    for (const [key, p] of this.#pending) {
      this.#pending.delete(key);
      p.cleanup();
      p.reject(err);
    }
    this.emit('close', err);
  }

  /** Stops the channel (detaches); pending requests are rejected. */
  close() {
    if (this.#closed) return;
    this.#stream?.return();
    this.#shut(new NotRunningError(`the ACP channel of ${this.#session} was closed`));
  }
}
