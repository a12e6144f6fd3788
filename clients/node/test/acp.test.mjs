// The JSON-RPC helper over send + attach against the fake agent: concurrent requests resolve to
// their own responses, a notification gets none, a response that arrives after its request was
// aborted is not handed to another request; and spawn() as the drop-in for child_process.spawn,
// with exit 125 as a typed error and the lease id in the caller's hands (resume() is in
// resume.test.mjs).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { writeFileSync } from 'node:fs';
import * as leash from '../src/index.js';
import { Daemon, scratch, fakeAgent, waitFor, LEASH_BIN } from './helpers.mjs';

test('concurrent requests resolve to their own responses; notifications get none', async (t) => {
  const dir = scratch(t, 'acp');
  const state = join(dir, 'state');
  await Daemon.start(t, state);
  const c = await leash.connect({ stateDir: state });
  t.after(() => c.disconnect());
  await c.ensure('a', { argv: fakeAgent() });
  const acp = await c.acp('a');
  t.after(() => acp.close());
  const init = await acp.request('initialize', { protocolVersion: 1 });
  assert.equal(init.agentCapabilities.loadSession, true);
  // Answered in the reverse order of the requests.
  const delays = [300, 200, 100, 0];
  const answers = await Promise.all(delays.map((ms, i) => acp.request('delay', { ms, tag: i })));
  assert.deepEqual(answers.map((a) => a.tag), [0, 1, 2, 3]);
  // A notification: nothing comes back for it (the agent answers unknown methods with ids only).
  const strays = [];
  acp.on('stray', (m) => strays.push(m));
  await acp.notify('nonexistent/notification', { x: 1 });
  assert.equal((await acp.request('echo', { after: 'notify' })).after, 'notify');
  assert.equal(acp.pendingCount, 0);
  assert.deepEqual(strays, []);
  // An error response rejects with AcpError carrying the JSON-RPC code.
  await assert.rejects(acp.request('no/such'), (e) => e instanceof leash.AcpError && e.rpcCode === -32601);
  // Notifications and stderr reach their listeners.
  const updates = [];
  acp.on('notification', (m) => updates.push(m));
  const stderr = [];
  acp.on('stderr', (l) => stderr.push(l));
  const { sessionId } = await acp.request('session/new', { cwd: dir, mcpServers: [] });
  const r = await acp.request('session/prompt', { sessionId, prompt: [{ type: 'text', text: 'hello' }] });
  assert.equal(r.stopReason, 'end_turn');
  assert.ok(updates.some((u) => u.method === 'session/update'), JSON.stringify(updates));
  await acp.request('stderr', { text: 'a warning' });
  await waitFor(() => stderr.includes('a warning'), 'the stderr line');
});

test('a late response after a cancelled request is not mis-delivered', async (t) => {
  const dir = scratch(t, 'late');
  const state = join(dir, 'state');
  await Daemon.start(t, state);
  const c = await leash.connect({ stateDir: state });
  t.after(() => c.disconnect());
  await c.ensure('a', { argv: fakeAgent() });
  const acp = await c.acp('a');
  t.after(() => acp.close());
  const strays = [];
  acp.on('stray', (m) => strays.push(m));
  const ac = new AbortController();
  const slow = acp.request('delay', { ms: 300, tag: 'slow' }, { signal: ac.signal });
  ac.abort();
  await assert.rejects(slow, leash.LeashAbortError);
  // A request sent meanwhile gets its own answer, never the late one.
  const next = await acp.request('delay', { ms: 600, tag: 'next' });
  assert.equal(next.tag, 'next');
  await waitFor(() => strays.length === 1, 'the late response');
  assert.equal(strays[0].result.tag, 'slow');
  // A timed-out request likewise.
  await assert.rejects(acp.request('delay', { ms: 400, tag: 't' }, { timeoutMs: 50 }), leash.LeashTimeoutError);
  await waitFor(() => strays.length === 2, 'the second late response');

  // Cancelling a turn: the agent answers the prompt with stopReason cancelled.
  const { sessionId } = await acp.request('session/new', { cwd: dir, mcpServers: [] });
  const turn = acp.request('session/prompt', { sessionId, prompt: [{ type: 'text', text: 'slow please' }] });
  await waitFor(async () => (await c.status()).daemon.busy.includes('a'), 'the session to be busy');
  const cancelled = await c.cancel({ session: 'a' });
  assert.equal(cancelled.acpSessionId, sessionId);
  assert.equal((await turn).stopReason, 'cancelled');
});

test('spawn() runs the adapter under leash exec, owned by this process; exit 125 is typed', async (t) => {
  const dir = scratch(t, 'spawn');
  const state = join(dir, 'state');
  const child = leash.spawn(['sh', '-c', 'read line; echo "got $line"; echo "$OPENCLAW_ACPX_LEASE_ID" >&2'], {
    session: 'sp',
    agent: 'fake',
    graceMs: 300,
    stateDir: state,
    leashBin: LEASH_BIN,
  });
  // The lease id is known before leash exec runs: a UUIDv7 made by spawn().
  assert.match(child.leaseId, /^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/);
  let out = '';
  let err = '';
  child.stdout.on('data', (d) => (out += d));
  child.stderr.on('data', (d) => (err += d));
  child.stdin.write('hi\n');
  const code = await new Promise((r) => child.once('exit', r));
  assert.equal(code, 0);
  assert.equal(out.trim(), 'got hi');
  // The lease names this process as the owner.
  await Daemon.start(t, state);
  const c = await leash.connect({ stateDir: state });
  t.after(() => c.disconnect());
  const lease = (await c.leases()).find((l) => l.sessionKey === 'sp');
  assert.equal(lease.leaseId, err.trim().split('\n').pop());
  assert.equal(lease.leaseId, child.leaseId, 'the id spawn() exposed is the lease row\'s');
  assert.equal(lease.ownerPid, process.pid, JSON.stringify(lease));
  await c.disconnect();

  // A caller-chosen id (recorded by the gateway before the spawn) is the one used...
  const chosen = leash.uuidv7();
  const mine = leash.spawn(['true'], { session: 'sp2', stateDir: state, leashBin: LEASH_BIN, leaseId: chosen });
  assert.equal(mine.leaseId, chosen);
  assert.equal(await new Promise((r) => mine.once('exit', r)), 0);
  const c2 = await leash.connect({ stateDir: state });
  assert.equal((await c2.leases()).find((l) => l.sessionKey === 'sp2').leaseId, chosen);
  await c2.disconnect();
  // ...and never twice: leash refuses it (exit 125), nothing starts.
  const again = leash.spawn(['sh', '-c', 'echo started'], { session: 'sp3', stateDir: state, leashBin: LEASH_BIN, leaseId: chosen });
  let againOut = '';
  again.stdout.on('data', (d) => (againOut += d));
  const dup = await new Promise((resolve) => again.once('error', resolve));
  assert.ok(dup instanceof leash.ExecFailedError, String(dup));
  assert.match(dup.message, /already taken/);
  assert.equal(dup.data.leaseId, chosen);
  assert.equal(againOut, '');
  // A malformed id is refused before anything runs.
  assert.throws(() => leash.spawn(['true'], { leaseId: 'not-a-uuid', leashBin: LEASH_BIN }), TypeError);
  assert.throws(() => leash.spawn(['true'], { leaseId: chosen.toUpperCase(), leashBin: LEASH_BIN }), TypeError);

  // Exit 125: leash could not start the adapter (here: the owner it was given is not its
  // parent, as when the spawner died before leash exec ran).
  const bad = leash.spawn(['true'], { stateDir: state, ownerPid: 999_999_999 % 4_194_304, leashBin: LEASH_BIN });
  const e = await new Promise((resolve) => bad.once('error', resolve));
  assert.ok(e instanceof leash.ExecFailedError, String(e));
  assert.equal(e.data.exitStatus, 125);
  assert.match(e.message, /not our parent/);
  assert.throws(() => leash.spawn([]), TypeError);
});

test('an adapter not found (127) or not executable (126) is one error class with the same fields through ensure and spawn(); an adapter that exits 127 itself is not one', async (t) => {
  const dir = scratch(t, 'spawn-missing');
  const state = join(dir, 'state');
  const opts = { stateDir: state, leashBin: LEASH_BIN };
  await Daemon.start(t, state);
  const c = await leash.connect({ stateDir: state });
  t.after(() => c.disconnect());
  const script = join(dir, 'not-executable.sh');
  writeFileSync(script, '#!/bin/sh\n', { mode: 0o644 });
  const viaSpawn = async (argv, session) => {
    const child = leash.spawn(argv, { ...opts, session });
    return new Promise((resolve) => child.once('error', resolve));
  };
  const viaEnsure = (argv, session) => c.ensure(session, { argv }).then(() => assert.fail('ensure started it'), (e) => e);
  const cases = [
    [['leash-test-no-such-adapter'], leash.AdapterNotFoundError, 127, 'adapter_not_found', /leash-test-no-such-adapter: not found on PATH/],
    [[script], leash.AdapterNotExecutableError, 126, 'adapter_not_executable', /not-executable\.sh: not executable/],
  ];
  for (const [argv, Cls, status, cause, said] of cases) {
    const doors = { spawn: await viaSpawn(argv, `s-${status}`), ensure: await viaEnsure(argv, `e-${status}`) };
    for (const [door, e] of Object.entries(doors)) {
      const what = `${door} ${argv[0]}: ${e?.stack} ${JSON.stringify(e?.data)}`;
      assert.ok(e instanceof Cls, what);
      assert.ok(e instanceof leash.SpawnFailedError, what);
      assert.ok(e instanceof leash.ExecFailedError, what);
      assert.equal(e.code, 'spawn_failed', what);
      assert.match(e.message, said, what);
      assert.equal(e.data.exitStatus, status, what);
      assert.equal(e.data.cause, cause, what);
      // stderr is an array of the adapter's lines, never leash's raw JSON error line.
      assert.ok(Array.isArray(e.data.stderr), what);
      assert.ok(!e.data.stderr.some((l) => l.includes('{"error"')), what);
      assert.match(e.data.leaseId ?? '', /^[0-9a-f-]{36}$/, what);
      assert.deepEqual(e.data.argv, argv, what);
    }
    assert.deepEqual(Object.keys(doors.spawn.data).sort(), Object.keys(doors.ensure.data).sort());
    // The lease each door names is the one leash exec recorded, ended with the reason.
    // A wrapper's exit is believed once the wrapper is gone: spawn() may answer from leash's
    // error line before node has reaped it, so the row settles within a deadline, not at once.
    for (const e of Object.values(doors)) {
      const deadline = Date.now() + 10_000;
      let row;
      for (;;) {
        const leases = await c.leases();
        row = leases.find((l) => l.leaseId === e.data.leaseId);
        assert.ok(row, `lease ${e.data.leaseId} in ${JSON.stringify(leases)}`);
        if (row.state !== 'open' || Date.now() > deadline) break;
        await new Promise((r) => setTimeout(r, 50));
      }
      assert.notEqual(row.state, 'open', JSON.stringify(row));
    }
  }

  // The adapter's own 127 (its shell did not find a command) is its status, not leash's error.
  const own = leash.spawn(['sh', '-c', 'exit 127'], { ...opts, session: 'own' });
  let errored = null;
  own.once('error', (err) => (errored = err));
  const code = await new Promise((r) => own.once('exit', r));
  assert.equal(code, 127);
  await new Promise((r) => setImmediate(r));
  assert.equal(errored, null, String(errored));
});

test('close and reap work through the CLI when no daemon runs', async (t) => {
  const dir = scratch(t, 'cli');
  const state = join(dir, 'state');
  const child = leash.spawn(['sleep', '1000'], { session: 'c1', stateDir: state, leashBin: LEASH_BIN, graceMs: 200 });
  t.after(() => child.kill('SIGKILL'));
  const exited = new Promise((r) => child.once('exit', r));
  const opts = { stateDir: state, leashBin: LEASH_BIN };
  await waitFor(async () => {
    // Until `leash exec` has created the state directory and its database, reap refuses it
    // (not_found, exit 4): not yet.
    const plan = await leash.reap({ dryRun: true, includeLive: true }, opts).catch((e) => {
      if (e.code === 'cli_failed' && e.data?.exitStatus === 4) return null;
      throw e;
    });
    return JSON.stringify(plan).includes('c1');
  }, 'the lease');
  // The lease is committed before `leash exec` execs the wrapper: until then its root runs
  // `leash`, and a close leaves it open ("retry"). Close once the live tree verifies as owned.
  await waitFor(async () => (await leash.verify({ session: 'c1' }, opts))?.answer === 'owned', 'an owned tree');
  const out = await leash.close('c1', opts);
  assert.equal(out[0].result, 'closed', JSON.stringify(out));
  await exited;
  const v = await leash.verify({ session: 'c1' }, opts);
  assert.ok(v !== null);
});
