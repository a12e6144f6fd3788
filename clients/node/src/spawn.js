// For gateways that keep spawning adapters themselves: `spawn(argv, opts)` is the drop-in for
// `child_process.spawn(argv[0], argv.slice(1), opts)`. It runs
// `leash exec --owner-pid <this process> --session … -- argv…` with piped stdio, so the adapter's
// tree is leased, owned by the gateway, and taken down when the gateway dies. Exit status 125
// means leash itself could not start the adapter, 127/126 that the adapter command was not found
// or not executable (leash asks for JSON errors, so those come with leash's JSON error line, and
// an adapter that itself exits 127 is not mistaken for one): the child then emits a
// SpawnFailedError (an 'error' event, as child_process does when a spawn fails), of the class of
// leash's cause word and with the fields an `ensure` of the daemon gives (see errors.js).
//
// The lease id is the caller's before anything runs: `spawn` takes `leaseId` (else it makes a
// UUIDv7), passes it as `leash exec --lease-id`, and sets `child.leaseId` synchronously, so a
// gateway can record its launch before the spawn and settle that record after it, as the
// incumbent does with its own lease ids. leash refuses an id any lease row has (exit 125).
//
// `close`, `reap` and `verify` here go through the daemon when one answers, else through the
// leash CLI on the state root.

import { spawn as cpSpawn, execFile } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { SPAWN_CAUSES, SpawnFailedError, HandshakeTimeoutError, LeashError, NoDaemonError } from './errors.js';
import { connect } from './client.js';
import { binaryPath } from './binaries.js';

/** `leash`: the option, else LEASH_BIN, else binaryPath's (the platform package, LEASH_BIN_DIR, PATH). */
function leashBin(opts) {
  if (opts.leashBin ?? process.env.LEASH_BIN) return opts.leashBin ?? process.env.LEASH_BIN;
  try {
    return binaryPath('leash');
  } catch {
    // Left to the spawn, whose ENOENT names the command.
    return 'leash';
  }
}

function stateArgs(opts) {
  return opts.stateDir ? ['--state-dir', opts.stateDir] : [];
}

const CANONICAL_UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;

/** A UUIDv7 (RFC 9562: 48-bit Unix ms, version 7, variant 10, random rest), as leash makes them. */
export function uuidv7() {
  const b = randomBytes(16);
  let ms = Date.now();
  for (let i = 5; i >= 0; i--) {
    b[i] = ms % 256;
    ms = Math.floor(ms / 256);
  }
  b[6] = (b[6] & 0x0f) | 0x70;
  b[8] = (b[8] & 0x3f) | 0x80;
  const h = b.toString('hex');
  return `${h.slice(0, 8)}-${h.slice(8, 12)}-${h.slice(12, 16)}-${h.slice(16, 20)}-${h.slice(20)}`;
}

function checkLeaseId(id) {
  if (typeof id !== 'string' || !CANONICAL_UUID.test(id) || /^[0-]+$/.test(id)) {
    throw new TypeError(`spawn: leaseId must be a UUID in canonical form (lowercase, hyphenated, not nil), not ${JSON.stringify(id)}`);
  }
  return id;
}

/** The `leash exec` argv for an adapter command (exported for tests and logging). */
export function execArgs(argv, opts = {}) {
  if (!Array.isArray(argv) || argv.length === 0 || typeof argv[0] !== 'string' || argv[0] === '') {
    throw new TypeError('spawn: argv must be a non-empty array of strings naming the adapter command');
  }
  const args = [...stateArgs(opts), '--error-format', 'json', 'exec', '--owner-pid', String(opts.ownerPid ?? process.pid)];
  const flags = [
    ['--session', opts.session],
    ['--agent', opts.agent],
    ['--owner', opts.owner],
    ['--spawned-by', opts.spawnedBy],
    ['--parent', opts.parent],
  ];
  for (const [flag, v] of flags) if (v !== undefined && v !== null) args.push(flag, String(v));
  if (opts.graceMs !== undefined) args.push('--grace-ms', String(opts.graceMs));
  if (opts.leaseId !== undefined) args.push('--lease-id', checkLeaseId(opts.leaseId));
  // The credential scrub (leash exec applies it to the wrapper's exec; the lease markers always
  // survive). Names are checked here too, so a bad one throws before anything is spawned.
  const unset = envNames('unsetEnv', opts.unsetEnv);
  const keep = envNames('keepEnv', opts.keepEnv);
  if (opts.clearEnv !== undefined && typeof opts.clearEnv !== 'boolean') throw new TypeError('spawn: clearEnv must be a boolean');
  if (keep.length > 0 && !opts.clearEnv) throw new TypeError('spawn: keepEnv needs clearEnv: true (without it every variable already passes; use unsetEnv to remove some)');
  if (unset.length > 0 && opts.clearEnv) throw new TypeError('spawn: unsetEnv has no effect with clearEnv (an empty start removes every variable); name the ones that pass in keepEnv');
  for (const n of unset) args.push('--unset-env', n);
  if (opts.clearEnv) args.push('--clear-env');
  for (const n of keep) args.push('--keep-env', n);
  args.push('--', ...argv);
  return args;
}

function envNames(what, list) {
  if (list === undefined || list === null) return [];
  if (!Array.isArray(list)) throw new TypeError(`spawn: ${what} must be an array of variable names`);
  for (const n of list) {
    if (typeof n !== 'string' || n === '' || n.includes('=') || n.includes('\0')) {
      throw new TypeError(`spawn: ${what}: ${JSON.stringify(n)} is not an environment variable name (non-empty, no '=' or NUL)`);
    }
  }
  return list;
}

/**
 * @param {string[]} argv the adapter command
 * @param {import('../index.js').SpawnOptions} [opts]
 */
export function spawn(argv, opts = {}) {
  const leaseId = opts.leaseId ?? uuidv7();
  const args = execArgs(argv, { ...opts, leaseId });
  const hs = opts.handshakeTimeoutMs;
  if (hs !== undefined) {
    if (!(Number.isInteger(hs) && hs > 0)) throw new TypeError(`spawn: handshakeTimeoutMs must be a positive integer (ms), not ${JSON.stringify(hs)}`);
    if (opts.stdio !== undefined && opts.stdio !== 'pipe') throw new TypeError('spawn: handshakeTimeoutMs watches the adapter\'s stdin and stdout: leave stdio piped');
  }
  const child = cpSpawn(leashBin(opts), args, {
    cwd: opts.cwd,
    env: opts.env,
    stdio: opts.stdio ?? 'pipe',
    signal: opts.signal,
  });
  /** The lease's id, known before leash exec runs (see the file's comment). */
  child.leaseId = leaseId;
  // leash's own message on a failed start is the last thing on stderr; keep a short tail.
  const tail = [];
  child.stderr?.on('data', (chunk) => {
    tail.push(String(chunk));
    while (tail.length > 16) tail.shift();
  });
  child.once('exit', (code) => {
    if (code !== 125 && code !== 126 && code !== 127) return;
    const lines = tail.join('').split('\n').filter((l) => l.trim() !== '');
    const line = leashError(lines.at(-1) ?? '', code);
    // 126/127 are leash's only with its error line: without one, they are the adapter's own.
    if (code !== 125 && !line) return;
    // As the daemon's spawn_failed: leash's line is the cause and the message, the rest stderr.
    const stderr = (line ? lines.slice(0, -1) : lines).slice(-20);
    const message = `${line?.message ?? stderr.at(-1) ?? 'leash exec gave no message (stderr was not piped)'} (exit status ${code})`;
    const Cls = SPAWN_CAUSES[line?.code] ?? SpawnFailedError;
    const data = { exitStatus: code, stderr, leaseId, argv };
    if (line) data.cause = line.code;
    child.emit('error', new Cls(message, { data }));
  });
  if (hs !== undefined) watchHandshake(child, argv, opts, leaseId, tail, hs);
  return child;
}

/**
 * The handshake deadline of `spawn`: the first JSON-RPC request written to the child's stdin
 * (the gateway's `initialize`) must be answered on its stdout within `ms`, else the lease is
 * closed (verified TERM, grace, KILL, through the daemon or the CLI), and once leash exec has
 * exited the child emits a HandshakeTimeoutError with the adapter's last stderr lines.
 */
function watchHandshake(child, argv, opts, leaseId, tail, ms) {
  const write = child.stdin.write;
  let pending = '';
  let id;
  let timer = null;
  let out = '';
  const onData = (chunk) => {
    out += String(chunk);
    let nl;
    while ((nl = out.indexOf('\n')) >= 0) {
      const line = out.slice(0, nl);
      out = out.slice(nl + 1);
      let msg;
      try {
        msg = JSON.parse(line);
      } catch {
        continue;
      }
      if (msg && typeof msg === 'object' && !('method' in msg) && ('result' in msg || 'error' in msg) && JSON.stringify(msg.id) === JSON.stringify(id)) {
        clearTimeout(timer);
        child.stdout.off('data', onData);
        return;
      }
    }
  };
  const expire = async () => {
    child.stdout.off('data', onData);
    let outcomes = null;
    let closeError;
    try {
      outcomes = await close({ lease: leaseId }, { stateDir: opts.stateDir, leashBin: opts.leashBin });
    } catch (e) {
      closeError = e;
    }
    if (child.exitCode === null && child.signalCode === null) {
      if (closeError) child.kill('SIGTERM');
      await new Promise((r) => child.once('exit', r));
    }
    const stderr = tail.join('').split('\n').filter((l) => l.trim() !== '' && !l.startsWith('{"error"')).slice(-20);
    child.emit('error', new HandshakeTimeoutError(
      `spawn ${argv[0]}: the adapter did not answer the first request within ${ms} ms; its lease ${leaseId} was closed${stderr.length ? `; its last stderr lines: ${stderr.join(' | ')}` : ''}`,
      { data: { argv, leaseId, stderr, outcomes, closeError } },
    ));
  };
  child.stdin.write = function (chunk, ...rest) {
    if (id === undefined) {
      pending += String(chunk);
      for (const line of pending.split('\n').slice(0, -1)) {
        try {
          const msg = JSON.parse(line);
          if (msg && typeof msg === 'object' && typeof msg.method === 'string' && msg.id !== undefined && msg.id !== null) {
            id = msg.id;
            break;
          }
        } catch {
          // not a request
        }
      }
      pending = pending.slice(pending.lastIndexOf('\n') + 1);
      if (id !== undefined) {
        child.stdin.write = write;
        pending = '';
        child.stdout.on('data', onData);
        timer = setTimeout(expire, ms);
        child.once('exit', () => clearTimeout(timer));
      }
    }
    return write.call(this, chunk, ...rest);
  };
}

/** leash's JSON error line (`{"error":{"code","message","exitCode"}}`) for this exit, if `last` is one. */
function leashError(last, code) {
  try {
    const e = JSON.parse(last)?.error;
    if (e && typeof e.message === 'string' && e.exitCode === code) return e;
  } catch {
    // not leash's line
  }
  return null;
}

/** Runs `leash ARGS` on the state root; `done(err, stdout, stderr)` as execFile calls it. */
function execCli(opts, args, done) {
  execFile(leashBin(opts), [...stateArgs(opts), ...args], { maxBuffer: 64 << 20 }, done);
}

/** The `cli_failed` error of a leash command that exited non-zero (`data.stderr`: its lines). */
function cliFailed(what, err, stderr) {
  const lines = String(stderr).split('\n').filter((l) => l.trim() !== '');
  return new LeashError(`leash ${what} failed (exit ${err.code}): ${lines.join(' | ')}`, { code: 'cli_failed', data: { exitStatus: err.code, stderr: lines } });
}

function runCli(opts, args) {
  return new Promise((resolve, reject) => {
    execCli(opts, args, (err, stdout, stderr) => {
      let parsed = null;
      try {
        parsed = stdout.trim() ? JSON.parse(stdout) : null;
      } catch {
        parsed = null;
      }
      if (parsed !== null) return resolve(parsed);
      if (err) return reject(cliFailed(args[0], err, stderr));
      resolve(parsed);
    });
  });
}

async function viaDaemon(opts, f) {
  let client;
  try {
    client = await connect({ stateDir: opts.stateDir, socket: opts.socket, reconnect: false, timeoutMs: opts.timeoutMs });
  } catch (e) {
    if (e instanceof NoDaemonError) return { noDaemon: true };
    throw e;
  }
  try {
    return { value: await f(client) };
  } finally {
    await client.disconnect();
  }
}

/** Closes leases (by session key or lease id) through the daemon, or the CLI without one. */
export async function close(target, opts = {}) {
  const t = typeof target === 'string' ? { session: target } : target;
  const r = await viaDaemon(opts, (c) => c.close(t, opts));
  if (!r.noDaemon) return r.value;
  const args = ['close', '--json'];
  for (const s of [t.session, ...(t.sessions ?? [])].filter(Boolean)) args.push('--session', s);
  if (t.graceMs !== undefined) args.push('--grace-ms', String(t.graceMs));
  for (const l of [t.lease, ...(t.leases ?? [])].filter(Boolean)) args.push(l);
  return runCli(opts, args);
}

/**
 * Imports the acpx extension's own state from its acpx directory (`leash legacy import --acpx`):
 * its process leases, gateway instance id and session records, all or nothing. A migration step
 * that runs before `leash serve` starts on the state root (the daemon's start-up reap then ends
 * the imported leases' orphans, fail-safe). Resolves with the import's report lines; rejects with
 * a LeashError (code `cli_failed`, the exit status and stderr in its data) when leash refuses.
 * @param {string} acpxDir the incumbent's `<OpenClaw state dir>/acpx`
 * @param {{stateDir?: string, leashBin?: string, openclawState?: string, acpxSessions?: string, adoptGatewayId?: boolean}} opts
 */
export function importAcpxState(acpxDir, opts = {}) {
  if (typeof acpxDir !== 'string' || acpxDir === '') throw new TypeError('importAcpxState: acpxDir must be a non-empty string');
  const args = ['legacy', 'import', '--acpx', acpxDir];
  if (opts.openclawState) args.push('--openclaw-state', opts.openclawState);
  if (opts.acpxSessions) args.push('--acpx-sessions', opts.acpxSessions);
  if (opts.adoptGatewayId) args.push('--adopt-gateway-id');
  return new Promise((resolve, reject) => {
    execCli(opts, args, (err, stdout, stderr) => {
      if (err) return reject(cliFailed('legacy import --acpx', err, stderr));
      const text = `${stdout}${stderr}`.trim();
      resolve({ report: text === '' ? [] : text.split('\n') });
    });
  });
}

/** The startup reap through the daemon, or the CLI without one. */
export async function reap(options = {}, opts = {}) {
  const r = await viaDaemon(opts, (c) => c.reap(options, opts));
  if (!r.noDaemon) return r.value;
  const args = ['reap', '--json'];
  if (options.dryRun) args.push('--dry-run');
  if (options.includeLive) args.push('--include-live');
  if (options.graceMs !== undefined) args.push('--grace-ms', String(options.graceMs));
  if (options.retentionMs !== undefined) args.push('--retention', `${Math.ceil(options.retentionMs / 1000)}s`);
  return runCli(opts, args);
}

/**
 * Verifies leases: the daemon's `verify` op when it has one, else `leash verify --json` (CLI
 * versions that have it), else the lease rows (`leash leases --json`) as the weakest answer.
 */
export async function verify(fields = {}, opts = {}) {
  const r = await viaDaemon(opts, async (c) => (c.info?.ops?.includes('verify') ? c.verify(fields, opts) : { unsupported: true }));
  if (!r.noDaemon && !r.value?.unsupported) return r.value;
  try {
    const args = ['verify', '--json'];
    if (fields.session) args.push('--session', fields.session);
    if (fields.lease) args.push(fields.lease);
    return await runCli(opts, args);
  } catch {
    return runCli(opts, ['leases', '--json']);
  }
}
