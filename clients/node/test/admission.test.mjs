// Same-key admission through the client against a real daemon: a second ensure of a
// key whose first ensure is in flight waits behind it (on its own client: a queued ensure holds
// its connection) and resolves as it would have alone; a short queueTimeoutMs rejects with
// ConflictError and starts nothing.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { execFileSync } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import * as leash from '../src/index.js';
import { Daemon, scratch, waitFor } from './helpers.mjs';

const QUEUED = 'ensure queued behind an ensure of the same key in flight';
const queued = (d) => d.log().split(QUEUED).length - 1;

test('a queued ensure resolves with the session its predecessor started', async (t) => {
  const dir = scratch(t, 'admission');
  const state = join(dir, 'state');
  const daemon = await Daemon.start(t, state);
  const fifo = join(dir, 'a.fifo');
  execFileSync('mkfifo', [fifo]);
  const [a, b, w] = await Promise.all([0, 1, 2].map(() => leash.connect({ stateDir: state })));
  t.after(() => [a, b, w].forEach((c) => c.disconnect()));
  const argv = ['sh', '-c', `read x < '${fifo}'; echo ready; exec sleep 1000`];
  const first = a.ensure('k', { argv, waitMs: 30_000, graceMs: 200 });
  await waitFor(() => daemon.log().includes('session spawned'), 'A spawned');
  // Refused after a short wait in the queue: typed, nothing started.
  await assert.rejects(w.ensure('k', { argv, queueTimeoutMs: 20 }), (e) => e instanceof leash.ConflictError && /queueTimeoutMs/.test(e.message));
  const second = b.ensure('k', { argv });
  await waitFor(() => queued(daemon) >= 2, 'B queued');
  writeFileSync(fifo, 'go\n');
  const [ra, rb] = await Promise.all([first, second]);
  assert.equal(ra.created, true);
  assert.equal(rb.created, false);
  assert.equal(rb.phase, 'running');
  assert.equal(rb.leaseId, ra.leaseId);
  const out = await w.close('k');
  assert.equal(out[0].result, 'closed');
});
