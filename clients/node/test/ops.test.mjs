// Every operation of `leash serve` through the client against a real daemon, and every error
// code it can provoke, each as its LeashError subclass.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { mkdirSync } from 'node:fs';
import * as leash from '../src/index.js';
import { Daemon, scratch, fakeAgent, waitFor, LEASH_BIN } from './helpers.mjs';

const { connect } = leash;

test('every op returns its typed result', async (t) => {
  const dir = scratch(t, 'ops');
  const state = join(dir, 'state');
  await Daemon.start(t, state);
  const c = await connect({ stateDir: state });
  t.after(() => c.disconnect());
  assert.equal(c.info.protocol, 1);
  for (const f of ['detach', 'attach.stderr', 'ensure.storedSpec']) assert.ok(c.supports(f), f);

  const h = await c.hello();
  assert.ok(h.ops.includes('ensure'));
  assert.equal((await c.ping()).pong, true);
  const e = await c.ensure('s1', { argv: fakeAgent(), agent: 'fake', owner: 'gw:main' });
  assert.equal(e.created, true);
  assert.equal(e.phase, 'running');
  assert.equal(e.argvMatches, true);
  assert.equal((await c.ensure('s1', { argv: ['other'] })).argvMatches, false);
  const st = await c.status();
  assert.equal(st.daemon.sessions[0].sessionKey, 's1');
  const sent = await c.send('s1', JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'echo', params: { a: 1 } }));
  assert.equal(sent.bytes > 0, true);
  const it = c.attach('s1', { since: 0 });
  let echoed = null;
  for await (const item of it) {
    if (item.type === 'output' && item.line.includes('"a":1')) {
      echoed = item;
      break;
    }
  }
  assert.ok(echoed.seq > 0);
  // detach of a running attach; the iterator, detached by someone else, attaches again.
  const live = c.attach('s1', { since: 'now' });
  await live.ready();
  const first = live.attachId;
  assert.equal((await c.detach(first)).detached, 1);
  await assert.rejects(c.detach(first), leash.NotFoundError);
  const next = live.next(); // the iterator sees the end, attaches again, then waits for items
  await waitFor(() => live.attachId !== first, 'the iterator to attach again');
  await c.send('s1', JSON.stringify({ jsonrpc: '2.0', id: 2, method: 'echo', params: { b: 2 } }));
  let item = (await next).value;
  while (!(item.type === 'output' && item.line.includes('"b":2'))) item = (await live.next()).value;
  await live.return();
  // A since above the last seq is clamped, and says so.
  const clamped = await c.request('attach', { session: 's1', since: 1e12 });
  assert.equal(clamped.clamped, true);
  assert.equal(clamped.since, clamped.lastSeq);
  const events = await c.events('s1');
  assert.ok(events.some((ev) => ev.kind === 'spawned'), JSON.stringify(events));
  const leases = await c.leases({ state: 'open' });
  assert.equal(leases.length, 1);
  const rows = await c.sessions({});
  assert.equal(rows[0].sessionKey, 's1');
  const listed = await c.sessions({ requesterSessionKey: 'gw:main', query: 'list' });
  assert.ok(JSON.stringify(listed).includes('s1'));
  const cancelled = await c.cancel({ session: 's1', acpSessionId: 'acp-x' });
  assert.equal(cancelled.notified, true);
  const plan = await c.reap({ dryRun: true });
  assert.ok(plan && typeof plan === 'object');
  const closed = await c.close('s1', { timeoutMs: 30_000 });
  assert.equal(closed[0].result, 'closed');
  // An op this client has no method for goes through request() and fails typed.
  await assert.rejects(c.request('frobnicate'), leash.UnknownOpError);
});

test('every reachable error code arrives as its LeashError subclass', async (t) => {
  const dir = scratch(t, 'errors');
  const state = join(dir, 'state');
  const daemon = await Daemon.start(t, state, ['--replay-lines', '20']);
  const c = await connect({ stateDir: state });
  t.after(() => c.disconnect());

  // Lines the daemon cannot read: null-id errors, emitted as protocolError.
  const nextProtocolError = () => new Promise((r) => c.once('protocolError', r));
  let p = nextProtocolError();
  c.writeRaw(Buffer.from([0x7b, 0xff, 0x7d, 0x0a]));
  assert.ok((await p) instanceof leash.BadUtf8Error);
  p = nextProtocolError();
  c.writeRaw('{nope\n');
  assert.ok((await p) instanceof leash.BadJsonError);
  p = nextProtocolError();
  c.writeRaw('x'.repeat((1 << 20) + 10) + '\n');
  assert.ok((await p) instanceof leash.LineTooLongError);

  await assert.rejects(c.request('ensure', { session: 's', argv: [] }), leash.BadRequestError);
  await assert.rejects(c.request('nope'), leash.UnknownOpError);
  await assert.rejects(c.send('missing', 'x'), leash.NotFoundError);
  await assert.rejects(c.sessions({ requesterSessionKey: 'a', query: 'status', session: 'b', visibility: 'self' }), (e) => e instanceof leash.NotFoundError || e instanceof leash.NotVisibleError);
  // not_visible: a session row that exists but is outside the requester's scope.
  await c.ensure('other', { argv: ['cat'], owner: 'someone-else', agent: 'x' });
  await assert.rejects(c.sessions({ requesterSessionKey: 'me', query: 'status', session: 'other', visibility: 'self' }), leash.NotVisibleError);
  // spawn_failed with the adapter's exit status and last stderr lines.
  const err = await c.ensure('crash', { argv: fakeAgent(), env: { FAKE_AGENT: 'crash' }, waitMs: 10_000 }).catch((e) => e);
  assert.ok(err instanceof leash.SpawnFailedError, String(err));
  // An exit before the first output line within waitMs: start_failed, still a SpawnFailedError.
  assert.ok(err instanceof leash.StartFailedError, String(err));
  assert.equal(err.code, 'start_failed');
  assert.equal(err.data.exitStatus, 2);
  assert.ok(err.data.stderr.some((l) => l.includes('bad config')), JSON.stringify(err.data));
  // conflict: a live lease of the session held by another process (a gateway's leash exec).
  const child = leash.spawn(['sleep', '1000'], { session: 'taken', stateDir: state, leashBin: LEASH_BIN });
  t.after(() => child.kill('SIGKILL'));
  await waitFor(async () => (await c.leases({ state: 'open' })).some((l) => l.sessionKey === 'taken'), 'the exec lease');
  await assert.rejects(c.ensure('taken', { argv: ['cat'] }), leash.ConflictError);
  // not_running: a session being closed or ended.
  await c.ensure('short', { argv: ['sh', '-c', 'echo hi; sleep 0.3'] });
  await waitFor(async () => (await c.status()).daemon.sessions.find((s) => s.sessionKey === 'short')?.phase === 'ended', 'the session to end');
  await assert.rejects(c.send('short', 'x'), leash.NotRunningError);
  // seq_evicted: more output than the replay buffer holds.
  await c.ensure('flood', { argv: ['sh', '-c', 'seq 1 200; exec cat'] });
  await waitFor(async () => (await c.status()).daemon.sessions.find((s) => s.sessionKey === 'flood')?.outputLines >= 200, 'the flood');
  await assert.rejects(c.request('attach', { session: 'flood', since: 1 }), (e) => e instanceof leash.SeqEvictedError && e.data.oldestSeq > 2);
  // shutting_down: an ensure that arrives while the daemon stops (another ensure holds the
  // shutdown back while the daemon watches its silent adapter).
  const c2 = await connect({ stateDir: state, reconnect: false });
  t.after(() => c2.disconnect());
  const slow = c.ensure('silent', { argv: ['sleep', '1000'], waitMs: 3000 }).catch((e) => e);
  await waitFor(async () => (await c2.status()).daemon.sessions.some((s) => s.sessionKey === 'silent' && s.leaseId), 'the silent session');
  daemon.child.kill('SIGTERM');
  await waitFor(async () => (await c2.status()).daemon.shuttingDown, 'the shutdown to begin');
  await assert.rejects(c2.ensure('late', { argv: ['cat'] }), leash.ShuttingDownError);
  await slow;
  await daemon.exited;
  // forbidden and internal need another uid or a broken database: mapped like the others.
  assert.ok(leash.errorFromWire({ code: 'forbidden', message: 'm' }) instanceof leash.ForbiddenError);
  assert.ok(leash.errorFromWire({ code: 'internal', message: 'm' }) instanceof leash.InternalError);
  assert.ok(leash.errorFromWire({ code: 'closed', message: 'm', leaseId: 'l' }) instanceof leash.ClosedError);
  const unknown = leash.errorFromWire({ code: 'brand_new', message: 'm', extra: 1 });
  assert.equal(unknown.constructor, leash.LeashError);
  assert.equal(unknown.code, 'brand_new');
  assert.equal(unknown.data.extra, 1);
});

test('calls honour AbortSignal and timeouts, and pending calls are rejected on close', async (t) => {
  const dir = scratch(t, 'abort');
  const state = join(dir, 'state');
  const daemon = await Daemon.start(t, state);
  const c = await connect({ stateDir: state, reconnect: false });
  // A send that blocks: the adapter never reads its stdin and the pipe fills up.
  await c.ensure('stuck', { argv: ['sleep', '1000'], waitMs: 0 });
  const big = 'y'.repeat(512 * 1024);
  const ac = new AbortController();
  const sending = (async () => {
    for (;;) await c.send('stuck', big, { signal: ac.signal });
  })();
  setTimeout(() => ac.abort(), 200);
  await assert.rejects(sending, leash.LeashAbortError);
  await assert.rejects(c.send('stuck', big, { timeoutMs: 100 }), leash.LeashTimeoutError);
  await assert.rejects(c.ping({ signal: AbortSignal.abort(new Error('mine')) }), /mine/);
  // The connection goes away with calls pending (this one waits behind the stuck send).
  const pending = c.ping({ timeoutMs: 60_000 }).catch((e) => e);
  await daemon.kill9();
  assert.ok((await pending) instanceof leash.ConnectionClosedError);
  await assert.rejects(c.ping(), leash.ConnectionClosedError);
  await c.disconnect();
});

test('connect finds the socket the daemon wrote into daemon.lock, else fails typed', async (t) => {
  const dir = scratch(t, 'locate');
  const state = join(dir, 'state');
  mkdirSync(state);
  await assert.rejects(connect({ stateDir: state, reconnect: false }), leash.NoDaemonError);
  const sock = join(dir, 'elsewhere.sock');
  await Daemon.start(t, state, ['--socket', sock]);
  const c = await connect({ stateDir: state });
  assert.equal((await c.status()).daemon.socket, sock);
  await c.disconnect();
  const prev = process.env.LEASH_STATE_DIR;
  process.env.LEASH_STATE_DIR = state;
  try {
    const d = await connect();
    assert.equal((await d.ping()).pong, true);
    await d.disconnect();
  } finally {
    if (prev === undefined) delete process.env.LEASH_STATE_DIR;
    else process.env.LEASH_STATE_DIR = prev;
  }
});
