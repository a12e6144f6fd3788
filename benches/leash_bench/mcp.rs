//! `leash mcp` start-up: an agent host starts one MCP server per agent session, so the time from
//! the server's exec to its answer to `initialize` is paid on every session. Measured as a whole
//! process — spawn, write `initialize`, read the response line — next to the same round trip
//! through `cat` (exec plus one line each way, nothing else: the floor for any stdio server), in
//! the same rounds, taking turns run by run. Also the first `sessions_list` answer (the state
//! database opened on first use, and read). Target: `initialize` answered within
//! 20 ms of exec.

use crate::procs::TempDir;
use crate::stats::{self, Summary, Table};
use crate::{Config, Env};
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::Instant;

const INITIALIZE: &str = concat!(
    r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","#,
    r#""capabilities":{},"clientInfo":{"name":"leash-bench","version":"0"}}}"#,
    "\n"
);
const LIST: &str = concat!(
    r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"sessions_list","arguments":{}}}"#,
    "\n"
);

struct Subject {
    label: &'static str,
    cmd: Box<dyn Fn() -> Command>,
    /// Lines to write; the time is taken when as many lines have been read back.
    input: Vec<&'static str>,
    rounds: Vec<f64>,
    all: Vec<f64>,
}

impl Subject {
    /// One run in ms: spawn, write the lines, read as many back, then EOF and reap (not timed).
    fn once(&self) -> Result<f64, String> {
        let t = Instant::now();
        let mut child = (self.cmd)()
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("{}: cannot start: {e}", self.label))?;
        let mut stdin = child.stdin.take().expect("piped");
        let mut out = BufReader::new(child.stdout.take().expect("piped"));
        let mut line = String::new();
        for msg in &self.input {
            stdin
                .write_all(msg.as_bytes())
                .map_err(|e| format!("{}: write: {e}", self.label))?;
            line.clear();
            out.read_line(&mut line)
                .map_err(|e| format!("{}: read: {e}", self.label))?;
            if !line.contains("\"jsonrpc\"") || line.contains("\"error\"") {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("{}: unexpected answer {line:?}", self.label));
            }
        }
        let dt = t.elapsed().as_secs_f64() * 1e3;
        drop(stdin);
        let status = child.wait().map_err(|e| e.to_string())?;
        if !status.success() {
            return Err(format!("{}: exited with {status}", self.label));
        }
        Ok(dt)
    }
}

pub fn run(env: &Env, cfg: &Config) -> Result<String, String> {
    let state = TempDir::new("mcp");
    let dir = state.path().to_path_buf();
    let leash = env.leash.clone();
    // `leash mcp` reads an existing state root (only exec, serve and legacy import create one):
    // create it the way a gateway does, with one short session.
    let init = Command::new(&leash)
        .arg("--state-dir")
        .arg(&dir)
        .args([
            "exec",
            "--containment",
            "off",
            "--session",
            "init",
            "--",
            "true",
        ])
        .env_remove("LEASH_LOG")
        .output()
        .map_err(|e| format!("cannot run leash exec: {e}"))?;
    if !init.status.success() {
        return Err(format!(
            "leash exec (creating the state root) failed: {}",
            String::from_utf8_lossy(&init.stderr)
        ));
    }
    let mcp = move || {
        let mut c = Command::new(&leash);
        c.arg("--state-dir")
            .arg(&dir)
            .args(["mcp", "--as", "agent:main:main"])
            .env_remove("LEASH_LOG");
        c
    };
    let mcp2 = mcp.clone();
    let cat = crate::procs::which("cat").ok_or("cat is not on PATH")?;
    let mut subjects = vec![
        Subject {
            label: "`cat`: one line each way (the floor)",
            cmd: Box::new(move || Command::new(&cat)),
            input: vec![INITIALIZE],
            rounds: Vec::new(),
            all: Vec::new(),
        },
        Subject {
            label: "`leash mcp`: exec → `initialize` answered",
            cmd: Box::new(mcp),
            input: vec![INITIALIZE],
            rounds: Vec::new(),
            all: Vec::new(),
        },
        Subject {
            label: "`leash mcp`: exec → first `sessions_list` answered",
            cmd: Box::new(mcp2),
            input: vec![INITIALIZE, LIST],
            rounds: Vec::new(),
            all: Vec::new(),
        },
    ];
    // Warm-up, and a check that every subject works.
    for s in &subjects {
        for _ in 0..3 {
            s.once()?;
        }
    }
    for _ in 0..cfg.spawn_rounds {
        let mut batches: Vec<Vec<f64>> = vec![Vec::new(); subjects.len()];
        for _ in 0..cfg.mcp_batch {
            for (s, b) in subjects.iter().zip(batches.iter_mut()) {
                b.push(s.once()?);
            }
        }
        for (s, b) in subjects.iter_mut().zip(batches) {
            s.rounds.push(stats::median(&b));
            s.all.extend(b);
        }
    }
    let base = subjects[0].rounds.clone();
    let mut out = format!(
        "\n### MCP server start-up (`leash mcp`)\n\n{} rounds of {} runs per command, the commands \
         taking turns run by run; per command the round's median, shown as median (min–max) over \
         rounds; p99 over all runs. Ratios per round against `cat` of the same round. Timed from \
         before the spawn to the response line read.\n\n",
        cfg.spawn_rounds, cfg.mcp_batch
    );
    let mut t = Table::new(&["command", "wall time", "p99", "× `cat`", "target"]);
    for (i, s) in subjects.iter().enumerate() {
        let r: Vec<f64> = s.rounds.iter().zip(&base).map(|(x, y)| x / y).collect();
        let p99 = stats::percentile(&s.all, 99.0);
        let target = if i == 1 {
            crate::spawn::verdict(p99 <= 20.0, "p99 ≤ 20 ms")
        } else {
            String::new()
        };
        t.row(vec![
            s.label.to_string(),
            Summary::of(&s.rounds).show(stats::ms),
            stats::ms(p99),
            Summary::of(&r).show(stats::ratio),
            target,
        ]);
    }
    out.push_str(&t.render());
    Ok(out)
}
