// resume() never opens a fresh context by accident. After a daemon restart it loads the ACP
// session that was interrupted, with the cwd and mcpServers it was opened with (the daemon
// recorded them from the session/new it relayed; the fake agent reports what session/load got).
// When that session cannot be loaded (no ACP session recorded, an agent without loadSession, a
// session/load that fails) it rejects with a ResumeError naming the reason, and opens a fresh
// session only with `fresh: 'allow'`.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { join } from 'node:path';
import * as leash from '../src/index.js';
import { Daemon, scratch, fakeAgent, waitFor } from './helpers.mjs';

const MCP = [
  { name: 'files', command: '/usr/bin/env', args: ['mcp-files', '--root', '/srv'], env: [{ name: 'MCP_TOKEN', value: 't0k' }] },
  { type: 'http', name: 'search', url: 'http://127.0.0.1:9/mcp', headers: [{ name: 'x-key', value: 'k' }] },
];

/**
 * A session whose turn was in flight when the daemon stopped (SIGTERM), and a new daemon on the
 * same root: the state a gateway finds after a restart. `env` goes to the fake agent.
 */
async function interrupted(t, tag, env = {}) {
  const dir = scratch(t, tag);
  const state = join(dir, 'state');
  const work = join(dir, 'work');
  const daemon = await Daemon.start(t, state);
  const c = await leash.connect({ stateDir: state, reconnect: false });
  // The agent's mode is no secret: stored with the spec, so the resume after the restart has it.
  await c.ensure('r', { argv: fakeAgent(), cwd: dir, env, persistEnv: true });
  const acp = await c.acp('r');
  await acp.request('initialize', { protocolVersion: 1 });
  const { sessionId } = await acp.request('session/new', { cwd: work, mcpServers: MCP });
  // The daemon learnt the ACP session and what it was opened with.
  const live = (await c.status()).daemon.sessions.find((s) => s.sessionKey === 'r');
  assert.deepEqual(live.acpSessions, [{ sessionId, cwd: work, mcpServers: MCP }]);
  acp.request('session/prompt', { sessionId, prompt: [{ type: 'text', text: 'slow work' }] }).catch(() => {});
  await waitFor(async () => (await c.status()).daemon.busy.includes('r'), 'the busy session');
  await daemon.terminate();
  await c.disconnect();
  await daemon.start();
  const client = await leash.connect({ stateDir: state, events: true });
  t.after(() => client.disconnect());
  return { dir, state, work, sessionId, client, daemon };
}

test('resume loads the interrupted ACP session with its recorded cwd and mcpServers', async (t) => {
  const { client: c, sessionId, work } = await interrupted(t, 'resume');
  const pushed = await waitFor(() => c.resumable.get('r'), 'the resumable push');
  assert.deepEqual(pushed.acpSessionIds, [sessionId]);
  assert.equal(pushed.hasSpec, true);
  const resumed = new Promise((resolve) => c.once('resumed', resolve));
  // No cwd, no mcpServers: both come from what the daemon recorded.
  const r = await c.resume('r', { prompt: 'continue please' });
  t.after(() => r.acp.close());
  assert.equal(r.loaded, true);
  assert.equal(r.fresh, false);
  assert.equal(r.acpSessionId, sessionId);
  assert.equal(r.response.stopReason, 'end_turn');
  assert.equal((await resumed).sessionKey, 'r');
  const got = await r.acp.request('fake/received');
  assert.deepEqual(got.load, { sessionId, cwd: work, mcpServers: MCP });
  assert.equal(got.new, null, 'no session/new: the context was restored, not replaced');
  // The credentials inside mcpServers are not written to the event log.
  const events = await c.events('r', 0);
  assert.ok(!JSON.stringify(events).includes('t0k'), JSON.stringify(events));
});

test('an agent without loadSession: ResumeError load_unsupported, a fresh session only when allowed', async (t) => {
  const { client: c, sessionId, work } = await interrupted(t, 'noload', { FAKE_AGENT_LOAD: 'none' });
  await assert.rejects(c.resume('r'), (e) => {
    assert.ok(e instanceof leash.ResumeError, String(e));
    assert.equal(e.code, 'resume_failed');
    assert.equal(e.reason, 'load_unsupported');
    assert.equal(e.data.acpSessionId, sessionId);
    return true;
  });
  // The adapter the failed resume ensured never got a session/new.
  let acp = await c.acp('r');
  assert.deepEqual(await acp.request('fake/received'), { new: null, load: null });
  acp.close();
  // The failed resume's ensure took the session off the daemon's resumable list; the client
  // kept what it had found, so a retry on it still knows the cwd and mcpServers.
  const r = await c.resume('r', { fresh: 'allow', prompt: null });
  t.after(() => r.acp.close());
  assert.equal(r.loaded, false);
  assert.equal(r.fresh, true);
  assert.equal(r.freshReason, 'load_unsupported');
  assert.notEqual(r.acpSessionId, sessionId);
  const got = await r.acp.request('fake/received');
  assert.deepEqual(got.new, { cwd: work, mcpServers: MCP }, 'the fresh session keeps the recorded cwd and MCP servers');
});

test('a session/load that fails: ResumeError load_failed with the agent error as cause', async (t) => {
  const { client: c, sessionId, work } = await interrupted(t, 'loadfail', { FAKE_AGENT_LOAD: 'fail' });
  await assert.rejects(c.resume('r'), (e) => {
    assert.ok(e instanceof leash.ResumeError, String(e));
    assert.equal(e.reason, 'load_failed');
    assert.ok(e.cause instanceof leash.AcpError);
    assert.match(e.message, /Session not found/);
    return true;
  });
  const r = await c.resume('r', { fresh: 'allow', prompt: null });
  t.after(() => r.acp.close());
  assert.equal(r.freshReason, 'load_failed');
  const got = await r.acp.request('fake/received');
  assert.deepEqual(got.load, { sessionId, cwd: work, mcpServers: MCP });
  assert.deepEqual(got.new, { cwd: work, mcpServers: MCP });
});

test('no recorded ACP session: ResumeError no_acp_session before anything is spawned', async (t) => {
  const dir = scratch(t, 'noacp');
  const state = join(dir, 'state');
  await Daemon.start(t, state);
  const c = await leash.connect({ stateDir: state });
  t.after(() => c.disconnect());
  // A stored spec, but the adapter never opened an ACP session; then it is closed.
  await c.ensure('n', { argv: fakeAgent(), cwd: dir });
  await c.close('n');
  // The close answers once the tree is terminated; the session ends when its wrapper is reaped.
  const live = async () => (await c.status()).daemon.sessions.some((s) => s.sessionKey === 'n' && s.phase !== 'ended');
  await waitFor(async () => !(await live()), 'the closed session to end');
  await assert.rejects(c.resume('n'), (e) => e instanceof leash.ResumeError && e.reason === 'no_acp_session');
  const st = await c.status();
  assert.ok(!st.daemon.sessions.some((s) => s.sessionKey === 'n' && s.phase !== 'ended'), 'nothing was ensured');
  // A fresh session needs its cwd and mcpServers from the caller (nothing was recorded).
  await assert.rejects(c.resume('n', { fresh: 'allow' }), (e) => e instanceof leash.ResumeError && e.reason === 'setup_unknown');
  const r = await c.resume('n', { fresh: 'allow', cwd: dir, mcpServers: [], prompt: null });
  t.after(() => r.acp.close());
  assert.equal(r.freshReason, 'no_acp_session');
  assert.deepEqual((await r.acp.request('fake/received')).new, { cwd: dir, mcpServers: [] });
  await assert.rejects(c.resume('n', { fresh: 'yes' }), TypeError);
});
