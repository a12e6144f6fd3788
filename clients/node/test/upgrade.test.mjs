// Live upgrade of `leash serve` under load: 20 sessions each print numbered lines as fast as the
// relay takes them, this client attached to all of them, and the daemon is upgraded three times
// in a row (`leash serve --upgrade`) to other builds of leash. Each build is a copy of the binary
// cargo built whose build marker (a fixed-length field in the binary's data, see
// src/daemon/version.rs) is replaced byte for byte, so each reports another version; the copy
// is put at the daemon's --upgrade-program path the way a package upgrade replaces a file
// (a rename over it). Proves: the daemon keeps its pid and reports each new version; every
// adapter keeps its pid, none is signalled, every lease stays open; every attach gets every
// line exactly once, in order, with no gap; `status` answers throughout.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { join, dirname } from 'node:path';
import { readFileSync, writeFileSync, mkdirSync, copyFileSync, renameSync, existsSync, chmodSync } from 'node:fs';
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import * as leash from '../src/index.js';
import { Daemon, LEASH_BIN, scratch, waitFor } from './helpers.mjs';

const SESSIONS = 20;
const UPGRADES = 3;
// Lines each session streams between two upgrades (and after the last).
const BETWEEN = 1500;

const MARKER_PREFIX = Buffer.from('LEASH-BUILD-MARKER:');
const MARKER_LEN = 32;

/** A copy of the leash binary (and leash-wrap beside it) whose build marker is `marker`. */
function buildCopy(dir, marker) {
  mkdirSync(dir, { recursive: true });
  const bin = readFileSync(LEASH_BIN);
  const at = bin.indexOf(MARKER_PREFIX);
  assert.ok(at >= 0, 'the binary has a build marker');
  assert.equal(bin.indexOf(MARKER_PREFIX, at + 1), -1, 'the build marker is found once');
  const field = Buffer.alloc(MARKER_LEN);
  field.write(marker);
  field.copy(bin, at + MARKER_PREFIX.length);
  writeFileSync(join(dir, 'leash'), bin, { mode: 0o755 });
  copyFileSync(join(dirname(LEASH_BIN), 'leash-wrap'), join(dir, 'leash-wrap'));
  chmodSync(join(dir, 'leash-wrap'), 0o755);
  return join(dir, 'leash');
}

/** Installs `copy` at `target` as a package upgrade does: a new file renamed over the old. */
function install(copy, target) {
  mkdirSync(dirname(target), { recursive: true });
  for (const name of ['leash', 'leash-wrap']) {
    const from = join(dirname(copy), name);
    const to = join(dirname(target), name);
    copyFileSync(from, `${to}.new`);
    chmodSync(`${to}.new`, 0o755);
    renameSync(`${to}.new`, to);
  }
}

test('three upgrades in a row under 20 streaming sessions: every line once, in order, every adapter kept', { timeout: 300_000 }, async (t) => {
  const dir = scratch(t, 'upgrade');
  const state = join(dir, 'state');
  const sigfile = join(dir, 'signalled');
  const program = join(dir, 'installed', 'leash');
  const copies = Array.from({ length: UPGRADES }, (_, i) => buildCopy(join(dir, `build-${i + 1}`), `up${i + 1}`));
  const daemon = await Daemon.start(t, state, ['--upgrade-program', program]);
  const c = await leash.connect({ stateDir: state, reconnectTimeoutMs: 60_000 });
  t.after(() => c.disconnect());
  // Each adapter, once told to go (after its attach began), prints 1, 2, 3, … as fast as its pipe
  // takes them; a signal would be written down.
  const counter = ['sh', '-c', `trap 'echo "$$ got a signal" >> ${sigfile}; exit 1' TERM INT HUP USR1 USR2; read go; i=0; while :; do i=$((i+1)); echo $i; done`];
  const keys = Array.from({ length: SESSIONS }, (_, i) => `s${i}`);
  const started = await Promise.all(keys.map((k) => c.ensure(k, { argv: counter })));
  const pids = new Map(started.map((r) => [r.sessionKey, r.rootPid]));
  const leaseIds = started.map((r) => r.leaseId);

  // Every attach: each line checked as it comes (next number, seq going up, no gap).
  const seen = new Map(keys.map((k) => [k, 0]));
  const problems = [];
  const attaches = keys.map((k) => (async () => {
    let lastSeq = 0;
    // The consumer keeps up: the stream never detaches itself to bound its queue.
    for await (const item of c.attach(k, { since: 0, highWaterMark: 1_000_000 })) {
      if (typeof item.seq === 'number') {
        if (item.seq <= lastSeq) problems.push(`${k}: seq ${item.seq} after ${lastSeq}`);
        lastSeq = item.seq;
      }
      if (item.type === 'gap' || item.type === 'end') problems.push(`${k}: ${JSON.stringify(item)}`);
      if (item.type !== 'output') continue;
      const n = Number(item.line);
      if (n !== seen.get(k) + 1) problems.push(`${k}: line ${n} after ${seen.get(k)}`);
      seen.set(k, n);
      if (stop) break;
    }
  })());
  let stop = false;
  await Promise.all(keys.map((k) => c.send(k, 'go')));

  // `status` asked again and again on a connection of its own, throughout.
  const s = await leash.connect({ stateDir: state, reconnectTimeoutMs: 60_000 });
  t.after(() => s.disconnect());
  const statusGaps = [];
  const versions = [];
  let polling = true;
  const poller = (async () => {
    let lastAnswer = Date.now();
    while (polling) {
      try {
        const st = await s.status({ timeoutMs: 10_000 });
        const now = Date.now();
        statusGaps.push(now - lastAnswer);
        lastAnswer = now;
        if (versions[versions.length - 1] !== st.daemon.version) versions.push(st.daemon.version);
        assert.equal(st.daemon.pid, daemon.pid);
      } catch (e) {
        // The connection closed under the call (the exec): asked again once reconnected.
        if (!(e instanceof leash.ConnectionClosedError)) throw e;
      }
      await new Promise((r) => setTimeout(r, 20));
    }
  })();

  const progress = async (from) => {
    await waitFor(() => keys.every((k) => seen.get(k) >= from.get(k) + BETWEEN), `every session to stream ${BETWEEN} more lines`, 120_000);
  };
  // `status` on the poller's connection right after an upgrade, retried while that connection is
  // re-established: the poller alone could sleep through a short program's whole term.
  const statusNow = async () => {
    const deadline = Date.now() + 60_000;
    for (;;) {
      try {
        return await s.status({ timeoutMs: 30_000 });
      } catch (e) {
        if (!(e instanceof leash.ConnectionClosedError) || Date.now() > deadline) throw e;
        await new Promise((r) => setTimeout(r, 10));
      }
    }
  };
  const outcomes = [];
  for (let i = 0; i < UPGRADES; i++) {
    await progress(new Map(seen));
    install(copies[i], program);
    // Asked without blocking this process: the attaches keep reading meanwhile.
    const r = await promisify(execFile)(LEASH_BIN, ['--state-dir', state, 'serve', '--upgrade'], { encoding: 'utf8', timeout: 120_000 })
      .catch((e) => assert.fail(`leash serve --upgrade: ${e.stdout}${e.stderr}\n${daemon.log()}`));
    outcomes.push(r.stdout.trim());
    assert.match(r.stdout, new RegExp(`-> \\d+\\.\\d+\\.\\d+\\+up${i + 1} in [\\d.]+ ms, ${SESSIONS} sessions kept`));
    const now = await statusNow();
    assert.equal(now.daemon.pid, daemon.pid, 'the daemon kept its pid');
    assert.match(now.daemon.version, new RegExp(`\\+up${i + 1}$`), `status answers from program ${i + 1}`);
  }
  await progress(new Map(seen));
  stop = true;
  await Promise.all(attaches);
  polling = false;
  await poller;

  assert.deepEqual(problems, [], `the streams went wrong; the daemon's log:\n${daemon.log().split('\n').slice(-400).join('\n')}`);
  assert.equal(existsSync(sigfile), false, existsSync(sigfile) ? readFileSync(sigfile, 'utf8') : '');
  const st = await s.status();
  assert.equal(st.daemon.pid, daemon.pid, 'the daemon kept its pid');
  assert.match(st.daemon.version, /\+up3$/);
  assert.equal(st.daemon.handoffs, UPGRADES);
  assert.ok(st.daemon.lastHandoff.ok, JSON.stringify(st.daemon.lastHandoff));
  // The poller saw only these programs, in this order (it may have slept through one).
  const order = ['', 'up1', 'up2', 'up3'];
  const seenOrder = versions.map((v) => order.indexOf(v.split('+')[1] ?? ''));
  assert.ok(seenOrder.every((x, j) => x >= 0 && (j === 0 || x > seenOrder[j - 1])), `versions in order: ${versions}`);
  for (const sess of st.daemon.sessions) {
    assert.equal(sess.phase, 'running', sess.sessionKey);
    assert.equal(sess.rootPid, pids.get(sess.sessionKey), `${sess.sessionKey} kept its wrapper`);
    process.kill(sess.rootPid, 0);
  }
  const leases = await s.leases({});
  const open = new Set((Array.isArray(leases) ? leases : leases.leases).filter((l) => l.state === 'open').map((l) => l.leaseId));
  for (const id of leaseIds) assert.ok(open.has(id), `lease ${id} stays open`);
  // Status answered throughout: every call was answered or met the exec's close (the poller
  // throws on anything else), and each new program answered (statusNow above). How long it went
  // silent is a figure, not a bound (the upgrade's own time is in `cargo bench -- --only upgrade`).
  t.diagnostic(`upgrades: ${outcomes.join(' | ')}; lines per session >= ${Math.min(...seen.values())}; longest status silence ${Math.max(...statusGaps)} ms`);
  await c.close({ sessions: keys, graceMs: 500 });
});
