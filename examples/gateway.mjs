#!/usr/bin/env node
// What a gateway does with leash, end to end, using the Node client (clients/node):
//
//   1. start (or find) `leash serve`, connect, subscribe to lifecycle pushes;
//   2. ensure a session running an ACP agent, `initialize`, `session/new`, `session/prompt`
//      (the agent's `session/update` notifications stream in), then cancel a turn with
//      `session/cancel` (the agent answers the prompt with stopReason "cancelled");
//   3. SIGKILL the daemon: its sessions die by design (the wrapper takes the adapter's tree
//      down); the restarted daemon's startup reap settles the lease and the client reconnects;
//   4. the `resumable` path: with a turn in flight, SIGTERM the daemon; the next daemon pushes
//      `resumable`; `client.resume()` re-spawns the session from its stored spec, loads the ACP
//      session and sends a continue prompt;
//   5. close the session and stop the daemon.
//
// Usage: node examples/gateway.mjs [--agent fake|codex] [--leash PATH] [--state-dir DIR]
//   fake  — clients/node/test/fixtures/fake-agent.mjs (default; needs nothing else)
//   codex — `codex-acp` (@zed-industries/codex-acp) from PATH: without credentials its
//           session/new answers "authentication required", which the example reports and
//           then closes cleanly.
// The daemon is started by this script (so it can kill and restart it) and stopped at the end;
// only processes it started are signalled, by pid.

import { spawn as spawnProcess } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, openSync, closeSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, dirname, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import * as leash from '../clients/node/src/index.js';

const here = dirname(fileURLToPath(import.meta.url));
const args = process.argv.slice(2);
const opt = (name, dflt) => {
  const i = args.indexOf(name);
  return i >= 0 ? args[i + 1] : dflt;
};
const agentKind = opt('--agent', 'fake');
const leashBin = opt('--leash', process.env.LEASH_BIN ?? 'leash');
const ownState = !opt('--state-dir');
const stateDir = opt('--state-dir') ?? join(mkdtempSync(join(tmpdir(), 'leash-gateway-')), 'state');
const argv = agentKind === 'codex'
  ? ['codex-acp']
  : [process.execPath, resolve(here, '../clients/node/test/fixtures/fake-agent.mjs')];
const SESSION = 'agent:main:acp:demo';
const log = (step, ...rest) => console.log(`[${step}]`, ...rest);

// --- the daemon this example owns --------------------------------------------------------------
let daemon = null;
async function startDaemon() {
  const fd = openSync(join(dirname(stateDir), 'serve.log'), 'a');
  const child = spawnProcess(leashBin, ['--state-dir', stateDir, 'serve'], { stdio: ['ignore', 'ignore', fd] });
  closeSync(fd);
  const exited = new Promise((r) => child.once('exit', (code, signal) => r({ code, signal })));
  daemon = { child, exited };
  const deadline = Date.now() + 30_000;
  for (;;) {
    try {
      const info = JSON.parse(readFileSync(join(stateDir, 'daemon.lock'), 'utf8'));
      if (info.pid === child.pid) {
        const c = await leash.connect({ stateDir, reconnect: false });
        await c.disconnect();
        break;
      }
    } catch {
      // not up yet
    }
    if (child.exitCode !== null || Date.now() > deadline) throw new Error(`leash serve did not start (see ${join(dirname(stateDir), 'serve.log')})`);
    await new Promise((r) => setTimeout(r, 20));
  }
  log('daemon', `leash serve pid ${child.pid} on ${stateDir}`);
}
async function stopDaemon(signal) {
  daemon.child.kill(signal);
  const r = await daemon.exited;
  log('daemon', `stopped by ${signal}: ${r.signal ? `signal ${r.signal}` : `exit ${r.code}`}`);
}

async function main() {
  await startDaemon();
  const client = await leash.connect({ stateDir, events: true, reconnectTimeoutMs: 60_000 });
  client.on('resumable', (r) => log('push', `resumable: ${r.sessionKey} (ACP sessions ${r.acpSessionIds.join(', ') || 'none'}, stored spec: ${r.hasSpec})`));
  client.on('reconnect', () => log('client', 'reconnected to the daemon'));

  // --- 2. ensure, initialize, session/new, prompt, cancel ---------------------------------------
  const ensured = await client.ensure(SESSION, { argv, cwd: process.cwd(), agent: agentKind });
  log('ensure', `${ensured.sessionKey}: ${ensured.phase}, lease ${ensured.leaseId}, created ${ensured.created}`);
  let acp = await client.acp(SESSION);
  acp.on('stderr', (line) => log('agent stderr', line));
  acp.on('notification', (m) => {
    const text = m.params?.update?.content?.text;
    if (m.method === 'session/update' && text) log('update', text);
  });
  const init = await acp.request('initialize', { protocolVersion: 1, clientCapabilities: { fs: { readTextFile: false, writeTextFile: false }, terminal: false } });
  log('initialize', `agent ${init.agentInfo?.name ?? 'unknown'}; loadSession: ${!!init.agentCapabilities?.loadSession}`);
  let acpSession;
  try {
    acpSession = (await acp.request('session/new', { cwd: process.cwd(), mcpServers: [] })).sessionId;
  } catch (e) {
    if (e instanceof leash.AcpError && /auth/i.test(e.message)) {
      log('session/new', `the agent needs credentials: ${e.rpcError?.message ?? e.data.rpcError?.message ?? e.message} (JSON-RPC ${e.rpcCode}); configure them and run again`);
      acp.close();
      const out = await client.close(SESSION);
      log('close', `${out[0].sessionKey}: ${out[0].result}`);
      await client.disconnect();
      await stopDaemon('SIGTERM');
      return;
    }
    throw e;
  }
  log('session/new', acpSession);
  const done = await acp.request('session/prompt', { sessionId: acpSession, prompt: [{ type: 'text', text: 'hello' }] });
  log('prompt', `stopReason ${done.stopReason}`);
  const turn = acp.request('session/prompt', { sessionId: acpSession, prompt: [{ type: 'text', text: 'a slow task' }] });
  const cancel = await client.cancel({ session: SESSION, acpSessionId: acpSession });
  log('cancel', `session/cancel written (event seq ${cancel.seq})`);
  log('prompt', `stopReason ${(await turn).stopReason}`);

  // --- 3. SIGKILL: the session dies with the daemon --------------------------------------------
  const ended = new Promise((r) => acp.once('close', r));
  await stopDaemon('SIGKILL');
  await startDaemon();
  await ended;
  log('sigkill', `ACP channel ended: ${acp.ended ? `end (${acp.ended.reason})` : 'connection lost'}`);
  const lease = (await client.leases()).find((l) => l.leaseId === ensured.leaseId);
  log('sigkill', `lease ${lease.leaseId}: ${lease.state} (${lease.stateReason ?? ''})`);

  // --- 4. the resumable path: SIGTERM with a turn in flight --------------------------------------
  const again = await client.ensure(SESSION, {}); // from the stored spec
  log('ensure', `re-spawned from the stored spec: lease ${again.leaseId}`);
  acp = await client.acp(SESSION);
  await acp.request('initialize', { protocolVersion: 1 });
  acpSession = (await acp.request('session/new', { cwd: process.cwd(), mcpServers: [] })).sessionId;
  acp.request('session/prompt', { sessionId: acpSession, prompt: [{ type: 'text', text: 'another slow task' }] }).catch(() => {});
  while (!(await client.status()).daemon.busy.includes(SESSION)) await new Promise((r) => setTimeout(r, 10));
  await stopDaemon('SIGTERM');
  acp.close();
  await startDaemon();
  while (!client.resumable.has(SESSION)) await new Promise((r) => setTimeout(r, 10));
  const resumed = await client.resume(SESSION, { prompt: 'please continue', cwd: process.cwd() });
  log('resume', `ACP session ${resumed.acpSessionId} ${resumed.loaded ? 'loaded' : 'created'}; continue prompt: stopReason ${resumed.response.stopReason}`);
  resumed.acp.close();

  // --- 5. close ------------------------------------------------------------------------------
  const out = await client.close(SESSION);
  log('close', `${out[0].sessionKey}: ${out[0].result}`);
  await client.disconnect();
  await stopDaemon('SIGTERM');
}

try {
  await main();
  log('done', 'ok');
} catch (e) {
  console.error('gateway example failed:', e);
  process.exitCode = 1;
  if (daemon && daemon.child.exitCode === null) daemon.child.kill('SIGKILL');
} finally {
  if (ownState) rmSync(dirname(stateDir), { recursive: true, force: true });
}
