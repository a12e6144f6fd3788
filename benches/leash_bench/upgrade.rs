//! The live upgrade (`--only upgrade`): how long `leash serve` takes to hand itself over to a
//! new program of itself with 100 idle sessions (`cat`, waiting on its stdin), from the
//! `upgrade` request to the new program's answer on the same connection, over several rounds.
//! The new program is the same binary (a handoff does the same work whichever build it execs).
//! Beside the client's round trip, what an operator waits for, the daemon's own figure
//! (`handoffMs`: from the request's arrival to the answer). Goal: ≤ 200 ms.

use crate::procs::{self, Children, TempDir, Tracked};
use crate::stats::{self, Summary};
use crate::{Config, Env};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const SESSIONS: usize = 100;

pub fn run(env: &Env, cfg: &Config) -> Result<String, String> {
    let rounds = if cfg.quick { 3 } else { cfg.spawn_rounds };
    let dir = TempDir::new("upgrade");
    let state = dir.path().join("state");
    let mut children = Children::new();
    let mut tracked = Tracked::new();
    let result = measure(env, &state, rounds, &mut children, &mut tracked);
    if let Some(c) = children_first(&children) {
        procs::term_child(c);
    }
    children.finish(Duration::from_secs(60));
    tracked.kill_all();
    let (client_ms, daemon_ms) = result?;
    let c = Summary::of(&client_ms);
    let d = Summary::of(&daemon_ms);
    let each = |v: &[f64]| {
        v.iter()
            .map(|x| format!("{x:.1}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    Ok(format!(
        "\n### Live upgrade (handoff to a new program, {SESSIONS} idle sessions)\n\n\
         | measure | median (min–max) over {rounds} rounds | every round (ms) |\n|---|---|---|\n\
         | request → the new program's answer (client) | {} | {} |\n\
         | the daemon's own figure (`handoffMs`) | {} | {} |\n",
        c.show(stats::ms),
        each(&client_ms),
        d.show(stats::ms),
        each(&daemon_ms),
    ))
}

fn children_first(c: &Children) -> Option<&std::process::Child> {
    c.list.first()
}

/// Starts the daemon and its sessions, then upgrades `rounds` times; returns the client's and
/// the daemon's figure of each round, in milliseconds.
fn measure(
    env: &Env,
    state: &Path,
    rounds: usize,
    children: &mut Children,
    tracked: &mut Tracked,
) -> Result<(Vec<f64>, Vec<f64>), String> {
    let child = Command::new(&env.leash)
        .arg("--state-dir")
        .arg(state)
        .arg("serve")
        .arg("--upgrade-program")
        .arg(&env.leash)
        .env("LEASH_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start leash serve: {e}"))?;
    children.push(child);
    let socket = state.join("leash.sock");
    if !procs::wait_for(Duration::from_secs(30), || {
        UnixStream::connect(&socket).is_ok()
    }) {
        return Err("leash serve did not listen within 30 s".into());
    }
    let mut c = connect(&socket)?;
    for i in 0..SESSIONS {
        let r = call(
            &mut c,
            "ensure",
            json!({"session": format!("idle-{i}"), "argv": ["cat"], "graceMs": 200}),
        )?;
        if let Some(pid) = r["rootPid"].as_i64() {
            tracked.add_tree(pid as i32);
        }
    }
    let (mut client, mut daemon) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        let mut u = connect(&socket)?;
        let begun = Instant::now();
        let r = call(&mut u, "upgrade", json!({}))?;
        client.push(begun.elapsed().as_secs_f64() * 1e3);
        if r["sessions"] != SESSIONS {
            return Err(format!("the upgrade kept {} sessions: {r}", r["sessions"]));
        }
        daemon.push(r["handoffMs"].as_f64().unwrap_or(0.0));
    }
    Ok((client, daemon))
}

fn connect(socket: &Path) -> Result<BufReader<UnixStream>, String> {
    let s = UnixStream::connect(socket).map_err(|e| format!("connect: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(120)))
        .map_err(|e| e.to_string())?;
    Ok(BufReader::new(s))
}

fn call(c: &mut BufReader<UnixStream>, op: &str, mut fields: Value) -> Result<Value, String> {
    fields["id"] = json!(1);
    fields["op"] = json!(op);
    let mut line = serde_json::to_vec(&fields).expect("serialisable");
    line.push(b'\n');
    c.get_mut()
        .write_all(&line)
        .map_err(|e| format!("{op}: {e}"))?;
    loop {
        let mut text = String::new();
        if c.read_line(&mut text).map_err(|e| e.to_string())? == 0 {
            return Err(format!("{op}: the daemon closed the connection"));
        }
        let v: Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
        if v["id"] == json!(1) && v.get("ok").is_some() {
            if v["ok"] != true {
                return Err(format!("{op} failed: {v}"));
            }
            return Ok(v["result"].clone());
        }
    }
}
