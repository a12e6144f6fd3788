// The credential scrub through the Node client: `spawn(argv, { unsetEnv, clearEnv, keepEnv })`
// (leash exec's flags) and `ensure(session, { unsetEnv, clearEnv, keepEnv })` against a real
// daemon whose own environment holds a provider credential. The adapter prints the environment
// it was started with (`/proc/$$/environ` of its shell: what the wrapper handed it), so each test
// sees exactly what passed. The lease markers always survive.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { readFileSync, existsSync } from 'node:fs';
import * as leash from '../src/index.js';
import { Daemon, scratch, waitFor, LEASH_BIN } from './helpers.mjs';

const MARKERS = ['OPENCLAW_ACPX_LEASE_ID', 'OPENCLAW_GATEWAY_INSTANCE_ID'];

function parseEnv(text) {
  const env = {};
  for (const entry of text.split('\0')) {
    const i = entry.indexOf('=');
    if (i > 0) env[entry.slice(0, i)] = entry.slice(i + 1);
  }
  return env;
}

/** Runs the adapter through `spawn` and returns the environment it printed. */
async function spawnedEnv(state, opts) {
  const child = leash.spawn(['/bin/cat', '/proc/self/environ'], { stateDir: state, leashBin: LEASH_BIN, ...opts });
  const chunks = [];
  child.stdout.on('data', (c) => chunks.push(c));
  const code = await new Promise((resolve, reject) => {
    child.once('error', reject);
    child.once('exit', resolve);
  });
  assert.equal(code, 0);
  return parseEnv(Buffer.concat(chunks).toString());
}

test('spawn removes what it is told, starts empty on clearEnv, and keeps the markers', async (t) => {
  const dir = scratch(t, 'env-spawn');
  const state = join(dir, 'state');
  const base = { ...process.env, SCRUB_A: 'a-secret', SCRUB_B: 'b-value' };
  delete base.LEASH_STATE_DIR;

  const all = await spawnedEnv(state, { env: base });
  assert.equal(all.SCRUB_A, 'a-secret');
  for (const m of MARKERS) assert.ok(all[m], m);

  const unset = await spawnedEnv(state, { env: base, unsetEnv: ['SCRUB_A', 'HOME'] });
  assert.deepEqual(
    Object.keys(unset).sort(),
    Object.keys(all).filter((k) => k !== 'SCRUB_A' && k !== 'HOME').sort(),
  );

  const clear = await spawnedEnv(state, { env: base, clearEnv: true, keepEnv: ['SCRUB_B'] });
  assert.deepEqual(Object.keys(clear).sort(), ['SCRUB_B', ...MARKERS].sort());
  assert.equal(clear.SCRUB_B, 'b-value');

  // Bad input throws before anything is spawned.
  assert.throws(() => leash.spawn(['/bin/true'], { unsetEnv: ['A=B'] }), TypeError);
  assert.throws(() => leash.spawn(['/bin/true'], { unsetEnv: [''] }), TypeError);
  assert.throws(() => leash.spawn(['/bin/true'], { keepEnv: ['PATH'] }), /clearEnv/);
  assert.throws(() => leash.spawn(['/bin/true'], { clearEnv: true, unsetEnv: ['PATH'] }), TypeError);
  assert.deepEqual(
    leash.execArgs(['x'], { clearEnv: true, keepEnv: ['PATH'] }).slice(-5),
    ['--clear-env', '--keep-env', 'PATH', '--', 'x'],
  );
});

test('ensure: the daemon scrubs provider credentials unless the ensure keeps them', async (t) => {
  const dir = scratch(t, 'env-ensure');
  const state = join(dir, 'state');
  await Daemon.start(t, state, [], { ANTHROPIC_API_KEY: 'sk-ant-daemon', DAEMON_SETTING: 'plain' });
  const c = await leash.connect({ stateDir: state });
  t.after(() => c.disconnect());

  const ensured = async (session, spec) => {
    const file = join(dir, `${session}.env`);
    const script = `/bin/cat /proc/$$/environ > ${file}.tmp; /bin/mv ${file}.tmp ${file}; exec /bin/cat`;
    const r = await c.ensure(session, { argv: ['/bin/sh', '-c', script], graceMs: 300, ...spec });
    await waitFor(() => existsSync(file), `${session} to print its environment`);
    return { env: parseEnv(readFileSync(file, 'utf8')), leaseId: r.leaseId };
  };

  const dflt = await ensured('default', {});
  assert.equal(dflt.env.ANTHROPIC_API_KEY, undefined);
  assert.equal(dflt.env.DAEMON_SETTING, 'plain');
  assert.equal(dflt.env.OPENCLAW_ACPX_LEASE_ID, dflt.leaseId);

  const kept = await ensured('kept', { keepEnv: ['ANTHROPIC_API_KEY'] });
  assert.equal(kept.env.ANTHROPIC_API_KEY, 'sk-ant-daemon');

  const unset = await ensured('unset', { unsetEnv: ['DAEMON_SETTING'] });
  assert.equal(unset.env.DAEMON_SETTING, undefined);

  const clear = await ensured('clear', { clearEnv: true, keepEnv: ['DAEMON_SETTING'], env: { SESSION_ONLY: '1' } });
  assert.deepEqual(Object.keys(clear.env).sort(), ['DAEMON_SETTING', 'SESSION_ONLY', ...MARKERS].sort());

  await assert.rejects(c.ensure('bad', { argv: ['/bin/cat'], unsetEnv: ['A=B'] }), leash.BadRequestError);
  await assert.rejects(c.ensure('bad', { argv: ['/bin/cat'], clearEnv: true, unsetEnv: ['PATH'] }), leash.BadRequestError);
  const leases = await c.leases();
  assert.ok(leases.every((l) => l.sessionKey !== 'bad'), JSON.stringify(leases));
});
