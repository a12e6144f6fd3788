#!/usr/bin/env node
// A gateway written only against the design's lifecycle controller (AcpxLifecycleController in
// clients/node), the way the incumbent's ACP runtime drives its process side:
//
//   1. reapStartupOrphans() at startup (from the leases on disk, each verified);
//   2. ensureSession() for two sessions of the fake agent, each with its cwd and MCP servers;
//   3. a prompt on the first; on the second a slow turn, cancelTurn() (the turn ends cancelled,
//      the process stays: verifyOwnedTree() still proves it ours, and it takes the next turn);
//   4. closeSession() of both (verified, then terminated; the second discards its stored state),
//      after which verifyOwnedTree() answers null;
//   5. a third session busy when the daemon stops (SIGTERM); after the restart a new controller
//      (the gateway restarted too, keeping only its handle) resumes it with ensureSession's
//      resumeSessionId: session/load with the cwd and MCP servers it was opened with, then a
//      continue prompt, then close.
//
// Usage: node examples/acpx-gateway.mjs [--leash PATH] [--state-dir DIR]
// The daemon is started by this script and stopped at the end; only processes it started are
// signalled, by pid.

import { spawn as spawnProcess } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, openSync, closeSync, existsSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, dirname, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { AcpxLifecycleController, connect } from '../clients/node/src/index.js';

const here = dirname(fileURLToPath(import.meta.url));
const args = process.argv.slice(2);
const opt = (name, dflt) => {
  const i = args.indexOf(name);
  return i >= 0 ? args[i + 1] : dflt;
};
const leashBin = opt('--leash', process.env.LEASH_BIN ?? 'leash');
const ownState = !opt('--state-dir');
const stateDir = opt('--state-dir') ?? join(mkdtempSync(join(tmpdir(), 'leash-acpx-gateway-')), 'state');
const workDir = dirname(stateDir);
const log = (step, ...rest) => console.log(`[${step}]`, ...rest);
const check = (ok, what) => {
  if (!ok) throw new Error(`check failed: ${what}`);
};

// --- the daemon this example owns ------------------------------------------------------------
let daemon = null;
async function startDaemon() {
  const fd = openSync(join(workDir, 'serve.log'), 'a');
  const child = spawnProcess(leashBin, ['--state-dir', stateDir, 'serve'], { stdio: ['ignore', 'ignore', fd] });
  closeSync(fd);
  const exited = new Promise((r) => child.once('exit', (code, signal) => r({ code, signal })));
  daemon = { child, exited };
  const deadline = Date.now() + 30_000;
  for (;;) {
    try {
      const info = JSON.parse(readFileSync(join(stateDir, 'daemon.lock'), 'utf8'));
      if (info.pid === child.pid) {
        const c = await connect({ stateDir, reconnect: false });
        await c.disconnect();
        break;
      }
    } catch {
      // not up yet
    }
    if (child.exitCode !== null || Date.now() > deadline) throw new Error(`leash serve did not start (see ${join(workDir, 'serve.log')})`);
    await new Promise((r) => setTimeout(r, 20));
  }
  log('daemon', `leash serve pid ${child.pid}`);
}

const agents = { fake: [process.execPath, resolve(here, '../clients/node/test/fixtures/fake-agent.mjs')] };
const MCP = [{ name: 'files', command: '/usr/bin/env', args: ['mcp-files'], env: [] }];

async function main() {
  await startDaemon();
  let ctl = await AcpxLifecycleController.connect({ stateDir, agents, mcpServers: MCP, reconnect: false });
  try {
    log('gateway', `instance ${await ctl.gatewayInstanceId()}`);
    const reaped = await ctl.reapStartupOrphans();
    log('reap', `startup reap: ${JSON.stringify(reaped.summary ?? reaped).slice(0, 120)}`);

    const a = await ctl.ensureSession({ sessionKey: 'agent:main:acp:one', agent: 'fake', mode: 'persistent', cwd: workDir });
    const b = await ctl.ensureSession({ sessionKey: 'agent:main:acp:two', agent: 'fake', mode: 'persistent', cwd: workDir, ownerSessionKey: 'agent:main:main' });
    log('ensure', `${a.sessionKey}: lease ${a.leaseId}, ACP session ${a.backendSessionId}`);
    log('ensure', `${b.sessionKey}: lease ${b.leaseId}, ACP session ${b.backendSessionId}`);

    const r1 = await ctl.prompt(a, 'hello');
    log('prompt', `${a.sessionKey}: stopReason ${r1.stopReason}`);

    // A slow turn, cancelled once the agent has started on it.
    const started = new Promise((r) => ctl.channel(b).once('notification', r));
    const turn = ctl.prompt(b, 'slow: think for a long time');
    await started;
    await ctl.cancelTurn(b);
    const r2 = await turn;
    log('cancel', `${b.sessionKey}: stopReason ${r2.stopReason}`);
    check(r2.stopReason === 'cancelled', 'the cancelled turn ends cancelled');
    const tree = await ctl.verifyOwnedTree({ leaseId: b.leaseId, rootPid: b.rootPid });
    check(tree !== null && tree.rootPid === b.rootPid, 'the process survives the cancel');
    log('cancel', `${b.sessionKey}: process kept (verified tree of ${tree.members.length} processes)`);
    const r3 = await ctl.prompt(b, 'and now?');
    log('prompt', `${b.sessionKey}: after the cancel, stopReason ${r3.stopReason}`);

    for (const [h, discard] of [[a, false], [b, true]]) {
      const outcomes = await ctl.closeSession({ handle: h, discardPersistentState: discard, reason: 'example over' });
      log('close', `${h.sessionKey}: ${outcomes.map((o) => o.result).join(', ')}${discard ? ' (stored state discarded)' : ''}`);
      check(await ctl.verifyOwnedTree({ leaseId: h.leaseId }) === null, 'a closed lease verifies as null');
      check(!existsSync(`/proc/${h.rootPid}`), 'the closed process is gone');
    }

    // A turn in flight when the daemon stops: the session is resumable after the restart.
    const c = await ctl.ensureSession({ sessionKey: 'agent:main:acp:three', agent: 'fake', cwd: workDir, mcpServers: [...MCP, { name: 'search', command: '/usr/bin/env', args: ['mcp-search'], env: [] }] });
    const busy = new Promise((r) => ctl.channel(c).once('notification', r));
    ctl.prompt(c, 'slow: a long job').catch(() => {});
    await busy;
    daemon.child.kill('SIGTERM');
    await daemon.exited;
    log('restart', 'daemon stopped (SIGTERM) with a turn in flight');
    await ctl.disconnect();
    await startDaemon();
    // The gateway, restarted too, has only the handle it persisted.
    ctl = await AcpxLifecycleController.connect({ stateDir, agents, reconnect: false });
    const resumed = await ctl.ensureSession({ sessionKey: c.sessionKey, agent: 'fake', resumeSessionId: c.backendSessionId });
    const got = await ctl.channel(resumed).request('fake/received');
    check(got.load?.sessionId === c.backendSessionId && got.new === null, 'the ACP session is loaded, not replaced');
    log('resume', `${c.sessionKey}: loaded ${got.load.sessionId} in ${got.load.cwd === workDir ? 'its cwd' : got.load.cwd} with MCP servers ${got.load.mcpServers.map((m) => m.name).join(', ')}`);
    const r4 = await ctl.prompt(resumed, 'continue where you left off');
    log('resume', `${c.sessionKey}: continue prompt: stopReason ${r4.stopReason}`);
    const out = await ctl.closeSession({ handle: resumed, discardPersistentState: true, reason: 'example over' });
    log('close', `${c.sessionKey}: ${out.map((o) => o.result).join(', ')}`);
    log('done', 'ok');
  } finally {
    await ctl.disconnect();
    daemon.child.kill('SIGTERM');
    await daemon.exited;
    if (ownState) rmSync(workDir, { recursive: true, force: true });
  }
}

main().catch((e) => {
  console.error(e);
  if (daemon && daemon.child.exitCode === null) daemon.child.kill('SIGKILL');
  process.exit(1);
});
