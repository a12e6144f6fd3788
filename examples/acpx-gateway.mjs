#!/usr/bin/env node
// A gateway written only against the design's lifecycle controller (AcpxLifecycleController in
// clients/node), the way the incumbent's ACP runtime drives its process side:
//
//   0. a fake incumbent (the acpx extension) left an orphan: a wrapper generated its way,
//      launched with its command line and markers by a gateway that was SIGKILLed, recorded in
//      its own acpx/process-leases.json and gateway-instance-id; the controller's migration step
//      AcpxLifecycleController.importAcpxState() (`leash legacy import --acpx`, before the daemon
//      starts) makes that state the root's own, and a dry-run reap shows what will be ended;
//   1. reapStartupOrphans() at startup (from the leases on disk, each verified): the incumbent's
//      orphan, wrapper and detached adapter, is ended;
//   2. ensureSession() for two sessions of the fake agent, each with its cwd and MCP servers;
//   3. a prompt on the first; on the second a slow turn, cancelTurn() (the turn ends cancelled,
//      the process stays: verifyOwnedTree() still proves it ours, and it takes the next turn);
//   4. closeSession() of both (verified, then terminated; the second discards its stored state),
//      after which verifyOwnedTree() answers null;
//   4b. a silent adapter (it never answers initialize): ensureSession with handshakeTimeoutMs
//      rejects HandshakeTimeoutError, twice, and nothing of either attempt is left; two
//      ensureSession calls of one key at once (two gateway connections) get the one adapter;
//   5. a third session busy when the daemon stops (SIGTERM); after the restart a new controller
//      (the gateway restarted too, keeping only its handle) resumes it with ensureSession's
//      resumeSessionId: session/load with the cwd and MCP servers it was opened with, then a
//      continue prompt, then close.
//
// Usage: node examples/acpx-gateway.mjs [--leash PATH] [--state-dir DIR]
// The daemon is started by this script and stopped at the end; only processes it started are
// signalled, by pid.

import { spawn as spawnProcess } from 'node:child_process';
import { createHash, randomUUID } from 'node:crypto';
import { mkdtempSync, mkdirSync, readFileSync, rmSync, openSync, closeSync, existsSync, writeFileSync, chmodSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, dirname, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { AcpxLifecycleController, HandshakeTimeoutError, connect, reap } from '../clients/node/src/index.js';

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

// --- the incumbent's leftovers ----------------------------------------------------------------
const alive = (pid) => {
  try {
    const st = readFileSync(`/proc/${pid}/stat`, 'utf8');
    return st.slice(st.lastIndexOf(')') + 2)[0] !== 'Z';
  } catch {
    return false;
  }
};
async function until(cond, what, ms = 30_000) {
  const deadline = Date.now() + ms;
  while (!cond()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

/**
 * What an install of the acpx extension leaves when its gateway dies: a wrapper generated the
 * extension's way (the adapter spawned detached, in its own group), launched with its command
 * line (`env OPENCLAW_ACPX_LEASE_ID=… OPENCLAW_GATEWAY_INSTANCE_ID=… "node" "wrapper"
 * --openclaw-acpx-lease-id … --openclaw-gateway-instance-id …`), and its state on disk. This
 * wrapper does not poll its ppid (the extension's poll misses a user manager, its #96032), so
 * it stays an orphan whoever adopts it.
 */
async function fakeIncumbent() {
  const oc = join(workDir, 'openclaw');
  const acpx = join(oc, 'acpx');
  mkdirSync(acpx, { recursive: true });
  const wrapper = join(acpx, 'codex-acp-wrapper.mjs');
  const pids = join(workDir, 'incumbent');
  writeFileSync(wrapper, `import { spawn } from "node:child_process";
import fs from "node:fs";
const child = spawn("/bin/sh", ["-c", "while :; do sleep 1 & wait $!; done"], { stdio: "ignore", detached: true });
fs.writeFileSync(${JSON.stringify(pids)}, process.pid + " " + child.pid);
for (const s of ["SIGINT", "SIGTERM", "SIGHUP"]) process.on(s, () => { try { process.kill(-child.pid, s); } catch {} process.exit(1); });
child.on("exit", () => process.exit(0));
`);
  const gatewayId = randomUUID();
  const leaseId = randomUUID();
  const command = `env OPENCLAW_ACPX_LEASE_ID=${leaseId} OPENCLAW_GATEWAY_INSTANCE_ID=${gatewayId} ${JSON.stringify(process.execPath)} ${JSON.stringify(wrapper)} --openclaw-acpx-lease-id ${leaseId} --openclaw-gateway-instance-id ${gatewayId}`;
  // The old gateway: launches the wrapper, then dies by SIGKILL.
  const oldGateway = spawnProcess('/bin/sh', ['-c', `${command} & wait`], { stdio: 'ignore' });
  await until(() => existsSync(pids) && readFileSync(pids, 'utf8').includes(' '), 'the incumbent wrapper');
  const [wrapperPid, adapterPid] = readFileSync(pids, 'utf8').split(' ').map(Number);
  oldGateway.kill('SIGKILL');
  await new Promise((r) => (oldGateway.exitCode !== null || oldGateway.signalCode !== null ? r() : oldGateway.once('exit', r)));
  writeFileSync(join(oc, 'gateway-instance-id'), `${gatewayId}\n`);
  const lease = {
    leaseId, gatewayInstanceId: gatewayId, sessionKey: 'agent:codex:acp:orphan', wrapperRoot: acpx, wrapperPath: wrapper,
    rootPid: wrapperPid, commandHash: createHash('sha256').update(command).digest('hex'), startedAt: Date.now() - 60_000, state: 'open',
  };
  writeFileSync(join(acpx, 'process-leases.json'), JSON.stringify({ version: 1, leases: [lease] }));
  return { acpx, gatewayId, leaseId, wrapperPid, adapterPid };
}

const mute = join(workDir, 'mute-adapter.sh');
writeFileSync(mute, '#!/bin/sh\necho "mute: loading a model that never finishes" >&2\nwhile :; do sleep 1 & wait $!; done\n');
chmodSync(mute, 0o755);
const agents = { fake: [process.execPath, resolve(here, '../clients/node/test/fixtures/fake-agent.mjs')], mute: [mute] };
const MCP = [{ name: 'files', command: '/usr/bin/env', args: ['mcp-files'], env: [] }];

let inc = null;
async function main() {
  inc = await fakeIncumbent();
  check(alive(inc.wrapperPid) && alive(inc.adapterPid), 'the incumbent left an orphan');
  log('incumbent', `gateway ${inc.gatewayId} died; its wrapper ${inc.wrapperPid} and adapter ${inc.adapterPid} run on`);
  // The migration step, before the daemon starts on the root: the incumbent's own state in.
  const imported = await AcpxLifecycleController.importAcpxState(inc.acpx, { stateDir, leashBin });
  log('import', imported.report.join('; '));
  // What the start-up reap will do with it (no daemon yet: the client asks the CLI).
  const plan = await reap({ dryRun: true }, { stateDir, leashBin });
  const mine = (plan.legacy ?? []).find((l) => JSON.stringify(l).includes(inc.leaseId));
  check(mine, 'the dry run plans the imported lease');
  log('import', `reap --dry-run: ${JSON.stringify(mine).slice(0, 200)}`);
  await startDaemon();
  let ctl = await AcpxLifecycleController.connect({ stateDir, agents, mcpServers: MCP, reconnect: false });
  try {
    const gw = await ctl.gatewayInstanceId();
    check(gw === inc.gatewayId, 'the root adopted the incumbent gateway id');
    log('gateway', `instance ${gw} (the incumbent's)`);
    // leash serve ran the startup reap as it started; the gateway's own call finds it done.
    const reaped = await ctl.reapStartupOrphans();
    log('reap', `startup reap: ${JSON.stringify(reaped.summary ?? reaped).slice(0, 160)}`);
    await until(() => !alive(inc.wrapperPid) && !alive(inc.adapterPid), 'the orphan ended');
    check(await ctl.verifyOwnedTree({ leaseId: inc.leaseId }) === null, 'the imported lease has no tree left');
    log('reap', `the incumbent's orphan is gone (wrapper ${inc.wrapperPid}, detached adapter ${inc.adapterPid})`);

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

    // A peer that never answers initialize: the ensure fails in time, and a retry leaves no
    // process behind (the incumbent's #147352 left one per retry and hung the gateway).
    for (let attempt = 1; attempt <= 2; attempt++) {
      try {
        await ctl.ensureSession({ sessionKey: 'agent:mute:acp:one', agent: 'mute', cwd: workDir, handshakeTimeoutMs: 300 });
        check(false, 'a silent adapter does not pass the handshake');
      } catch (e) {
        if (!(e instanceof HandshakeTimeoutError)) throw e;
        check(await ctl.verifyOwnedTree({ leaseId: e.data.leaseId }) === null, 'the timed-out lease has no tree left');
        log('handshake', `attempt ${attempt}: ${e.code}; stderr: ${e.data.stderr.join(' | ')}; lease ${e.data.leaseId} closed, nothing left`);
      }
    }
    // Two ensures of one key at once (two connections of the gateway): one adapter.
    const other = await AcpxLifecycleController.connect({ stateDir, agents, mcpServers: MCP, reconnect: false });
    const [s1, s2] = await Promise.all([
      ctl.ensureSession({ sessionKey: 'agent:main:acp:same', agent: 'fake', cwd: workDir }),
      other.ensureSession({ sessionKey: 'agent:main:acp:same', agent: 'fake', cwd: workDir }),
    ]);
    check(s1.leaseId === s2.leaseId && s1.rootPid === s2.rootPid, 'same-key ensures share one adapter');
    log('same-key', `two ensures of ${s1.sessionKey}: one lease ${s1.leaseId}, one process ${s1.rootPid}`);
    await other.disconnect();
    await ctl.closeSession({ handle: s1, discardPersistentState: true, reason: 'example over' });

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
  // The incumbent's leftovers are this script's own processes: ended by pid if still there.
  for (const pid of inc ? [inc.adapterPid, inc.wrapperPid] : []) {
    try {
      if (alive(pid)) process.kill(pid, 'SIGKILL');
    } catch {
      // gone
    }
  }
  process.exit(1);
});
