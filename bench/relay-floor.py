#!/usr/bin/env python3
"""Relay floor (issue 24, docs/benchmarks.md "stop 33"): the bench's relay loop (200,000 lines of
`yes | head -n`, a pipe round and the same lines through a relay, in turns, 2 warm-up rounds)
with `relay-floor` (bench/relay-floor.c, built here with gcc) in the middle instead of the
daemon: mode 0 forwards bytes, mode 1 frames each line as the daemon does. Prints each round's
ratio to the pipe. Starts and waits for its own processes only.
usage: relay-floor.py [--len 100] [--rounds 5] [MODE...]"""
import argparse, os, shutil, socket, statistics, subprocess, tempfile, time

ap = argparse.ArgumentParser()
ap.add_argument("--len", type=int, default=100)
ap.add_argument("--rounds", type=int, default=5)
ap.add_argument("modes", nargs="*", default=["0", "1"])
a = ap.parse_args()
here = os.path.dirname(os.path.abspath(__file__))
tmp = tempfile.mkdtemp(prefix="relay-floor-")
exe = os.path.join(tmp, "relay-floor")
subprocess.run(["gcc", "-O3", "-march=native", "-o", exe, os.path.join(here, "relay-floor.c")], check=True)
n = 200_000
gen = f"yes {'x' * (a.len - 1)} | head -n {n}"


def count(read):
    c = 0
    while c < n:
        b = read(1 << 16)
        if not b:
            break
        c += b.count(b"\n")
    return c


def pipe_round():
    t = time_now()
    p = subprocess.Popen(["sh", "-c", gen], stdout=subprocess.PIPE)
    c = count(p.stdout.read1)
    dt = time_now() - t
    p.wait()
    assert c == n, c
    return n / dt


def relay_round(mode):
    r, w = socket.socketpair()
    t = time_now()
    p = subprocess.Popen(["sh", "-c", f"{gen} | {exe} {mode}"], stdout=w)
    w.close()
    c = count(r.recv)
    dt = time_now() - t
    p.wait()
    r.close()
    assert c == n, c
    return n / dt


def time_now():
    return time.perf_counter()


res = {m: [] for m in a.modes}
try:
    for k in range(2 + a.rounds):
        pr = pipe_round()
        for m in a.modes:
            x = relay_round(m)
            if k >= 2:
                res[m].append(x / pr)
finally:
    shutil.rmtree(tmp, ignore_errors=True)
for m, v in res.items():
    print(f"{a.len} B, mode {m}: median {statistics.median(v):.2f}x, rounds "
          + " ".join(f"{x:.2f}" for x in v) + f", >= 0.8x: {sum(x >= 0.8 for x in v)}/{len(v)}")
