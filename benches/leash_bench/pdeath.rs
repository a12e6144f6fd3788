//! Parent death → the adapter's SIGTERM: how long after its owner is SIGKILLed does the adapter
//! learn that it must stop?
//!
//! Staging, per trial: this binary starts a *parent* (itself, `--role pdeath-parent`), which
//! starts the wrapper under test, which starts an *adapter* (itself, `--role pdeath-adapter`).
//! The adapter blocks SIGTERM, takes it from a signalfd, and prints the CLOCK_REALTIME time at
//! which it woke up; it prints `ready` first, so the kill never races the set-up. The benchmark
//! reads the clock, SIGKILLs the parent (its own child), and takes the difference. Everything
//! runs as our own processes; whatever is left after a trial is killed by pid and start time.
//!
//! The wrappers with parent-death handling take turns (one trial of each per turn, 200 turns),
//! on the quiet host and again with 2,000 idle unrelated `sleep`s this section starts and kills
//! by pid; `leash-wrap`'s p99 is judged against tini's (`-p SIGTERM`) from the same turns.

use crate::procs::{self, Children, TempDir, Tracked};
use crate::spawn::verdict;
use crate::stats::{self, Table};
use crate::{Config, Env};
use std::ffi::OsString;
use std::io::{BufRead, BufReader, Write};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

const SCRIPT: &str = include_str!("incumbent-wrapper.js");

/// Writes the Node stand-in for the incumbent's wrapper into `dir`.
pub fn node_wrapper_script(dir: &Path) -> Result<PathBuf, String> {
    let p = dir.join("incumbent-wrapper.js");
    std::fs::write(&p, SCRIPT).map_err(|e| format!("cannot write {}: {e}", p.display()))?;
    Ok(p)
}

fn realtime_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

/// The helper roles this binary plays inside a staging.
pub fn role(args: &[OsString]) -> i32 {
    match args.first().and_then(|a| a.to_str()) {
        Some("pdeath-parent") => parent(&args[1..]),
        Some("pdeath-adapter") => adapter(),
        _ => {
            eprintln!("leash-bench: unknown role");
            2
        }
    }
}

/// Starts the command and waits; the benchmark SIGKILLs us while it runs.
fn parent(args: &[OsString]) -> i32 {
    let cmd = match args.first() {
        Some(a) if a == "--" => &args[1..],
        _ => args,
    };
    if cmd.is_empty() {
        return 2;
    }
    match Command::new(&cmd[0]).args(&cmd[1..]).spawn() {
        Ok(mut c) => c.wait().ok().and_then(|s| s.code()).unwrap_or(1),
        Err(e) => {
            eprintln!("leash-bench parent: cannot start {:?}: {e}", cmd[0]);
            127
        }
    }
}

/// Reports `ready <pid>`, then `term <realtime ns>` when SIGTERM arrives (or gives up after a
/// minute, so a broken staging cannot leave it behind for long).
fn adapter() -> i32 {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    use nix::sys::signal::{SigSet, Signal};
    use nix::sys::signalfd::{SfdFlags, SignalFd};

    let mut mask = SigSet::empty();
    mask.add(Signal::SIGTERM);
    if mask.thread_block().is_err() {
        return 1;
    }
    let Ok(sfd) = SignalFd::with_flags(&mask, SfdFlags::SFD_CLOEXEC) else {
        return 1;
    };
    let mut out = std::io::stdout().lock();
    if writeln!(out, "ready {}", std::process::id())
        .and_then(|()| out.flush())
        .is_err()
    {
        return 1;
    }
    let mut fds = [PollFd::new(sfd.as_fd(), PollFlags::POLLIN)];
    match poll(&mut fds, PollTimeout::from(60_000u16)) {
        Ok(n) if n > 0 => {}
        _ => return 3,
    }
    let now = realtime_ns();
    let _ = writeln!(out, "term {now}").and_then(|()| out.flush());
    0
}

struct Subject {
    name: String,
    /// The wrapper's argv up to the adapter command.
    argv: Vec<OsString>,
    envs: Vec<(String, OsString)>,
    trials: usize,
    /// How long to wait for the adapter's SIGTERM before calling the trial "not signalled".
    patience: Duration,
    has_pdeath: bool,
}

enum Outcome {
    Signalled(f64),
    NotSignalled,
}

pub fn run(env: &Env, cfg: &Config) -> Result<String, String> {
    let scratch = TempDir::new("pdeath");
    let state = scratch.path().join("state");
    let mut subjects = Vec::new();
    let subject = |name: &str, argv: Vec<OsString>, trials, patience_ms, has_pdeath| Subject {
        name: name.to_string(),
        argv,
        envs: Vec::new(),
        trials,
        patience: Duration::from_millis(patience_ms),
        has_pdeath,
    };
    subjects.push(subject(
        "leash-wrap",
        vec![env.wrap.clone().into(), "--".into()],
        cfg.pdeath_trials,
        3_000,
        true,
    ));
    for (name, path) in &cfg.extra_wrappers {
        subjects.push(subject(
            name,
            vec![path.clone().into(), "--".into()],
            cfg.pdeath_trials,
            3_000,
            true,
        ));
    }
    let mut exec = subject(
        "leash exec",
        vec![env.leash.clone().into(), "exec".into(), "--".into()],
        cfg.pdeath_trials,
        3_000,
        true,
    );
    exec.envs
        .push(("LEASH_STATE_DIR".into(), state.clone().into()));
    subjects.push(exec);
    for (name, tini) in [("tini", &env.tini), ("tini-static", &env.tini_static)] {
        if let Some(t) = tini {
            subjects.push(subject(
                &format!("{name} -s -g -p SIGTERM"),
                vec![
                    t.clone().into(),
                    "-s".into(),
                    "-g".into(),
                    "-p".into(),
                    "SIGTERM".into(),
                    "--".into(),
                ],
                cfg.pdeath_trials,
                3_000,
                true,
            ));
        }
    }
    if let Some(node) = &env.node {
        let script = node_wrapper_script(scratch.path())?;
        subjects.push(subject(
            "Node wrapper (incumbent stand-in, 1 s polling)",
            vec![node.clone().into(), script.into(), "--".into()],
            cfg.pdeath_trials_node,
            3_000,
            true,
        ));
    }
    if let Some(d) = &env.dumb_init {
        subjects.push(subject(
            "dumb-init",
            vec![d.clone().into()],
            3,
            1_000,
            false,
        ));
    }
    if let Some(c) = &env.catatonit {
        subjects.push(subject(
            "catatonit",
            vec![c.clone().into(), "--".into()],
            3,
            1_000,
            false,
        ));
    }

    // The wrappers that handle parent death are measured in turns, one trial of each per turn,
    // so whatever else the host does at a moment falls on all of them alike; on the quiet host
    // and again with thousands of idle unrelated processes. Wrappers without parent-death
    // handling (their trials only wait out the patience) and the Node stand-in (1 s polling)
    // run once, on the quiet host.
    let (turned, alone): (Vec<Subject>, Vec<Subject>) = subjects
        .into_iter()
        .partition(|s| s.has_pdeath && !s.name.starts_with("Node"));
    let crowd = if cfg.quick { 200 } else { 2_000 };
    let mut out = String::from(
        "\n### 3. Parent death → the adapter's SIGTERM\n\nPer trial: a parent process runs the \
         wrapper, whose adapter blocks SIGTERM and takes it from a signalfd; once the adapter \
         reports ready, the parent is SIGKILLed, and the latency runs from just before that \
         kill to the moment the adapter wakes with SIGTERM (CLOCK_REALTIME, ns, both sides). \
         The wrappers take turns (one trial of each per turn), on the quiet host and with idle \
         unrelated `sleep` processes; `leash-wrap`'s target is a p99 no worse than tini's in the \
         same run (and ≤ 1 ms). Percentiles are nearest-rank over all trials; `over 1 ms` counts the \
         trials slower than 1 ms.\n\n",
    );
    let mut t = Table::new(&[
        "host",
        "wrapper",
        "trials",
        "p50",
        "p99",
        "min",
        "max",
        "over 1 ms",
        "not signalled",
        "target",
    ]);
    for n in [0, crowd] {
        let mut sleepers = Children::new();
        sleepers.grow_sleepers(&env.sleep, n)?;
        let host = if n == 0 {
            "quiet".to_string()
        } else {
            format!("+{n} sleeps")
        };
        let mut lat: Vec<Vec<f64>> = vec![Vec::new(); turned.len()];
        let mut missed = vec![0usize; turned.len()];
        for _ in 0..cfg.pdeath_trials {
            for (i, s) in turned.iter().enumerate() {
                match trial(env, s)? {
                    Outcome::Signalled(ms) => lat[i].push(ms),
                    Outcome::NotSignalled => missed[i] += 1,
                }
            }
        }
        let p99 = |l: &[f64]| {
            if l.is_empty() {
                f64::INFINITY
            } else {
                stats::percentile(l, 99.0)
            }
        };
        // The best tini of the run (dynamic or static): the bar leash-wrap must meet.
        let tini_p99 = turned
            .iter()
            .zip(&lat)
            .filter(|(s, _)| s.name.starts_with("tini"))
            .map(|(_, l)| p99(l))
            .fold(f64::INFINITY, f64::min);
        for (i, s) in turned.iter().enumerate() {
            let target = if s.name == "leash-wrap" {
                let mine = p99(&lat[i]);
                let vs_tini = if tini_p99.is_finite() {
                    format!(
                        "p99 ≤ tini's ({}, {}) {}",
                        stats::ms(tini_p99),
                        stats::ratio(mine / tini_p99),
                        if missed[i] == 0 && mine <= tini_p99 {
                            "**met**"
                        } else {
                            "**missed**"
                        }
                    )
                } else {
                    "tini missing: not compared".to_string()
                };
                format!(
                    "{vs_tini}; {}",
                    verdict(missed[i] == 0 && mine <= 1.0, "p99 ≤ 1 ms")
                )
            } else {
                String::new()
            };
            t.row(row(&host, s, &lat[i], missed[i], target));
        }
        drop(sleepers);
    }
    for s in &alone {
        let mut lat = Vec::new();
        let mut missed = 0;
        for _ in 0..s.trials {
            match trial(env, s)? {
                Outcome::Signalled(ms) => lat.push(ms),
                Outcome::NotSignalled => missed += 1,
            }
        }
        t.row(row("quiet", s, &lat, missed, String::new()));
    }
    out.push_str(&t.render());
    Ok(out)
}

/// One table row: percentiles of the latencies (ms) of a subject's trials.
fn row(host: &str, s: &Subject, lat: &[f64], missed: usize, target: String) -> Vec<String> {
    let cell = |p: f64| {
        if lat.is_empty() {
            "—".to_string()
        } else {
            stats::ms(stats::percentile(lat, p))
        }
    };
    let not_signalled = if s.has_pdeath {
        format!("{missed}")
    } else {
        format!(
            "{missed}/{} (no parent-death handling; waited {} ms)",
            s.trials,
            s.patience.as_millis()
        )
    };
    vec![
        host.to_string(),
        format!("`{}`", s.name),
        s.trials.to_string(),
        cell(50.0),
        cell(99.0),
        cell(0.0),
        cell(100.0),
        // The tail as a count: a p99 of 200 trials is the second slowest, and which wrapper the
        // host's few slow moments fall on decides it; the count says whether one wrapper is
        // slow more often.
        lat.iter().filter(|&&l| l > 1.0).count().to_string(),
        not_signalled,
        target,
    ]
}

fn trial(env: &Env, s: &Subject) -> Result<Outcome, String> {
    let mut children = Children::new();
    let mut tracked = Tracked::new();
    let mut parent = Command::new(&env.this)
        .args(["--role", "pdeath-parent", "--"])
        .args(&s.argv)
        .arg(&env.this)
        .args(["--role", "pdeath-adapter"])
        .envs(s.envs.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("{}: cannot start the parent: {e}", s.name))?;
    let stdout = parent.stdout.take().expect("piped stdout");
    let parent_pid = parent.id() as i32;
    children.push(parent);

    let (tx, rx) = mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });

    let ready = rx
        .recv_timeout(Duration::from_secs(20))
        .map_err(|_| format!("{}: the adapter did not report ready", s.name))?;
    let adapter: i32 = ready
        .strip_prefix("ready ")
        .and_then(|p| p.parse().ok())
        .ok_or_else(|| format!("{}: unexpected line from the adapter: {ready}", s.name))?;
    tracked.add_pid(adapter);
    let info = leash::proc::ProcessTable::process(&leash::proc::LiveTable, adapter)
        .ok()
        .flatten()
        .ok_or_else(|| format!("{}: the adapter vanished before the kill", s.name))?;
    let wrapper = info.ppid;
    tracked.add_pid(wrapper);
    let wrapper_parent = leash::proc::ProcessTable::process(&leash::proc::LiveTable, wrapper)
        .ok()
        .flatten()
        .map(|p| p.ppid);
    if wrapper_parent != Some(parent_pid) {
        return Err(format!(
            "{}: staging broken: the adapter's parent {wrapper} is not the parent's child",
            s.name
        ));
    }

    let t0 = realtime_ns();
    let _ = children.list[0].kill();
    let outcome = match rx.recv_timeout(s.patience) {
        Ok(line) => {
            let t1: u128 = line
                .strip_prefix("term ")
                .and_then(|t| t.parse().ok())
                .ok_or_else(|| format!("{}: unexpected line from the adapter: {line}", s.name))?;
            Outcome::Signalled(t1.saturating_sub(t0) as f64 / 1e6)
        }
        Err(RecvTimeoutError::Timeout) => Outcome::NotSignalled,
        Err(RecvTimeoutError::Disconnected) => {
            return Err(format!(
                "{}: the adapter exited without reporting SIGTERM",
                s.name
            ))
        }
    };
    if matches!(outcome, Outcome::Signalled(_)) {
        // The adapter exits on SIGTERM, then the wrapper once its tree is gone: the pipe closes.
        let closed = procs::wait_for(Duration::from_secs(5), || {
            matches!(rx.try_recv(), Err(mpsc::TryRecvError::Disconnected))
        });
        if !closed {
            eprintln!(
                "leash-bench: {}: the wrapper did not exit within 5 s of its adapter",
                s.name
            );
        }
    }
    tracked.kill_all();
    children.finish(Duration::from_secs(5));
    Ok(outcome)
}
