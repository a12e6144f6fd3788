#!/usr/bin/env node
// Benchmarks of the Node client against a real `leash serve` (docs/benchmarks.md, "Node client"),
// each against a baseline measured in the same run, runs of the two interleaved so load bursts
// hit both alike:
//   1. prompt round trip: a JSON-RPC request written with `send` → its response on the attach
//      stream, through the client (`acp().request`) vs the same exchange hand-written on a raw
//      socket (one NDJSON `send`, read lines until the output item that carries the response);
//      p50 and p99. Target: the client adds <= 10 %.
//   2. attach throughput of 1 KiB lines: the same generator read through `leash serve` and the
//      client's attach iterator vs read from a plain pipe; lines per second. Target: >= 50 % of
//      the pipe's rate.
// Usage: node bench/bench.mjs [--leash PATH] [--round-trips N] [--lines N] [--runs N] [--json]
import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync, readFileSync, openSync, closeSync } from 'node:fs';
import { createConnection } from 'node:net';
import { tmpdir } from 'node:os';
import { join, dirname, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { performance } from 'node:perf_hooks';
import * as leash from '../src/index.js';

const here = dirname(fileURLToPath(import.meta.url));
const args = process.argv.slice(2);
const opt = (n, d) => (args.includes(n) ? args[args.indexOf(n) + 1] : d);
const LEASH = opt('--leash', process.env.LEASH_BIN ?? resolve(here, '../../../target/release/leash'));
const ROUND_TRIPS = Number(opt('--round-trips', 2000));
const LINES = Number(opt('--lines', 100_000));
const RUNS = Number(opt('--runs', 3));
const FAKE = [process.execPath, resolve(here, '../test/fixtures/fake-agent.mjs')];
const LINE = 'x'.repeat(1023); // + '\n' = 1 KiB
// Waits for "go" on stdin, writes LINES lines of 1 KiB, then stays up.
const GENERATOR = ['sh', '-c', `read go; yes "${LINE}" | head -n ${LINES}; exec cat`];

const dir = mkdtempSync(join(tmpdir(), 'leash-node-bench-'));
const state = join(dir, 'state');
let daemon;

async function startDaemon() {
  const fd = openSync(join(dir, 'serve.log'), 'w');
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

async function roundTrips(socket) {
  const client = await leash.connect({ stateDir: state });
  // Two sessions, one agent each, so neither side reads the other's traffic.
  await client.ensure('rt-client', { argv: FAKE });
  await client.ensure('rt-raw', { argv: FAKE });
  const acp = await client.acp('rt-client');
  // The raw side: what a gateway writes by hand, as lean as it gets — its own connection and
  // attach, lines parsed in the data handler, the agent's line parsed and matched by id.
  const sock = await new Promise((res, rej) => {
    const s = createConnection({ path: socket });
    s.once('connect', () => res(s));
    s.once('error', rej);
  });
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
    sock.write(JSON.stringify({ id: 'a', op: 'attach', session: 'rt-raw', since: Number.MAX_SAFE_INTEGER }) + '\n');
  });
  let rawId = 0;
  const rawOnce = async () => {
    const id = `raw-${++rawId}`;
    const t0 = performance.now();
    const got = new Promise((resolve) => (want = { id, resolve }));
    sock.write(JSON.stringify({ id: `s${rawId}`, op: 'send', session: 'rt-raw', line: JSON.stringify({ jsonrpc: '2.0', id, method: 'echo', params: { n: rawId } }) }) + '\n');
    await got;
    return performance.now() - t0;
  };
  const clientOnce = async () => {
    const t0 = performance.now();
    await acp.request('echo', { n: 1 });
    return performance.now() - t0;
  };
  for (let i = 0; i < 200; i++) {
    await rawOnce();
    await clientOnce();
  }
  const r = { raw: [], client: [] };
  for (let i = 0; i < ROUND_TRIPS; i++) {
    if (i % 2 === 0) {
      r.raw.push(await rawOnce());
      r.client.push(await clientOnce());
    } else {
      r.client.push(await clientOnce());
      r.raw.push(await rawOnce());
    }
  }
  acp.close();
  sock.destroy();
  await client.close({ sessions: ['rt-client', 'rt-raw'] });
  await client.disconnect();
  return r;
}

async function pipeRate() {
  const child = spawn(GENERATOR[0], GENERATOR.slice(1), { stdio: ['pipe', 'pipe', 'ignore'] });
  let n = 0;
  const t0 = performance.now();
  const done = new Promise((res) => {
    child.stdout.on('data', (chunk) => {
      for (let i = chunk.indexOf(10); i >= 0; i = chunk.indexOf(10, i + 1)) n++;
      if (n >= LINES) res(performance.now() - t0);
    });
  });
  child.stdin.write('go\n');
  const ms = await done;
  child.kill('SIGKILL');
  return (LINES / ms) * 1000;
}

/** The same through `leash serve` on a raw socket counting newlines: the daemon's share. */
async function rawAttachRate(run, socket) {
  const client = await leash.connect({ stateDir: state });
  const session = `raw-tp-${run}`;
  await client.ensure(session, { argv: GENERATOR, waitMs: 0 });
  const sock = await new Promise((res, rej) => {
    const s = createConnection({ path: socket });
    s.once('connect', () => res(s));
    s.once('error', rej);
  });
  const raw = { sock };
  const st = await client.status();
  const last = st.daemon.sessions.find((s) => s.sessionKey === session).lastSeq;
  let n = -1; // the reply line
  const t0 = performance.now();
  const done = new Promise((res) => {
    raw.sock.on('data', (chunk) => {
      for (let i = chunk.indexOf(10); i >= 0; i = chunk.indexOf(10, i + 1)) n++;
      if (n >= LINES) res(performance.now() - t0);
    });
  });
  raw.sock.write(JSON.stringify({ id: 1, op: 'attach', session, since: last }) + '\n');
  await client.send(session, 'go');
  const ms = await done;
  raw.sock.destroy();
  await client.close(session);
  await client.disconnect();
  return (LINES / ms) * 1000;
}

async function attachRate(run) {
  const client = await leash.connect({ stateDir: state });
  const session = `tp-${run}`;
  await client.ensure(session, { argv: GENERATOR, waitMs: 0 });
  const it = client.attach(session, { since: 'now', stderr: false, highWaterMark: LINES * 2 });
  await it.ready();
  const t0 = performance.now();
  await client.send(session, 'go');
  let n = 0;
  for await (const item of it) {
    if (item.type === 'output' && ++n === LINES) break;
    if (item.type === 'gap') throw new Error(`gap during the throughput run: ${JSON.stringify(item)}`);
  }
  const ms = performance.now() - t0;
  await client.close(session);
  await client.disconnect();
  return (LINES / ms) * 1000;
}

try {
  const socket = await startDaemon();
  const rt = await roundTrips(socket);
  const tp = { pipe: [], attach: [], rawAttach: [] };
  for (let run = 0; run < RUNS; run++) {
    tp.pipe.push(await pipeRate());
    tp.attach.push(await attachRate(run));
    tp.rawAttach.push(await rawAttachRate(run, socket));
  }
  const median = (xs) => pct(xs, 50);
  const result = {
    roundTrip: {
      n: ROUND_TRIPS,
      rawP50Ms: pct(rt.raw, 50),
      rawP99Ms: pct(rt.raw, 99),
      clientP50Ms: pct(rt.client, 50),
      clientP99Ms: pct(rt.client, 99),
    },
    throughput: {
      lines: LINES,
      lineBytes: 1024,
      runs: RUNS,
      pipeLinesPerSec: median(tp.pipe),
      attachLinesPerSec: median(tp.attach),
      rawAttachLinesPerSec: median(tp.rawAttach),
      allPipe: tp.pipe,
      allAttach: tp.attach,
    },
  };
  result.roundTrip.p50Overhead = result.roundTrip.clientP50Ms / result.roundTrip.rawP50Ms - 1;
  result.roundTrip.p99Overhead = result.roundTrip.clientP99Ms / result.roundTrip.rawP99Ms - 1;
  result.throughput.ratio = result.throughput.attachLinesPerSec / result.throughput.pipeLinesPerSec;
  if (args.includes('--json')) console.log(JSON.stringify(result, null, 2));
  else {
    const f = (x) => x.toFixed(3);
    const r = result.roundTrip;
    console.log(`round trip (n=${r.n}): raw p50 ${f(r.rawP50Ms)} ms p99 ${f(r.rawP99Ms)} ms | client p50 ${f(r.clientP50Ms)} ms p99 ${f(r.clientP99Ms)} ms | client adds ${(r.p50Overhead * 100).toFixed(1)} % (p50), ${(r.p99Overhead * 100).toFixed(1)} % (p99)`);
    const t = result.throughput;
    console.log(`attach throughput (${t.lines} x 1 KiB, median of ${t.runs}): pipe ${Math.round(t.pipeLinesPerSec)} lines/s | attach (client) ${Math.round(t.attachLinesPerSec)} lines/s | attach (raw socket, newlines counted) ${Math.round(t.rawAttachLinesPerSec)} lines/s | ${(t.ratio * 100).toFixed(1)} % of the pipe`);
  }
} finally {
  daemon?.kill('SIGTERM');
  await new Promise((r) => (daemon ? daemon.once('exit', r) : r()));
  rmSync(dir, { recursive: true, force: true });
}
