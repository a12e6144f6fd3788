// binaryPath (LEASH_BIN_DIR, then PATH, with a typed error naming what it tried) and startDaemon
// (starts `leash serve` from those binaries, finds one already serving, stop() ends only its
// own) against the leash cargo built. The platform package's copy is covered by tests/dist.rs,
// which installs the packed packages.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { writeFileSync, mkdirSync, chmodSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { LEASH_BIN, scratch, waitFor } from './helpers.mjs';
import { binaryPath, startDaemon, connect, BinaryNotFoundError, LeashError } from '../src/index.js';

const BIN_DIR = dirname(LEASH_BIN);

function alive(pid) {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

test('binaryPath takes LEASH_BIN_DIR before PATH, and PATH without it', (t) => {
  const dir = scratch(t, 'binpath');
  const onPath = join(dir, 'path');
  mkdirSync(onPath);
  for (const name of ['leash', 'leash-wrap']) {
    writeFileSync(join(onPath, name), '#!/bin/sh\n');
    chmodSync(join(onPath, name), 0o755);
  }
  const env = { LEASH_BIN_DIR: BIN_DIR, PATH: `/nonexistent:${onPath}` };
  assert.equal(binaryPath('leash', { env }), join(BIN_DIR, 'leash'));
  assert.equal(binaryPath('leash-wrap', { env }), join(BIN_DIR, 'leash-wrap'));
  assert.equal(binaryPath('leash', { env: { PATH: `/nonexistent:${onPath}` } }), join(onPath, 'leash'));
  // A LEASH_BIN_DIR without the binary falls through to PATH.
  assert.equal(binaryPath('leash', { env: { LEASH_BIN_DIR: dir, PATH: onPath } }), join(onPath, 'leash'));
});

test('binaryPath throws BinaryNotFoundError listing every place tried and why', (t) => {
  const dir = scratch(t, 'binmiss');
  // Present but not executable: skipped, with the reason.
  writeFileSync(join(dir, 'leash'), '#!/bin/sh\n');
  chmodSync(join(dir, 'leash'), 0o644);
  let caught;
  assert.throws(
    () => binaryPath('leash', { env: { LEASH_BIN_DIR: dir, PATH: '/nonexistent-a:/nonexistent-b' } }),
    (e) => {
      caught = e;
      return e instanceof BinaryNotFoundError;
    },
  );
  assert.ok(caught instanceof LeashError);
  assert.equal(caught.code, 'binary_not_found');
  assert.equal(caught.binary, 'leash');
  const paths = caught.tried.map((x) => x.path);
  assert.deepEqual(paths.slice(1), [join(dir, 'leash'), '/nonexistent-a/leash', '/nonexistent-b/leash']);
  assert.match(caught.tried[0].path, /^leash-client-[a-z0-9]+-[a-z0-9]+\/bin\/leash$/);
  assert.match(caught.tried[1].why, /not executable/);
  assert.equal(caught.tried[2].why, 'missing');
  assert.match(caught.message, /LEASH_BIN_DIR/);
  assert.throws(() => binaryPath('leash-main'), TypeError);
});

test('startDaemon starts leash serve, finds it again, and stop() ends only the one it started', async (t) => {
  const dir = scratch(t, 'startd');
  const stateDir = join(dir, 'state');
  const env = { ...process.env, LEASH_BIN_DIR: BIN_DIR, PATH: '/usr/bin:/bin' };
  const d = await startDaemon({ stateDir, env, stderr: 'ignore' });
  t.after(() => d.stop());
  assert.equal(d.started, true);
  assert.equal(d.stateDir, stateDir);
  assert.ok(alive(d.pid));

  // It answers.
  const c = await connect({ stateDir, reconnect: false });
  const st = await c.status();
  assert.equal(st.daemon.pid, d.pid);
  await c.disconnect();

  // A second start finds it; stopping that one leaves the daemon running.
  const again = await startDaemon({ stateDir, env, stderr: 'ignore' });
  assert.equal(again.started, false);
  assert.equal(again.pid, d.pid);
  assert.equal(await again.stop(), null);
  assert.ok(alive(d.pid), 'stop() of a found daemon must not end it');
  const c2 = await connect({ stateDir, reconnect: false });
  await c2.ping();
  await c2.disconnect();

  // Its own stop() ends it: SIGTERM, then it waits for the exit.
  const exit = await d.stop();
  assert.equal(exit.signal, null, `leash serve ended by ${exit.signal}`);
  assert.equal(exit.code, 0);
  await waitFor(() => !alive(d.pid), 'the daemon to be reaped');
  assert.equal(await d.stop(), exit, 'stop() again resolves to the same exit');
});

test('startDaemon reports a daemon that cannot start, with its exit', async (t) => {
  const dir = scratch(t, 'startbad');
  // The state directory is a file: leash serve refuses it and exits.
  const stateDir = join(dir, 'not-a-dir');
  writeFileSync(stateDir, '');
  const env = { ...process.env, LEASH_BIN_DIR: BIN_DIR };
  await assert.rejects(startDaemon({ stateDir, env, stderr: 'ignore', timeoutMs: 20_000 }), (e) => {
    assert.ok(e instanceof LeashError);
    assert.equal(e.code, 'daemon_start_failed');
    assert.equal(e.data.stateDir, stateDir);
    assert.notEqual(e.data.code, 0);
    return true;
  });
  // And with no binary anywhere, the typed error before anything starts.
  await assert.rejects(
    startDaemon({ stateDir: join(dir, 'state'), env: { PATH: '/nonexistent' } }),
    BinaryNotFoundError,
  );
});
