//! Containment: what a cgroup per session costs and saves, side by side in one run.
//! - `leash exec -- /bin/true` with and without containment, run for run in turns (mkdir of the
//!   cgroup, the commit, clone3 into it, the wrapper's rmdir: all in the contained figure);
//! - close of many TERM-ignoring trees with `cgroup.kill` against SIGKILL per pid (the `scale`
//!   section's staging, contained and not);
//! - `leash ps` over 200 sessions, from their cgroups and, with containment off, from their
//!   verified trees.
//!
//! Every cgroup is made under `<cgroup2 mount>/leash-bench-<pid>`, which this section makes and
//! removes (kill, wait, rmdir, bottom-up), also when it fails. Skipped unless root with cgroup2.

use crate::procs::{self, env_of, Children, TempDir, Tracked};
use crate::stats::{Summary, Table};
use crate::{Config, Env};
use leash::cgroup::{Requested, Settings};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A cgroup root this benchmark made; removed with everything below it on drop.
pub struct BenchRoot(pub PathBuf);

impl BenchRoot {
    pub fn new() -> Result<BenchRoot, String> {
        if !nix::unistd::geteuid().is_root() {
            return Err("skipped: needs root to create cgroups".into());
        }
        let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let mount = leash::cgroup::cgroup2_mount(&info).ok_or("skipped: no cgroup2 mount")?;
        // Left-overs of a benchmark that was killed before its clean-up: its pid is gone.
        if let Ok(rd) = std::fs::read_dir(&mount) {
            for e in rd.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                let dead = name
                    .strip_prefix("leash-bench-")
                    .and_then(|p| p.parse::<i32>().ok())
                    .is_some_and(|p| !Path::new(&format!("/proc/{p}")).exists());
                if dead {
                    drop(BenchRoot(e.path()));
                }
            }
        }
        let p = mount.join(format!("leash-bench-{}", std::process::id()));
        std::fs::create_dir(&p).map_err(|e| format!("mkdir {}: {e}", p.display()))?;
        Ok(BenchRoot(p))
    }
}

impl Drop for BenchRoot {
    fn drop(&mut self) {
        fn dirs(p: &Path, out: &mut Vec<PathBuf>) {
            if let Ok(rd) = std::fs::read_dir(p) {
                for e in rd.flatten() {
                    if e.file_type().is_ok_and(|t| t.is_dir()) {
                        dirs(&e.path(), out);
                    }
                }
            }
            out.push(p.to_path_buf());
        }
        let mut all = Vec::new();
        dirs(&self.0, &mut all);
        for d in &all {
            let _ = std::fs::write(d.join("cgroup.kill"), "1");
        }
        for d in &all {
            procs::wait_for(Duration::from_secs(10), || {
                std::fs::read_to_string(d.join("cgroup.events"))
                    .is_ok_and(|t| t.contains("populated 0"))
            });
            let _ = std::fs::remove_dir(d);
        }
    }
}

pub fn run(env: &Env, cfg: &Config) -> Result<String, String> {
    let root = match BenchRoot::new() {
        Ok(r) => r,
        Err(e) => return Ok(format!("\n### 6. Containment\n\n{e}\n")),
    };
    let on = Settings {
        requested: Requested::On,
        root: Some(root.0.clone()),
    };
    let off = Settings {
        requested: Requested::Off,
        root: None,
    };
    let mut out = format!(
        "\n### 6. Containment (a cgroup per session)\n\n{} rounds; median (min–max).\n\n",
        cfg.spawn_rounds
    );
    let mut t = Table::new(&["operation", "result", "target"]);

    // 1. exec of /bin/true, in turns.
    let scratch = TempDir::new("cg-exec");
    let batch = if cfg.quick { 20 } else { 100 };
    let (mut with, mut without) = (Vec::new(), Vec::new());
    for _ in 0..cfg.spawn_rounds {
        let (mut a, mut b) = (Vec::new(), Vec::new());
        for _ in 0..batch {
            for (settings, dir, out) in [(&on, "on", &mut a), (&off, "off", &mut b)] {
                let t0 = Instant::now();
                let st = Command::new(&env.leash)
                    .args(["exec", "--"])
                    .arg(&env.true_bin)
                    .env("LEASH_STATE_DIR", scratch.path().join(dir))
                    .envs(env_of(settings))
                    .stdin(Stdio::null())
                    .status()
                    .map_err(|e| e.to_string())?;
                out.push(t0.elapsed().as_secs_f64() * 1e3);
                if !st.success() {
                    return Err(format!("leash exec /bin/true ({dir}) failed: {st}"));
                }
            }
        }
        with.push(crate::stats::median(&a));
        without.push(crate::stats::median(&b));
    }
    let deltas: Vec<f64> = with.iter().zip(&without).map(|(a, b)| a - b).collect();
    let ms = |v: f64| format!("{v:.2} ms");
    t.row(vec![
        "`leash exec -- /bin/true`, containment off".into(),
        Summary::of(&without).show(ms),
        String::new(),
    ]);
    t.row(vec![
        "`leash exec -- /bin/true`, containment on (mkdir, clone3 into the cgroup, rmdir)".into(),
        Summary::of(&with).show(ms),
        String::new(),
    ]);
    let d = Summary::of(&deltas);
    t.row(vec![
        "… the cgroup's cost per session (on − off, per round)".into(),
        d.show(ms),
        crate::spawn::verdict(d.median <= 0.5, "≤ +0.5 ms"),
    ]);

    // 2. close of many TERM-ignoring trees: cgroup.kill against signals per pid.
    // In turns, so load bursts hit both alike.
    let (mut plain, mut contained) = (Vec::new(), Vec::new());
    for _ in 0..cfg.scale_rounds {
        plain.push(crate::scale::close_many(env, cfg, None)?.1);
        contained.push(crate::scale::close_many(env, cfg, Some(&root.0))?.1);
    }
    let g = cfg.close_grace_ms as f64 / 1e3;
    let s = |v: f64| format!("{v:.2} s");
    let c = Summary::of(&contained);
    t.row(vec![
        format!(
            "close {} TERM-ignoring trees, grace G = {g:.1} s, SIGKILL per pid (containment off)",
            cfg.close_leases
        ),
        Summary::of(&plain).show(s),
        String::new(),
    ]);
    t.row(vec![
        format!(
            "close {} TERM-ignoring trees, grace G = {g:.1} s, `cgroup.kill` per lease",
            cfg.close_leases
        ),
        c.show(s),
        crate::spawn::verdict(
            c.median < g + 0.44,
            &format!("< G + 0.44 s = {:.2} s", g + 0.44),
        ),
    ]);

    // 3. leash ps over 200 sessions.
    let n = if cfg.quick { 20 } else { 200 };
    let (ps_cg, ps_tree) = ps_over(env, &on, n, if cfg.quick { 3 } else { 15 })?;
    t.row(vec![
        format!("`leash ps --json` over {n} sessions, from their cgroups"),
        Summary::of(&ps_cg).show(ms),
        crate::spawn::verdict(crate::stats::median(&ps_cg) <= 50.0, "≤ 50 ms"),
    ]);
    t.row(vec![
        format!(
            "`leash ps --json` over the same {n} sessions with containment off (verified trees)"
        ),
        Summary::of(&ps_tree).show(ms),
        String::new(),
    ]);
    out.push_str(&t.render());
    Ok(out)
}

/// Starts `n` contained sessions (`sleep`), then times `leash ps --json` `runs` times each way.
fn ps_over(
    env: &Env,
    on: &Settings,
    n: usize,
    runs: usize,
) -> Result<(Vec<f64>, Vec<f64>), String> {
    let scratch = TempDir::new("cg-ps");
    let state = scratch.path().join("state");
    let mut children = Children::new();
    let mut tracked = Tracked::new();
    for i in 0..n {
        let c = Command::new(&env.leash)
            .args(["exec", "--session", &format!("ps-{i}"), "--"])
            .arg(&env.sleep)
            .arg("600")
            .env("LEASH_STATE_DIR", &state)
            .envs(env_of(on))
            .stdin(Stdio::null())
            .spawn()
            .map_err(|e| e.to_string())?;
        tracked.add_pid(c.id() as i32);
        let pid = c.id() as i32;
        children.push(c);
        procs::wait_for(Duration::from_secs(30), || {
            !procs::children_of(pid).is_empty()
        });
        tracked.add_tree(pid);
    }
    let time = |settings: Vec<(&'static str, std::ffi::OsString)>| -> Result<f64, String> {
        let t0 = Instant::now();
        let out = Command::new(&env.leash)
            .args(["ps", "--json"])
            .env("LEASH_STATE_DIR", &state)
            .envs(settings)
            .output()
            .map_err(|e| e.to_string())?;
        let dt = t0.elapsed().as_secs_f64() * 1e3;
        let v: serde_json::Value =
            serde_json::from_slice(&out.stdout).map_err(|e| e.to_string())?;
        if v["sessions"].as_array().map_or(0, Vec::len) != n {
            return Err(format!("leash ps listed the wrong sessions: {v}"));
        }
        Ok(dt)
    };
    let (mut cg, mut tree) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        cg.push(time(env_of(on))?);
        tree.push(time(env_of(&Settings::default_off()))?);
    }
    tracked.kill_all();
    children.finish(Duration::from_secs(10));
    Ok((cg, tree))
}
