// The handshake deadline through the client against a real daemon and real
// processes: `ensure` with `initialize` rejects with HandshakeTimeoutError (stderr tail, lease
// id) once the daemon closed a silent adapter; the controller's ensureSession does the same and
// five retries leave no process; a channel opened with `handshakeTimeoutMs` and a `spawn()`
// child given one close their session / lease when the first request goes unanswered.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { readFileSync, writeFileSync, chmodSync } from 'node:fs';
import * as leash from '../src/index.js';
import { Daemon, scratch, waitFor, LEASH_BIN, fakeAgent } from './helpers.mjs';

/** A silent adapter script: records its pid and a child's in `pids`, says hello on stderr. */
function silent(dir, name, extra = '') {
  const pids = join(dir, `${name}.pids`);
  const path = join(dir, `${name}.sh`);
  writeFileSync(path, `#!/bin/sh\n${extra}\nsleep 1000 &\necho $$ >> '${pids}'\necho $! >> '${pids}'\necho "${name}: loading" >&2\nwhile :; do sleep 1 & wait $!; done\n`);
  chmodSync(path, 0o755);
  return { path, pids };
}

/** The recorded pids still alive (signal 0 on a pid the test's own scripts wrote). */
function alive(pidsFile) {
  let text = '';
  try {
    text = readFileSync(pidsFile, 'utf8');
  } catch {
    return [];
  }
  return text.split('\n').filter(Boolean).map(Number).filter((pid) => {
    try {
      const st = readFileSync(`/proc/${pid}/stat`, 'utf8');
      return st.slice(st.lastIndexOf(')') + 2)[0] !== 'Z';
    } catch {
      return false;
    }
  });
}

test('ensure with initialize: a silent adapter rejects HandshakeTimeoutError and nothing is left', async (t) => {
  const dir = scratch(t, 'hs-ensure');
  const state = join(dir, 'state');
  await Daemon.start(t, state);
  const c = await leash.connect({ stateDir: state });
  t.after(() => c.disconnect());
  const { path, pids } = silent(dir, 'mute');
  const started = Date.now();
  await assert.rejects(
    c.ensure('m', { argv: [path], graceMs: 200, initialize: { protocolVersion: 1 }, handshakeTimeoutMs: 300 }),
    (e) => {
      assert.ok(e instanceof leash.HandshakeTimeoutError, `${e}`);
      assert.equal(e.code, 'handshake_timeout');
      assert.ok(e.data.stderr.some((l) => l.includes('mute: loading')), JSON.stringify(e.data));
      assert.match(e.data.leaseId, /^[0-9a-f-]{36}$/);
      return true;
    },
  );
  assert.ok(Date.now() - started >= 300);
  assert.deepEqual(alive(pids), []);
  // The real agent answers: the reply carries its initialize response.
  const ok = await c.ensure('a', { argv: fakeAgent(), initialize: { protocolVersion: 1 }, handshakeTimeoutMs: 10_000 });
  assert.equal(ok.created, true);
  assert.equal(ok.initialize.id, 'leash-handshake');
  assert.ok(ok.initialize.result.protocolVersion, JSON.stringify(ok.initialize));
  await c.close('a');
});

test('ensureSession: five retries of a silent adapter leave no process; the fake agent still works', async (t) => {
  const dir = scratch(t, 'hs-ctl');
  const state = join(dir, 'state');
  await Daemon.start(t, state);
  const { path, pids } = silent(dir, 'stubborn', "trap '' TERM");
  const ctl = await leash.AcpxLifecycleController.connect({ stateDir: state, agents: { mute: [path], fake: fakeAgent() } });
  t.after(() => ctl.disconnect());
  for (let i = 0; i < 5; i++) {
    await assert.rejects(
      ctl.ensureSession({ sessionKey: 'agent:mute:1', agent: 'mute', handshakeTimeoutMs: 200 }),
      (e) => e instanceof leash.HandshakeTimeoutError && e.data.stderr.some((l) => l.includes('stubborn: loading')),
    );
    assert.equal(readFileSync(pids, 'utf8').split('\n').filter(Boolean).length, 2 * (i + 1));
    assert.deepEqual(alive(pids), [], `retry ${i}`);
  }
  const st = await ctl.client.status();
  assert.deepEqual(st.daemon.sessions.filter((s) => s.phase !== 'ended'), []);
  // A real agent through the same path: its initialize came with the ensure.
  const h = await ctl.ensureSession({ sessionKey: 'agent:fake:1', agent: 'fake', handshakeTimeoutMs: 10_000 });
  assert.ok(h.backendSessionId);
  await ctl.closeSession({ handle: h });
});

test('acp() with handshakeTimeoutMs closes the session when the first request goes unanswered', async (t) => {
  const dir = scratch(t, 'hs-acp');
  const state = join(dir, 'state');
  await Daemon.start(t, state);
  const c = await leash.connect({ stateDir: state });
  t.after(() => c.disconnect());
  const pids = join(dir, 'cat.pids');
  // cat echoes the request back: a line with a method is no response.
  // Reads its stdin and never answers (`cat` itself would echo the request back, and the
  // channel's own error reply to that echo would come back as the response).
  await c.ensure('k', { argv: ['sh', '-c', `echo $$ >> '${pids}'; echo "cat: up" >&2; exec cat > /dev/null`], graceMs: 200 });
  const ch = await c.acp('k', { since: 0, handshakeTimeoutMs: 300 });
  await assert.rejects(ch.request('initialize', { protocolVersion: 1 }), (e) => {
    assert.ok(e instanceof leash.HandshakeTimeoutError, `${e}`);
    assert.ok(e.data.stderr.includes('cat: up'), JSON.stringify(e.data));
    assert.equal(e.data.outcomes[0].result, 'closed');
    return true;
  });
  assert.deepEqual(alive(pids), []);
  const s = (await c.status()).daemon.sessions.find((x) => x.sessionKey === 'k');
  assert.ok(!s || s.phase === 'ended', JSON.stringify(s));
  await assert.rejects(c.acp('k', { handshakeTimeoutMs: 0 }), TypeError);
});

test('spawn() with handshakeTimeoutMs closes the lease of an adapter that never answers', async (t) => {
  const dir = scratch(t, 'hs-spawn');
  const state = join(dir, 'state');
  const { path, pids } = silent(dir, 'quiet', "trap '' TERM");
  assert.throws(() => leash.spawn([path], { stateDir: state, leashBin: LEASH_BIN, handshakeTimeoutMs: -1 }), TypeError);
  for (let i = 0; i < 2; i++) {
    const child = leash.spawn([path], { stateDir: state, leashBin: LEASH_BIN, graceMs: 200, handshakeTimeoutMs: 300 });
    const failed = new Promise((resolve) => child.once('error', resolve));
    child.stdin.write(`${JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'initialize', params: { protocolVersion: 1 } })}\n`);
    const e = await failed;
    assert.ok(e instanceof leash.HandshakeTimeoutError, `${e}`);
    assert.equal(e.data.leaseId, child.leaseId);
    assert.ok(e.data.stderr.some((l) => l.includes('quiet: loading')), JSON.stringify(e.data));
    assert.ok(child.exitCode !== null || child.signalCode !== null, 'leash exec exited before the error');
    await waitFor(() => alive(pids).length === 0, 'the adapters gone', 5_000);
  }
  // An adapter that answers in time is left running (the request goes once it is up: node's
  // start on a busy host is not the handshake's to time here).
  const child = leash.spawn(fakeAgent(), { stateDir: state, leashBin: LEASH_BIN, graceMs: 200, handshakeTimeoutMs: 1_500 });
  let failed = null;
  child.once('error', (e) => (failed = e));
  let out = '';
  let err = '';
  child.stdout.on('data', (d) => (out += d));
  child.stderr.on('data', (d) => (err += d));
  await waitFor(() => err.includes('fake-agent ready'), 'the fake agent up');
  const sent = Date.now();
  child.stdin.write(`${JSON.stringify({ jsonrpc: '2.0', id: 'i1', method: 'initialize', params: { protocolVersion: 1 } })}\n`);
  await waitFor(() => out.includes('"i1"'), 'the response');
  // The deadline passes unfired: nothing to wait for but the time.
  await new Promise((r) => setTimeout(r, Math.max(0, sent + 1_800 - Date.now())));
  assert.equal(failed, null);
  assert.equal(child.exitCode, null);
  await leash.close({ lease: child.leaseId }, { stateDir: state, leashBin: LEASH_BIN });
  await new Promise((r) => (child.exitCode !== null ? r() : child.once('exit', r)));
});
