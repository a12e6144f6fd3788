//! The live upgrade (`--only upgrade`): how long `leash serve` takes to hand itself over to a
//! new program of itself with 100 idle sessions (`cat`, waiting on its stdin), from the
//! `upgrade` request to the new program's answer on the same connection, over several rounds.
//! The new program is the same binary (a handoff does the same work whichever build it execs).
//! Beside the client's round trip, what an operator waits for, the daemon's own figure
//! (`handoffMs`: from the request's arrival to the answer). Goal: ≤ 200 ms.

use crate::daemon::Serve;
use crate::stats::{self, Summary};
use crate::{Config, Env};
use serde_json::json;
use std::time::Instant;

const SESSIONS: usize = 100;

pub fn run(env: &Env, cfg: &Config) -> Result<String, String> {
    let rounds = if cfg.quick { 3 } else { cfg.spawn_rounds };
    let program = env
        .leash
        .to_str()
        .ok_or("the leash binary's path is not UTF-8")?;
    // Dropped at the end: the daemon terminated, what is left of the sessions killed by pid.
    let mut serve = Serve::start(env, &["--upgrade-program", program])?;
    let result = measure(&mut serve, rounds);
    drop(serve);
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

/// Starts the sessions, then upgrades `rounds` times; returns the client's and the daemon's
/// figure of each round, in milliseconds.
fn measure(serve: &mut Serve, rounds: usize) -> Result<(Vec<f64>, Vec<f64>), String> {
    let mut c = serve.connect()?;
    for i in 0..SESSIONS {
        serve.ensure(&mut c, &format!("idle-{i}"), &["cat"])?;
    }
    let (mut client, mut daemon) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        let mut u = serve.connect()?;
        let begun = Instant::now();
        let r = u.call("upgrade", json!({}))?;
        client.push(begun.elapsed().as_secs_f64() * 1e3);
        if r["sessions"] != SESSIONS {
            return Err(format!("the upgrade kept {} sessions: {r}", r["sessions"]));
        }
        daemon.push(r["handoffMs"].as_f64().unwrap_or(0.0));
    }
    Ok((client, daemon))
}
