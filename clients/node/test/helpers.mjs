// Shared helpers of the client's tests: a real `leash serve` (the binary cargo built, from
// LEASH_BIN) on a scratch state root, polling with deadlines, and the fake agent's argv. Every
// test stops (by pid) the daemons it started and removes its scratch directory. The cgroups
// leash makes for the tests' sessions are under this process's own cgroup root
// (cgroup-root.mjs, imported first: in place before any leash command), removed at exit; so is
// the wrappers' reports directory, LEASH_RUNTIME_DIR (runtime-dir.mjs).
import './cgroup-root.mjs';
import './runtime-dir.mjs';
import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync, readFileSync, openSync, closeSync, existsSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, dirname, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { createConnection } from 'node:net';
import { connect } from '../src/client.js';

const here = dirname(fileURLToPath(import.meta.url));
export const repoRoot = resolve(here, '../../..');
export const LEASH_BIN = process.env.LEASH_BIN ?? join(repoRoot, 'target/debug/leash');
export const FAKE_AGENT = join(here, 'fixtures/fake-agent.mjs');
export const fakeAgent = () => [process.execPath, FAKE_AGENT];
export const PATIENCE_MS = 30_000;
export { CGROUP_ROOT } from './cgroup-root.mjs';

if (!existsSync(LEASH_BIN)) {
  throw new Error(`${LEASH_BIN} is missing: build it with \`cargo build --workspace\` or set LEASH_BIN`);
}

/** The daemons started and not yet stopped, so that a scratch directory's cleanup stops its own first. */
const running = new Set();

export function scratch(t, tag) {
  const dir = mkdtempSync(join(tmpdir(), `leash-node-${tag}-`));
  // `after` hooks run in the order they were added, and one that throws skips the rest: the
  // directory's removal (added first) stops the daemons inside it first, or a daemon writing
  // into it makes the removal fail (ENOTEMPTY) and, never stopped, keeps the test file's
  // process alive for ever.
  t.after(async () => {
    for (const d of [...running]) {
      if (!d.stateDir.startsWith(dir)) continue;
      await d.closeSessions();
      await d.kill9();
    }
    // A wrapper that outlived its daemon (a session the test left running, e.g. after a
    // failure) still writes its report into run/ while it ends: retry for a few seconds.
    rmSync(dir, { recursive: true, force: true, maxRetries: 40, retryDelay: 100 });
  });
  return dir;
}

export async function waitFor(cond, what = 'condition', limitMs = PATIENCE_MS) {
  const deadline = Date.now() + limitMs;
  for (;;) {
    const v = await cond();
    if (v) return v;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}

function canConnect(path) {
  return new Promise((res) => {
    const s = createConnection({ path });
    s.once('connect', () => { s.destroy(); res(true); });
    s.once('error', () => res(false));
  });
}

/** A `leash serve` the test owns; stopped (SIGKILL, by pid) when the test ends. */
export class Daemon {
  constructor(t, stateDir, args = [], extraEnv = {}) {
    this.t = t;
    this.stateDir = stateDir;
    this.args = args;
    this.extraEnv = extraEnv;
    this.n = 0;
    t.after(() => this.kill9());
  }

  static async start(t, stateDir, args = [], extraEnv = {}) {
    const d = new Daemon(t, stateDir, args, extraEnv);
    await d.start();
    return d;
  }

  async start() {
    this.logPath = join(dirname(this.stateDir), `serve-${this.n++}.log`);
    const fd = openSync(this.logPath, 'w');
    const env = { ...process.env, LEASH_LOG: 'info', ...this.extraEnv };
    delete env.LEASH_STATE_DIR;
    this.child = spawn(LEASH_BIN, ['--state-dir', this.stateDir, 'serve', ...this.args], { stdio: ['ignore', 'ignore', fd], env });
    closeSync(fd);
    running.add(this);
    this.exited = new Promise((r) =>
      this.child.once('exit', (code, signal) => {
        running.delete(this);
        r({ code, signal });
      }),
    );
    this.pid = this.child.pid;
    await waitFor(async () => {
      if (this.child.exitCode !== null) throw new Error(`leash serve exited early:\n${this.log()}`);
      let info;
      try {
        info = JSON.parse(readFileSync(join(this.stateDir, 'daemon.lock'), 'utf8'));
      } catch {
        return false;
      }
      return info.pid === this.pid && (await canConnect(info.socket));
    }, 'leash serve to listen');
  }

  log() {
    try {
      return readFileSync(this.logPath, 'utf8');
    } catch {
      return '';
    }
  }

  async terminate() {
    this.child.kill('SIGTERM');
    return this.exited;
  }

  /**
   * Closes the sessions a test left running and waits (bounded) until they have ended, so that
   * no wrapper is still writing into the state root when it is removed. Best effort: a daemon
   * that does not answer is killed anyway.
   */
  async closeSessions() {
    if (!this.child || this.child.exitCode !== null || this.child.signalCode !== null) return;
    let c = null;
    try {
      c = await connect({ stateDir: this.stateDir, reconnect: false, timeoutMs: 10_000 });
      const live = async () => (await c.status()).daemon.sessions.filter((s) => s.phase !== 'ended').map((s) => s.sessionKey);
      const keys = await live();
      if (keys.length > 0) await c.close({ sessions: keys, graceMs: 200 }).catch(() => {});
      await waitFor(async () => (await live()).length === 0, 'the sessions to end', 10_000).catch(() => {});
    } catch {
      // not answering: killed next
    } finally {
      await c?.disconnect().catch(() => {});
    }
  }

  async kill9() {
    if (this.child && this.child.exitCode === null && this.child.signalCode === null) {
      this.child.kill('SIGKILL');
      await this.exited;
    }
  }
}

/** Collects items from an attach iterator until `until(item, items)` is true. */
export async function collect(iter, until, limitMs = PATIENCE_MS) {
  const items = [];
  const timer = setTimeout(() => iter.return(), limitMs);
  try {
    for await (const item of iter) {
      items.push(item);
      if (until(item, items)) break;
    }
  } finally {
    clearTimeout(timer);
  }
  return items;
}
