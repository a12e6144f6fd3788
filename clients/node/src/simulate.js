// `simulate(file, options)`: a thin call of `leash simulate FILE --json` (docs/guide/simulate.md).
// It replays `reap` (default), `close` of `options.close` or `verify` of `options.verify` over a
// snapshot on leash's recording signaller: nothing is signalled, no state directory is needed.
// Resolves with what the command prints (`plan`, `reap`/`close`/`verify`, `timeline`,
// `signalled`, `exits`, and `expect` with its `diff` when `options.expect` names an expectation
// file), plus `exitStatus`: 0 no signal (with `expect`: it holds), 1 some, 2 the expectation
// does not hold. A file leash refuses (not a snapshot, a newer version, a cycle in its parent
// links, an unknown lease) rejects with a LeashError of code `cli_failed` carrying leash's
// message, its exit status (2) and stderr.
import { execFile } from 'node:child_process';
import { LeashError } from './errors.js';

export function simulate(file, options = {}) {
  if (typeof file !== 'string' || file === '') throw new TypeError('simulate: file must be the path of a snapshot');
  const args = ['simulate', file, '--json'];
  if (options.close !== undefined && options.verify !== undefined) throw new TypeError('simulate: give close or verify, not both');
  if (options.close !== undefined) args.push('--close', String(options.close));
  if (options.verify !== undefined) args.push('--verify', String(options.verify));
  if (options.expect !== undefined) args.push('--expect', String(options.expect));
  const bin = options.leashBin ?? process.env.LEASH_BIN ?? 'leash';
  return new Promise((resolve, reject) => {
    execFile(bin, args, { maxBuffer: 64 << 20, signal: options.signal }, (err, stdout, stderr) => {
      const exitStatus = err ? (typeof err.code === 'number' ? err.code : null) : 0;
      let parsed = null;
      try {
        parsed = stdout.trim() ? JSON.parse(stdout) : null;
      } catch {
        parsed = null;
      }
      if (parsed !== null && exitStatus !== null && exitStatus <= 2) return resolve({ ...parsed, exitStatus });
      let message = String(stderr).trim();
      try {
        message = JSON.parse(message).error.message;
      } catch {
        // not a JSON error line: the text as it is
      }
      reject(new LeashError(`leash simulate failed (exit ${err?.code}): ${message}`, { code: 'cli_failed', data: { exitStatus, stderr: String(stderr) }, cause: err }));
    });
  });
}
