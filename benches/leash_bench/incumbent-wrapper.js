// A stand-in for the incumbent's generated Node wrapper, written from its description in
// ../../../shared/CONTEXT.md ("How the incumbent does it today"), not from its source: the adapter
// is spawned detached (its own process group), INT/TERM/HUP are forwarded to that group, parent
// death is found by polling process.ppid every 1,000 ms, and then the group gets SIGTERM and,
// 1,500 ms later, SIGKILL. The benchmarks use it for the two things that decide its cost: the
// Node runtime's footprint and the polling latency.
//
// usage: node incumbent-wrapper.js [--] CMD [ARGS...]
'use strict';
const { spawn } = require('child_process');

let argv = process.argv.slice(2);
if (argv[0] === '--') argv = argv.slice(1);
const parent = process.ppid;
const child = spawn(argv[0], argv.slice(1), { detached: true, stdio: 'inherit' });

const signalGroup = (sig) => {
  try {
    process.kill(-child.pid, sig);
  } catch (_) {
    // ESRCH: the group is already empty.
  }
};
for (const sig of ['SIGINT', 'SIGTERM', 'SIGHUP']) process.on(sig, () => signalGroup(sig));

const poll = setInterval(() => {
  if (process.ppid !== parent) {
    clearInterval(poll);
    signalGroup('SIGTERM');
    setTimeout(() => signalGroup('SIGKILL'), 1500).unref();
  }
}, 1000);

child.on('exit', (code, signal) => {
  clearInterval(poll);
  process.exit(code === null ? 128 + (require('os').constants.signals[signal] || 0) : code);
});
child.on('error', (e) => {
  process.stderr.write(`incumbent-wrapper: ${e.message}\n`);
  process.exit(127);
});
