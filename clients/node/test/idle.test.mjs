// A script that forgets `disconnect()` still exits once its work is done: an idle client does
// not hold Node's event loop, while a pending call or an open attach does. Each script runs in a
// child Node process from a directory of its own that has the package installed by path (a
// `node_modules/leash-client` link to this directory, which is what `npm install
// /path/to/leash/clients/node` makes), importing it by name as the README shows.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdirSync, symlinkSync, writeFileSync } from 'node:fs';
import { join, resolve, dirname } from 'node:path';
import { fileURLToPath } from 'node:url';
import { connect } from '../src/index.js';
import { Daemon, scratch, waitFor } from './helpers.mjs';

const pkg = resolve(dirname(fileURLToPath(import.meta.url)), '..');

/** A directory with leash-client installed by path and `script` in it as main.mjs. */
function app(dir, script) {
  const root = join(dir, 'app');
  mkdirSync(join(root, 'node_modules'), { recursive: true });
  symlinkSync(pkg, join(root, 'node_modules', 'leash-client'), 'dir');
  writeFileSync(join(root, 'main.mjs'), script);
  return root;
}

/** Runs `node main.mjs ...args` in `root`; the child is SIGKILLed (by pid) if the test ends first. */
function run(t, root, args) {
  const child = spawn(process.execPath, ['main.mjs', ...args], { cwd: root, stdio: ['ignore', 'pipe', 'pipe'] });
  const out = { stdout: '', stderr: '', exit: null };
  child.stdout.on('data', (b) => { out.stdout += b; });
  child.stderr.on('data', (b) => { out.stderr += b; });
  child.once('exit', (code, signal) => { out.exit = { code, signal }; });
  t.after(() => {
    if (out.exit === null) child.kill('SIGKILL');
  });
  return out;
}

test('a script that never calls disconnect() exits when its calls are answered', async (t) => {
  const dir = scratch(t, 'idle');
  const state = join(dir, 'state');
  await Daemon.start(t, state);
  const root = app(dir, `import { connect } from 'leash-client';
const leash = await connect({ stateDir: process.argv[2] });
const st = await leash.status();
console.log('sessions', st.daemon.sessions.length);
`);
  const out = run(t, root, [state]);
  await waitFor(() => out.exit !== null, `the idle script to exit (stdout ${JSON.stringify(out.stdout)})`);
  assert.deepEqual(out.exit, { code: 0, signal: null }, out.stderr);
  assert.equal(out.stdout, 'sessions 0\n', out.stderr);
});

test('a pending call keeps the script alive until its reply', async (t) => {
  const dir = scratch(t, 'idle-call');
  const state = join(dir, 'state');
  await Daemon.start(t, state);
  // The close waits out the grace of an adapter that ignores SIGTERM: the script has nothing
  // but that call to wait on meanwhile.
  const root = app(dir, `import { connect } from 'leash-client';
const leash = await connect({ stateDir: process.argv[2] });
await leash.ensure('s', { argv: ['sh', '-c', 'trap "" TERM; exec sleep 1000'] });
const [closed] = await leash.close({ session: 's', graceMs: 500 });
console.log(closed.result);
`);
  const out = run(t, root, [state]);
  await waitFor(() => out.exit !== null, 'the script to exit');
  assert.deepEqual(out.exit, { code: 0, signal: null }, out.stderr);
  assert.equal(out.stdout, 'closed\n', out.stderr);
});

test('an open attach keeps the script alive until it ends', async (t) => {
  const dir = scratch(t, 'idle-attach');
  const state = join(dir, 'state');
  await Daemon.start(t, state);
  const c = await connect({ stateDir: state });
  t.after(() => c.disconnect());
  await c.ensure('s', { argv: ['cat'] });
  const root = app(dir, `import { connect } from 'leash-client';
const leash = await connect({ stateDir: process.argv[2] });
for await (const item of leash.attach('s', { since: 0 })) {
  if (item.type === 'event' && item.kind === 'spawned') console.log('attached');
  if (item.type === 'output') { console.log('got', item.line); break; }
}
`);
  const out = run(t, root, [state]);
  await waitFor(() => out.stdout.includes('attached') || out.exit !== null, 'the script to attach');
  // Nothing but the attach holds the script now; it is still there to see the line.
  await c.send('s', 'hello');
  await waitFor(() => out.exit !== null, 'the script to exit');
  assert.deepEqual(out.exit, { code: 0, signal: null }, out.stderr);
  assert.equal(out.stdout, 'attached\ngot hello\n', out.stderr);
});

test('await disconnect() on an idle client resolves and the next line runs', async (t) => {
  const dir = scratch(t, 'idle-disconnect');
  const state = join(dir, 'state');
  await Daemon.start(t, state);
  const root = app(dir, `import { connect } from 'leash-client';
const leash = await connect({ stateDir: process.argv[2] });
await leash.ping();
await leash.disconnect();
console.log('after disconnect', leash.connected);
await leash.disconnect();
console.log('twice');
`);
  const out = run(t, root, [state]);
  await waitFor(() => out.exit !== null, 'the script to exit');
  // A top-level await that never settles ends node with status 13 and the lines unprinted.
  assert.deepEqual(out.exit, { code: 0, signal: null }, out.stderr);
  assert.equal(out.stdout, 'after disconnect false\ntwice\n', out.stderr);
});
