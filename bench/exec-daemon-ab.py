# `leash exec -- /bin/true` through the daemon, two builds in the same turns, against the bare
# wrapper: per round each subject's median of PER runs, taken run by run in turns;
# the difference and the ratio to the bare wrapper per round, summarised over ROUNDS rounds.
#
#   python3 bench/exec-daemon-ab.py old=/path/to/old/release new=target/release
#
# `name=BUILD@DIR` runs that subject with the wrappers' reports in DIR (`LEASH_RUNTIME_DIR`),
# made 0700 here if missing and removed at the end, e.g. the same build twice:
#
#   python3 bench/exec-daemon-ab.py disk=target/release@/tmp/ab-reports \
#       tmpfs=target/release@/dev/shm/ab-reports
#
# Each build's `leash serve` gets a state root of its own, and containment under a cgroup root
# this script makes in the cgroup2 mount (root with cgroup2; found in /proc/self/mountinfo) and
# removes at the end; both daemons are stopped with SIGTERM, also when a run fails.
import os, sys, time, statistics, subprocess, tempfile, shutil
from abturns import cgroup2_mount, turns

builds, reports = {}, {}
for a in sys.argv[1:]:
    name, rel = a.split("=", 1)
    rel, _, rdir = rel.partition("@")
    builds[name] = rel
    if rdir:
        reports[name] = rdir
made = [d for d in reports.values() if not os.path.exists(d)]
for d in made:
    os.mkdir(d, 0o700)
cg = f"{cgroup2_mount()}/leash-exec-ab-{os.getpid()}"
os.mkdir(cg)
tmp = tempfile.mkdtemp(prefix="exec-ab-")
daemons, envs = {}, {}
try:
    for name, rel in builds.items():
        e = dict(os.environ, LEASH_STATE_DIR=f"{tmp}/{name}", LEASH_CONTAINMENT="on",
                 LEASH_CGROUP_ROOT=cg)
        if name in reports:
            e["LEASH_RUNTIME_DIR"] = reports[name]
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
    subjects = {"bare": lambda i: ([wrap, "--", "/bin/true"], dict(os.environ))}
    for n, r in builds.items():
        subjects[n] = lambda i, r=r, n=n: ([f"{r}/leash", "exec", "--", "/bin/true"], envs[n])
    res = turns(subjects)
finally:
    for p in daemons.values():
        p.terminate()
        p.wait()
    shutil.rmtree(tmp, ignore_errors=True)
    for d in made:
        shutil.rmtree(d, ignore_errors=True)
    os.rmdir(cg)  # the wrappers removed their cgroups, the daemons their gateways' directories
b = res["bare"]
print("bare %.3f ms (%.3f-%.3f)" % (statistics.median(b), min(b), max(b)))
for n in builds:
    d = [x - y for x, y in zip(res[n], b)]
    q = [x / y for x, y in zip(res[n], b)]
    print("%-8s %.3f ms  - bare %+.3f ms (%+.3f..%+.3f)  / bare %.2fx (%.2f-%.2f)" % (
        n, statistics.median(res[n]), statistics.median(d), min(d), max(d),
        statistics.median(q), min(q), max(q)))
