// The wrappers' reports of the sessions these tests start go to this test process's own runtime
// directory (LEASH_RUNTIME_DIR, made by runtime-dir.mjs when the caller set none), never to the
// user's shared default (`/dev/shm/leash-<uid>`, `/run/leash`): the lease names it, the report is
// there while the session runs, and it is gone once the session is closed.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { existsSync } from 'node:fs';
import { connect } from '../src/index.js';
import { Daemon, scratch, fakeAgent, waitFor } from './helpers.mjs';

test("the sessions' reports go to the tests' own runtime directory and go away", async (t) => {
  const RUNTIME_DIR = process.env.LEASH_RUNTIME_DIR;
  assert.ok(RUNTIME_DIR, 'LEASH_RUNTIME_DIR is set for every leash command of the tests');
  for (const shared of [`/dev/shm/leash-${process.getuid()}`, '/run/leash']) {
    assert.notEqual(RUNTIME_DIR, shared);
  }
  const dir = scratch(t, 'runtime');
  const state = join(dir, 'state');
  await Daemon.start(t, state);
  const c = await connect({ stateDir: state });
  t.after(() => c.disconnect());
  const e = await c.ensure('rt', { argv: fakeAgent() });
  const lease = (await c.leases()).find((l) => l.leaseId === e.leaseId);
  assert.equal(lease.reportDir, RUNTIME_DIR);
  const report = join(RUNTIME_DIR, `${e.leaseId}.json`);
  assert.ok(existsSync(report), report);
  await c.close('rt', { graceMs: 200 });
  await waitFor(() => !existsSync(report), "the closed session's report to go");
});
