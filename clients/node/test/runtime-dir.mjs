// The wrappers' reports directory of this test process (imported first by helpers.mjs, so it is
// in place before any leash command runs). Without LEASH_RUNTIME_DIR leash puts the reports in a
// runtime directory shared by every state root of the user (`/run/leash`, `/dev/shm/leash-<uid>`),
// where a test that ends with a lease still open leaves its report behind. So unless the caller
// set LEASH_RUNTIME_DIR (the Rust test that runs this suite sets its own), this points it at
// `/dev/shm/leash-test-<pid>-node-rt` (tmpfs, as the default is; the system's temporary directory
// without /dev/shm), mode 0700, removed with everything in it at exit, also after a failure or
// SIGINT/SIGTERM. Every daemon and CLI the tests start inherits it. A directory of a test process
// that died before its clean-up (SIGKILL) is removed by the Rust tests' helper, which sweeps
// `leash-test-<dead pid>-*-rt` there.
import { existsSync, mkdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

function makeRuntimeDir() {
  if (process.env.LEASH_RUNTIME_DIR) return process.env.LEASH_RUNTIME_DIR;
  const base = existsSync('/dev/shm') ? '/dev/shm' : tmpdir();
  const dir = join(base, `leash-test-${process.pid}-node-rt`);
  // A directory of this name left by an earlier process that had this pid goes first.
  rmSync(dir, { recursive: true, force: true });
  mkdirSync(dir, { mode: 0o700 });
  let removed = false;
  const cleanup = () => {
    if (removed) return;
    removed = true;
    rmSync(dir, { recursive: true, force: true });
  };
  process.on('exit', cleanup);
  for (const sig of ['SIGINT', 'SIGTERM', 'SIGHUP']) {
    process.once(sig, () => {
      cleanup();
      process.kill(process.pid, sig);
    });
  }
  process.env.LEASH_RUNTIME_DIR = dir;
  return dir;
}

/** This test process's reports directory (LEASH_RUNTIME_DIR). */
export const RUNTIME_DIR = makeRuntimeDir();
