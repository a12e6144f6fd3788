#!/usr/bin/env node
// Benchmarks of the Node client against a real `leash serve` (docs/benchmarks.md, "Node client").
// Every figure is a ratio against a baseline measured in the same run, and the two sides are
// interleaved so that load bursts from elsewhere on the host hit both alike; each run gives one
// ratio, and the summary states the median and the spread over the runs, with the load average.
//   1. prompt round trip: a JSON-RPC request written with `send` → its response on the attach
//      stream, through the client (`acp().request`) vs the same exchange hand-written on a raw
//      socket (one NDJSON `send`, lines parsed in the data handler, the agent's line parsed and
//      matched by id), both on one session; client and raw alternate request by request (order
//      swapped every other pair). p50 and p99 per run. Target: the client adds <= 10 %.
//   2. attach throughput of 1 KiB lines: the same generator read through `leash serve` and the
//      client's attach iterator (every item's text touched) vs read from a plain pipe by this
//      process (newlines counted); the three readers of a run go in a rotating order. Lines
//      per second. Target: >= 50 % of the pipe's rate. A raw socket reader counting newlines
//      shows the daemon's share; a second pair with 1 KiB JSON-RPC lines (every quote escaped
//      on the wire, as an adapter's output is) shows the client on realistic text.
// Usage: node bench/bench.mjs [--leash PATH] [--runs N] [--round-trips N] [--lines N]
//                             [--only rt|tp] [--json]
import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync, readFileSync, openSync, closeSync } from 'node:fs';
import { createConnection } from 'node:net';
import { tmpdir, loadavg, cpus } from 'node:os';
import { join, dirname, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { performance } from 'node:perf_hooks';
import * as leash from '../src/index.js';

const here = dirname(fileURLToPath(import.meta.url));
const args = process.argv.slice(2);
const opt = (n, d) => (args.includes(n) ? args[args.indexOf(n) + 1] : d);
const LEASH = opt('--leash', process.env.LEASH_BIN ?? resolve(here, '../../../target/release/leash'));
const RUNS = Number(opt('--runs', 5));
const ROUND_TRIPS = Number(opt('--round-trips', 2000));
const LINES = Number(opt('--lines', 100_000));
const ONLY = opt('--only', 'all');
const FAKE = [process.execPath, resolve(here, '../test/fixtures/fake-agent.mjs')];
const PLAIN = 'x'.repeat(1023); // + '\n' = 1 KiB
// An ACP-like notification of 1,023 bytes: its 20-odd quotes are escaped in the stream item.
const ACP = (() => {
  const msg = (pad) => JSON.stringify({ jsonrpc: '2.0', method: 'session/update', params: { sessionId: 's1', update: { sessionUpdate: 'agent_message_chunk', content: { type: 'text', text: pad } } } });
  const base = msg('').length;
  return msg('y'.repeat(1023 - base));
})();
/** Waits for "go" on stdin, writes LINES copies of `line`, then stays up. */
const generator = (line) => ['sh', '-c', `read go; yes '${line}' | head -n ${LINES}; exec cat`];

const dir = mkdtempSync(join(tmpdir(), 'leash-node-bench-'));
const state = join(dir, 'state');
let daemon;

async function startDaemon() {
  const fd = openSync(join(dir, 'serve.log'), 'w');
  // The replay buffer holds a whole burst, so a reader that falls behind during a load spike is
  // slowed, not evicted (an eviction would end the run with a gap).
  daemon = spawn(LEASH, ['--state-dir', state, 'serve', '--replay-lines', String(LINES * 2), '--replay-bytes', String(LINES * 2048)], { stdio: ['ignore', 'ignore', fd] });
  closeSync(fd);
  for (let i = 0; i < 3000; i++) {
    try {
      const info = JSON.parse(readFileSync(join(state, 'daemon.lock'), 'utf8'));
      if (info.pid === daemon.pid) return info.socket;
    } catch {}
    await new Promise((r) => setTimeout(r, 10));
  }
  throw new Error('leash serve did not start');
}

const pct = (xs, p) => {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))];
};
const median = (xs) => pct(xs, 50);

function rawSocket(socket) {
  return new Promise((res, rej) => {
    const s = createConnection({ path: socket });
    s.once('connect', () => res(s));
    s.once('error', rej);
  });
}

/** Both sides of the round trip, set up once: `once()` of each gives one sample in ms. */
async function roundTripSides(socket) {
  const client = await leash.connect({ stateDir: state });
  // One session, one agent, for both sides: each side's attach sees both sides' traffic (and
  // skips the other's responses by id), so the agent, the daemon's output thread and the
  // stream are shared and only what is per connection — the client, or the hand-written
  // reader — differs between the two. (With a session each, which agent process the scheduler
  // woke first moved the per-run ratio by ±20 % under load.)
  await client.ensure('rt', { argv: FAKE });
  const acp = await client.acp('rt');
  acp.on('stray', () => {});
  // The raw side: what a gateway writes by hand, as lean as it gets — its own connection and
  // attach, lines parsed in the data handler, the agent's line parsed and matched by id.
  const sock = await rawSocket(socket);
  sock.setEncoding('utf8');
  let buf = '';
  let want = null;
  let attached = null;
  sock.on('data', (d) => {
    buf += d;
    let start = 0;
    let nl;
    while ((nl = buf.indexOf('\n', start)) >= 0) {
      const item = JSON.parse(buf.slice(start, nl));
      start = nl + 1;
      if (item.id === 'a' && item.ok) attached?.();
      if (item.id !== 'a' || item.type !== 'output' || !want) continue;
      const msg = JSON.parse(item.line);
      if (msg.id === want.id && !('method' in msg)) {
        const w = want;
        want = null;
        w.resolve();
      }
    }
    buf = buf.slice(start);
  });
  await new Promise((r) => {
    attached = r;
    sock.write(JSON.stringify({ id: 'a', op: 'attach', session: 'rt', since: Number.MAX_SAFE_INTEGER }) + '\n');
  });
  let rawId = 0;
  const raw = async () => {
    const id = `raw-${++rawId}`;
    const t0 = performance.now();
    const got = new Promise((resolve) => (want = { id, resolve }));
    sock.write(JSON.stringify({ id: `s${rawId}`, op: 'send', session: 'rt', line: JSON.stringify({ jsonrpc: '2.0', id, method: 'echo', params: { n: rawId } }) }) + '\n');
    await got;
    return performance.now() - t0;
  };
  let n = 0;
  const viaClient = async () => {
    const t0 = performance.now();
    await acp.request('echo', { n: ++n });
    return performance.now() - t0;
  };
  for (let i = 0; i < 200; i++) {
    await raw();
    await viaClient();
  }
  return {
    raw,
    client: viaClient,
    async close() {
      acp.close();
      sock.destroy();
      await client.close('rt');
      await client.disconnect();
    },
  };
}

async function roundTripRun(sides) {
  const r = { raw: [], client: [] };
  for (let i = 0; i < ROUND_TRIPS; i++) {
    if (i % 2 === 0) {
      r.raw.push(await sides.raw());
      r.client.push(await sides.client());
    } else {
      r.client.push(await sides.client());
      r.raw.push(await sides.raw());
    }
  }
  if (process.env.BENCH_DIST) for (const side of ['raw', 'client']) console.log(side, [5, 10, 25, 50, 75, 90, 95, 99].map((p) => `p${p} ${pct(r[side], p).toFixed(3)}`).join(' '));
  return {
    rawP50: pct(r.raw, 50),
    rawP99: pct(r.raw, 99),
    clientP50: pct(r.client, 50),
    clientP99: pct(r.client, 99),
  };
}

/** The generator read from a plain pipe by this process, newlines counted. */
async function pipeRate(line) {
  const child = spawn('sh', generator(line).slice(1), { stdio: ['pipe', 'pipe', 'ignore'] });
  let n = 0;
  let t0 = 0;
  const done = new Promise((res) => {
    child.stdout.on('data', (chunk) => {
      for (let i = chunk.indexOf(10); i >= 0; i = chunk.indexOf(10, i + 1)) n++;
      if (n >= LINES) res(performance.now() - t0);
    });
  });
  t0 = performance.now();
  child.stdin.write('go\n');
  const ms = await done;
  child.kill('SIGKILL');
  return (LINES / ms) * 1000;
}

let sessionNo = 0;

/** The same through `leash serve` on a raw socket counting newlines: the daemon's share. */
async function rawAttachRate(socket, line) {
  const client = await leash.connect({ stateDir: state });
  const session = `raw-tp-${++sessionNo}`;
  await client.ensure(session, { argv: generator(line), waitMs: 0 });
  const sock = await rawSocket(socket);
  let n = -1; // the reply line
  let t0 = 0;
  const done = new Promise((res) => {
    sock.on('data', (chunk) => {
      for (let i = chunk.indexOf(10); i >= 0; i = chunk.indexOf(10, i + 1)) n++;
      if (n >= LINES) res(performance.now() - t0);
    });
  });
  sock.write(JSON.stringify({ id: 1, op: 'attach', session, since: Number.MAX_SAFE_INTEGER }) + '\n');
  while (n < 0) await new Promise((r) => setImmediate(r));
  t0 = performance.now();
  await client.send(session, 'go');
  const ms = await done;
  sock.destroy();
  await client.close(session);
  await client.disconnect();
  return (LINES / ms) * 1000;
}

/** The same through the client's attach iterator; every item's text is touched. */
async function attachRate(line) {
  const client = await leash.connect({ stateDir: state });
  const session = `tp-${++sessionNo}`;
  await client.ensure(session, { argv: generator(line), waitMs: 0 });
  const it = client.attach(session, { since: 'now', stderr: false, highWaterMark: LINES * 2 });
  await it.ready();
  const t0 = performance.now();
  await client.send(session, 'go');
  let n = 0;
  let bytes = 0;
  for await (const item of it) {
    if (item.type === 'output') {
      bytes += item.line.length;
      if (++n === LINES) break;
    }
    if (item.type === 'gap') throw new Error(`gap during the throughput run: ${JSON.stringify(item)}`);
  }
  const ms = performance.now() - t0;
  if (bytes !== LINES * line.length) throw new Error(`got ${bytes} bytes of text, expected ${LINES * line.length}`);
  await client.close(session);
  await client.disconnect();
  return (LINES / ms) * 1000;
}

/** One throughput run: the readers in an order that rotates with the run. */
async function throughputRun(run, socket) {
  const steps = [
    ['pipe', () => pipeRate(PLAIN)],
    ['client', () => attachRate(PLAIN)],
    ['raw', () => rawAttachRate(socket, PLAIN)],
  ];
  const r = {};
  for (let k = 0; k < steps.length; k++) {
    const [name, f] = steps[(k + run) % steps.length];
    r[name] = await f();
  }
  // JSON-RPC lines, the pair swapped every other run.
  const acp = [
    ['acpPipe', () => pipeRate(ACP)],
    ['acpClient', () => attachRate(ACP)],
  ];
  if (run % 2) acp.reverse();
  for (const [name, f] of acp) r[name] = await f();
  return r;
}

const spread = (xs, f = (x) => x) => ({ median: f(median(xs)), min: f(Math.min(...xs)), max: f(Math.max(...xs)), all: xs.map(f) });

try {
  const startedAt = new Date().toISOString();
  const loadBefore = loadavg();
  const socket = await startDaemon();
  const sides = ONLY === 'tp' ? null : await roundTripSides(socket);
  const rt = [];
  const tp = [];
  for (let run = 0; run < RUNS; run++) {
    if (sides) rt.push(await roundTripRun(sides));
    if (ONLY !== 'rt') tp.push(await throughputRun(run, socket));
    if (!args.includes('--json')) {
      const parts = [`run ${run + 1}/${RUNS}`];
      const r = rt[rt.length - 1];
      if (sides) parts.push(`round trip p50 raw ${r.rawP50.toFixed(3)} ms, client ${r.clientP50.toFixed(3)} ms (${pctStr(r.clientP50 / r.rawP50 - 1)}); p99 raw ${r.rawP99.toFixed(3)}, client ${r.clientP99.toFixed(3)} (${pctStr(r.clientP99 / r.rawP99 - 1)})`);
      const t = tp[tp.length - 1];
      if (t) parts.push(`attach ${k(t.client)}/s = ${(100 * t.client / t.pipe).toFixed(1)} % of the pipe ${k(t.pipe)}/s (raw socket ${(100 * t.raw / t.pipe).toFixed(1)} %; JSON-RPC lines ${(100 * t.acpClient / t.acpPipe).toFixed(1)} %)`);
      console.log(parts.join(' | '));
    }
  }
  await sides?.close();
  const result = {
    startedAt,
    host: { cpus: cpus().length, node: process.version, loadBefore, loadAfter: loadavg() },
    runs: RUNS,
  };
  if (sides) {
    result.roundTrip = {
      perRun: ROUND_TRIPS,
      rawP50Ms: spread(rt.map((r) => r.rawP50)),
      clientP50Ms: spread(rt.map((r) => r.clientP50)),
      rawP99Ms: spread(rt.map((r) => r.rawP99)),
      clientP99Ms: spread(rt.map((r) => r.clientP99)),
      p50Overhead: spread(rt.map((r) => r.clientP50 / r.rawP50 - 1)),
      p99Overhead: spread(rt.map((r) => r.clientP99 / r.rawP99 - 1)),
    };
  }
  if (tp.length) {
    result.throughput = {
      lines: LINES,
      lineBytes: 1024,
      pipeLinesPerSec: spread(tp.map((t) => t.pipe)),
      attachLinesPerSec: spread(tp.map((t) => t.client)),
      rawAttachLinesPerSec: spread(tp.map((t) => t.raw)),
      ratio: spread(tp.map((t) => t.client / t.pipe)),
      rawRatio: spread(tp.map((t) => t.raw / t.pipe)),
      clientOfRaw: spread(tp.map((t) => t.client / t.raw)),
      acpRatio: spread(tp.map((t) => t.acpClient / t.acpPipe)),
    };
  }
  if (args.includes('--json')) console.log(JSON.stringify(result, null, 2));
  else {
    const la = (l) => l.map((x) => x.toFixed(2)).join(' ');
    console.log(`${startedAt}, ${result.host.cpus} CPUs, node ${process.version}, load average ${la(loadBefore)} before, ${la(result.host.loadAfter)} after; ${RUNS} runs`);
    const sp = (s, f) => `${f(s.median)} (${f(s.min)} … ${f(s.max)})`;
    const ms = (x) => `${x.toFixed(3)} ms`;
    const pc = (x) => pctStr(x);
    if (result.roundTrip) {
      const r = result.roundTrip;
      console.log(`round trip, ${ROUND_TRIPS} per side per run, median of the runs (min … max): p50 raw ${sp(r.rawP50Ms, ms)}, client ${sp(r.clientP50Ms, ms)}: client adds ${sp(r.p50Overhead, pc)} [target <= +10 %]`);
      console.log(`  p99 raw ${sp(r.rawP99Ms, ms)}, client ${sp(r.clientP99Ms, ms)}: client adds ${sp(r.p99Overhead, pc)}`);
    }
    if (result.throughput) {
      const t = result.throughput;
      const pr = (x) => `${(100 * x).toFixed(1)} %`;
      console.log(`attach, ${LINES} x 1 KiB lines, median of the runs (min … max): pipe ${sp(t.pipeLinesPerSec, k)}/s, client ${sp(t.attachLinesPerSec, k)}/s: ${sp(t.ratio, pr)} of the pipe [target >= 50 %]`);
      console.log(`  raw socket (daemon only) ${sp(t.rawAttachLinesPerSec, k)}/s = ${sp(t.rawRatio, pr)} of the pipe; the client keeps ${sp(t.clientOfRaw, pr)} of the raw socket's rate; JSON-RPC lines: client ${sp(t.acpRatio, pr)} of the pipe`);
    }
  }
} finally {
  daemon?.kill('SIGTERM');
  await new Promise((r) => (daemon ? daemon.once('exit', r) : r()));
  rmSync(dir, { recursive: true, force: true });
}

function pctStr(x) {
  return `${x >= 0 ? '+' : ''}${(100 * x).toFixed(1)} %`;
}

function k(x) {
  return `${Math.round(x / 1000)}k`;
}
