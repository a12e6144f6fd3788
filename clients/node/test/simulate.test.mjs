// simulate(file): the thin call of `leash simulate FILE --json`, against the real binary over the
// repository's fixtures: the reap replay's signals and timeline, an expectation that holds and
// one that does not (exit 2 with the diff), close and verify replays, and a refused file (a
// newer version) rejecting with leash's message.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, readFileSync, writeFileSync, existsSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, dirname, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { simulate, LeashError } from '../src/index.js';

const here = dirname(fileURLToPath(import.meta.url));
const repoRoot = resolve(here, '../../..');
const leashBin = process.env.LEASH_BIN ?? join(repoRoot, 'target/debug/leash');
const fixture = (name) => join(repoRoot, 'fixtures/lifecycle', `${name}.json`);
assert.ok(existsSync(leashBin), `${leashBin} is missing: build leash or set LEASH_BIN`);

test('reap replay: children first, SIGKILL at the end of the grace, exit status 1', async () => {
  const sim = await simulate(fixture('wrapper_killed_escapee_found_by_markers'), { leashBin });
  assert.equal(sim.verb, 'reap');
  assert.equal(sim.exitStatus, 1);
  assert.deepEqual(sim.signalled, [1205, 1204]);
  const lines = sim.timeline.map((e) => `${e.at} ${e.signal} ${e.pid}`);
  assert.deepEqual(lines, ['0 SIGTERM 1205', '0 SIGTERM 1204', '3000 SIGKILL 1204']);
  assert.ok(sim.plan.leases.length === 1);
});

test('expectations: the fixture\'s own holds (0); a contrary one fails with its diff (2)', async (t) => {
  const f = fixture('startup_orphans_wrapper_adapter_descendants');
  const ok = await simulate(f, { leashBin, expect: f });
  assert.equal(ok.exitStatus, 0);
  assert.deepEqual(ok.expect.diff, []);
  const dir = mkdtempSync(join(tmpdir(), 'leash-node-simulate-'));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  const exp = join(dir, 'expect.json');
  writeFileSync(exp, JSON.stringify({ notSignalled: [1201] }));
  const bad = await simulate(f, { leashBin, expect: exp });
  assert.equal(bad.exitStatus, 2);
  assert.deepEqual(bad.expect.diff, ['- pid 1201 is signalled but must not be']);
});

test('close and verify replays; nothing signalled for a reused root pid', async () => {
  const f = fixture('unrelated_process_reuses_root_pid');
  const leaseId = JSON.parse(readFileSync(f, 'utf8')).leases[0].leaseId;
  const v = await simulate(f, { leashBin, verify: leaseId });
  assert.equal(v.verb, 'verify');
  assert.equal(v.verify.answer, 'dead');
  assert.equal(v.exitStatus, 0);
  const c = await simulate(f, { leashBin, close: leaseId });
  assert.equal(c.close[0].result, 'lost');
  assert.deepEqual(c.timeline, []);
});

test('a refused file rejects with leash\'s message', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'leash-node-simulate-'));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  const doc = JSON.parse(readFileSync(fixture('parent_death_sigterm_then_sigkill'), 'utf8'));
  doc.version = 9;
  const f = join(dir, 'newer.json');
  writeFileSync(f, JSON.stringify(doc));
  await assert.rejects(simulate(f, { leashBin }), (e) => {
    assert.ok(e instanceof LeashError);
    assert.equal(e.code, 'cli_failed');
    assert.equal(e.data.exitStatus, 2);
    assert.match(e.message, /version 9, newer than this leash reads/);
    return true;
  });
  assert.throws(() => simulate(''), TypeError);
});
