#!/usr/bin/env python3
# `status` latency while N daemon sessions print as fast as a shell loop can (bursts of 2,000
# lines every 20 ms each), next to the latency of a request that does no work (an unknown op).
# A daemon whose output threads held each session's lock across a database write answered no
# `status` within 20 s with 100 sessions; this script shows whether `status` stays fast.
#   usage: bench/status-under-load.py path/to/leash [N] [op] [idle]   (op: status, ping, or both:
#   status and ping interleaved, each figure with the load average at the start and the end)
# Starts its own `leash serve` on a temporary state root and SIGKILLs it at the end (its
# wrappers then take their adapters down).
import json, os, socket, subprocess, sys, tempfile, time, shutil
leash = sys.argv[1]
OP = sys.argv[3] if len(sys.argv) > 3 else "status"
n = int(sys.argv[2]) if len(sys.argv) > 2 else 100
# A fourth argument `idle` starts sessions that print nothing (the cost of the request alone).
IDLE = len(sys.argv) > 4 and sys.argv[4] == "idle"
LOAD = "sleep 600" if IDLE else "sleep 3; while :; do seq 1 2000; sleep 0.02; done"
tmp = tempfile.mkdtemp(prefix="leash-status-load-")
state = os.path.join(tmp, "state")
log = open(os.path.join(tmp, "serve.log"), "w")
d = subprocess.Popen([leash, "--state-dir", state, "serve"], stdout=subprocess.DEVNULL, stderr=log,
                     env=dict(os.environ, LEASH_LOG="warn"))
def main():
    sock = os.path.join(state, "leash.sock")
    for _ in range(500):
        try:
            s = socket.socket(socket.AF_UNIX); s.connect(sock); break
        except OSError:
            time.sleep(0.02)
    s.settimeout(20)
    f = s.makefile("rwb")
    rid = [0]
    def call(op, **kw):
        rid[0] += 1
        kw.update(id=rid[0], op=op)
        f.write((json.dumps(kw) + "\n").encode()); f.flush()
        while True:
            v = json.loads(f.readline())
            if v.get("id") == rid[0]: return v
    for i in range(n):
        r = call("ensure", session=f"s{i}", argv=["sh", "-c", LOAD], graceMs=200)
        pass
    time.sleep(4)
    ops = ["status", "ping"] if OP == "both" else [OP]
    lat = {op: [] for op in ops}
    timeouts = 0
    t_end = time.monotonic() + 60
    load0 = os.getloadavg()[0]
    while len(lat[ops[-1]]) < 100 and time.monotonic() < t_end:
        for op in ops:
            t = time.monotonic()
            try:
                call(op)
            except (TimeoutError, socket.timeout):
                timeouts += 1
                break
            lat[op].append(time.monotonic() - t)
            time.sleep(0.05)
    load1 = os.getloadavg()[0]
    for op in ops:
        l = sorted(lat[op])
        if l:
            print(f"{leash} {op}: sessions={n} samples={len(l)} p50={l[len(l)//2]*1000:.1f}ms p99={l[min(len(l)-1,int(len(l)*0.99))]*1000:.1f}ms max={l[-1]*1000:.1f}ms timeouts(>20s)={timeouts} load={load0:.1f}-{load1:.1f} LEASH_OUTPUT_NICE={os.environ.get('LEASH_OUTPUT_NICE', '(default)')}")
        else:
            print(f"{leash} {op}: sessions={n} nothing answered within 20 s")
try:
    main()
finally:
    d.kill(); d.wait(timeout=60); time.sleep(3)  # the wrappers see their parent die
    shutil.rmtree(tmp, ignore_errors=True)
