//! Start-up overhead: how much longer `WRAPPER -- /bin/true` takes than `/bin/true`, for
//! leash-wrap and each peer, and how `leash exec -- /bin/true` (lease committed to SQLite, then
//! the wrapper exec'd in place) compares with starting Node, the incumbent wrapper's runtime.
//!
//! Each run is a whole process: spawned, waited for, timed from before the spawn to after the
//! reap. Within a round the commands take turns run by run, and each command's figure for the
//! round is the median of its runs; ratios are taken against `/bin/true` of the same round.

use crate::procs::TempDir;
use crate::stats::{self, Summary, Table};
use crate::{Config, Env};
use leash::state::StateRoot;
use leash::store::Store;
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::process::{Command, Stdio};
use std::time::Instant;

struct Subject {
    name: String,
    /// How the command reads in the report.
    label: String,
    argv: Vec<OsString>,
    envs: Vec<(String, OsString)>,
    batch: usize,
    /// Medians of each round, in ms.
    rounds: Vec<f64>,
}

impl Subject {
    fn new(name: &str, argv: Vec<OsString>, batch: usize) -> Subject {
        let label = argv
            .iter()
            .enumerate()
            .map(|(i, a)| {
                let a = a.to_string_lossy();
                // The binary's name, not its build path.
                if i == 0 {
                    a.rsplit('/').next().unwrap_or(&a).to_string()
                } else {
                    a.into_owned()
                }
            })
            .collect::<Vec<_>>()
            .join(" ");
        Subject {
            name: name.to_string(),
            label: format!("`{label}`"),
            argv,
            envs: Vec::new(),
            batch,
            rounds: Vec::new(),
        }
    }

    fn command(&self) -> Command {
        let mut c = Command::new(&self.argv[0]);
        c.args(&self.argv[1..])
            .envs(self.envs.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        c
    }

    /// One run, in ms; an error when the command fails (a broken subject is not a fast one).
    fn once(&self) -> Result<f64, String> {
        let mut c = self.command();
        let t = Instant::now();
        let status = c
            .status()
            .map_err(|e| format!("{}: cannot start: {e}", self.name))?;
        let dt = t.elapsed().as_secs_f64() * 1e3;
        if !status.success() {
            return Err(format!("{}: exited with {status}", self.name));
        }
        Ok(dt)
    }
}

pub fn run(env: &Env, cfg: &Config) -> Result<String, String> {
    let state = TempDir::new("spawn");
    let true_argv = vec![OsString::from(&env.true_bin)];
    let mut subjects = vec![Subject::new(
        "/bin/true",
        true_argv.clone(),
        cfg.spawn_batch,
    )];
    for (name, prefix) in env.wrappers(cfg) {
        let mut argv = prefix;
        argv.push(env.true_bin.clone().into());
        subjects.push(Subject::new(&name, argv, cfg.spawn_batch));
    }
    let mut exec = Subject::new(
        "leash exec",
        vec![
            env.leash.clone().into(),
            "exec".into(),
            "--".into(),
            env.true_bin.clone().into(),
        ],
        cfg.spawn_batch,
    );
    exec.envs
        .push(("LEASH_STATE_DIR".into(), state.path().as_os_str().into()));
    subjects.push(exec);
    // The same, with the database also open in this process, as a running daemon would hold it:
    // then `leash exec` is not the last connection to close, so SQLite neither creates the WAL
    // on open nor checkpoints and deletes it on close (the fsyncs of an otherwise idle store).
    let held_state = TempDir::new("spawn-held");
    let held_root = StateRoot::open(held_state.path()).map_err(|e| e.to_string())?;
    let _held = Store::open(&held_root.db_path()).map_err(|e| e.to_string())?;
    let mut held = Subject::new(
        "leash exec (held)",
        subjects.last().expect("leash exec").argv.clone(),
        cfg.spawn_batch,
    );
    held.label = format!(
        "{}, its database also open elsewhere (as a daemon would hold it)",
        held.label
    );
    held.envs.push((
        "LEASH_STATE_DIR".into(),
        held_state.path().as_os_str().into(),
    ));
    subjects.push(held);
    if let Some(node) = &env.node {
        subjects.push(Subject::new(
            "node -e 0",
            vec![node.clone().into(), "-e".into(), "0".into()],
            cfg.spawn_batch_slow,
        ));
    }

    // Warm-up: page cache, the wrapper install of the first `leash exec`, and a check that every
    // subject works at all.
    for s in &subjects {
        for _ in 0..3 {
            s.once()?;
        }
    }
    // Run by run: within a round every command takes its turn in each slot (a slower command,
    // with a smaller batch, only in every k-th slot), so a burst of load on this shared machine
    // hits all of them alike instead of one command's whole batch.
    let slots = subjects.iter().map(|s| s.batch).max().unwrap_or(0);
    for _ in 0..cfg.spawn_rounds {
        let mut batches: Vec<Vec<f64>> = subjects
            .iter()
            .map(|s| Vec::with_capacity(s.batch))
            .collect();
        for slot in 0..slots {
            for (s, batch) in subjects.iter().zip(batches.iter_mut()) {
                let every = slots / s.batch;
                if slot % every == 0 && batch.len() < s.batch {
                    batch.push(s.once()?);
                }
            }
        }
        for (s, batch) in subjects.iter_mut().zip(&batches) {
            s.rounds.push(stats::median(batch));
        }
    }

    let by_name: BTreeMap<&str, &Subject> = subjects.iter().map(|s| (s.name.as_str(), s)).collect();
    let base = &by_name["/bin/true"].rounds;
    let per_round = |s: &Subject, b: &[f64]| -> Summary {
        let r: Vec<f64> = s.rounds.iter().zip(b).map(|(x, y)| x / y).collect();
        Summary::of(&r)
    };

    let mut out = String::new();
    out.push_str(&format!(
        "\n### 1. Spawn overhead\n\n{} rounds; each round runs every command {} times \
         (Node {} times), the commands taking turns run by run; per command the round's median; \
         shown: median (min–max) over rounds. Ratios are per round, against `/bin/true` of the \
         same round.\n\n",
        cfg.spawn_rounds, cfg.spawn_batch, cfg.spawn_batch_slow
    ));
    let mut t = Table::new(&["command", "wall time", "× `/bin/true`", "target"]);
    for s in &subjects {
        let (label, target) = match s.name.as_str() {
            "/bin/true" => ("`/bin/true` (direct)".to_string(), String::new()),
            "leash-wrap" => (
                s.label.clone(),
                verdict(per_round(s, base).median <= 1.8, "≤ 1.8×"),
            ),
            "leash exec" => (
                format!("{} (lease commit included)", s.label),
                String::new(),
            ),
            "leash exec (held)" => (s.label.clone(), String::new()),
            name if cfg.extra_wrappers.iter().any(|(n, _)| n == name) => {
                (format!("{} (`{name}`)", s.label), String::new())
            }
            _ => (s.label.clone(), String::new()),
        };
        t.row(vec![
            label,
            Summary::of(&s.rounds).show(stats::ms),
            per_round(s, base).show(stats::ratio),
            target,
        ]);
    }
    out.push_str(&t.render());
    // The wrapper spawns in catatonit's class; a memory saving must not cost that.
    if let Some(cat) = by_name.get("catatonit") {
        let r = per_round(by_name["leash-wrap"], &cat.rounds);
        out.push_str(&format!(
            "\n`leash-wrap -- /bin/true` ÷ `catatonit -- /bin/true`, per round: {} — target \
             ≤ 1.05×: {}\n",
            r.show(stats::ratio),
            verdict(r.median <= 1.05, "")
        ));
    }
    if let Some(node) = by_name.get("node -e 0") {
        let exec = by_name["leash exec"];
        let r = per_round(node, &exec.rounds);
        out.push_str(&format!(
            "\n`node -e 0` ÷ `leash exec -- /bin/true`, per round: {} — target ≥ 10×: {}\n",
            r.show(stats::ratio),
            verdict(r.median >= 10.0, "")
        ));
        let held = by_name["leash exec (held)"];
        let r = per_round(node, &held.rounds);
        out.push_str(&format!(
            "\n`node -e 0` ÷ `leash exec -- /bin/true` with its database held open elsewhere, \
             per round: {}\n",
            r.show(stats::ratio),
        ));
    }
    Ok(out)
}

pub fn verdict(met: bool, target: &str) -> String {
    let sep = if target.is_empty() { "" } else { " " };
    format!(
        "{target}{sep}{}",
        if met { "**met**" } else { "**missed**" }
    )
}
