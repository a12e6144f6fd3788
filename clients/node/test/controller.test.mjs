// AcpxLifecycleController over a real daemon and the fake agent: ensureSession opens the ACP
// session (session/new with the input's cwd and mcpServers), cancelTurn cancels the turn and
// keeps the process, closeSession signals only a verified tree (and forgets the stored spec when
// asked), verifyOwnedTree answers a tree or null, reapStartupOrphans runs the startup reap, and a
// second controller (a restarted gateway) reuses the running adapter's recorded ACP session;
// after a daemon restart, ensureSession with resumeSessionId loads it with its recorded cwd and
// mcpServers.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, mkdirSync } from 'node:fs';
import { join } from 'node:path';
import * as leash from '../src/index.js';
import { Daemon, scratch, fakeAgent, waitFor } from './helpers.mjs';

const MCP = [{ name: 'files', command: '/usr/bin/env', args: ['mcp-files'], env: [] }];

test('ensureSession, prompt, cancelTurn keeps the process, closeSession, verifyOwnedTree', async (t) => {
  const dir = scratch(t, 'ctl');
  const state = join(dir, 'state');
  await Daemon.start(t, state);
  const ctl = await leash.AcpxLifecycleController.connect({ stateDir: state, agents: { fake: fakeAgent() }, mcpServers: MCP });
  t.after(() => ctl.disconnect());
  assert.match(await ctl.gatewayInstanceId(), /^[0-9a-f-]{36}$/);

  const a = await ctl.ensureSession({ sessionKey: 'agent:main:acp:a', agent: 'fake', mode: 'persistent', cwd: dir });
  const b = await ctl.ensureSession({ sessionKey: 'agent:main:acp:b', agent: 'fake', mode: 'persistent', cwd: dir, ownerSessionKey: 'agent:main:main' });
  assert.equal(a.backend, 'acpx');
  assert.equal(a.runtimeSessionName, 'agent:main:acp:a');
  assert.ok(a.backendSessionId && a.leaseId && a.rootPid, JSON.stringify(a));
  assert.notEqual(a.leaseId, b.leaseId);
  assert.deepEqual((await ctl.channel(a).request('fake/received')).new, { cwd: dir, mcpServers: MCP });
  // Ensuring again returns the same handle: same process, same ACP session.
  assert.deepEqual(await ctl.ensureSession({ sessionKey: 'agent:main:acp:a', agent: 'fake', cwd: dir }), a);

  assert.equal((await ctl.prompt(a, 'hello')).stopReason, 'end_turn');
  // A cancelled turn: the turn ends cancelled, the adapter lives on and takes the next turn.
  const turn = ctl.prompt(b, 'slow please');
  await waitFor(async () => (await ctl.client.status()).daemon.busy.includes('agent:main:acp:b'), 'the busy turn');
  await ctl.cancelTurn(b);
  assert.equal((await turn).stopReason, 'cancelled');
  assert.ok(existsSync(`/proc/${b.rootPid}`), 'cancel must not end the process');
  assert.equal((await ctl.prompt(b, 'again')).stopReason, 'end_turn');

  // The lease's live tree, as the daemon verified it.
  const tree = await ctl.verifyOwnedTree({ leaseId: b.leaseId, rootPid: b.rootPid });
  assert.equal(tree.leaseId, b.leaseId);
  assert.equal(tree.rootPid, b.rootPid);
  assert.ok(tree.members.length >= 2, JSON.stringify(tree));
  // A lease record whose root pid is not the one leash recorded is not ours.
  assert.equal(await ctl.verifyOwnedTree({ leaseId: b.leaseId, rootPid: b.rootPid + 1 }), null);
  assert.equal(await ctl.verifyOwnedTree({ leaseId: leash.uuidv7() }), null);

  // Close: verified, terminated; the tree is gone and verifies as null.
  const outcomes = await ctl.closeSession({ handle: b, reason: 'test over' });
  assert.equal(outcomes[0].result, 'closed', JSON.stringify(outcomes));
  await waitFor(() => !existsSync(`/proc/${b.rootPid}`), 'the closed adapter to be gone');
  assert.equal(await ctl.verifyOwnedTree(b), null);
  assert.ok(existsSync(`/proc/${a.rootPid}`), 'the other session is untouched');
  // Closing again: nothing left to close.
  assert.deepEqual(await ctl.closeSession({ handle: b }), []);
  // The stored spec is kept unless the caller discards it...
  assert.equal((await ctl.client.ensure('agent:main:acp:b', {})).created, true);
  await ctl.client.close('agent:main:acp:b');
  // ...and with discardPersistentState nothing can bring the session back.
  await ctl.closeSession({ handle: a, discardPersistentState: true, reason: 'discard' });
  const ended = async () => !(await ctl.client.status()).daemon.sessions.some((s) => s.sessionKey === 'agent:main:acp:a' && s.phase !== 'ended');
  await waitFor(ended, 'the discarded session to end');
  await assert.rejects(ctl.client.ensure('agent:main:acp:a', {}), (e) => e instanceof leash.NotFoundError && /no stored spec/.test(e.message));
  await assert.rejects(ctl.client.resume('agent:main:acp:a'), leash.ResumeError);

  const report = await ctl.reapStartupOrphans();
  assert.ok(report && typeof report === 'object', JSON.stringify(report));
  assert.throws(() => new leash.AcpxLifecycleController({ client: ctl.client }), TypeError);
  await assert.rejects(ctl.ensureSession({ sessionKey: 'x', agent: 'nope' }), TypeError);
});

test('a restarted gateway reuses the running adapter and its ACP session; resume is never fresh', async (t) => {
  const dir = scratch(t, 'ctl2');
  const state = join(dir, 'state');
  await Daemon.start(t, state);
  const agents = { fake: fakeAgent(), noload: fakeAgent() };
  const first = await leash.AcpxLifecycleController.connect({ stateDir: state, agents });
  const h = await first.ensureSession({ sessionKey: 's', agent: 'fake', cwd: dir, mcpServers: MCP });
  await first.disconnect();
  // Another controller (the gateway after a restart; the daemon kept the adapter).
  const second = await leash.AcpxLifecycleController.connect({ stateDir: state, agents });
  t.after(() => second.disconnect());
  const again = await second.ensureSession({ sessionKey: 's', agent: 'fake', cwd: dir });
  assert.equal(again.leaseId, h.leaseId);
  assert.equal(again.backendSessionId, h.backendSessionId);
  assert.equal((await second.prompt(again, 'still there?')).stopReason, 'end_turn');
  // resumeSessionId on an agent that cannot load: a typed error, never a fresh context.
  await assert.rejects(
    second.ensureSession({ sessionKey: 'n', agent: 'noload', cwd: dir, resumeSessionId: 'old-1', env: { FAKE_AGENT_LOAD: 'none' } }),
    (e) => e instanceof leash.ResumeError && e.reason === 'load_unsupported',
  );
  const loaded = await second.ensureSession({ sessionKey: 'l', agent: 'fake', cwd: dir, resumeSessionId: 'old-2', mcpServers: MCP });
  assert.equal(loaded.backendSessionId, 'old-2');
  assert.deepEqual((await second.channel(loaded).request('fake/received')).load, { sessionId: 'old-2', cwd: dir, mcpServers: MCP });
});

test('after a daemon restart, ensureSession resumes with the recorded cwd and mcpServers', async (t) => {
  const dir = scratch(t, 'ctl3');
  const state = join(dir, 'state');
  const work = join(dir, 'work');
  mkdirSync(work);
  const daemon = await Daemon.start(t, state);
  const agents = { fake: fakeAgent() };
  const before = await leash.AcpxLifecycleController.connect({ stateDir: state, agents, reconnect: false });
  const h = await before.ensureSession({ sessionKey: 'agent:main:acp:r', agent: 'fake', cwd: work, mcpServers: MCP });
  // A turn in flight when the daemon stops (SIGTERM): recorded for resumption.
  const started = new Promise((r) => before.channel(h).once('notification', r));
  before.prompt(h, 'slow work').catch(() => {});
  await started;
  await daemon.terminate();
  await before.disconnect();
  await daemon.start();
  // The gateway after its restart: only its persisted handle; no cwd, no MCP servers given.
  const after = await leash.AcpxLifecycleController.connect({ stateDir: state, agents });
  t.after(() => after.disconnect());
  const r = await after.ensureSession({ sessionKey: h.sessionKey, agent: 'fake', resumeSessionId: h.backendSessionId });
  assert.equal(r.backendSessionId, h.backendSessionId);
  assert.notEqual(r.leaseId, h.leaseId, 'a new process under a new lease');
  assert.equal(r.cwd, work);
  const got = await after.channel(r).request('fake/received');
  assert.deepEqual(got.load, { sessionId: h.backendSessionId, cwd: work, mcpServers: MCP });
  assert.equal(got.new, null);
  assert.equal((await after.prompt(r, 'continue')).stopReason, 'end_turn');
});
