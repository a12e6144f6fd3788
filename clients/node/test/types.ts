// Compiled by `tsc --noEmit` only (never run): typical gateway code against index.d.ts, so a
// wrong or missing declaration fails the type-check.
import {
  connect,
  spawn,
  binaryPath,
  startDaemon,
  BinaryNotFoundError,
  type Daemon,
  close,
  LeashError,
  NotFoundError,
  SpawnFailedError,
  AdapterNotFoundError,
  type AttachItem,
  type EnsureResult,
  type HelloResult,
  AcpxLifecycleController,
  ResumeError,
  canSeeSessionRow,
  type AcpxLifecycleControllerContract,
  type AcpSessionOwner,
  type AcpxProcessLease,
  type GatewayInstanceId,
  type OwnedProcessTree,
  simulate,
  type Simulation,
} from '../index.js';

/** A gateway written against the design's interface only. */
export async function designGateway(ctl: AcpxLifecycleControllerContract, lease: AcpxProcessLease): Promise<void> {
  await ctl.reapStartupOrphans();
  const handle = await ctl.ensureSession({ sessionKey: 'agent:main:acp:1', agent: 'codex', mode: 'persistent', cwd: '/w' });
  await ctl.cancelTurn(handle);
  const tree: OwnedProcessTree | null = await ctl.verifyOwnedTree(lease);
  if (tree) console.log(tree.members.map((m) => m.pid));
  await ctl.closeSession({ handle, discardPersistentState: true, reason: 'done' });
}

export async function controllerOverTheDaemon(): Promise<void> {
  const imported: { report: string[] } = await AcpxLifecycleController.importAcpxState('/srv/openclaw/acpx', { stateDir: '/tmp/state', adoptGatewayId: false });
  console.log(imported.report.length);
  const ctl = await AcpxLifecycleController.connect({ stateDir: '/tmp/state', agents: { codex: ['codex-acp'] }, mcpServers: [] });
  const contract: AcpxLifecycleControllerContract = ctl;
  const id: GatewayInstanceId = await ctl.gatewayInstanceId();
  const h = await ctl.ensureSession({ sessionKey: 's', agent: 'codex', ownerSessionKey: 'agent:main:main', mcpServers: [{ name: 'm', command: 'x', args: [], env: [] }] });
  const r = await ctl.prompt(h, 'hi');
  console.log(contract, id, h.leaseId, h.backendSessionId, r.stopReason);
  const row: AcpSessionOwner = { sessionKey: 's', ownerSessionKey: 'agent:main:main', agentId: 'codex', backend: 'acpx', gatewayInstanceId: id, createdAt: 0 };
  const ok: boolean = canSeeSessionRow({ row, rows: [row], requesterSessionKey: 'agent:main:main', visibility: 'tree', a2aPolicy: { mode: 'on', rules: ['main:*'] } });
  console.log(ok);
  try {
    await ctl.client.resume('s', { fresh: 'never', mcpServers: [] });
  } catch (e) {
    if (e instanceof ResumeError && e.reason === 'load_unsupported') console.log(e.data);
  }
  await ctl.disconnect();
}

export async function gateway(): Promise<void> {
  const client = await connect({ stateDir: '/tmp/state', timeoutMs: 5000, events: true });
  const hello: HelloResult | null = client.info;
  if (hello && !client.supports('detach')) throw new Error(hello.version);
  client.on('resumable', (r) => console.log(r.sessionKey, r.acpSessionIds.length, r.hasSpec));
  const e: EnsureResult = await client.ensure('s', { argv: ['codex-acp'], env: { A: 'b' }, waitMs: 100 });
  if (e.argvMatches === false) console.log('argv differs');
  const ac = new AbortController();
  for await (const item of client.attach('s', { since: e.lastSeq, signal: ac.signal })) {
    const it: AttachItem = item;
    switch (it.type) {
      case 'output':
      case 'stderr':
        console.log(it.seq, it.line.length);
        break;
      case 'gap':
        console.log(it.reason, it.afterSeq);
        break;
      case 'event':
        console.log(it.kind);
        break;
      case 'end':
        console.log(it.reason, it.lastSeq);
        break;
    }
  }
  const acp = await client.acp('s');
  const init = await acp.request<{ agentCapabilities?: { loadSession?: boolean } }>('initialize', { protocolVersion: 1 });
  console.log(init.agentCapabilities?.loadSession);
  await acp.notify('session/cancel', { sessionId: 'x' });
  acp.on('notification', (m) => console.log(m.method));
  try {
    await client.send('s', 'x', { signal: AbortSignal.timeout(10) });
  } catch (err) {
    if (err instanceof AdapterNotFoundError) {
      const lines: string[] = err.data.stderr;
      const status: number | null = err.data.exitStatus;
      console.log(err.data.cause, status, lines.join('\n'));
    } else if (err instanceof NotFoundError || err instanceof SpawnFailedError) console.log(err.code, err.data);
    else if (err instanceof LeashError) console.log(err.code);
  }
  const st = await client.status();
  console.log(st.daemon.sessions.map((s) => s.phase));
  const r = await client.resume('s', { prompt: 'go on' });
  console.log(r.loaded, r.acpSessionId, r.fresh, r.freshReason, r.mcpServers.length);
  const child = spawn(['codex-acp'], { session: 's', agent: 'codex', graceMs: 500, leaseId: '0190b1f2-7c3a-7d4e-8f00-1234567890ab' });
  const leaseId: string = child.leaseId;
  console.log(leaseId);
  spawn(['codex-acp'], { session: 's', agent: 'codex', graceMs: 500, unsetEnv: ['OPENAI_API_KEY'] });
  spawn(['codex-acp'], { clearEnv: true, keepEnv: ['PATH', 'HOME'] });
  await client.ensure('t', { argv: ['claude-acp'], clearEnv: true, keepEnv: ['PATH'], unsetEnv: [], persistEnv: false });
  await client.ensure('t', { env: { ANTHROPIC_API_KEY: 'k' } });
  await client.close({ session: 't', discardPersistentState: true });
  child.stdout?.on('data', () => {});
  const outcomes = await close({ session: 's' });
  console.log(outcomes[0]?.result);
  const v: unknown = await client.request('metrics', {});
  console.log(v);
  await client.disconnect();
}

/** A CI step written against the simulate declaration. */
export async function ciStep(file: string): Promise<number[]> {
  const sim: Simulation = await simulate(file, { expect: file });
  if (sim.exitStatus === 2) throw new Error(sim.expect?.diff.join('\n'));
  for (const e of sim.timeline) if (e.event === 'signal') console.log(`t+${e.at} ms ${e.signal} pid ${e.pid}`);
  return sim.signalled;
}
// The binaries and the daemon, as a gateway installed with npm starts them.
async function ownDaemon(stateDir: string): Promise<void> {
  const leashPath: string = binaryPath('leash');
  const wrapPath: string = binaryPath('leash-wrap', { env: { LEASH_BIN_DIR: '/opt/leash' } });
  void leashPath;
  void wrapPath;
  const daemon: Daemon = await startDaemon({ stateDir, args: ['--idle-close', '10m'], stderr: 'ignore' });
  const pid: number = daemon.pid;
  const mine: boolean = daemon.started;
  void pid;
  void mine;
  const exit = await daemon.stop({ graceMs: 5_000 });
  if (exit !== null && exit.code !== 0) throw new Error(`leash serve exited ${exit.code ?? exit.signal}`);
  try {
    binaryPath('leash');
  } catch (e) {
    if (e instanceof BinaryNotFoundError) for (const t of e.tried) console.log(t.path, t.why);
  }
}
void ownDaemon;
