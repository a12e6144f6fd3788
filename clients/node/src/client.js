// The connection to `leash serve`: NDJSON framing, request ids and reply matching, routing of
// stream items to their attach (or to the lifecycle subscription), typed errors, per-call
// timeouts and AbortSignals, and reconnection. Pending calls are rejected when the connection
// closes (a request may or may not have been applied: it is never re-sent); attach streams and
// the lifecycle subscription are re-established on the new connection.
//
// An idle client does not keep Node's event loop alive: the socket is referenced only while a
// call waits for its reply, an attach (or an ACP channel) is open, or the connection is
// subscribed to lifecycle pushes, so a script that forgets `disconnect()` still exits when its
// work is done (like a timer with `unref()`).
//
// The client reads the socket eagerly and never stops reading (the daemon drops a client that
// does not read for 30 s); an attach whose consumer falls behind detaches itself and reattaches
// from its last seq once drained (see attach.js), so memory stays bounded without stalling the
// connection.

import { EventEmitter } from 'node:events';
import { createConnection } from 'node:net';
import {
  abortError,
  ConnectionClosedError,
  LeashAbortError,
  LeashTimeoutError,
  NoDaemonError,
  ProtocolError,
  ForbiddenError,
  AcpError,
  ResumeError,
  SpawnFailedError,
  errorFromWire,
} from './errors.js';
import { findSocket, resolveStateDir } from './locate.js';
import { AttachStream } from './attach.js';
import { AcpChannel } from './acp.js';
import { LineDecoder } from './wire.js';

const DEFAULT_TIMEOUT_MS = 60_000;
/** Timeouts at least this long are checked by the sweeping timer, every SWEEP_EVERY_MS. */
const SWEEP_MIN_MS = 2_000;
const SWEEP_EVERY_MS = 100;
const DEFAULT_RECONNECT_MS = 30_000;
const CLIENT_NAME = 'leash-client/0.1.0';

/**
 * Connects to the daemon of a state root (found as the CLI finds it) and says hello.
 * @param {import('../index.js').ConnectOptions} [opts]
 */
export async function connect(opts = {}) {
  const c = new LeashClient(opts);
  await c.open();
  return c;
}

export class LeashClient extends EventEmitter {
  #opts;
  #socket = null;
  /** Frames and decodes what the daemon sends (see wire.js). */
  #lines = new LineDecoder(
    (msg) => this.#route(msg),
    (text, e) => this.emit('protocolError', new ProtocolError(`the daemon sent a line that is not JSON: ${text.slice(0, 200)}`, { cause: e })),
  );
  #nextId = 1;
  /** id (string form) -> { resolve, reject, cleanup } */
  #pending = new Map();
  /** id (string form) -> handler(item) for stream items (attaches, the hello subscription) */
  #streams = new Map();
  #closed = false;
  #connected = false;
  /** resolves when a connection is up; replaced while reconnecting */
  #ready = null;
  #reconnecting = null;
  #attaches = new Set();
  #subscribed = false;
  #helloId = null;
  /** What the daemon said in its hello (null for a daemon without hello). */
  info = null;
  /**
   * Resumable sessions pushed on this connection (with `events: true`), by session key, until
   * they are resumed: pushes that came before a listener was added are found here.
   * @type {Map<string, object>}
   */
  resumable = new Map();

  constructor(opts = {}) {
    super();
    this.#opts = {
      timeoutMs: DEFAULT_TIMEOUT_MS,
      reconnect: true,
      reconnectTimeoutMs: DEFAULT_RECONNECT_MS,
      ...opts,
    };
    this.#subscribed = !!opts.events;
  }

  get stateDir() {
    return resolveStateDir(this.#opts.stateDir);
  }

  get connected() {
    return this.#connected;
  }

  /** Features the daemon announced in hello (empty for a daemon without hello). */
  get features() {
    return this.info?.features ?? [];
  }

  supports(feature) {
    return this.features.includes(feature);
  }

  async open() {
    this.#ready = this.#dial();
    await this.#ready;
  }

  #dialing = false;

  async #dial() {
    this.#dialing = true;
    try {
      return await this.#dialOnce();
    } finally {
      this.#dialing = false;
    }
  }

  async #dialOnce() {
    const path = await findSocket(this.#opts);
    const sock = await new Promise((resolve, reject) => {
      const s = createConnection({ path });
      const fail = (e) => {
        s.destroy();
        reject(new NoDaemonError(`no leash serve answers on ${path} (${e.code ?? e.message}); start it with \`leash serve\``, { cause: e }));
      };
      s.once('error', fail);
      s.once('connect', () => {
        s.off('error', fail);
        resolve(s);
      });
    });
    this.#attachSocket(sock);
    // A (re)started daemon pushes its own list of resumable sessions after the hello.
    this.resumable.clear();
    try {
      this.info = await this.#hello();
    } catch (e) {
      if (e && e.code === 'unknown_op') this.info = null; // an older daemon: no hello
      else {
        this.#socket?.destroy();
        throw e;
      }
    }
    this.emit('connect', this.info);
    return this.info;
  }

  /**
   * References the socket (and so keeps the event loop alive) only while something waits on
   * it: a pending call, an open attach, a lifecycle subscription. Called whenever one of them
   * changes; a no-op unless the answer changes.
   */
  #refresh() {
    const sock = this.#socket;
    if (!sock) return;
    const hold = this.#pending.size > 0 || this.#attaches.size > 0 || this.#subscribed;
    if (hold === this.#held) return;
    this.#held = hold;
    if (hold) sock.ref();
    else sock.unref();
  }

  /** Whether the current socket is referenced (sockets start referenced). */
  #held = true;

  #attachSocket(sock) {
    this.#socket = sock;
    this.#held = true;
    this.#connected = true;
    this.#lines.reset();
    sock.on('data', (chunk) => this.#lines.push(chunk));
    sock.on('error', () => {});
    sock.on('close', () => this.#onClose(sock));
  }

  #hello() {
    const fields = { client: CLIENT_NAME, protocol: 1 };
    if (this.#subscribed) fields.events = true;
    const id = this.#allocId();
    this.#helloId = id;
    if (this.#subscribed) this.#streams.set(String(id), (item) => this.#onLifecycle(item));
    return this.#call(id, 'hello', fields, {});
  }

  #onLifecycle(item) {
    const { id, ...rest } = item;
    if (rest.type === 'resumable' && typeof rest.sessionKey === 'string') this.resumable.set(rest.sessionKey, rest);
    if (rest.type === 'resumed') this.resumable.delete(rest.sessionKey);
    this.emit('lifecycle', rest);
    if (typeof rest.type === 'string') this.emit(rest.type, rest);
  }

  #route(msg) {
    if (msg === null || typeof msg !== 'object') return;
    const key = msg.id === null || msg.id === undefined ? null : String(msg.id);
    if ('ok' in msg) {
      const p = key === null ? undefined : this.#pending.get(key);
      if (!p) {
        // An error without an id (a line the daemon could not read) or a reply to a call that
        // timed out or was aborted.
        if (msg.ok === false) {
          const err = errorFromWire(msg.error);
          if (err instanceof ForbiddenError) this.#forbidden = err;
          this.emit('protocolError', err);
        }
        return;
      }
      this.#pending.delete(key);
      p.cleanup();
      this.#refresh();
      if (msg.ok === true) p.resolve(msg.result);
      else p.reject(errorFromWire(msg.error));
      return;
    }
    const h = key === null ? undefined : this.#streams.get(key);
    if (h) h(msg);
  }

  #forbidden = null;
  /** session key -> what a resume that failed after its ensure had found (see resume()). */
  #unresumed = new Map();

  #onClose(sock) {
    if (sock !== this.#socket) return;
    this.#connected = false;
    this.#socket = null;
    if (this.#dialing) {
      // A connection that died during its own hello: the dial fails and its caller retries.
      for (const [key, p] of this.#pending) {
        this.#pending.delete(key);
        p.cleanup();
        p.reject(new ConnectionClosedError('the connection to leash serve closed during hello'));
      }
      this.#streams.clear();
      return;
    }
    const err = this.#forbidden ?? new ConnectionClosedError('the connection to leash serve closed before the reply came; the request may or may not have been applied');
    for (const [key, p] of this.#pending) {
      this.#pending.delete(key);
      p.cleanup();
      p.reject(err);
    }
    // Stream handlers belong to the old connection; attaches re-register on reconnect.
    this.#streams.clear();
    for (const a of this.#attaches) a._disconnected();
    this.emit('disconnect');
    if (this.#closed) return;
    if (!this.#opts.reconnect || this.#forbidden) {
      this.#giveUp(err);
      return;
    }
    this.#reconnecting = this.#reconnectLoop();
    this.#ready = this.#reconnecting;
    this.#ready.catch(() => {});
  }

  async #reconnectLoop() {
    const deadline = Date.now() + this.#opts.reconnectTimeoutMs;
    let delay = 25;
    for (;;) {
      if (this.#closed) throw new ConnectionClosedError('the client was closed');
      try {
        const info = await this.#dial();
        this.#reconnecting = null;
        this.emit('reconnect', info);
        for (const a of this.#attaches) a._reconnected();
        return info;
      } catch (e) {
        if (Date.now() + delay > deadline) {
          const err = new ConnectionClosedError(`cannot reconnect to leash serve within ${this.#opts.reconnectTimeoutMs} ms: ${e.message}`, { cause: e });
          this.#giveUp(err);
          throw err;
        }
        await new Promise((r) => {
          const t = setTimeout(r, delay);
          // An idle client retries in the background without keeping the process alive.
          if (this.#pending.size === 0 && this.#attaches.size === 0 && !this.#subscribed) t.unref();
        });
        delay = Math.min(delay * 2, 1000);
      }
    }
  }

  #giveUp(err) {
    this.#closed = true;
    for (const a of this.#attaches) a._failed(err);
    this.#attaches.clear();
    this.emit('close', err);
  }

  #allocId() {
    return this.#nextId++;
  }

  /** The line to write for a request (exposed for the raw-socket benchmark and tests). */
  static requestLine(id, op, fields) {
    // Written as text around the fields' own JSON: spreading the fields into a new object
    // first cost more than the rest of the request's JSON (a few µs a request).
    // Anything but a plain object without `id`, `op` or `toJSON` of its own takes the spread.
    if (fields === null || typeof fields !== 'object' || Object.getPrototypeOf(fields) !== Object.prototype || 'id' in fields || 'op' in fields || 'toJSON' in fields) {
      return JSON.stringify({ ...fields, id, op }) + '\n';
    }
    const head = `{"id":${JSON.stringify(id)},"op":${JSON.stringify(op)}`;
    const body = JSON.stringify(fields);
    return body.length === 2 ? `${head}}\n` : `${head},${body.slice(1)}\n`;
  }

  /**
   * Sends any operation, also ones this client has no method for (a newer daemon's), and
   * resolves with its result.
   * @param {string} op
   * @param {Record<string, unknown>} [fields]
   * @param {import('../index.js').CallOptions} [opts]
   */
  request(op, fields = {}, opts = {}) {
    // The hot path (connected) sends at once; otherwise wait for the (re)connection first.
    if (!this.#closed && this.#connected && !this.#reconnecting) {
      return this.#call(this.#allocId(), op, fields, opts);
    }
    return this.#whenReady(opts).then(() => this.#call(this.#allocId(), op, fields, opts));
  }

  async #whenReady(opts) {
    if (this.#closed) throw new ConnectionClosedError('the client is closed');
    if (this.#connected && !this.#reconnecting) return;
    const ready = this.#ready;
    await withDeadline(ready, opts, this.#opts.timeoutMs, 'waiting for the connection');
  }

  /** Sends a request with a given id and waits for its reply. */
  #call(id, op, fields, opts) {
    const sock = this.#socket;
    if (!sock || !this.#connected) {
      return Promise.reject(new ConnectionClosedError('not connected to leash serve'));
    }
    const key = String(id);
    const timeoutMs = opts.timeoutMs ?? this.#opts.timeoutMs;
    return new Promise((resolve, reject) => {
      let timer = null;
      const signal = opts.signal;
      const onAbort = () => {
        this.#pending.delete(key);
        cleanup();
        this.#refresh();
        reject(abortError(signal, `${op} aborted`));
      };
      const cleanup = () => {
        if (timer) clearTimeout(timer);
        if (signal) signal.removeEventListener('abort', onAbort);
      };
      if (signal?.aborted) {
        reject(abortError(signal, `${op} aborted`));
        return;
      }
      const expire = () => {
        this.#pending.delete(key);
        cleanup();
        this.#refresh();
        reject(new LeashTimeoutError(`${op}: no reply from leash serve within ${timeoutMs} ms (it may still take effect)`));
      };
      let deadline = 0;
      if (timeoutMs > 0 && Number.isFinite(timeoutMs)) {
        if (timeoutMs < SWEEP_MIN_MS) {
          timer = setTimeout(expire, timeoutMs);
          timer.unref?.();
        } else {
          // Long timeouts (the default) are checked by one sweeping timer rather than a timer
          // per call: a few ms late at most, and nothing to create and cancel per request.
          deadline = Date.now() + timeoutMs;
          this.#armSweep();
        }
      }
      if (signal) signal.addEventListener('abort', onAbort, { once: true });
      this.#pending.set(key, { resolve, reject, cleanup, deadline, expire });
      this.#refresh();
      sock.write(LeashClient.requestLine(id, op, fields));
    });
  }

  #sweeper = null;

  #armSweep() {
    if (this.#sweeper) return;
    this.#sweeper = setInterval(() => {
      const now = Date.now();
      let waiting = 0;
      for (const p of this.#pending.values()) {
        if (p.deadline === 0) continue;
        if (p.deadline <= now) p.expire();
        else waiting++;
      }
      if (waiting === 0) {
        clearInterval(this.#sweeper);
        this.#sweeper = null;
      }
    }, SWEEP_EVERY_MS);
    this.#sweeper.unref?.();
  }

  /** Registers a stream handler for an id, then sends the request (so no item is missed). */
  async _stream(op, fields, handler, opts = {}) {
    await this.#whenReady(opts);
    const id = this.#allocId();
    this.#streams.set(String(id), handler);
    try {
      const result = await this.#call(id, op, fields, opts);
      return { id, result };
    } catch (e) {
      this.#streams.delete(String(id));
      throw e;
    }
  }

  /** Resolves once connected (waiting for a reconnection in progress); rejects once given up. */
  _ready(opts = {}) {
    return this.#whenReady(opts);
  }

  _unstream(id) {
    this.#streams.delete(String(id));
  }

  _track(a) {
    this.#attaches.add(a);
    this.#refresh();
  }

  _untrack(a) {
    this.#attaches.delete(a);
    this.#refresh();
  }

  /** Writes bytes as they are (diagnostics and tests: malformed lines get null-id errors). */
  writeRaw(data) {
    if (!this.#socket) throw new ConnectionClosedError('not connected to leash serve');
    this.#socket.write(data);
  }

  /**
   * Drops the current connection as a network failure would (the client reconnects, attaches
   * reattach from their last seq). For tests and for operators who want a fresh connection.
   */
  dropConnection() {
    this.#socket?.destroy();
  }

  /** Closes the client: pending calls are rejected, attaches end, no reconnection. */
  async disconnect() {
    if (this.#closed && !this.#socket) return;
    this.#closed = true;
    const sock = this.#socket;
    for (const a of [...this.#attaches]) a._failed(new ConnectionClosedError('the client was closed'));
    this.#attaches.clear();
    if (sock && !sock.destroyed) {
      // The wait holds the event loop: an idle client's socket is unref'd, and a promise that
      // nothing referenced can settle would end a top-level `await` with Node's exit 13.
      // The daemon closes its side on our end-of-file; a daemon that does not within a second
      // has the socket destroyed.
      sock.ref();
      await new Promise((r) => {
        const timer = setTimeout(() => sock.destroy(), 1000);
        sock.once('close', () => {
          clearTimeout(timer);
          r();
        });
        sock.end();
      });
    }
  }

  async [Symbol.asyncDispose]() {
    await this.disconnect();
  }

  // --- one method per operation -------------------------------------------------------------

  hello(opts) {
    return this.request('hello', { client: CLIENT_NAME, protocol: 1 }, opts);
  }

  ping(opts) {
    return this.request('ping', {}, opts);
  }

  status(opts) {
    return this.request('status', {}, opts);
  }

  /**
   * Starts a session's adapter, or returns the running one. Without `argv` the session's stored
   * spec is used (resume).
   */
  ensure(session, spec = {}, opts = {}) {
    // The reply may come after a wait in the key's queue and the adapter's first-line wait.
    // With `initialize`, the handshake's deadline and the close after a timeout as well.
    const handshake = spec.initialize ? (spec.handshakeTimeoutMs ?? 30_000) + (spec.graceMs ?? 3_000) + 5_000 : 0;
    const waits = (spec.queueTimeoutMs ?? 120_000) + (spec.waitMs ?? 0) + handshake + 5_000;
    const reply = this.request('ensure', { session, ...spec }, { timeoutMs: Math.max(this.#opts.timeoutMs, 30_000, waits), ...opts });
    if (!Array.isArray(spec.argv)) return reply;
    // A failed start carries the command, as spawn()'s does.
    return reply.catch((e) => {
      if (e instanceof SpawnFailedError && e.data.argv === undefined) e.data.argv = spec.argv;
      throw e;
    });
  }

  send(session, line, opts) {
    return this.request('send', { session, line }, opts);
  }

  /** Streams a session's items after `since`; see AttachStream. */
  attach(session, opts = {}) {
    return new AttachStream(this, session, opts);
  }

  detach(attachId, opts) {
    return this.request('detach', { attachId }, opts);
  }

  cancel(target, opts = {}) {
    const t = typeof target === 'string' ? { session: target } : target;
    return this.request('cancel', t, opts);
  }

  close(target, opts = {}) {
    const t = typeof target === 'string' ? { session: target } : target;
    return this.request('close', t, { timeoutMs: Math.max(this.#opts.timeoutMs, 120_000), ...opts });
  }

  reap(options = {}, opts = {}) {
    return this.request('reap', options, { timeoutMs: Math.max(this.#opts.timeoutMs, 120_000), ...opts });
  }

  leases(filter = {}, opts) {
    return this.request('leases', filter, opts);
  }

  sessions(query = {}, opts) {
    return this.request('sessions', query, opts);
  }

  events(session, since = 0, opts) {
    return this.request('events', { session, since }, opts);
  }

  /** The `verify` op of daemons that have it (unknown_op otherwise). */
  verify(fields = {}, opts) {
    return this.request('verify', fields, opts);
  }

  /** Subscribes this connection (and its reconnections) to lifecycle pushes. */
  async subscribe(opts = {}) {
    if (this.#subscribed) return;
    this.#subscribed = true;
    this.#refresh();
    await this.#whenReady(opts);
    const { id } = await this._stream('hello', { client: CLIENT_NAME, protocol: 1, events: true }, (item) => this.#onLifecycle(item), opts);
    this.#helloId = id;
  }

  /** A JSON-RPC 2.0 channel to the session's agent over `send` and the attach stream. */
  acp(session, opts = {}) {
    return AcpChannel.open(this, session, opts);
  }

  /**
   * What an agent host does after a restart: ensure the session from its stored spec,
   * `initialize`, `session/load` of the recorded ACP session with the cwd and mcpServers it was
   * opened with (the daemon records both from the `session/new` or `session/load` it relayed),
   * then a continue prompt. When that ACP session cannot be loaded (none recorded, an agent
   * without `loadSession`, `session/load` failing) it rejects with a ResumeError, and opens a
   * fresh ACP session instead only with `fresh: 'allow'`.
   */
  async resume(session, opts = {}) {
    const fresh = opts.fresh ?? 'never';
    if (fresh !== 'never' && fresh !== 'allow') {
      throw new TypeError(`resume: fresh must be 'never' or 'allow', not ${JSON.stringify(fresh)}`);
    }
    const st = await this.status(opts);
    const entry = (st?.daemon?.resumable ?? []).find((r) => r.sessionKey === session) ?? null;
    const live = (st?.daemon?.sessions ?? []).find((s) => s.sessionKey === session && s.phase !== 'ended') ?? null;
    // A resume that failed after its ensure took the session off the daemon's resumable list;
    // what it had found is kept here for a retry on this client (e.g. with fresh: 'allow').
    const memo = entry || live?.acpSessionIds?.length ? null : this.#unresumed.get(session) ?? null;
    const recorded = [...(entry?.acpSessions ?? []), ...(live?.acpSessions ?? []), ...(memo ? [memo.rec] : [])];
    const fail = (reason, message, extra = {}) =>
      new ResumeError(`resume ${session}: ${message}`, { reason, cause: extra.cause, data: { session, ...extra.data } });

    // The target: the caller's, else the ACP session of the interrupted prompt, else the only one.
    let target = opts.acpSessionId ?? memo?.rec?.sessionId ?? null;
    let why = null;
    if (!target) {
      const interrupted = [...new Set((entry?.pendingPrompts ?? []).map((p) => p.acpSessionId).filter(Boolean))];
      const ids = [...new Set([...(entry?.acpSessionIds ?? []), ...(live?.acpSessionIds ?? [])])];
      if (interrupted.length === 1) target = interrupted[0];
      else if (ids.length === 1) target = ids[0];
      else if (ids.length === 0) why = fail('no_acp_session', 'no ACP session was recorded for it (it never opened one, or it was not running when the daemon stopped)');
      else why = fail('ambiguous_acp_session', `it had ${ids.length} ACP sessions (${ids.join(', ')}) and none was interrupted; name one with acpSessionId`, { data: { acpSessionIds: ids } });
    }
    if (why && fresh !== 'allow') throw why;
    const rec = target ? recorded.find((a) => a.sessionId === target) : null;
    const cwd = opts.cwd ?? rec?.cwd;
    const mcpServers = opts.mcpServers ?? rec?.mcpServers;
    if (typeof cwd !== 'string' || !Array.isArray(mcpServers)) {
      throw fail(
        'setup_unknown',
        `the cwd and mcpServers ${target ? `of ACP session ${target}` : 'of a fresh ACP session'} are not recorded (a daemon that does not record them, or an ACP session opened without them); pass cwd and mcpServers`,
        { data: { acpSessionId: target } },
      );
    }
    this.#unresumed.delete(session);

    // A spec stored without its env values (no persistEnv) needs them again.
    const ensured = await this.ensure(session, opts.env ? { env: opts.env } : {}, opts);
    const acp = await this.acp(session, opts);
    try {
      const init = await acp.request('initialize', {
        protocolVersion: 1,
        clientCapabilities: opts.clientCapabilities ?? { fs: { readTextFile: false, writeTextFile: false }, terminal: false },
      }, opts);
      let acpSessionId = target;
      let loaded = false;
      if (target && !init?.agentCapabilities?.loadSession) {
        why = fail('load_unsupported', `the agent has no loadSession capability, so ACP session ${target} cannot be loaded`, { data: { acpSessionId: target, ensured } });
        if (fresh !== 'allow') throw why;
      } else if (target) {
        try {
          await acp.request('session/load', { sessionId: target, cwd, mcpServers }, opts);
          loaded = true;
        } catch (e) {
          if (!(e instanceof AcpError)) throw e;
          why = fail('load_failed', `session/load of ${target} failed: ${e.message}`, { cause: e, data: { acpSessionId: target, ensured, rpcCode: e.rpcCode } });
          if (fresh !== 'allow') throw why;
        }
      }
      if (!loaded) {
        const created = await acp.request('session/new', { cwd, mcpServers }, opts);
        acpSessionId = created.sessionId;
      }
      let response = null;
      if (opts.prompt !== null) {
        const text = opts.prompt ?? 'Continue where you left off.';
        response = await acp.request('session/prompt', { sessionId: acpSessionId, prompt: [{ type: 'text', text }] }, opts);
      }
      return {
        acp,
        acpSessionId,
        loaded,
        fresh: !loaded,
        freshReason: loaded ? null : why?.reason ?? null,
        cwd,
        mcpServers,
        ensured,
        resumable: entry ?? memo?.entry ?? null,
        initialize: init,
        response,
      };
    } catch (e) {
      acp.close();
      if (e instanceof ResumeError) {
        e.data.ensured ??= ensured;
        Object.assign(e.data, { cwd, mcpServers });
        if (target) this.#unresumed.set(session, { rec: { sessionId: target, cwd, mcpServers }, entry });
      }
      throw e;
    }
  }
}

/** Awaits `p` within the call's timeout and signal. */
function withDeadline(p, opts, defaultMs, what) {
  const timeoutMs = opts.timeoutMs ?? defaultMs;
  const signal = opts.signal;
  if (!signal && !(timeoutMs > 0 && Number.isFinite(timeoutMs))) return p;
  return new Promise((resolve, reject) => {
    let timer = null;
    const done = () => {
      if (timer) clearTimeout(timer);
      signal?.removeEventListener('abort', onAbort);
    };
    const onAbort = () => {
      done();
      reject(abortError(signal, `aborted while ${what}`));
    };
    if (signal?.aborted) return onAbort();
    signal?.addEventListener('abort', onAbort, { once: true });
    if (timeoutMs > 0 && Number.isFinite(timeoutMs)) {
      timer = setTimeout(() => {
        done();
        reject(new LeashTimeoutError(`timed out after ${timeoutMs} ms ${what}`));
      }, timeoutMs);
      timer.unref?.();
    }
    p.then((v) => { done(); resolve(v); }, (e) => { done(); reject(e); });
  });
}

export { withDeadline };
