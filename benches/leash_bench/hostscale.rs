//! Host scale: what `leash exec` with a reused session key, `leash close` of one idle
//! session and `leash reap` cost on a quiet host and with N unrelated processes running (N = 0,
//! 500, 2,000, 10,000 where pid_max and the process limit allow), side by side in one run, with
//! the ratios against the quiet figure. The unrelated processes are `sleep`s this section starts
//! as its own children and kills by pid (its unreaped children: their pids cannot be recycled).
//!
//! `LEASH_BENCH_BASELINE=/path/to/leash` times another build the same way, in turns with this
//! one at every level (a "before" column; its `leash-wrap` must lie next to it).

use crate::procs::{self, Children, TempDir};
use crate::stats::{median, Table};
use crate::{Config, Env};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// One build's figures at one level, in ms.
#[derive(Default, Clone)]
struct Figures {
    /// The control: spawning `/bin/true` from the same process, no leash at all.
    spawn: Vec<f64>,
    exec: Vec<f64>,
    close: Vec<f64>,
    reap: Vec<f64>,
}

impl Figures {
    fn medians(&self) -> (f64, f64, f64) {
        (median(&self.exec), median(&self.close), median(&self.reap))
    }
}

/// A build under test and its own state root.
struct Subject {
    leash: PathBuf,
    state: PathBuf,
}

pub(crate) fn timed(cmd: &mut Command) -> Result<f64, String> {
    let t0 = Instant::now();
    let st = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map_err(|e| e.to_string())?;
    let dt = t0.elapsed().as_secs_f64() * 1e3;
    if !st.success() {
        return Err(format!("{cmd:?} failed: {st}"));
    }
    Ok(dt)
}

impl Subject {
    fn leash(&self) -> Command {
        let mut c = Command::new(&self.leash);
        c.env("LEASH_STATE_DIR", &self.state)
            .env("LEASH_CONTAINMENT", "off");
        c
    }

    /// `leash exec --session hs-exec -- true`: the key's previous lease is open with its root
    /// gone (the wrapper exits with `true`), so every run decides that it is over.
    fn exec(&self, env: &Env) -> Result<f64, String> {
        timed(
            self.leash()
                .args(["exec", "--session", "hs-exec", "--"])
                .arg(&env.true_bin),
        )
    }

    /// Starts an idle session (`sleep`), then times `leash close --session hs-close`.
    fn close(&self, env: &Env) -> Result<f64, String> {
        let mut child = self
            .leash()
            .args(["exec", "--session", "hs-close", "--"])
            .arg(&env.sleep)
            .arg("600")
            .stdin(Stdio::null())
            .spawn()
            .map_err(|e| e.to_string())?;
        let pid = child.id() as i32;
        let started = procs::wait_for(Duration::from_secs(30), || {
            !procs::children_of(pid).is_empty()
        });
        let dt = if started {
            timed(self.leash().args(["close", "--session", "hs-close"]))
        } else {
            Err("the idle session never started its adapter".into())
        };
        if dt.is_err() {
            let _ = child.kill();
        }
        let _ = child.wait();
        dt
    }

    fn reap(&self) -> Result<f64, String> {
        timed(self.leash().args(["reap"]))
    }
}

fn host_processes() -> usize {
    std::fs::read_dir("/proc")
        .map(|rd| {
            rd.flatten()
                .filter(|e| e.file_name().to_string_lossy().parse::<u32>().is_ok())
                .count()
        })
        .unwrap_or(0)
}

/// How many unrelated processes this machine has room for: pid_max and RLIMIT_NPROC, less what
/// runs already, with 2,000 to spare.
pub fn room() -> usize {
    let read = |p: &str| -> Option<usize> { std::fs::read_to_string(p).ok()?.trim().parse().ok() };
    let pid_max = read("/proc/sys/kernel/pid_max").unwrap_or(32_768);
    let nproc = {
        let mut r = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit fills a local struct we own.
        if unsafe { libc::getrlimit(libc::RLIMIT_NPROC, &mut r) } == 0 {
            usize::try_from(r.rlim_cur).unwrap_or(usize::MAX)
        } else {
            usize::MAX
        }
    };
    pid_max.min(nproc).saturating_sub(host_processes() + 2_000)
}

/// The levels this machine allows: pid_max and RLIMIT_NPROC with room to spare.
fn levels(cfg: &Config) -> Vec<usize> {
    let room = room();
    let want: &[usize] = if cfg.quick {
        &[0, 500, 2_000]
    } else {
        &[0, 500, 2_000, 10_000]
    };
    want.iter().copied().filter(|&n| n <= room).collect()
}

fn measure(env: &Env, s: &Subject, f: &mut Figures, runs: usize) -> Result<(), String> {
    for _ in 0..runs {
        f.exec.push(s.exec(env)?);
        f.spawn.push(timed(&mut Command::new(&env.true_bin))?);
    }
    for _ in 0..runs.div_ceil(3) {
        f.close.push(s.close(env)?);
    }
    for _ in 0..runs.div_ceil(5).max(2) {
        f.reap.push(s.reap()?);
    }
    Ok(())
}

pub fn run(env: &Env, cfg: &Config) -> Result<String, String> {
    let scratch = TempDir::new("hostscale");
    let mut subjects = vec![(
        "this build".to_string(),
        Subject {
            leash: env.leash.clone(),
            state: scratch.path().join("state"),
        },
    )];
    if let Some(b) = std::env::var_os("LEASH_BENCH_BASELINE").map(PathBuf::from) {
        if !Path::new(&b).is_file() {
            return Err(format!(
                "LEASH_BENCH_BASELINE={} is not a file",
                b.display()
            ));
        }
        subjects.push((
            "baseline".to_string(),
            Subject {
                leash: b,
                state: scratch.path().join("state-baseline"),
            },
        ));
    }
    let runs: usize = if cfg.quick { 6 } else { 30 };
    let levels = levels(cfg);
    // Warm-up: the state roots, the installed wrappers, the page cache.
    for (_, s) in &subjects {
        s.exec(env)?;
        s.close(env)?;
    }
    let mut sleepers = Children::new();
    let mut results: Vec<(usize, usize, Vec<Figures>)> = Vec::new();
    for &n in &levels {
        eprintln!("leash-bench: hostscale: {n} unrelated processes");
        sleepers.grow_sleepers(&env.sleep, n)?;
        let mut figs = vec![Figures::default(); subjects.len()];
        // In turns, a few runs at a time, so load bursts hit every build alike.
        for _ in 0..3 {
            for (i, (_, s)) in subjects.iter().enumerate() {
                measure(env, s, &mut figs[i], runs.div_ceil(3))?;
            }
        }
        results.push((n, host_processes(), figs));
    }
    // Quiet again, after the levels: the quiet figure the ratios use pools both quiet runs, so a
    // load burst during one of them (the machine is shared) moves the baseline less.
    sleepers.finish(Duration::ZERO);
    let mut again = vec![Figures::default(); subjects.len()];
    for _ in 0..3 {
        for (i, (_, s)) in subjects.iter().enumerate() {
            measure(env, s, &mut again[i], runs.div_ceil(3))?;
        }
    }
    if let Some((_, _, first)) = results.first_mut() {
        for (f, a) in first.iter_mut().zip(&again) {
            f.exec.extend_from_slice(&a.exec);
            f.spawn.extend_from_slice(&a.spawn);
            f.close.extend_from_slice(&a.close);
            f.reap.extend_from_slice(&a.reap);
        }
    }
    results.push((0, host_processes(), again));

    let mut out = format!(
        "\n### 8. Host scale\n\nContainment off. Per level: {} runs of `leash exec \
         --session K -- true` (K reused: its previous lease is open, its root gone), {} of \
         `leash close --session C` of an idle session (`sleep`), {} of `leash reap`; median ms, \
         and the ratio to the quiet host; the control is a plain spawn of `true` from the same \
         process, which no leash change can touch (N = 0: the first row pools the quiet runs before and after \
         the levels; the last row is the quiet run after them alone). The unrelated processes are \
         `sleep`s.\n\n",
        3 * runs.div_ceil(3),
        3 * runs.div_ceil(3).div_ceil(3),
        3 * runs.div_ceil(3).div_ceil(5).max(2),
    );
    let mut head = vec!["build", "N unrelated", "processes on host"];
    head.extend([
        "spawn `true` (control, ms)",
        "×quiet",
        "exec (ms)",
        "×quiet",
        "close (ms)",
        "×quiet",
        "reap (ms)",
        "×quiet",
    ]);
    let mut t = Table::new(&head);
    let quiet: Vec<(f64, f64, f64)> = results
        .first()
        .map(|(_, _, f)| f.iter().map(Figures::medians).collect())
        .unwrap_or_default();
    let quiet_spawn: Vec<f64> = results
        .first()
        .map(|(_, _, f)| f.iter().map(|x| median(&x.spawn)).collect())
        .unwrap_or_default();
    for (i, (name, _)) in subjects.iter().enumerate() {
        for (n, host, figs) in &results {
            let (e, c, r) = figs[i].medians();
            let (qe, qc, qr) = quiet[i];
            let (sp, qsp) = (median(&figs[i].spawn), quiet_spawn[i]);
            t.row(vec![
                name.clone(),
                n.to_string(),
                host.to_string(),
                format!("{sp:.2}"),
                format!("{:.2}×", sp / qsp),
                format!("{e:.2}"),
                format!("{:.2}×", e / qe),
                format!("{c:.2}"),
                format!("{:.2}×", c / qc),
                format!("{r:.2}"),
                format!("{:.2}×", r / qr),
            ]);
        }
    }
    out.push_str(&t.render());

    // The targets, for this build.
    let mut v = Table::new(&["target", "figure", ""]);
    let at = |n: usize| {
        results
            .iter()
            .find(|(m, _, _)| *m == n)
            .map(|(_, _, f)| f[0].medians())
    };
    if let (Some(q), Some(b)) = (at(0), at(2_000)) {
        v.row(vec![
            "exec, reused key, at 2,000: ≤ 1.5× quiet and ≤ 5 ms".into(),
            format!("{:.2} ms, {:.2}× (quiet {:.2} ms)", b.0, b.0 / q.0, q.0),
            crate::spawn::verdict(b.0 <= 1.5 * q.0 && b.0 <= 5.0, "≤ 1.5× and ≤ 5 ms"),
        ]);
        v.row(vec![
            "close of one session, at 2,000: ≤ 1.5× quiet + 20 ms".into(),
            format!("{:.2} ms (quiet {:.2} ms)", b.1, q.1),
            crate::spawn::verdict(
                b.1 <= 1.5 * q.1 + 20.0,
                &format!("≤ {:.1} ms", 1.5 * q.1 + 20.0),
            ),
        ]);
        v.row(vec![
            "reap (one host-wide pass), at 2,000".into(),
            format!("{:.2} ms ({:.2}× quiet)", b.2, b.2 / q.2),
            "reported".into(),
        ]);
    }
    if let (Some(q), Some(b)) = (at(0), at(10_000)) {
        v.row(vec![
            "reap (one host-wide pass), at 10,000".into(),
            format!("{:.2} ms ({:.2}× quiet)", b.2, b.2 / q.2),
            "reported".into(),
        ]);
        v.row(vec![
            "exec / close at 10,000".into(),
            format!(
                "{:.2} ms ({:.2}×) / {:.2} ms ({:.2}×)",
                b.0,
                b.0 / q.0,
                b.1,
                b.1 / q.1
            ),
            String::new(),
        ]);
    }
    out.push('\n');
    out.push_str(&v.render());
    Ok(out)
}
