"""What the A/B scripts in bench/ share (`exec-daemon-ab.py`, `wrapper-options-ab.py`): the
cgroup2 mount, the turns and their size (`ROUNDS` rounds of `PER` runs, from the environment).

`turns(subjects)` runs every subject once per turn, in order, PER turns a round, ROUNDS rounds,
and returns each subject's median wall time per round, in ms. A subject is a function of the
run's number giving `(argv, env)`; stdin and stdout go to /dev/null; a non-zero exit ends the
script."""
import os, sys, time, statistics

ROUNDS, PER = int(os.environ.get("ROUNDS", "10")), int(os.environ.get("PER", "40"))


def cgroup2_mount():
    """The cgroup2 mount point, from /proc/self/mountinfo (never assumed)."""
    return next(l.split(" - ")[0].split()[4] for l in open("/proc/self/mountinfo")
                if l.split(" - ")[1].split()[0] == "cgroup2")


def turns(subjects, after_round=None):
    devnull = os.open("/dev/null", os.O_RDWR)
    res = {name: [] for name in subjects}
    run = 0
    for _ in range(ROUNDS):
        t = {name: [] for name in subjects}
        for _ in range(PER):
            for name, subject in subjects.items():
                run += 1
                argv, env = subject(run)
                start = time.perf_counter()
                pid = os.posix_spawn(argv[0], argv, env, file_actions=[
                    (os.POSIX_SPAWN_DUP2, devnull, 0), (os.POSIX_SPAWN_DUP2, devnull, 1)])
                _, st = os.waitpid(pid, 0)
                t[name].append((time.perf_counter() - start) * 1e3)
                if st != 0:
                    sys.exit(f"{name}: exit status {st}")
        for name in t:
            res[name].append(statistics.median(t[name]))
        if after_round:
            after_round()
    os.close(devnull)
    return res
