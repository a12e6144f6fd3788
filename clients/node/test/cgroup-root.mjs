// The cgroup root of this test process (imported first by helpers.mjs, so it is in place before
// any leash command runs). leash contains each lease in a cgroup by default, under the caller's
// own cgroup (as root: `<cgroup2 mount>/leash`, the default root a real gateway uses); a test must
// make cgroups only under a root it made for itself and remove them, also when it fails. So this
// makes `<parent>/leash-test-<pid>-node`, where the parent is the cgroup2 mount found in
// /proc/self/mountinfo when it is writable (root), else this process's own cgroup when it was
// delegated to it, and points LEASH_CGROUP_ROOT at it (every daemon and CLI the tests start
// inherits it). At exit, also after a failure or SIGINT/SIGTERM, it kills what is left in it
// (cgroup.kill), waits until each cgroup is empty and removes them depth-first: only that tree,
// which only this process's leash commands wrote to. Roots of test processes that died before
// their clean-up (SIGKILL) are removed by the next run (here, and by the Rust tests' helper,
// which sweeps `leash-test-<dead pid>-*` the same way). Where no cgroup can be made, or
// LEASH_CONTAINMENT=off, the tests run uncontained and nothing is made.
import { readFileSync, readdirSync, mkdirSync, rmdirSync, writeFileSync, accessSync, existsSync, constants } from 'node:fs';
import { join } from 'node:path';

/** The cgroup2 mount point, from /proc/self/mountinfo (null without one). */
export function cgroup2Mount() {
  let text;
  try {
    text = readFileSync('/proc/self/mountinfo', 'utf8');
  } catch {
    return null;
  }
  for (const line of text.split('\n')) {
    const [left, right] = line.split(' - ');
    if (!right || right.split(' ')[0] !== 'cgroup2') continue;
    return left.split(' ')[4] ?? null;
  }
  return null;
}

function writable(p) {
  try {
    accessSync(p, constants.W_OK);
    return true;
  } catch {
    return false;
  }
}

/** This process's own cgroup (the `0::` line of /proc/self/cgroup), e.g. `/` or `/a/b`. */
export function ownCgroup() {
  try {
    const line = readFileSync('/proc/self/cgroup', 'utf8').split('\n').find((l) => l.startsWith('0::'));
    return line ? line.slice(3) : null;
  } catch {
    return null;
  }
}

/** Where this process may make cgroups: the mount (root), else its own delegated cgroup. */
function parentDir(mount) {
  if (writable(mount)) return mount;
  const own = ownCgroup();
  if (!own || own === '/') return null;
  const dir = join(mount, own);
  return writable(dir) && writable(join(dir, 'cgroup.procs')) ? dir : null;
}

/** Every directory under `dir` and `dir` itself, deepest first. */
function dirsDepthFirst(dir) {
  const out = [];
  let entries = [];
  try {
    entries = readdirSync(dir, { withFileTypes: true });
  } catch {
    return out;
  }
  for (const e of entries) if (e.isDirectory()) out.push(...dirsDepthFirst(join(dir, e.name)));
  out.push(dir);
  return out;
}

function populated(dir) {
  try {
    return readFileSync(join(dir, 'cgroup.events'), 'utf8').split('\n').some((l) => l.trim() === 'populated 1');
  } catch {
    return false;
  }
}

const pause = new Int32Array(new SharedArrayBuffer(4));
/** Kills what is left in a cgroup tree this process made, waits until it is empty, removes it. */
export function removeCgroupTree(root) {
  const dirs = dirsDepthFirst(root);
  for (const d of dirs) {
    try {
      writeFileSync(join(d, 'cgroup.kill'), '1');
    } catch {
      // gone already, or a kernel without cgroup.kill (< 5.14): removal below fails and says so
    }
  }
  for (const d of dirs) {
    const deadline = Date.now() + 10_000;
    while (populated(d) && Date.now() < deadline) Atomics.wait(pause, 0, 0, 5);
    try {
      rmdirSync(d);
    } catch (e) {
      if (e.code !== 'ENOENT') process.stderr.write(`cgroup-root: cannot remove ${d}: ${e.message}\n`);
    }
  }
}

/** Removes `leash-test-<pid>-*` roots under `parent` whose process is gone. */
function sweepDeadRoots(parent) {
  let names = [];
  try {
    names = readdirSync(parent);
  } catch {
    return;
  }
  for (const name of names) {
    const m = /^leash-test-(\d+)-/.exec(name);
    if (m && !existsSync(`/proc/${m[1]}`)) removeCgroupTree(join(parent, name));
  }
}

function makeRoot() {
  if (process.env.LEASH_CONTAINMENT === 'off') return null;
  const mount = cgroup2Mount();
  const parent = mount && parentDir(mount);
  if (!parent) {
    // No cgroup can be made here, so none will be under the default root either.
    process.env.LEASH_CONTAINMENT = 'off';
    return null;
  }
  sweepDeadRoots(parent);
  const root = join(parent, `leash-test-${process.pid}-node`);
  // A root of this name left by an earlier process that had this pid goes first.
  if (existsSync(root)) removeCgroupTree(root);
  mkdirSync(root);
  let removed = false;
  const cleanup = () => {
    if (removed) return;
    removed = true;
    removeCgroupTree(root);
  };
  process.on('exit', cleanup);
  for (const sig of ['SIGINT', 'SIGTERM', 'SIGHUP']) {
    process.once(sig, () => {
      cleanup();
      process.kill(process.pid, sig);
    });
  }
  process.env.LEASH_CGROUP_ROOT = root;
  process.env.LEASH_CONTAINMENT = 'on';
  return root;
}

/** This test process's cgroup root (null when the tests run uncontained). */
export const CGROUP_ROOT = makeRoot();
