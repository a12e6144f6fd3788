// Finding and starting leash's own binaries. `npm install leash-client` brings them in the
// platform package npm picked by `os` and `cpu` (leash-client-<platform>-<arch>, one of the
// client's optionalDependencies, the esbuild pattern); a checkout or a system install provides
// them through LEASH_BIN_DIR or PATH instead. `leash` finds `leash-wrap` beside itself, so both
// come from the same place.

import { spawn as spawnChild } from 'node:child_process';
import { accessSync, constants, readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { delimiter, dirname, join } from 'node:path';
import { LeashError } from './errors.js';
import { connect } from './client.js';
import { resolveStateDir } from './locate.js';

/** The binaries the packages ship. */
const BINARIES = ['leash', 'leash-wrap'];

/**
 * No usable binary was found: `tried` lists every place looked at, in order, each with why it
 * was not taken.
 */
export class BinaryNotFoundError extends LeashError {
  constructor(name, tried) {
    super(
      `cannot find the ${name} binary; tried: ${tried.map((t) => `${t.path} (${t.why})`).join('; ')}. ` +
        'Install leash-client with its optional dependencies (npm install leash-client, not --omit=optional), ' +
        'or set LEASH_BIN_DIR to the directory holding leash and leash-wrap',
      { code: 'binary_not_found', data: { name, tried } },
    );
    this.binary = name;
    this.tried = tried;
  }
}

/** The npm name of the platform package for this process's platform and CPU. */
export function platformPackage(platform = process.platform, arch = process.arch) {
  return `leash-client-${platform}-${arch}`;
}

function executable(path) {
  try {
    accessSync(path, constants.X_OK);
    return null;
  } catch (e) {
    return e.code === 'ENOENT' ? 'missing' : `not executable: ${e.code}`;
  }
}

/**
 * The path of `leash` or `leash-wrap`: the platform package's copy, else `$LEASH_BIN_DIR/<name>`,
 * else the first on PATH. Throws BinaryNotFoundError, saying what was tried.
 * @param {'leash' | 'leash-wrap'} name
 * @param {{ env?: NodeJS.ProcessEnv }} [opts]
 */
export function binaryPath(name, opts = {}) {
  if (!BINARIES.includes(name)) {
    throw new TypeError(`binaryPath: no binary ${JSON.stringify(name)} (one of: ${BINARIES.join(', ')})`);
  }
  const env = opts.env ?? process.env;
  const tried = [];
  const pkg = platformPackage();
  let pkgDir = null;
  try {
    pkgDir = dirname(createRequire(import.meta.url).resolve(`${pkg}/package.json`));
  } catch {
    tried.push({ path: `${pkg}/bin/${name}`, why: `the package ${pkg} is not installed` });
  }
  const candidates = [];
  if (pkgDir) candidates.push(join(pkgDir, 'bin', name));
  if (env.LEASH_BIN_DIR) candidates.push(join(env.LEASH_BIN_DIR, name));
  else tried.push({ path: `$LEASH_BIN_DIR/${name}`, why: 'LEASH_BIN_DIR is not set' });
  for (const dir of (env.PATH ?? '').split(delimiter)) {
    if (dir) candidates.push(join(dir, name));
  }
  if (!env.PATH) tried.push({ path: `$PATH/${name}`, why: 'PATH is empty' });
  for (const path of candidates) {
    const why = executable(path);
    if (why === null) return path;
    tried.push({ path, why });
  }
  throw new BinaryNotFoundError(name, tried);
}

/** The daemon's lock file, if it names a live pid and a socket; else null. */
function readLock(stateDir) {
  try {
    const info = JSON.parse(readFileSync(join(stateDir, 'daemon.lock'), 'utf8'));
    if (info && Number.isInteger(info.pid) && typeof info.socket === 'string' && info.socket) return info;
  } catch {
    // No daemon has run here, or the file is being written.
  }
  return null;
}

/** Whether a daemon answers a ping on `socket` (nothing listening fails the connect at once). */
async function answers(socket, timeoutMs) {
  let c = null;
  try {
    c = await connect({ socket, reconnect: false, timeoutMs });
    await c.ping({ timeoutMs });
    return true;
  } catch {
    return false;
  } finally {
    if (c) await c.disconnect().catch(() => {});
  }
}

/** The daemon serving `stateDir` now (its lock names it and its socket answers), or null. */
async function serving(stateDir, timeoutMs) {
  const info = readLock(stateDir);
  return info && (await answers(info.socket, timeoutMs)) ? info : null;
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/**
 * Starts `leash serve` for a state directory, or finds the one already serving it, and waits
 * until it answers.
 * @param {import('../index.js').StartDaemonOptions} [opts]
 * @returns {Promise<import('../index.js').Daemon>}
 */
export async function startDaemon(opts = {}) {
  const stateDir = resolveStateDir(opts.stateDir);
  const timeoutMs = opts.timeoutMs ?? 30_000;
  const deadline = Date.now() + timeoutMs;
  const probeMs = Math.min(5_000, timeoutMs);

  const existing = await serving(stateDir, probeMs);
  if (existing) return foreign(existing.pid, stateDir);

  const leash = binaryPath('leash', { env: opts.env ?? process.env });
  const env = { ...(opts.env ?? process.env) };
  delete env.LEASH_STATE_DIR;
  const child = spawnChild(leash, ['--state-dir', stateDir, 'serve', ...(opts.args ?? [])], {
    stdio: ['ignore', 'ignore', opts.stderr ?? 'inherit'],
    env,
  });
  let exit = null;
  const exited = new Promise((resolve) => {
    child.once('exit', (code, signal) => {
      exit = { code, signal };
      resolve(exit);
    });
    child.once('error', (error) => {
      exit = { code: null, signal: null, error };
      resolve(exit);
    });
  });

  for (;;) {
    if (exit) {
      // Another daemon may have taken the state directory first: use it.
      const other = await serving(stateDir, probeMs);
      if (other) return foreign(other.pid, stateDir);
      const how = exit.error ? exit.error.message : exit.signal ? `signal ${exit.signal}` : `exit code ${exit.code}`;
      throw new LeashError(`${leash} serve for ${stateDir} ended before it answered (${how})`, {
        code: 'daemon_start_failed',
        data: { binary: leash, stateDir, ...exit },
      });
    }
    const info = readLock(stateDir);
    if (info && info.pid === child.pid && (await answers(info.socket, probeMs))) break;
    if (Date.now() > deadline) {
      child.kill('SIGKILL');
      await exited;
      throw new LeashError(`${leash} serve for ${stateDir} did not answer within ${timeoutMs} ms`, {
        code: 'daemon_start_timeout',
        data: { binary: leash, stateDir },
      });
    }
    await sleep(20);
  }

  let stopping = null;
  return {
    pid: child.pid,
    stateDir,
    started: true,
    exited,
    /**
     * Ends this daemon: SIGTERM (it closes its sessions first), then waits for it to exit.
     * Past `graceMs` (default 60 s) it is SIGKILLed.
     */
    stop(stopOpts = {}) {
      stopping ??= (async () => {
        if (exit) return exit;
        child.kill('SIGTERM');
        const graceMs = stopOpts.graceMs ?? 60_000;
        let timer;
        const late = new Promise((r) => {
          timer = setTimeout(r, graceMs, 'late');
        });
        const first = await Promise.race([exited, late]);
        clearTimeout(timer);
        if (first === 'late') {
          child.kill('SIGKILL');
          return exited;
        }
        return first;
      })();
      return stopping;
    },
  };
}

/** A daemon this process did not start: `stop()` leaves it running. */
function foreign(pid, stateDir) {
  return {
    pid,
    stateDir,
    started: false,
    exited: null,
    async stop() {
      return null;
    },
  };
}
