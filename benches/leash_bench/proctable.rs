//! Process-table work on a busy host: 2,000 extra live processes (our own `sleep`s), one live
//! lease (`leash exec` of a shell with two children). Measured: verifying that lease's tree the
//! way `close` does when its wrapper is alive (`LiveTable::subtree` + `verify_owned_tree`), the
//! same verification over a full `LiveTable::snapshot` (what `reap` reads), the snapshot alone,
//! and the incumbent's way: running `ps -axo pid=,ppid=,pgid=,command=` and parsing all of it
//! for the lease's marker. Also the daemon's idle reconcile pass over that state root (it must
//! read only the lease rows and their owners' and roots' `/proc` entries, so it should not grow
//! with the host) and `leash verify`'s read.

use crate::procs::{self, Children, TempDir, Tracked};
use crate::spawn::verdict;
use crate::stats::{self, Summary, Table};
use crate::{Config, Env};
use leash::controller::Controller;
use leash::proc::{LiveTable, ProcessTable};
use leash::state::StateRoot;
use leash_core::model::Snapshot;
use leash_core::verify::{verify_owned_tree, Expect, Verdict};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const SESSION: &str = "bench-verify";

pub fn run(env: &Env, cfg: &Config) -> Result<String, String> {
    let scratch = TempDir::new("proctable");
    let state_dir = scratch.path().join("state");
    let root = StateRoot::open(&state_dir).map_err(|e| e.to_string())?;
    let mut children = Children::new();
    let mut tracked = Tracked::new();

    // The lease: wrapper → sh → two sleeps, in the adapter's group.
    let sh = procs::which("sh").ok_or("sh is not on PATH")?;
    let lease_proc = Command::new(&env.leash)
        .args(["exec", "--session", SESSION, "--grace-ms", "1000", "--"])
        .arg(&sh)
        .args(["-c", "sleep 600 & sleep 600 & wait"])
        .env("LEASH_STATE_DIR", &state_dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start leash exec: {e}"))?;
    let root_pid = lease_proc.id() as i32;
    children.push(lease_proc);
    // The wrapper's first report record is where the lease's row says (the reports directory).
    let reported = || {
        let Ok(ctl) = Controller::open(root.clone(), &LiveTable) else {
            return false;
        };
        let Ok(Some(lease)) = ctl.store().active_lease_for_session(SESSION) else {
            return false;
        };
        root.report_file(&lease.lease_id, lease.report_dir.as_deref())
            .is_some_and(|p| p.exists())
    };
    let ready = procs::wait_for(Duration::from_secs(30), || {
        LiveTable.subtree(root_pid).is_ok_and(|s| s.len() == 4)
            && root.db_path().exists()
            && reported()
    });
    if !ready {
        return Err("the staged lease's tree did not come up within 30 s".into());
    }
    tracked.add_tree(root_pid);

    let ctl = Controller::open(root.clone(), &LiveTable).map_err(|e| e.to_string())?;
    ctl.ingest_reports_marking_ended_lost()
        .map_err(|e| e.to_string())?;
    let lease = ctl
        .store()
        .active_lease_for_session(SESSION)
        .map_err(|e| e.to_string())?
        .ok_or("the staged lease is not in the store")?;
    if lease.process_group_id.is_none() {
        return Err("the wrapper's report was not folded into the lease".into());
    }
    let gateway = ctl.store().gateway_instance_id().to_string();
    drop(ctl);
    let wrapper_root = root.wrapper_root();
    let expect = Expect {
        gateway_instance_id: &gateway,
        wrapper_root: &wrapper_root,
        cgroup_root: None,
    };
    // Each measured operation must also be right: a fast wrong answer is no answer.
    let verify = |snap: &Snapshot| -> Result<(), String> {
        match verify_owned_tree(&lease, &expect, snap) {
            Verdict::Owned(t) if t.len() == 4 => Ok(()),
            other => Err(format!(
                "verification gave {} instead of the 4-process tree",
                other.name()
            )),
        }
    };

    // The crowd.
    let mut sleepers = Children::new();
    sleepers.grow_sleepers(&env.sleep, cfg.extra_procs)?;
    let host_procs = LiveTable.snapshot().map_err(|e| e.to_string())?.len();
    let marker = lease.lease_id.clone();

    let mut subtree = Vec::new();
    let mut full_verify = Vec::new();
    let mut snapshot = Vec::new();
    let mut floor = Vec::new();
    let mut ps = Vec::new();
    let mut ps_lines = 0;
    let mut reconcile = Vec::new();
    let mut verify_cmd = Vec::new();
    let me = leash::proc::self_id();
    let time = |reps: usize, f: &mut dyn FnMut() -> Result<(), String>| -> Result<f64, String> {
        let mut v = Vec::with_capacity(reps);
        for _ in 0..reps {
            let t = Instant::now();
            f()?;
            v.push(t.elapsed().as_secs_f64() * 1e3);
        }
        Ok(stats::median(&v))
    };
    let reps_fast = if cfg.quick { 20 } else { 200 };
    let reps_slow = if cfg.quick { 3 } else { 9 };
    for _ in 0..cfg.table_rounds {
        subtree.push(time(reps_fast, &mut || {
            let snap = LiveTable.subtree(root_pid).map_err(|e| e.to_string())?;
            verify(&snap)
        })?);
        full_verify.push(time(reps_slow, &mut || {
            let snap = LiveTable.snapshot().map_err(|e| e.to_string())?;
            verify(&snap)
        })?);
        snapshot.push(time(reps_slow, &mut || {
            let snap = LiveTable.snapshot().map_err(|e| e.to_string())?;
            std::hint::black_box(snap.len());
            Ok(())
        })?);
        floor.push(time(reps_slow, &mut || {
            if stat_pass() < cfg.extra_procs {
                return Err("the /proc scan missed processes".into());
            }
            Ok(())
        })?);
        // The daemon holds one controller for its life: a pass does not open the store.
        let ctl = leash::controller::Controller::open(root.clone(), &LiveTable)
            .map_err(|e| e.to_string())?;
        reconcile.push(time(reps_fast, &mut || {
            let r = leash::reconcile::pass(&ctl, me, Duration::from_secs(86_400))
                .map_err(|e| e.to_string())?;
            if r.active != 1 || r.acted() {
                return Err(format!("the idle pass saw {} leases or acted", r.active));
            }
            Ok(())
        })?);
        verify_cmd.push(time(reps_fast, &mut || {
            // As `leash verify` runs it: one controller for the process, then the verb.
            let r = Controller::open(root.clone(), &LiveTable)
                .map_err(|e| e.to_string())?
                .verify(&leash::controller::LeaseRef::Id(lease.lease_id.clone()))
                .map_err(|e| e.to_string())?;
            if r.answer != leash_core::answer::Answer::Owned {
                return Err(format!("leash verify answered {}", r.answer.as_str()));
            }
            Ok(())
        })?);
        ps.push(time(reps_slow, &mut || {
            let (lines, hits) = ps_and_parse(&marker)?;
            if hits == 0 {
                return Err("ps did not show the lease's marker".into());
            }
            ps_lines = lines;
            Ok(())
        })?);
    }

    // Close the lease (SIGTERM to its wrapper, our child, which drains its tree), then the crowd.
    procs::term_child(&children.list[0]);
    children.finish(Duration::from_secs(10));
    tracked.kill_all();
    drop(sleepers);

    let per_round = |num: &[f64], den: &[f64]| -> Summary {
        let r: Vec<f64> = num.iter().zip(den).map(|(a, b)| a / b).collect();
        Summary::of(&r)
    };
    let mut out = format!(
        "\n### 4. Process-table work with {} extra processes\n\n{host_procs} processes on the \
         host during the run (`ps` listed {ps_lines}). The lease verified is a live `leash exec` \
         of `sh -c 'sleep 600 & sleep 600 & wait'` (4 processes); every verification must \
         return its 4-process tree. {} rounds; per round the median of {reps_fast} (subtree, reconcile, verify) or \
         {reps_slow} (everything else) repetitions; median (min–max) over rounds. \"ps ÷ this\" \
         is per round.\n\n",
        cfg.extra_procs, cfg.table_rounds
    );
    let mut t = Table::new(&["operation", "time", "ps ÷ this", "target"]);
    t.row(vec![
        "`ps -axo pid=,ppid=,pgid=,command=`, run and parsed, marker searched (the incumbent)"
            .into(),
        Summary::of(&ps).show(stats::ms),
        "1×".into(),
        String::new(),
    ]);
    for (label, v, target) in [
        (
            "verify one lease: `LiveTable::subtree` + `verify_owned_tree` (close)",
            &subtree,
            true,
        ),
        (
            "verify one lease over a full `LiveTable::snapshot` (reap)",
            &full_verify,
            false,
        ),
        ("full `LiveTable::snapshot` alone", &snapshot, true),
        (
            "idle reconcile pass of `leash serve` (1 live lease; opens the store, reads rows, \
             owner/root `/proc`)",
            &reconcile,
            true,
        ),
        (
            "`leash verify --lease` read: row + root subtree + judge (no process start)",
            &verify_cmd,
            true,
        ),
        (
            "floor of any full scan: list `/proc`, read every `/proc/<pid>/stat` once \
             (bench code, not leash's)",
            &floor,
            false,
        ),
    ] {
        let r = per_round(&ps, v);
        t.row(vec![
            label.into(),
            Summary::of(v).show(stats::ms),
            r.show(stats::ratio),
            if target {
                verdict(r.median >= 20.0, "≥ 20×")
            } else {
                String::new()
            },
        ]);
    }
    out.push_str(&t.render());
    Ok(out)
}

/// Runs `ps` as the incumbent does and parses every line; returns the line count and how many
/// lines carry the marker.
fn ps_and_parse(marker: &str) -> Result<(usize, usize), String> {
    let out = Command::new("ps")
        .args(["-axo", "pid=,ppid=,pgid=,command="])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run ps: {e}"))?;
    if !out.status.success() {
        return Err(format!("ps failed: {}", out.status));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let mut lines = 0;
    let mut hits = 0;
    for line in text.lines() {
        let mut it = line.split_whitespace();
        let (Some(pid), Some(ppid), Some(pgid)) = (it.next(), it.next(), it.next()) else {
            continue;
        };
        let parsed: Result<Vec<i32>, _> = [pid, ppid, pgid].iter().map(|s| s.parse()).collect();
        if parsed.is_err() {
            continue;
        }
        lines += 1;
        let command: Vec<&str> = it.collect();
        if command.iter().any(|w| w.contains(marker)) {
            hits += 1;
        }
    }
    Ok((lines, hits))
}

/// The least a full scan of the process table must do: list `/proc` and read each process's
/// `stat` (parent, group, start time). Returns how many processes it read.
fn stat_pass() -> usize {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return 0;
    };
    let mut n = 0;
    for e in dir.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let rest = &text[text.rfind(')').map_or(0, |i| i + 1)..];
        let f: Vec<&str> = rest.split_whitespace().collect();
        if f.len() > 19 {
            std::hint::black_box((f[1], f[2], f[19]));
            n += 1;
        }
    }
    n
}
