//! Reap of contained leases on a busy host: `leash reap` over 100 contained sessions
//! (live, owned by this process: every one is planned from its root, owner and cgroup, and
//! skipped), on a quiet host and with 10,000 unrelated processes, in the same round. The control
//! is the same reap of the same state with containment off, which takes the host-wide pass (what a
//! reap takes for uncontained leases). Each round measures quiet, then busy (the `sleep`s started,
//! measured, killed); the ratio is per round, busy against that round's quiet figure.
//!
//! The history row: the same reap over another 100 live contained
//! sessions whose state root also retains 2,000 closed contained leases (what days of closed
//! sessions leave within the 7-day retention; their cgroups gone, their pids long dead), against
//! the row without them, in the same round: the history should cost no `/proc` read, only its
//! rows in SQLite.
//!
//! The sessions' cgroups are made under `<cgroup2 mount>/leash-bench-<pid>` (removed on drop,
//! also on failure). Skipped unless root with cgroup2.

use crate::containment::BenchRoot;
use crate::procs::env_of;
use crate::procs::{self, Children, TempDir};
use crate::stats::{median, Summary, Table};
use crate::{Config, Env};
use leash::cgroup::{Requested, Settings};
use std::process::{Command, Stdio};
use std::time::Duration;

const SESSIONS: usize = 100;
/// Retained closed leases in the history row's state root.
const HISTORY: usize = 2_000;

/// Starts `SESSIONS` contained sessions `<prefix>-<i>` (a `sleep` each) in `state`.
fn start_sessions(
    env: &Env,
    state: &std::path::Path,
    on: &Settings,
    prefix: &str,
    wrappers: &mut Children,
) -> Result<(), String> {
    for i in 0..SESSIONS {
        let c = Command::new(&env.leash)
            .args(["exec", "--session", &format!("{prefix}-{i}"), "--"])
            .arg(&env.sleep)
            .arg("3600")
            .env("LEASH_STATE_DIR", state)
            .envs(env_of(on))
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
            return Err(format!("session {prefix}-{i} never started its adapter"));
        }
    }
    Ok(())
}

/// Adds `HISTORY` closed contained leases to `state`, copies of one live session's row with their
/// own ids and keys, ended an hour ago (well within the retention), their cgroups where this
/// gateway puts them but removed, their root and adapter pids distinct and long gone.
fn add_history(state: &std::path::Path) -> Result<(), String> {
    use leash_core::model::LeaseState;
    let root = leash::state::StateRoot::open(state).map_err(|e| e.to_string())?;
    let mut store = leash::store::Store::open(&root.db_path()).map_err(|e| e.to_string())?;
    let t = store
        .leases(&[LeaseState::Open])
        .map_err(|e| e.to_string())?
        .into_iter()
        .flatten()
        .next()
        .ok_or("no open lease to copy")?;
    let gateway_dir = std::path::Path::new(t.cgroup_path.as_deref().ok_or("lease not contained")?)
        .parent()
        .ok_or("cgroup path has no parent")?
        .to_path_buf();
    let now = leash::lease::now_ms();
    for i in 0..HISTORY {
        let mut l = t.clone();
        l.lease_id = leash::lease::new_lease_id();
        l.session_key = format!("history-{i}");
        l.state = LeaseState::Closed;
        l.state_reason = Some("terminated 2 process(es) children first".into());
        l.closed_at = Some(now - 3_600_000);
        l.claimed_by = None;
        l.root_pid = 3_000_000 + 2 * i as i32;
        l.adapter_pid = Some(3_000_001 + 2 * i as i32);
        l.cgroup_path = Some(gateway_dir.join(&l.lease_id).display().to_string());
        l.cgroup_id = Some(1_000_000 + i as u64);
        store
            .insert_lease(&l, None, |_| None)
            .map_err(|e| e.to_string())?;
    }
    Ok(())
}

fn reap(env: &Env, state: &std::path::Path, settings: &Settings) -> Result<f64, String> {
    crate::hostscale::timed(
        Command::new(&env.leash)
            .arg("reap")
            .env("LEASH_STATE_DIR", state)
            .envs(env_of(settings)),
    )
}

pub fn run(env: &Env, cfg: &Config) -> Result<String, String> {
    let title = "\n### Reap of contained leases on a busy host\n\n";
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
    let hist = scratch.path().join("state-history");
    let busy_n: usize = if cfg.quick { 2_000 } else { 10_000 };
    let rounds = if cfg.quick {
        2
    } else {
        cfg.spawn_rounds.clamp(3, 5)
    };
    let per = if cfg.quick { 3 } else { 7 };

    let mut wrappers = Children::new();
    start_sessions(env, &state, &on, "hr", &mut wrappers)?;
    start_sessions(env, &hist, &on, "hh", &mut wrappers)?;
    add_history(&hist)?;
    // Warm-up.
    reap(env, &state, &on)?;
    reap(env, &state, &off)?;
    reap(env, &hist, &on)?;

    let (mut q_on, mut b_on, mut q_off, mut b_off) = (vec![], vec![], vec![], vec![]);
    let (mut q_hist, mut b_hist) = (vec![], vec![]);
    let (mut r_on, mut r_off, mut r_hist) = (vec![], vec![], vec![]);
    let (mut h_quiet, mut h_busy) = (vec![], vec![]);
    let mut loads = Vec::new();
    let mut host = 0;
    for round in 0..rounds {
        eprintln!("leash-bench: hostreap: round {} of {rounds}", round + 1);
        let phase = |a: &mut Vec<f64>, b: &mut Vec<f64>, h: &mut Vec<f64>| -> Result<(), String> {
            let (mut x, mut y, mut z) = (Vec::new(), Vec::new(), Vec::new());
            for _ in 0..per {
                x.push(reap(env, &state, &on)?);
                y.push(reap(env, &state, &off)?);
                z.push(reap(env, &hist, &on)?);
            }
            a.push(median(&x));
            b.push(median(&y));
            h.push(median(&z));
            Ok(())
        };
        phase(&mut q_on, &mut q_off, &mut q_hist)?;
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
        phase(&mut b_on, &mut b_off, &mut b_hist)?;
        sleepers.finish(Duration::ZERO);
        r_on.push(b_on[round] / q_on[round]);
        r_off.push(b_off[round] / q_off[round]);
        r_hist.push(b_hist[round] / q_hist[round]);
        h_quiet.push(q_hist[round] / q_on[round]);
        h_busy.push(b_hist[round] / b_on[round]);
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
    t.row(vec![
        format!("containment on, and {HISTORY} retained closed leases in the store"),
        Summary::of(&q_hist).show(ms),
        Summary::of(&b_hist).show(ms),
        Summary::of(&r_hist).show(x),
        "reported".into(),
    ]);
    out.push_str(&t.render());
    out.push_str(&format!(
        "\nWhat the history costs (reap reads no `/proc` entry for a closed lease whose \
         cgroup is gone): the reap of {SESSIONS} sessions plus {HISTORY} retained closed leases \
         against the same reap without them, per round in the same run.\n\n"
    ));
    let mut h = Table::new(&["history / no history", "quiet", "busy", "target"]);
    let (hq, hb) = (Summary::of(&h_quiet), Summary::of(&h_busy));
    h.row(vec![
        format!("{HISTORY} closed leases"),
        hq.show(x),
        hb.show(x),
        crate::spawn::verdict(hq.median <= 1.5 && hb.median <= 1.5, "≤ 1.5×"),
    ]);
    out.push_str(&h.render());
    Ok(out)
}
