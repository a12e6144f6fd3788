# What `leash exec`'s options cost the wrapper: `leash-wrap -- /bin/true` bare, with
# `--report`, with `--cgroup`, and with both, run by run in turns; per round each subject's median
# of PER runs; printed: the median over ROUNDS rounds and the difference to the bare wrapper of
# the same round (median, min..max). Give a second wrapper as NAME=PATH to measure it in the same
# turns (its report and both).
#
#   python3 bench/wrapper-options-ab.py target/release/leash-wrap [old=/path/to/old/leash-wrap]
#
# Root with cgroup2 (the mount is found in /proc/self/mountinfo): the cgroups are made under a
# root of this script's own, one per run, and the root is removed at the end, also on failure.
import os, sys, statistics, tempfile, shutil
from abturns import cgroup2_mount, turns

wrap = sys.argv[1]
others = dict(a.split("=", 1) for a in sys.argv[2:])
root = f"{cgroup2_mount()}/leash-wrapper-options-{os.getpid()}"
os.mkdir(root)
tmp = tempfile.mkdtemp(prefix="wrapper-options-")
made = []


def cgroup(i):
    p = f"{root}/l{i}"
    os.mkdir(p)
    made.append(p)
    return p


subjects = {
    "bare": lambda i: [wrap, "--", "/bin/true"],
    "report": lambda i: [wrap, "--report", f"{tmp}/r{i}.json", "--", "/bin/true"],
    "cgroup": lambda i: [wrap, "--cgroup", cgroup(i), "--", "/bin/true"],
    "both": lambda i: [wrap, "--report", f"{tmp}/b{i}.json", "--cgroup", cgroup(i), "--",
                       "/bin/true"],
}
for name, path in others.items():
    subjects[f"{name} report"] = lambda i, w=path: [w, "--report", f"{tmp}/o{i}.json", "--",
                                                     "/bin/true"]
    subjects[f"{name} both"] = lambda i, w=path: [w, "--report", f"{tmp}/p{i}.json",
                                                   "--cgroup", cgroup(i), "--", "/bin/true"]


def clear_reports():
    for f in os.listdir(tmp):
        os.unlink(f"{tmp}/{f}")


try:
    res = turns({n: (lambda i, s=s: (s(i), os.environ)) for n, s in subjects.items()},
                after_round=clear_reports)
finally:
    for p in made:  # each wrapper removed its own; one that failed may not have
        if os.path.isdir(p):
            os.rmdir(p)
    os.rmdir(root)
    shutil.rmtree(tmp, ignore_errors=True)
b = res["bare"]
for s, v in res.items():
    d = [x - y for x, y in zip(v, b)]
    print("%-14s %.3f ms  - bare %+.3f ms (%+.3f..%+.3f)" % (
        s, statistics.median(v), statistics.median(d), min(d), max(d)))
