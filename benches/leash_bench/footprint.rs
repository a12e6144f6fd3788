//! Footprint: the resident memory of each wrapper process while its adapter (`sleep`) runs, and
//! the size of its binary on disk.
//!
//! RSS is read from the wrapper's own pid (`/proc/<pid>/status` VmRSS, RssAnon, RssFile, and Pss
//! from `smaps_rollup`) once the adapter has exec'd and the wrapper sleeps in its wait loop.
//! VmRSS counts shared pages (libc, the binary's page-cache pages) in full for every process that
//! maps them; that is the figure the peers are usually quoted with, so it is the headline. The
//! target: `leash-wrap` ≤ 0.25 MB; the line under the table gives the ratio to catatonit's, and
//! the next the sizes of the two programs leash ships, `leash` and `leash-wrap`.

use crate::pdeath::node_wrapper_script;
use crate::procs::{self, Children, Rss, Tracked};
use crate::spawn::verdict;
use crate::stats::{self, Summary, Table};
use crate::{file_size, Config, Env};
use std::ffi::OsString;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

struct Subject {
    name: String,
    argv: Vec<OsString>,
    envs: Vec<(String, OsString)>,
    binary: PathBuf,
    /// For `leash exec`: the process runs the wrapper only after it has exec'd it from here.
    exe_under: Option<PathBuf>,
    size_note: String,
}

pub fn run(env: &Env, cfg: &Config) -> Result<String, String> {
    let scratch = procs::TempDir::new("footprint");
    let state = scratch.path().join("state");
    let mut subjects = Vec::new();
    for (name, prefix) in env.wrappers(cfg) {
        let binary = PathBuf::from(&prefix[0]);
        subjects.push(Subject {
            name,
            argv: prefix,
            envs: Vec::new(),
            binary,
            exe_under: None,
            size_note: String::new(),
        });
    }
    subjects.push(Subject {
        name: "leash exec (the wrapper it execs)".into(),
        argv: vec![env.leash.clone().into(), "exec".into(), "--".into()],
        envs: vec![("LEASH_STATE_DIR".into(), state.clone().into())],
        binary: env.wrap.clone(),
        exe_under: Some(state.join("wrappers")),
        size_note: " (installed copy of leash-wrap)".into(),
    });
    if let Some(node) = &env.node {
        let script = node_wrapper_script(scratch.path())?;
        subjects.push(Subject {
            name: "Node wrapper (incumbent stand-in)".into(),
            argv: vec![node.clone().into(), script.clone().into(), "--".into()],
            envs: Vec::new(),
            binary: node.clone(),
            exe_under: None,
            size_note: format!(" + {} B script", file_size(&script)),
        });
    }

    let mut out = format!(
        "\n### 2. Footprint\n\nEach wrapper runs `sleep 60` as its adapter; once the adapter \
         has exec'd and the wrapper sleeps in its wait loop, its own `/proc/<pid>` is read. \
         {} measurements each; median (min–max). MB = 1024 kB as `/proc` counts them. Binary \
         sizes are the files as shipped (leash-wrap: release profile, stripped).\n\n",
        cfg.footprint_runs
    );
    let mut t = Table::new(&[
        "wrapper", "VmRSS", "Pss", "RssAnon", "RssFile", "binary", "linked", "target",
    ]);
    let mut medians = Vec::new();
    for s in &subjects {
        let mut samples = Vec::new();
        for _ in 0..cfg.footprint_runs {
            samples.push(measure(env, s)?);
        }
        let col = |f: fn(&Rss) -> f64| {
            let v: Vec<f64> = samples.iter().map(f).collect();
            Summary::of(&v)
        };
        let rss = col(|r| r.rss);
        medians.push((s.name.clone(), rss.median));
        let target = if s.name == "leash-wrap" {
            verdict(rss.median <= 0.25 * 1024.0, "≤ 0.25 MB")
        } else {
            String::new()
        };
        t.row(vec![
            format!("`{}`", s.name),
            rss.show(stats::mb),
            col(|r| r.pss).show(stats::mb),
            col(|r| r.anon).show(stats::mb),
            col(|r| r.file).show(stats::mb),
            format!(
                "{:.0} kB{}",
                file_size(&s.binary) as f64 / 1024.0,
                s.size_note
            ),
            match procs::elf_is_dynamic(&s.binary) {
                Some(true) => "dynamic".into(),
                Some(false) => "static".into(),
                None => "?".into(),
            },
            target,
        ]);
    }
    out.push_str(&t.render());
    let median_of = |name: &str| medians.iter().find(|(n, _)| n == name).map(|m| m.1);
    if let (Some(w), Some(c)) = (median_of("leash-wrap"), median_of("catatonit")) {
        out.push_str(&format!(
            "\n`leash-wrap` VmRSS ÷ `catatonit` VmRSS (medians): {}\n",
            stats::ratio(w / c)
        ));
    }
    out.push_str(&format!(
        "\nThe programs leash ships (release profile, stripped): `leash` {:.0} kB, `leash-wrap` \
         {:.0} kB.\n",
        file_size(&env.leash) as f64 / 1024.0,
        file_size(&env.wrap) as f64 / 1024.0
    ));
    Ok(out)
}

fn measure(env: &Env, s: &Subject) -> Result<Rss, String> {
    let mut children = Children::new();
    let mut tracked = Tracked::new();
    let child = Command::new(&s.argv[0])
        .args(&s.argv[1..])
        .arg(&env.sleep)
        .arg("60")
        .envs(s.envs.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("{}: cannot start: {e}", s.name))?;
    let pid = child.id() as i32;
    children.push(child);
    tracked.add_pid(pid);

    let settled = || -> bool {
        if let Some(dir) = &s.exe_under {
            if !procs::exe_of(pid).is_some_and(|e| e.starts_with(dir)) {
                return false;
            }
        }
        let adapter_running = procs::children_of(pid)
            .into_iter()
            .any(|c| procs::exe_of(c).as_deref() == Some(env.sleep.as_path()));
        adapter_running && procs::state_of(pid) == Some('S')
    };
    let ready = procs::wait_for(Duration::from_secs(20), || {
        settled() && {
            // Still asleep a moment later: the wrapper is in its wait loop, not between steps.
            std::thread::sleep(Duration::from_millis(30));
            settled()
        }
    });
    if !ready {
        return Err(format!("{}: the adapter did not start within 20 s", s.name));
    }
    for c in procs::children_of(pid) {
        tracked.add_pid(c);
    }
    let rss = procs::rss_of(pid).ok_or_else(|| format!("{}: cannot read its RSS", s.name))?;
    crate::procs::term_child(&children.list[0]);
    if children.finish(Duration::from_secs(10)) > 0 {
        return Err(format!("{}: did not exit within 10 s of SIGTERM", s.name));
    }
    tracked.kill_all();
    Ok(rss)
}
