# `leash exec -- /bin/true` through the daemon, two builds in the same turns, against the bare
# wrapper (issue 24): per round each subject's median of PER runs, taken run by run in turns;
# the difference and the ratio to the bare wrapper per round, summarised over ROUNDS rounds.
#
#   python3 bench/exec-daemon-ab.py old=/path/to/old/release new=target/release
#
# Each build's `leash serve` gets a state root of its own, and containment under a cgroup root
# this script makes in the cgroup2 mount (root with cgroup2; found in /proc/self/mountinfo) and
# removes at the end; both daemons are stopped with SIGTERM, also when a run fails.
import os, sys, time, statistics, subprocess, tempfile, shutil

builds = dict(a.split("=", 1) for a in sys.argv[1:])
rounds, per = int(os.environ.get("ROUNDS", "10")), int(os.environ.get("PER", "40"))
mount = next(l.split(" - ")[0].split()[4] for l in open("/proc/self/mountinfo")
             if l.split(" - ")[1].split()[0] == "cgroup2")
cg = f"{mount}/leash-exec-ab-{os.getpid()}"
os.mkdir(cg)
tmp = tempfile.mkdtemp(prefix="exec-ab-")
devnull = os.open("/dev/null", os.O_RDWR)
daemons, envs = {}, {}
try:
    for name, rel in builds.items():
        e = dict(os.environ, LEASH_STATE_DIR=f"{tmp}/{name}", LEASH_CONTAINMENT="on",
                 LEASH_CGROUP_ROOT=cg)
        daemons[name] = subprocess.Popen([f"{rel}/leash", "serve"], env=e,
                                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                         stderr=open(f"{tmp}/{name}.log", "w"))
        envs[name] = e
    for name in builds:
        sock = f"{tmp}/{name}/leash.sock"
        deadline = time.monotonic() + 10
        while not os.path.exists(sock):
            if time.monotonic() > deadline:
                sys.exit(f"{name}: no daemon socket at {sock}")
            time.sleep(0.02)
    for name, rel in builds.items():  # installs each wrapper, warms each daemon
        for _ in range(5):
            subprocess.run([f"{rel}/leash", "exec", "--", "/bin/true"], env=envs[name], check=True)
    first = next(iter(builds))
    wdir = f"{tmp}/{first}/wrappers"
    wrap = os.path.join(wdir, next(f for f in os.listdir(wdir) if f.startswith("leash-wrap-")))
    subjects = [("bare", [wrap, "--", "/bin/true"], dict(os.environ))]
    subjects += [(n, [f"{r}/leash", "exec", "--", "/bin/true"], envs[n]) for n, r in builds.items()]
    res = {n: [] for n, _, _ in subjects}
    for _ in range(rounds):
        t = {n: [] for n, _, _ in subjects}
        for _ in range(per):
            for n, argv, e in subjects:
                s = time.perf_counter()
                pid = os.posix_spawn(argv[0], argv, e, file_actions=[
                    (os.POSIX_SPAWN_DUP2, devnull, 0), (os.POSIX_SPAWN_DUP2, devnull, 1)])
                _, st = os.waitpid(pid, 0)
                t[n].append((time.perf_counter() - s) * 1e3)
                if st != 0:
                    sys.exit(f"{n}: exit status {st}")
        for n in t:
            res[n].append(statistics.median(t[n]))
finally:
    for p in daemons.values():
        p.terminate()
        p.wait()
    shutil.rmtree(tmp, ignore_errors=True)
    os.rmdir(cg)  # the wrappers removed their cgroups, the daemons their gateways' directories
b = res["bare"]
print("bare %.3f ms (%.3f-%.3f)" % (statistics.median(b), min(b), max(b)))
for n in builds:
    d = [x - y for x, y in zip(res[n], b)]
    q = [x / y for x, y in zip(res[n], b)]
    print("%-8s %.3f ms  - bare %+.3f ms (%+.3f..%+.3f)  / bare %.2fx (%.2f-%.2f)" % (
        n, statistics.median(res[n]), statistics.median(d), min(d), max(d),
        statistics.median(q), min(q), max(q)))
