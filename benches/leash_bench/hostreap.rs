//! Reap of contained leases on a busy host (issue 24): `leash reap` over 100 contained sessions
//! (live, owned by this process: every one is planned from its root, owner and cgroup, and
//! skipped), on a quiet host and with 10,000 unrelated processes, in the same round. The control
//! is the same reap of the same state with containment off, which takes the host-wide pass (what
//! every reap took before issue 24). Each round measures quiet, then busy (the `sleep`s started,
//! measured, killed); the ratio is per round, busy against that round's quiet figure.
//!
//! The sessions' cgroups are made under `<cgroup2 mount>/leash-bench-<pid>` (removed on drop,
//! also on failure). Skipped unless root with cgroup2.

use crate::containment::{env_of, BenchRoot};
use crate::procs::{self, Children, TempDir};
use crate::stats::{median, Summary, Table};
use crate::{Config, Env};
use leash::cgroup::{Requested, Settings};
use std::process::{Command, Stdio};
use std::time::Duration;

const SESSIONS: usize = 100;

fn reap(env: &Env, state: &std::path::Path, settings: &Settings) -> Result<f64, String> {
    crate::hostscale::timed(
        Command::new(&env.leash)
            .arg("reap")
            .env("LEASH_STATE_DIR", state)
            .envs(env_of(settings)),
    )
}

pub fn run(env: &Env, cfg: &Config) -> Result<String, String> {
    let title = "\n### Reap of contained leases on a busy host (issue 24)\n\n";
    // Dropped last: kills and removes what is left in the sessions' cgroups.
    let root = match BenchRoot::new() {
        Ok(r) => r,
        Err(e) => return Ok(format!("{title}{e}\n")),
    };
    let on = Settings {
        requested: Requested::On,
        root: Some(root.0.clone()),
    };
    let off = Settings {
        requested: Requested::Off,
        root: None,
    };
    let scratch = TempDir::new("hostreap");
    let state = scratch.path().join("state");
    let busy_n: usize = if cfg.quick { 2_000 } else { 10_000 };
    let rounds = if cfg.quick {
        2
    } else {
        cfg.spawn_rounds.clamp(3, 5)
    };
    let per = if cfg.quick { 3 } else { 7 };

    let mut wrappers = Children::new();
    for i in 0..SESSIONS {
        let c = Command::new(&env.leash)
            .args(["exec", "--session", &format!("hr-{i}"), "--"])
            .arg(&env.sleep)
            .arg("3600")
            .env("LEASH_STATE_DIR", &state)
            .envs(env_of(&on))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| e.to_string())?;
        let pid = c.id() as i32;
        wrappers.push(c);
        if !procs::wait_for(Duration::from_secs(30), || {
            !procs::children_of(pid).is_empty()
        }) {
            return Err(format!("session hr-{i} never started its adapter"));
        }
    }
    // Warm-up.
    reap(env, &state, &on)?;
    reap(env, &state, &off)?;

    let (mut q_on, mut b_on, mut q_off, mut b_off) = (vec![], vec![], vec![], vec![]);
    let (mut r_on, mut r_off) = (vec![], vec![]);
    let mut loads = Vec::new();
    let mut host = 0;
    for round in 0..rounds {
        eprintln!("leash-bench: hostreap: round {} of {rounds}", round + 1);
        let phase = |a: &mut Vec<f64>, b: &mut Vec<f64>| -> Result<(), String> {
            let (mut x, mut y) = (Vec::new(), Vec::new());
            for _ in 0..per {
                x.push(reap(env, &state, &on)?);
                y.push(reap(env, &state, &off)?);
            }
            a.push(median(&x));
            b.push(median(&y));
            Ok(())
        };
        phase(&mut q_on, &mut q_off)?;
        let mut sleepers = Children::new();
        sleepers.grow_sleepers(&env.sleep, busy_n)?;
        host = std::fs::read_dir("/proc")
            .map(|rd| {
                rd.flatten()
                    .filter(|e| e.file_name().to_string_lossy().parse::<u32>().is_ok())
                    .count()
            })
            .unwrap_or(0);
        loads.push(crate::loadavg());
        phase(&mut b_on, &mut b_off)?;
        sleepers.finish(Duration::ZERO);
        r_on.push(b_on[round] / q_on[round]);
        r_off.push(b_off[round] / q_off[round]);
    }
    drop(wrappers);

    let ms = |v: f64| format!("{v:.1} ms");
    let x = |v: f64| format!("{v:.2}×");
    let mut out = format!(
        "{title}`leash reap` over {SESSIONS} contained live sessions (each planned and skipped), \
         {rounds} rounds of {per} reaps per figure; per round the median, then over rounds the \
         median (min–max). Busy: {busy_n} unrelated `sleep`s ({host} processes on the host); \
         load at the busy phases: {}.\n\n",
        loads.join(", ")
    );
    let mut t = Table::new(&[
        "reap",
        "quiet",
        "busy",
        "busy / quiet (per round)",
        "target",
    ]);
    let on_ratio = Summary::of(&r_on);
    t.row(vec![
        "containment on: the leases' roots, owners and cgroups".into(),
        Summary::of(&q_on).show(ms),
        Summary::of(&b_on).show(ms),
        on_ratio.show(x),
        crate::spawn::verdict(on_ratio.median <= 1.5, "≤ 1.5×"),
    ]);
    t.row(vec![
        "control, containment off: the host-wide pass".into(),
        Summary::of(&q_off).show(ms),
        Summary::of(&b_off).show(ms),
        Summary::of(&r_off).show(x),
        "reported".into(),
    ]);
    out.push_str(&t.render());
    Ok(out)
}
