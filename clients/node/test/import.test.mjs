// AcpxLifecycleController.importAcpxState: the migration step of an existing OpenClaw install
// (`leash legacy import --acpx DIR`) through the client. A state in the incumbent's formats is
// imported (its gateway id becomes the root's, a pending lease is kept and reported); a malformed
// file rejects with a LeashError and changes nothing; a root of another gateway refuses unless
// adoptGatewayId. Real leash binary, real files, no processes signalled.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdirSync, writeFileSync } from 'node:fs';
import { execFileSync } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { join } from 'node:path';
import * as leash from '../src/index.js';
import { LEASH_BIN, scratch } from './helpers.mjs';

function incumbent(dir, gatewayId, leases) {
  const oc = join(dir, 'openclaw');
  const acpx = join(oc, 'acpx');
  mkdirSync(acpx, { recursive: true });
  writeFileSync(join(oc, 'gateway-instance-id'), `${gatewayId}\n`);
  writeFileSync(join(acpx, 'process-leases.json'), typeof leases === 'string' ? leases : JSON.stringify({ version: 1, leases }));
  return acpx;
}

const pending = (gatewayId, acpx) => ({
  leaseId: randomUUID(), gatewayInstanceId: gatewayId, sessionKey: 'agent:codex:acp:pending', wrapperRoot: acpx,
  wrapperPath: join(acpx, 'codex-acp-wrapper.mjs'), rootPid: 0, commandHash: 'a'.repeat(64), startedAt: Date.now() - 1000, state: 'open',
});

const legacyList = (state) => JSON.parse(execFileSync(LEASH_BIN, ['--state-dir', state, 'legacy', 'list', '--json'], { encoding: 'utf8' }));
const status = (state) => JSON.parse(execFileSync(LEASH_BIN, ['--state-dir', state, '--no-daemon', 'status', '--json'], { encoding: 'utf8' }));

test('importAcpxState imports the incumbent state and adopts its gateway id', async (t) => {
  const dir = scratch(t, 'import');
  const state = join(dir, 'state');
  const gw = randomUUID();
  const acpx = join(dir, 'openclaw', 'acpx');
  const lease = pending(gw, acpx);
  incumbent(dir, gw, [lease]);
  const r = await leash.AcpxLifecycleController.importAcpxState(acpx, { stateDir: state, leashBin: LEASH_BIN });
  assert.ok(Array.isArray(r.report) && r.report.length > 0, JSON.stringify(r));
  assert.equal(status(state).gatewayInstanceId, gw, 'the root adopted the incumbent gateway id');
  const list = JSON.stringify(legacyList(state));
  assert.ok(list.includes(lease.leaseId), `the pending lease is a legacy record: ${list}`);
  // The same function is exported on its own, and importing twice imports nothing new.
  await leash.importAcpxState(acpx, { stateDir: state, leashBin: LEASH_BIN });
  assert.equal(JSON.stringify(legacyList(state)), list);
});

test('a malformed file rejects with a LeashError and changes nothing', async (t) => {
  const dir = scratch(t, 'import-bad');
  const state = join(dir, 'state');
  const gw = randomUUID();
  const acpx = incumbent(dir, gw, '{"version": 1, "leases": [ {"leaseId": 7 ');
  await assert.rejects(
    leash.AcpxLifecycleController.importAcpxState(acpx, { stateDir: state, leashBin: LEASH_BIN }),
    (e) => e instanceof leash.LeashError && e.code === 'cli_failed' && e.data.exitStatus !== 0 && /process-leases/.test(e.message)
      // stderr, as everywhere in the client's errors, is an array of lines.
      && Array.isArray(e.data.stderr) && e.data.stderr.some((l) => /process-leases/.test(l)),
  );
  assert.deepEqual(legacyList(state), [], 'no record');
  assert.notEqual(status(state).gatewayInstanceId, gw, 'the gateway id was not adopted');
  assert.throws(() => leash.importAcpxState('', { stateDir: state }), TypeError);
});

test('a root of another gateway refuses unless adoptGatewayId', async (t) => {
  const dir = scratch(t, 'import-adopt');
  const state = join(dir, 'state');
  // The root is in use: a session ran and ended under its own gateway id.
  // (Without containment: the scratch root is removed with the test, and a lease cgroup made
  // under the default cgroup root would outlive it, empty.)
  execFileSync(LEASH_BIN, ['--state-dir', state, 'exec', '--session', 'used', '--', '/bin/true'], { env: { ...process.env, LEASH_CONTAINMENT: 'off' } });
  const before = status(state).gatewayInstanceId;
  const gw = randomUUID();
  const acpx = join(dir, 'openclaw', 'acpx');
  incumbent(dir, gw, [pending(gw, acpx)]);
  await assert.rejects(
    leash.importAcpxState(acpx, { stateDir: state, leashBin: LEASH_BIN }),
    (e) => e instanceof leash.LeashError && /adopt-gateway-id/.test(e.message),
  );
  assert.equal(status(state).gatewayInstanceId, before, 'nothing adopted');
  await leash.importAcpxState(acpx, { stateDir: state, leashBin: LEASH_BIN, adoptGatewayId: true });
  assert.equal(status(state).gatewayInstanceId, gw);
});
