// attach() as an async iterator: every seq exactly once and in order across dropped connections
// and a daemon restart, evicted items as a typed gap, bounded buffering by detach/reattach, and
// a consumer that stops detaching its stream on the daemon.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { join } from 'node:path';
import * as leash from '../src/index.js';
import { Daemon, scratch, waitFor } from './helpers.mjs';

const COUNT = 3000;
// Prints 1..N with a pause every 100 lines (so a stream takes a while), then keeps running.
const counter = (n) => ['sh', '-c', `i=0; while [ $i -lt ${n} ]; do i=$((i+1)); echo $i; case $i in *00) sleep 0.02;; esac; done; exec cat`];

function checkInOrder(items) {
  let last = 0;
  for (const it of items) {
    if (typeof it.seq !== 'number') continue;
    assert.ok(it.seq > last, `seq ${it.seq} after ${last}`);
    last = it.seq;
  }
}

function outputs(items) {
  return items.filter((i) => i.type === 'output').map((i) => Number(i.line));
}

test('dropped connections: the iterator reconnects and reattaches, each seq once, in order', async (t) => {
  const dir = scratch(t, 'drop');
  const state = join(dir, 'state');
  await Daemon.start(t, state);
  const c = await leash.connect({ stateDir: state });
  t.after(() => c.disconnect());
  let reconnects = 0;
  c.on('reconnect', () => reconnects++);
  await c.ensure('count', { argv: counter(COUNT) });
  const items = [];
  const drops = new Set([200, 900, 1700]);
  for await (const item of c.attach('count', { since: 0 })) {
    items.push(item);
    const n = item.type === 'output' ? Number(item.line) : 0;
    if (drops.has(n)) {
      drops.delete(n);
      c.dropConnection();
    }
    if (n === COUNT) break;
  }
  assert.equal(reconnects, 3);
  checkInOrder(items);
  assert.deepEqual(outputs(items), Array.from({ length: COUNT }, (_, i) => i + 1));
  assert.ok(!items.some((i) => i.type === 'gap'), 'no gap expected');
});

test('a daemon stopped by SIGTERM mid-stream: every item up to the end, then a restart', async (t) => {
  const dir = scratch(t, 'sigterm');
  const state = join(dir, 'state');
  const daemon = await Daemon.start(t, state);
  const c = await leash.connect({ stateDir: state, reconnectTimeoutMs: 60_000 });
  t.after(() => c.disconnect());
  await c.ensure('count', { argv: counter(1_000_000) });
  const it = c.attach('count', { since: 0 });
  const items = [];
  let stopped = null;
  for await (const item of it) {
    items.push(item);
    if (!stopped && item.type === 'output' && Number(item.line) === 500) stopped = daemon.terminate();
  }
  const last = items[items.length - 1];
  assert.equal(last.type, 'end');
  assert.ok(['ended', 'gone'].includes(last.reason), JSON.stringify(last));
  checkInOrder(items);
  const nums = outputs(items);
  assert.deepEqual(nums, Array.from({ length: nums.length }, (_, i) => i + 1), 'no hole, no repeat');
  if (last.reason === 'ended') {
    const kinds = items.filter((i) => i.type === 'event').map((i) => i.kind);
    assert.ok(kinds.includes('exit'), kinds.join(','));
  }
  assert.equal((await stopped).code, 0);

  // The restarted daemon: the client reconnects by itself; the session comes back from its
  // stored spec, and attaching after the old stream's last seq gets only the new lease's items.
  await daemon.start();
  await waitFor(() => c.connected, 'the client to reconnect');
  const again = await c.ensure('count', {});
  assert.equal(again.created, true);
  const more = [];
  for await (const item of c.attach('count', { since: it.lastSeq })) {
    more.push(item);
    if (item.type === 'output' && Number(item.line) === 10) break;
  }
  assert.ok(more.every((i) => typeof i.seq !== 'number' || i.seq > it.lastSeq));
  assert.deepEqual(outputs(more), Array.from({ length: 10 }, (_, i) => i + 1));
});

test('a daemon killed mid-stream: the iterator reattaches to the new lease behind a typed gap, or ends as gone', async (t) => {
  const dir = scratch(t, 'sigkill');
  const state = join(dir, 'state');
  const daemon = await Daemon.start(t, state);
  const c = await leash.connect({ stateDir: state, reconnectTimeoutMs: 60_000 });
  t.after(() => c.disconnect());
  await c.ensure('count', { argv: counter(1_000_000) });
  const items = [];
  let killed = false;
  let outputs = 0;
  for await (const item of c.attach('count', { since: 0 })) {
    items.push(item);
    if (item.type === 'output') outputs += 1;
    if (!killed && item.type === 'output' && Number(item.line) === 300) {
      killed = true;
      await daemon.kill9();
      await daemon.start();
      await c.ensure('count', {}).catch(() => {});
    }
    // A safety valve only. What the killed daemon had already written (its batches of up to
    // 512 items, the socket's and the client's buffers) is delivered before the reconnect,
    // however far the counter ran ahead of this loop on a loaded host.
    if (item.type === 'gap' || outputs > 50_000) break;
  }
  checkInOrder(items);
  const last = items[items.length - 1];
  if (last.type === 'gap') {
    assert.equal(last.reason, 'lease_changed');
    assert.notEqual(last.leaseId, last.previousLeaseId);
  } else {
    assert.equal(last.type, 'end', JSON.stringify(last));
    assert.equal(last.reason, 'gone');
  }
});

test('items evicted from the replay buffer are a typed gap, then the stream goes on', async (t) => {
  const dir = scratch(t, 'evict');
  const state = join(dir, 'state');
  await Daemon.start(t, state, ['--replay-lines', '50']);
  const c = await leash.connect({ stateDir: state });
  t.after(() => c.disconnect());
  await c.ensure('flood', { argv: ['sh', '-c', 'seq 1 500; exec cat'] });
  await waitFor(async () => (await c.status()).daemon.sessions[0].outputLines >= 500, 'the flood');
  const items = [];
  for await (const item of c.attach('flood', { since: 1 })) {
    items.push(item);
    if (item.type === 'output' && item.line === '500') break;
  }
  assert.equal(items[0].type, 'gap');
  assert.equal(items[0].reason, 'evicted');
  assert.equal(items[0].afterSeq, 1);
  assert.equal(items[1].seq, items[0].oldestSeq);
  checkInOrder(items);
  assert.deepEqual(outputs(items), Array.from({ length: 50 }, (_, i) => 451 + i));
});

test('a slow consumer detaches at the high-water mark and reattaches from its last seq', async (t) => {
  const dir = scratch(t, 'slow');
  const state = join(dir, 'state');
  await Daemon.start(t, state);
  const c = await leash.connect({ stateDir: state });
  t.after(() => c.disconnect());
  await c.ensure('flood', { argv: ['sh', '-c', 'seq 1 2000; exec cat'] });
  const it = c.attach('flood', { since: 0, highWaterMark: 100, lowWaterMark: 20 });
  const items = [];
  let sawDetached = false;
  for (;;) {
    const { value, done } = await it.next();
    assert.ok(!done);
    items.push(value);
    if (items.length === 5) {
      // Stop consuming until the stream has detached itself (nothing attached on the daemon).
      await waitFor(async () => (await c.status()).daemon.sessions[0].attached === 0, 'the detach');
      sawDetached = true;
    }
    if (value.type === 'output' && value.line === '2000') break;
  }
  assert.ok(sawDetached);
  checkInOrder(items);
  assert.deepEqual(outputs(items), Array.from({ length: 2000 }, (_, i) => i + 1));
  await it.return();
});

test('a consumer that stops detaches its stream; an aborted one throws', async (t) => {
  const dir = scratch(t, 'stop');
  const state = join(dir, 'state');
  await Daemon.start(t, state);
  const c = await leash.connect({ stateDir: state });
  t.after(() => c.disconnect());
  await c.ensure('s', { argv: ['sh', '-c', 'echo one; exec cat'] });
  for await (const item of c.attach('s')) {
    if (item.type === 'output') break;
  }
  await waitFor(async () => (await c.status()).daemon.sessions[0].attached === 0, 'the detach');
  const ac = new AbortController();
  const it = c.attach('s', { signal: ac.signal });
  await it.ready();
  setTimeout(() => ac.abort(), 50);
  await assert.rejects(async () => {
    for await (const _ of it) {
      // drains 'one', then waits until the abort
    }
  }, leash.LeashAbortError);
  await assert.rejects(c.attach('nope').ready(), leash.NotFoundError);
});
