// Finding the daemon as the leash CLI does: the state directory is the option, else
// LEASH_STATE_DIR, else $XDG_STATE_HOME/leash, else ~/.local/state/leash; the socket is the one
// the daemon wrote into <state-dir>/daemon.lock, else <state-dir>/leash.sock. Read again on every
// (re)connect: a restarted daemon may listen elsewhere.

import { readFile } from 'node:fs/promises';
import { join } from 'node:path';

export function resolveStateDir(stateDir) {
  if (stateDir) return stateDir;
  const env = (k) => (process.env[k] ? process.env[k] : undefined);
  if (env('LEASH_STATE_DIR')) return env('LEASH_STATE_DIR');
  if (env('XDG_STATE_HOME')) return join(env('XDG_STATE_HOME'), 'leash');
  if (env('HOME')) return join(env('HOME'), '.local/state/leash');
  throw new Error('cannot find a state directory: pass stateDir, or set LEASH_STATE_DIR, XDG_STATE_HOME or HOME');
}

export async function findSocket({ stateDir, socket } = {}) {
  if (socket) return socket;
  const dir = resolveStateDir(stateDir);
  try {
    const info = JSON.parse(await readFile(join(dir, 'daemon.lock'), 'utf8'));
    if (info && typeof info.socket === 'string' && info.socket) return info.socket;
  } catch {
    // No lock file, or an empty one (no daemon, or one that stopped): the default path.
  }
  return join(dir, 'leash.sock');
}
