//! The fixed cost of `leash exec` against its floor: `leash exec -- /bin/true` (the
//! lease committed to SQLite, the lease's cgroup made, then the wrapper exec'd in place) against
//! the bare `leash-wrap -- /bin/true` (no lease, no cgroup, no report), run for run in turns, on
//! a quiet host and with 2,000 unrelated processes. Per round each command's figure is the median
//! of its runs; the difference and the ratio are taken per round and summarised over rounds
//! (median, min–max). The target, for both paths (with and without a running daemon) and at
//! both host levels: `leash exec` ≤ the bare wrapper + 2.5 ms, by the median of the per-round
//! differences (the table shows their min–max beside it).
//!
//! Containment is on (a cgroup per lease under `<cgroup2 mount>/leash-bench-<pid>`, which this
//! section makes and removes) when running as root with cgroup2; otherwise off, and the report
//! says so. `LEASH_BENCH_BASELINE=/path/to/leash` also times another build's `leash exec` the
//! same way, in the direct path's turns (its `leash-wrap` must lie next to it).
//!
//! `leash exec` is timed both ways in the same run: on a state root a `leash serve` started by
//! this section serves (the daemon commits the lease on its warm connection; stopped with SIGTERM
//! at the end of the section), and on one no daemon serves (`leash` commits the lease to
//! SQLite itself). Each way takes turns with a `/bin/true` and a bare wrapper of its own
//! ([`DAEMON_TURNS`], [`DIRECT_TURNS`]), and is compared with them.
//!
//! As root, a third level runs every command in a private mount namespace holding 5,000 tmpfs
//! mounts (a container host's mount table): `leash exec` reads `/proc/self/mountinfo` for its
//! containment, and that read must not grow with the table. The namespace is a child's
//! (`unshare -m`, which makes the mounts and then sleeps); each run enters it with `setns` before
//! its exec, the baseline and the bare wrapper too, and it goes with its mounts when the child is
//! killed at the end of the section.
//!
//! Two more subjects split the daemon path's difference (`floorserve.rs`): the same `leash exec`
//! answered by a server of the bench's own that does nothing (`exec-null`: `leash`'s process,
//! the round trip, the wrapper's `execve`), and one that does the least a daemon must
//! (`exec-floor`: the peer proven, one row committed, the cgroup made). What `leash serve` costs
//! above `exec-floor` is leash's own op.

use crate::containment::BenchRoot;
use crate::floorserve::{floor_db, Floor, FloorServer, HeldGateway};
use crate::procs::{Children, TempDir};
use crate::stats::{median, ms, ratio, Summary, Table};
use crate::{Config, Env};
use std::ffi::OsString;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Instant;

struct Subject {
    name: &'static str,
    /// The turns it is timed in: [`DAEMON_TURNS`] or [`DIRECT_TURNS`].
    turns: usize,
    label: String,
    argv: Vec<OsString>,
    envs: Vec<(&'static str, OsString)>,
}

/// The daemon path's subjects (the daemon, the null and the floor servers) take turns with a
/// bare wrapper and `/bin/true` of their own; the direct path's (`leash` committing to its
/// own database, and a baseline build's) with another pair. `leash` is an 8 MB program that
/// opens, commits to and checkpoints a database of its own on every run: between two daemon-path
/// runs it made them 0.12–0.19 ms slower in every one of three A/B pairs, a cost of the bench's own turns, not of the daemon path.
const DAEMON_TURNS: usize = 0;
const DIRECT_TURNS: usize = 1;

/// What `leash exec -- /bin/true` may add to the bare wrapper, either path: the median of the
/// per-round differences, in ms.
const EXEC_TARGET_MS: f64 = 2.5;

impl Subject {
    /// One run, in ms; an error when the command fails. `ns`: a mount namespace to run in.
    fn once(&self, ns: Option<&std::fs::File>) -> Result<f64, String> {
        let mut c = Command::new(&self.argv[0]);
        if let Some(ns) = ns {
            use std::os::fd::AsRawFd;
            use std::os::unix::process::CommandExt;
            let fd = ns.as_raw_fd();
            // SAFETY: setns is one system call, async-signal-safe, in the forked child.
            unsafe {
                c.pre_exec(move || {
                    if libc::setns(fd, libc::CLONE_NEWNS) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        c.args(&self.argv[1..])
            .envs(self.envs.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let t = Instant::now();
        let st = c
            .status()
            .map_err(|e| format!("{}: cannot start: {e}", self.name))?;
        let dt = t.elapsed().as_secs_f64() * 1e3;
        if !st.success() {
            return Err(format!("{}: exited with {st}", self.name));
        }
        Ok(dt)
    }
}

/// Per-round medians of every subject at one level.
struct Level {
    n: usize,
    /// The mounts of the namespace the runs entered (0: this process's own).
    mounts: usize,
    load_start: String,
    load_end: String,
    rounds: Vec<Vec<f64>>,
}

pub fn run(env: &Env, cfg: &Config) -> Result<String, String> {
    let cg = BenchRoot::new();
    let scratch = TempDir::new("execfloor");
    let contain = |state: &str| -> Vec<(&'static str, OsString)> {
        let mut v = vec![(
            "LEASH_STATE_DIR",
            scratch.path().join(state).into_os_string(),
        )];
        match &cg {
            Ok(root) => {
                v.push(("LEASH_CONTAINMENT", "on".into()));
                v.push(("LEASH_CGROUP_ROOT", root.0.clone().into_os_string()));
            }
            Err(_) => v.push(("LEASH_CONTAINMENT", "off".into())),
        }
        v
    };
    let exec_line = |leash: &PathBuf| -> Vec<OsString> {
        vec![
            leash.clone().into(),
            "exec".into(),
            "--".into(),
            env.true_bin.clone().into(),
        ]
    };
    let baselines = |turns: usize| {
        let whose = if turns == DAEMON_TURNS {
            ""
        } else {
            ", the direct path's turns"
        };
        [
            Subject {
                name: "true",
                turns,
                label: format!("`/bin/true` (direct{whose})"),
                argv: vec![env.true_bin.clone().into()],
                envs: Vec::new(),
            },
            Subject {
                name: "wrap",
                turns,
                label: format!(
                    "`leash-wrap -- /bin/true` (bare: no lease, no cgroup, no report{whose})"
                ),
                argv: vec![
                    env.wrap.clone().into(),
                    "--".into(),
                    env.true_bin.clone().into(),
                ],
                envs: Vec::new(),
            },
        ]
    };
    // `leash exec` on the state root `state`, where `who` commits the lease.
    let exec = |name, turns, state: &str, how: &str, who: &str| Subject {
        name,
        turns,
        label: format!(
            "`leash exec -- /bin/true`, {how} ({who} commits the lease{})",
            if cg.is_ok() {
                " and makes the cgroup"
            } else {
                "; containment off"
            }
        ),
        argv: exec_line(&env.leash),
        envs: contain(state),
    };
    let mut subjects: Vec<Subject> = baselines(DAEMON_TURNS).into_iter().collect();
    subjects.push(exec(
        "exec-daemon",
        DAEMON_TURNS,
        "state-daemon",
        "a `leash serve` of the state root running",
        "it",
    ));
    for (name, label) in [
        (
            "exec-null",
            "the same, answered at once by a server that does nothing (client, round trip)",
        ),
        (
            "exec-floor",
            "the same, answered by the least a daemon must do (peer proven, one row, the cgroup)",
        ),
    ] {
        subjects.push(Subject {
            name,
            turns: DAEMON_TURNS,
            label: label.into(),
            argv: exec_line(&env.leash),
            envs: vec![(
                "LEASH_STATE_DIR",
                scratch.path().join(name).into_os_string(),
            )],
        });
    }
    let null = FloorServer::start(&scratch.path().join("exec-null"), Floor::Null, None)?;
    let floor = FloorServer::start(
        &scratch.path().join("exec-floor"),
        Floor::Commit,
        cg.as_ref().ok().map(|r| r.0.as_path()),
    )?;
    let _daemon = Serve::start(
        &env.leash,
        &contain("state-daemon"),
        &scratch.path().join("state-daemon"),
    )?;
    subjects.extend(baselines(DIRECT_TURNS));
    subjects.push(exec("exec", DIRECT_TURNS, "state", "no daemon", "`leash`"));
    // The issue's own floor as one static program, no daemon (bench/issue-floor.c, built by
    // bench/setup.sh): in the direct path's turns, as it commits to a database of its own.
    let issue_floor = IssueFloor::prepare(env, &scratch, cg.as_ref().ok().map(|r| r.0.as_path()))?;
    if let Some(f) = &issue_floor {
        subjects.extend(f.subjects(env));
    }
    if let Some(b) = std::env::var_os("LEASH_BENCH_BASELINE").map(PathBuf::from) {
        if !b.is_file() {
            return Err(format!(
                "LEASH_BENCH_BASELINE={} is not a file",
                b.display()
            ));
        }
        subjects.push(Subject {
            name: "baseline",
            turns: DIRECT_TURNS,
            label: format!("the same, baseline build ({})", b.display()),
            argv: exec_line(&b),
            envs: contain("state-baseline"),
        });
    }
    let rounds = cfg.spawn_rounds;
    let batch = if cfg.quick { 10 } else { 40 };
    // Warm-up: page cache, state roots, the installed wrappers.
    for s in &subjects {
        for _ in 0..5 {
            s.once(None)?;
        }
    }
    let room = crate::hostscale::room();
    let mut levels: Vec<(usize, usize)> = [0, 2_000]
        .into_iter()
        .filter(|&n| n <= room)
        .map(|n| (n, 0))
        .collect();
    let many = if cfg.quick { 500 } else { 5_000 };
    let mounts = if nix::unistd::geteuid().is_root() {
        Some(Mounts::new(&scratch.path().join("mounts"), many)?)
    } else {
        eprintln!("leash-bench: execfloor: not root: no level with {many} mounts");
        None
    };
    if mounts.is_some() {
        levels.push((0, many));
    }
    let mut sleepers = Children::new();
    let mut results = Vec::new();
    for &(n, m) in &levels {
        eprintln!("leash-bench: execfloor: {n} unrelated processes, {m} extra mounts");
        sleepers.grow_sleepers(&env.sleep, n)?;
        let ns = mounts.as_ref().filter(|_| m > 0).map(|x| &x.ns);
        let mut level = Level {
            n,
            mounts: m,
            load_start: crate::loadavg(),
            load_end: String::new(),
            rounds: vec![Vec::new(); subjects.len()],
        };
        for turns in [DAEMON_TURNS, DIRECT_TURNS] {
            let members: Vec<usize> = (0..subjects.len())
                .filter(|&i| subjects[i].turns == turns)
                .collect();
            for _ in 0..rounds {
                let mut runs: Vec<Vec<f64>> = vec![Vec::with_capacity(batch); members.len()];
                for _ in 0..batch {
                    for (&i, r) in members.iter().zip(runs.iter_mut()) {
                        r.push(subjects[i].once(ns)?);
                    }
                }
                for (&i, r) in members.iter().zip(&runs) {
                    level.rounds[i].push(median(r));
                }
            }
        }
        level.load_end = crate::loadavg();
        results.push(level);
    }
    drop(sleepers);
    drop(mounts);
    null.check()?;
    floor.check()?;
    let issue_floor_note = issue_floor
        .as_ref()
        .map_or_else(IssueFloor::missing_note, IssueFloor::note);
    drop(issue_floor);

    let mut out = format!(
        "\n### 10. `leash exec` against the bare wrapper\n\n{rounds} rounds per \
         level; each round runs every command {batch} times, the commands taking turns run by \
         run; per command the round's median; shown: median (min–max) over rounds. The \
         difference and the ratio are per round, against `leash-wrap -- /bin/true` of the same \
         round. The daemon path and the direct path (`leash`, no daemon) are timed in \
         turns of their own, each with its own bare wrapper: the direct path's runs slowed the \
         daemon path's between them. {} The state roots are under {}, on {}; the wrappers' \
         reports (one file created per exec) are in {}.\n\n",
        match &cg {
            Ok(r) => format!("Containment on, under {}.", r.0.display()),
            Err(e) => format!("Containment off ({e})."),
        },
        scratch.path().display(),
        filesystem(scratch.path()),
        match leash::state::resolve_reports_dir(&|k| std::env::var_os(k)) {
            Ok(Some(dir)) => format!("{}, on {}", dir.display(), filesystem(&dir)),
            Ok(None) => "each state root's `run/`".to_string(),
            Err(e) => format!("no usable directory ({e})"),
        }
    );
    let mut t = Table::new(&[
        "unrelated processes, extra mounts (load start → end)",
        "command",
        "wall time",
        "− bare wrapper",
        "÷ bare wrapper",
        "target",
    ]);
    // A subject by name and turns (each turns has its own `true` and `wrap`).
    let at = |name: &str, turns: usize| {
        subjects
            .iter()
            .position(|s| s.name == name && s.turns == turns)
            .expect("subject")
    };
    for level in &results {
        for (i, s) in subjects.iter().enumerate() {
            let r = &level.rounds[i];
            let base = &level.rounds[at("wrap", s.turns)];
            let (diff, div, target) = if s.name == "wrap" || s.name == "true" {
                (String::new(), String::new(), String::new())
            } else {
                let d: Vec<f64> = r.iter().zip(base).map(|(x, y)| x - y).collect();
                let q: Vec<f64> = r.iter().zip(base).map(|(x, y)| x / y).collect();
                let (d, q) = (Summary::of(&d), Summary::of(&q));
                let target = if s.name == "exec" || s.name == "exec-daemon" {
                    crate::spawn::verdict(d.median <= EXEC_TARGET_MS, "≤ +2.5 ms")
                } else {
                    String::new()
                };
                (d.show(|v| format!("{v:+.2} ms")), q.show(ratio), target)
            };
            t.row(vec![
                format!(
                    "{}, {} ({} → {})",
                    level.n, level.mounts, level.load_start, level.load_end
                ),
                s.label.clone(),
                Summary::of(r).show(ms),
                diff,
                div,
                target,
            ]);
        }
    }
    out.push_str(&t.render());
    out.push_str(&issue_floor_note);
    // Where the daemon path's difference goes, per round: each step's subject minus the one
    // below it, in the same turns.
    let steps = [
        ("`leash`'s process and the round trip", "exec-null", "wrap"),
        (
            "the peer's evidence, one commit, the cgroup",
            "exec-floor",
            "exec-null",
        ),
        (
            "leash's own op above that floor",
            "exec-daemon",
            "exec-floor",
        ),
    ];
    out.push_str(
        "\nThe daemon path's difference to the bare wrapper, step by step (each step: its \
         subject minus the one below it, per round; median (min–max) over rounds):\n\n",
    );
    let mut t = Table::new(&["unrelated processes, extra mounts", "step", "adds"]);
    for level in &results {
        for (what, hi, lo) in steps {
            let (hi, lo) = (
                &level.rounds[at(hi, DAEMON_TURNS)],
                &level.rounds[at(lo, DAEMON_TURNS)],
            );
            let d: Vec<f64> = hi.iter().zip(lo).map(|(x, y)| x - y).collect();
            t.row(vec![
                format!("{}, {}", level.n, level.mounts),
                what.into(),
                Summary::of(&d).show(|v| format!("{v:+.2} ms")),
            ]);
        }
    }
    out.push_str(&t.render());
    Ok(out)
}

/// The type of the filesystem `path` is on, by its magic number: a file's create costs 20–60 µs
/// on ext4 in a quiet minute and up to 0.7 ms in a busy one, where tmpfs stays near 5 µs (stop
/// 35, docs/benchmarks.md), so the figures depend on it.
fn filesystem(path: &std::path::Path) -> String {
    match nix::sys::statfs::statfs(path) {
        Ok(fs) => match fs.filesystem_type().0 {
            0xEF53 => "ext2/3/4".into(),
            0x0102_1994 => "tmpfs".into(),
            0x5846_5342 => "XFS".into(),
            0x9123_683E => "Btrfs".into(),
            0x794C_7630 => "overlayfs".into(),
            m => format!("a filesystem of magic {m:#x}"),
        },
        Err(e) => format!("a filesystem statfs cannot name ({e})"),
    }
}

/// The `leash serve` of the daemon subject's state root, stopped (SIGTERM, then waited for) on
/// drop.
struct Serve(std::process::Child);

impl Serve {
    fn start(
        leash: &PathBuf,
        envs: &[(&'static str, OsString)],
        state: &std::path::Path,
    ) -> Result<Serve, String> {
        let child = Command::new(leash)
            .arg("serve")
            .envs(envs.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start leash serve: {e}"))?;
        let serve = Serve(child);
        let pid = serve.0.id() as i32;
        let lock = state.join("daemon.lock");
        let socket = state.join("leash.sock");
        let up = crate::procs::wait_for(std::time::Duration::from_secs(30), || {
            std::fs::read_to_string(&lock).is_ok_and(|t| t.contains(&format!("\"pid\":{pid},")))
                && std::os::unix::net::UnixStream::connect(&socket).is_ok()
        });
        if !up {
            return Err("leash serve did not start listening within 30 s".into());
        }
        Ok(serve)
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        crate::procs::term_child(&self.0);
        let _ = self.0.wait();
    }
}

/// A private mount namespace with `n` extra tmpfs mounts under `dir` (a directory of this
/// section's scratch space, empty on the host), held by a child that made them and sleeps; its
/// `ns/mnt` is opened for `setns`. Killing the child on drop ends the namespace and its mounts.
struct Mounts {
    child: std::process::Child,
    ns: std::fs::File,
}

impl Mounts {
    fn new(dir: &std::path::Path, n: usize) -> Result<Mounts, String> {
        use std::io::BufRead;
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let script = format!(
            "set -e; d=\"$1\"; mount -t tmpfs none \"$d\"; i=0; while [ $i -lt {n} ]; do \
             mkdir \"$d/$i\"; mount -t tmpfs none \"$d/$i\"; i=$((i+1)); done; echo ready; \
             exec sleep 3600"
        );
        let mut child = Command::new("unshare")
            .args(["-m", "--propagation", "private", "sh", "-c", &script, "sh"])
            .arg(dir)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("cannot start unshare: {e}"))?;
        let out = child.stdout.take().expect("piped");
        let mut line = String::new();
        let _ = std::io::BufReader::new(out).read_line(&mut line);
        let ns = std::fs::File::open(format!("/proc/{}/ns/mnt", child.id()));
        if line.trim() != "ready" || ns.is_err() {
            crate::procs::term_child(&child);
            let _ = child.wait();
            return Err(format!(
                "the mount namespace of {n} mounts was not made ({})",
                ns.err()
                    .map_or("the child did not say ready".into(), |e| e.to_string())
            ));
        }
        Ok(Mounts {
            child,
            ns: ns.expect("checked"),
        })
    }
}

impl Drop for Mounts {
    fn drop(&mut self) {
        crate::procs::term_child(&self.child);
        let _ = self.child.wait();
    }
}

/// The issue's own floor under `leash exec` ("the wrapper plus one SQLite commit in WAL and one
/// mkdir") as one process: `bench/issue-floor.c`, static with musl, SQLite linked in, no daemon,
/// no round trip, no parser, no checks (built by `bench/setup.sh` into
/// `target/issue-floor/issue-floor`; without it these rows are skipped with a note). It commits
/// one row to a database of the bench's own (WAL, one table, its key the only index), makes the
/// lease's cgroup in a gateway directory held as the daemon holds its own, and execs the wrapper
/// with leash's options. Two more subjects leave out the cgroup or the row, to tell their costs
/// apart. If this is above 1.5× the bare wrapper, no design without a daemon that commits the
/// lease and makes its cgroup before the wrapper runs meets 1.5× on the host. A daemon's floor is
/// `exec-floor`: it pays a round trip, but no process's SQLite open per exec.
///
/// The bench holds a connection to the database open while it times, as a running gateway's
/// store would: each run then finds the WAL's index in shared memory, the case most favourable
/// to the floor. With no connection open, each run's open rebuilds that index by reading the
/// whole WAL (the program does not checkpoint on close), which grew its time from 3 to 11 ms
/// over one bench run; checkpointing on every close instead is what `leash` does.
struct IssueFloor {
    /// Held open while the runs are timed (see above).
    _held: rusqlite::Connection,
    bin: PathBuf,
    db: PathBuf,
    reports: PathBuf,
    /// The gateway's cgroup directory, held while the runs are timed; `None`: containment off.
    gateway: Option<HeldGateway>,
}

impl IssueFloor {
    fn path(env: &Env) -> Option<PathBuf> {
        let target = env.leash.parent()?.parent()?;
        Some(target.join("issue-floor").join("issue-floor"))
    }

    fn prepare(
        env: &Env,
        scratch: &TempDir,
        cgroup_root: Option<&std::path::Path>,
    ) -> Result<Option<IssueFloor>, String> {
        let Some(bin) = Self::path(env).filter(|p| p.is_file()) else {
            return Ok(None);
        };
        let dir = scratch.path().join("issue-floor");
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let db = dir.join("floor.db");
        let conn = floor_db(&db).map_err(|e| format!("issue-floor database: {e}"))?;
        // Where leash's own reports go in this run, else a directory of the scratch.
        let reports = match leash::state::resolve_reports_dir(&|k| std::env::var_os(k)) {
            Ok(Some(d)) => d,
            _ => {
                let d = dir.join("run");
                std::fs::create_dir_all(&d).map_err(|e| format!("{}: {e}", d.display()))?;
                d
            }
        };
        let gateway = match cgroup_root {
            Some(r) => Some(HeldGateway::new(
                r.join(format!("issue-floor-{}", std::process::id())),
            )?),
            None => None,
        };
        Ok(Some(IssueFloor {
            _held: conn,
            bin,
            db,
            reports,
            gateway,
        }))
    }

    fn subjects(&self, env: &Env) -> Vec<Subject> {
        let argv = |flags: &[&str]| -> Vec<OsString> {
            let mut v: Vec<OsString> = vec![self.bin.clone().into()];
            v.extend(flags.iter().map(OsString::from));
            if self.gateway.is_none() && !flags.contains(&"--no-cgroup") {
                v.push("--no-cgroup".into());
            }
            v.extend([
                self.db.clone().into(),
                self.gateway
                    .as_ref()
                    .map_or_else(|| PathBuf::from("/nonexistent"), |g| g.path().to_path_buf())
                    .into(),
                self.reports.clone().into(),
                env.wrap.clone().into(),
                "--".into(),
                env.true_bin.clone().into(),
            ]);
            v
        };
        let contained = if self.gateway.is_some() {
            "one row, the cgroup"
        } else {
            "one row; containment off"
        };
        let mut v = vec![Subject {
            name: "issue-floor",
            turns: DIRECT_TURNS,
            label: format!(
                "the issue's own floor as one static program, no daemon (`bench/issue-floor.c`: \
                 {contained}, the wrapper given leash's options)"
            ),
            argv: argv(&[]),
            envs: Vec::new(),
        }];
        if self.gateway.is_some() {
            v.push(Subject {
                name: "issue-floor-row",
                turns: DIRECT_TURNS,
                label: "the same, the row only (no cgroup)".into(),
                argv: argv(&["--no-cgroup"]),
                envs: Vec::new(),
            });
            v.push(Subject {
                name: "issue-floor-cgroup",
                turns: DIRECT_TURNS,
                label: "the same, the cgroup only (no row)".into(),
                argv: argv(&["--no-row"]),
                envs: Vec::new(),
            });
        }
        v
    }

    fn note(&self) -> String {
        format!(
            "\nThe issue's own floor (`{}`) is one static program with SQLite linked in and no \
             glibc: it commits one row in WAL (`synchronous=NORMAL`, one table) to {}, makes \
             the lease's cgroup, and execs the wrapper with leash's options. The bench holds \
             the database open meanwhile, so each run finds the WAL's index in shared memory \
             (the case most favourable to it). When it is above \
             1.5× the bare wrapper, so is every design without a daemon that commits the lease \
             and makes its cgroup before the wrapper runs; a daemon's floor is the least \
             daemon's row above (a round trip, but no SQLite open per exec).\n",
            self.bin.display(),
            filesystem(&self.db)
        )
    }

    fn missing_note() -> String {
        "\nThe issue's own floor as one program was not timed: `bench/setup.sh` builds it \
         (`bench/issue-floor.c`, with musl-gcc).\n"
            .into()
    }
}
