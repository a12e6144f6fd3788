// Compiled by `tsc --noEmit` only (never run): typical gateway code against index.d.ts, so a
// wrong or missing declaration fails the type-check.
import {
  connect,
  spawn,
  close,
  LeashError,
  NotFoundError,
  SpawnFailedError,
  type AttachItem,
  type EnsureResult,
  type HelloResult,
} from '../index.js';

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
    if (err instanceof NotFoundError || err instanceof SpawnFailedError) console.log(err.code, err.data);
    else if (err instanceof LeashError) console.log(err.code);
  }
  const st = await client.status();
  console.log(st.daemon.sessions.map((s) => s.phase));
  const r = await client.resume('s', { prompt: 'go on' });
  console.log(r.loaded, r.acpSessionId);
  const child = spawn(['codex-acp'], { session: 's', agent: 'codex', graceMs: 500, unsetEnv: ['OPENAI_API_KEY'] });
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
