# Stand-in for `cargo bench -- --only execfloor` while the bench binary builds: same subjects,
# same turns, same per-round medians. Our own cgroup root; our own sleeps; all cleaned up.
import os, sys, time, statistics, subprocess, shutil, tempfile
NEW, BASE, WRAP = sys.argv[1], sys.argv[2], sys.argv[3]
rounds, batch = int(sys.argv[4]), int(sys.argv[5])
mount = "/sys/fs/cgroup/unified"
cg = f"{mount}/leash-exec-h-{os.getpid()}"
os.mkdir(cg)
tmp = tempfile.mkdtemp(prefix="exec-h-")
devnull = os.open("/dev/null", os.O_RDWR)
def env_for(state):
    e = dict(os.environ); e.update(LEASH_STATE_DIR=f"{tmp}/{state}", LEASH_CONTAINMENT="on", LEASH_CGROUP_ROOT=cg); return e
subs = [("true", ["/bin/true"], dict(os.environ)),
        ("wrap", [WRAP, "--", "/bin/true"], dict(os.environ)),
        ("exec", [NEW, "exec", "--", "/bin/true"], env_for("new")),
        ("execd", [NEW, "exec", "--", "/bin/true"], env_for("newd")),
        ("base", [BASE, "exec", "--", "/bin/true"], env_for("base"))]
# "execd": the same state root layout with a `leash serve` of it running (the daemon commits).
daemon = subprocess.Popen([NEW, "serve"], env=env_for("newd"), stdin=subprocess.DEVNULL,
                          stdout=subprocess.DEVNULL, stderr=open(f"{tmp}/serve.log", "w"))
for _ in range(3000):
    try:
        if f'"pid":{daemon.pid},' in open(f"{tmp}/newd/daemon.lock").read(): break
    except OSError: pass
    time.sleep(0.01)
else:
    daemon.kill(); sys.exit("leash serve did not start")
def once(argv, env):
    t = time.perf_counter()
    pid = os.posix_spawn(argv[0], argv, env, file_actions=[(os.POSIX_SPAWN_DUP2, devnull, 0),(os.POSIX_SPAWN_DUP2, devnull, 1),(os.POSIX_SPAWN_DUP2, devnull, 2)])
    _, st = os.waitpid(pid, 0)
    dt = (time.perf_counter() - t) * 1e3
    assert st == 0, (argv, st)
    return dt
sleepers = []
def loadavg(): return " ".join(open("/proc/loadavg").read().split()[:3])
try:
    for s in subs:
        for _ in range(5): once(s[1], s[2])
    for level in (0, 2000):
        while len(sleepers) < level:
            sleepers.append(subprocess.Popen(["sleep", "3600"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        l0 = loadavg()
        per = {s[0]: [] for s in subs}
        for _ in range(rounds):
            runs = {s[0]: [] for s in subs}
            for _ in range(batch):
                for n, a, e in subs: runs[n].append(once(a, e))
            for n in per: per[n].append(statistics.median(runs[n]))
        l1 = loadavg()
        print(f"level {level} load {l0} -> {l1}")
        def show(v): return f"{statistics.median(v):.2f} ({min(v):.2f}-{max(v):.2f})"
        for n in per:
            line = f"  {n:5s} {show(per[n])} ms"
            if n in ("exec", "execd", "base"):
                d = [x - y for x, y in zip(per[n], per["wrap"])]; q = [x / y for x, y in zip(per[n], per["wrap"])]
                line += f"   -wrap {show(d)} ms   /wrap {show(q)}"
            print(line, flush=True)
        if "base" in per:
            q = [x / y for x, y in zip(per["exec"], per["base"])]
            print(f"  exec/base per round {show(q)}", flush=True)
        q = [x / y for x, y in zip(per["execd"], per["exec"])]
        print(f"  execd/exec per round {show(q)}", flush=True)
finally:
    daemon.terminate(); daemon.wait()
    for p in sleepers: p.kill()
    for p in sleepers: p.wait()
    for d in sorted((os.path.join(r, x) for r, ds, _ in os.walk(cg) for x in ds), key=len, reverse=True):
        try: os.rmdir(d)
        except OSError as e: print("rmdir", d, e)
    os.rmdir(cg)
    shutil.rmtree(tmp, ignore_errors=True)
