#!/usr/bin/env python3
"""Relay probe (docs/benchmarks.md, "The daemon"): the loop of `leash_bench --only
relay` (a pipe round, then the same lines through `leash serve` to one attached client) with
load-independent instruments on the daemon: `--perf OUT` runs `perf stat --per-thread` (task-clock,
context switches, page faults) over the counted rounds, `--callgrind OUT` runs the daemon under
callgrind with instrumentation switched on for the counted rounds only (instructions per line =
the totals / (rounds x n)). Needs leash-wrap next to LEASH (or LEASH_WRAP_BIN). Signals only the
daemon it started. usage:
  relay-probe.py LEASH [--len 100] [--n 200000] [--warm 2] [--rounds 3] [--perf OUT]
                 [--callgrind OUT] [--nopipe]"""
import argparse, json, os, socket, subprocess, sys, tempfile, time, signal

ap = argparse.ArgumentParser()
ap.add_argument("leash")
ap.add_argument("--len", type=int, default=100)
ap.add_argument("--n", type=int, default=200000)
ap.add_argument("--warm", type=int, default=2)
ap.add_argument("--rounds", type=int, default=3)
ap.add_argument("--perf")
ap.add_argument("--callgrind")
ap.add_argument("--nopipe", action="store_true")
a = ap.parse_args()

d = tempfile.mkdtemp(prefix="relaydrv")
state = os.path.join(d, "state")
n = a.n
args = [a.leash, "--state-dir", state, "serve", "--replay-lines", str(2 * n),
        "--replay-bytes", str(n * (a.len + 200) * 2)]
if a.callgrind:
    args = ["valgrind", "--tool=callgrind", "--callgrind-out-file=" + a.callgrind,
            "--instr-atstart=no", "--separate-threads=no"] + args
# Containment off, as in the bench's relay section (leash_bench sets it off for every section
# that does not make a cgroup root of its own): a root daemon would otherwise contain under the
# default root, <cgroup2 mount>/leash, and leave that directory behind.
env = dict(os.environ, LEASH_LOG="warn", LEASH_CONTAINMENT="off")
daemon = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                          stderr=open(os.path.join(d, "err"), "w"), env=env)
sock = os.path.join(state, "leash.sock")


def stop_daemon():
    """Ends the daemon this probe started (by its pid), also when the probe fails early."""
    if daemon.poll() is None:
        daemon.send_signal(signal.SIGTERM)
        try:
            daemon.wait(30)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait()


import atexit
atexit.register(stop_daemon)

class C:
    def __init__(self):
        self.s = socket.socket(socket.AF_UNIX); self.s.connect(sock)
        self.f = self.s.makefile("rb", buffering=65536); self.next = 0
    def request(self, op, **fields):
        self.next += 1; fields["id"] = self.next; fields["op"] = op
        self.s.sendall(json.dumps(fields).encode() + b"\n"); return self.next
    def reply(self, i):
        while True:
            l = self.f.readline()
            if not l: raise SystemExit("daemon closed")
            v = json.loads(l)
            if v.get("id") == i and "ok" in v: return v
    def call(self, op, **f):
        v = self.reply(self.request(op, **f))
        if v["ok"] is not True: raise SystemExit(f"{op}: {v}")
        return v.get("result")

for _ in range(600):
    try:
        c = C(); break
    except OSError:
        time.sleep(0.1)
else:
    raise SystemExit("no socket")

def count(read, n):
    seen = 0
    while seen < n:
        b = read(65536)
        if not b: raise SystemExit(f"ended after {seen}")
        seen += b.count(b"\n")

text = "x" * (a.len - 1)
gen = f"yes {text} | head -n {n}"
c.call("ensure", session="relay", argv=["sh", "-c", f"while read go; do {gen}; done"], graceMs=200)
perf = None
pipe_r, dmn_r = [], []
for rnd in range(a.warm + a.rounds):
    counted = rnd >= a.warm
    if counted and rnd == a.warm:
        if a.perf:
            perf = subprocess.Popen(["perf", "stat", "--per-thread", "-e", "task-clock,context-switches,page-faults",
                                     "-p", str(daemon.pid), "-o", a.perf])
            time.sleep(0.5)
        if a.callgrind:
            subprocess.run(["callgrind_control", "-i", "on", str(daemon.pid)], stdout=subprocess.DEVNULL)
        def times():
            f = open(f"/proc/{daemon.pid}/stat").read().rsplit(")", 1)[1].split()
            return int(f[11]), int(f[12])
        t0 = times()
    if not a.nopipe:
        t = time.perf_counter()
        p = subprocess.Popen(["sh", "-c", gen], stdout=subprocess.PIPE, bufsize=0)
        count(p.stdout.read, n)
        el = time.perf_counter() - t
        p.wait()
    last = c.call("status")["daemon"]["sessions"][0]["lastSeq"]
    at = C()
    i = at.request("attach", session="relay", since=last)
    r = at.reply(i)
    assert r["ok"] is True, r
    t = time.perf_counter()
    c.call("send", session="relay", line="go")
    # Leftover buffered bytes in the makefile reader count too.
    count(at.f.read1, n)
    de = time.perf_counter() - t
    if counted:
        if not a.nopipe: pipe_r.append(n / el)
        dmn_r.append(n / de)
    try: at.call("detach", attachId=i)
    except SystemExit: pass
    at.s.close()
t1 = times()
tk = os.sysconf("SC_CLK_TCK"); kl = a.rounds * n / 1000
print(f"process per 1000 lines: user {(t1[0]-t0[0])/tk*1e6/kl:.0f} us, sys {(t1[1]-t0[1])/tk*1e6/kl:.0f} us")
if a.callgrind:
    subprocess.run(["callgrind_control", "-i", "off", str(daemon.pid)], stdout=subprocess.DEVNULL)
    subprocess.run(["callgrind_control", "-d", str(daemon.pid)], stdout=subprocess.DEVNULL)
if perf:
    perf.send_signal(signal.SIGINT); perf.wait()
for k, (pp, dd) in enumerate(zip(pipe_r or [0]*len(dmn_r), dmn_r)):
    print(f"round {k}: pipe {pp/1e6:.2f} M/s daemon {dd/1e6:.2f} M/s ratio {dd/pp if pp else 0:.2f}")
stop_daemon()
print("lines counted", a.rounds * n, "load", open("/proc/loadavg").read().split()[:3])
if a.perf:
    import re
    tot = rd = 0.0
    for l in open(a.perf):
        m = re.match(r"\s*(\S+)-(\d+)\s+([\d.,]+)\s+msec task-clock", l)
        if m:
            v = float(m.group(3).replace(",", ""))
            tot += v
            rd += v if m.group(1).startswith("out:") else 0
    k = a.rounds * n / 1000
    print(f"task-clock per 1,000 lines: stdout reader {rd * 1000 / k:.0f} us, "
          f"the rest of the daemon {(tot - rd) * 1000 / k:.0f} us, daemon {tot * 1000 / k:.0f} us")
import shutil
shutil.rmtree(d, ignore_errors=True)
