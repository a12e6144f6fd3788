//! `leash verify` answers owned / dead / unavailable with documented exit codes and evidence, and
//! never signals: on a live session (directly and through the daemon's `verify` op), on a dead one,
//! on a root pid handed to a decoy (the decoy survives, unsignalled), and with an unreadable
//! process table (a private mount namespace whose /proc is an empty tmpfs; the pure answer on a
//! fixture table is in `src/controller/verify.rs`).
mod common;
mod daemon_support;
use common::*;
use daemon_support::*;
use serde_json::{json, Value};
use std::process::{Command, Stdio};

fn verify(state: &std::path::Path, args: &[&str]) -> (Option<i32>, Value, String) {
    let mut all = vec!["verify"];
    all.extend_from_slice(args);
    all.push("--json");
    let out = run(state, &all);
    let v = serde_json::from_str(&out.stdout).unwrap_or(Value::Null);
    (out.code, v, format!("{}{}", out.stdout, out.stderr))
}

#[test]
fn a_live_session_is_owned_and_a_dead_one_dead() {
    let tmp = TempDir::new("verify-live");
    let state = tmp.join("state");
    let mut guard = Guard::new();
    let (wrapper, adapter) = exec_trap(&mut guard, &state, tmp.path(), "live", &[]);
    guard.add(adapter.pid);

    let (code, v, text) = verify(&state, &["--session", "live"]);
    assert_eq!(code, Some(0), "{text}");
    assert_eq!(v["answer"], "owned", "{text}");
    assert_eq!(v["rootPid"], wrapper.pid);
    let pids: Vec<i64> = v["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["pid"].as_i64().unwrap())
        .collect();
    assert!(pids.contains(&(wrapper.pid as i64)), "{text}");
    assert!(pids.contains(&(adapter.pid.pid as i64)), "{text}");
    assert!(
        v["evidence"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e.as_str().unwrap().contains("verified")),
        "{text}"
    );
    // Each member's evidence names its role as `members[].role` does (`root`, `descendant`).
    let evidence: Vec<&str> = v["evidence"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e.as_str().unwrap())
        .collect();
    for m in v["members"].as_array().unwrap() {
        let line = format!(
            "pid {} ({}, start time ",
            m["pid"],
            m["role"].as_str().unwrap()
        );
        assert!(
            evidence.iter().any(|e| e.starts_with(&line)),
            "{line}: {text}"
        );
    }
    assert!(
        evidence
            .iter()
            .any(|e| e.starts_with(&format!("pid {} (root, ", wrapper.pid))),
        "{text}"
    );
    // The text form names the answer first.
    let out = run(&state, &["verify", "--session", "live"]);
    assert_eq!(out.code, Some(0));
    assert!(out.stdout.starts_with("owned"), "{}", out.stdout);

    let (dead_id, dead_pid) = dead_session(&state, "gone");
    let (code, v, text) = verify(&state, &["--lease", &dead_id]);
    assert_eq!(code, Some(8), "{text}");
    assert_eq!(v["answer"], "dead");
    assert_eq!(v["verdict"], "gone");
    // On a busy host the freed pid may already name a stranger: the evidence says which.
    assert!(
        text.contains(&format!("root pid {dead_pid} is not running"))
            || text.contains(&format!(
                "root pid {dead_pid} now belongs to another process"
            )),
        "{text}"
    );

    // Unknown names: exit 4, nothing printed on stdout.
    let out = run(&state, &["verify", "--session", "nope"]);
    assert_eq!(out.code, Some(4), "{}", out.stderr);
    let out = run(&state, &["verify", "--lease", "nope"]);
    assert_eq!(out.code, Some(4), "{}", out.stderr);

    // Verifying signalled nothing and changed nothing.
    assert!(wrapper.alive() && adapter.pid.alive());
    assert_eq!(adapter.signals(), "");
    assert_eq!(lease_of(&state, "live")["state"], "open");
    assert_eq!(lease_of(&state, "gone")["state"], "open");
}

#[test]
fn the_daemon_answers_the_verify_op() {
    let tmp = TempDir::new("verify-op");
    let state = tmp.join("state");
    let d = Daemon::start(&state, &[]);
    let mut c = d.connect();
    let started = ensure(&mut c, "s", &["sleep", "1000"]);
    let lease = started["leaseId"].as_str().unwrap().to_string();
    let r = c.call("verify", json!({"session": "s"}));
    assert_eq!(r["answer"], "owned", "{r}");
    assert_eq!(r["leaseId"], lease.as_str());
    assert_eq!(r["ownerPid"], d.pid.pid, "the daemon owns its sessions");
    assert_eq!(
        c.error_code("verify", json!({"lease": "nope"})),
        "not_found"
    );
    assert_eq!(
        c.error_code("verify", json!({"lease": "a", "session": "b"})),
        "bad_request"
    );
    // The CLI goes through the daemon and prints the same answer.
    let (code, v, text) = verify(&state, &["--lease", &lease]);
    assert_eq!(code, Some(0), "{text}");
    assert_eq!(v["answer"], "owned");
    c.call("close", json!({"session": "s", "graceMs": 100}));
    let (code, v, text) = verify(&state, &["--session", "s"]);
    assert_eq!(code, Some(8), "{text}");
    assert_eq!(v["state"], "closed", "{text}");
}

#[test]
fn a_decoy_on_the_reused_root_pid_is_dead_and_survives() {
    if !is_root() {
        common::skip("forcing pids through ns_last_pid needs root");
        return;
    }
    let _serial = FORCING_PIDS.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = TempDir::new("verify-reuse");
    let state = tmp.join("state");
    let trap = trap_script(tmp.path());
    let mut guard = Guard::new();
    let log = tmp.join("decoy.log");
    let mut found = None;
    for attempt in 0..10 {
        let (id, dead) = dead_session(&state, &format!("s{attempt}"));
        if let Some(c) = spawn_with_pid(dead, Command::new(&trap).arg(&log).stdin(Stdio::null())) {
            guard.child(c);
            found = Some((id, dead));
            break;
        }
    }
    let (id, dead) = found.expect("could not hand a dead root's pid to a decoy in 10 tries");
    let decoy = Logged::wait_started(log);
    assert_eq!(decoy.pid.pid, dead);

    let (code, v, text) = verify(&state, &["--lease", &id]);
    assert_eq!(code, Some(8), "{text}");
    assert_eq!(v["answer"], "dead", "{text}");
    assert!(text.contains("pid was reused"), "{text}");
    assert!(decoy.pid.alive(), "the decoy on pid {dead} was killed");
    assert_eq!(decoy.signals(), "", "the decoy was signalled");
}

#[test]
fn an_unreadable_process_table_is_unavailable() {
    if !is_root() || !std::path::Path::new("/usr/bin/unshare").exists() {
        common::skip("needs root and unshare(1) to hide /proc");
        return;
    }
    let tmp = TempDir::new("verify-noproc");
    let state = tmp.join("state");
    let mut guard = Guard::new();
    let (_, adapter) = exec_trap(&mut guard, &state, tmp.path(), "p", &[]);
    guard.add(adapter.pid);
    let out = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "--", "sh", "-c"])
        .arg(format!(
            "mount -t tmpfs none /proc && exec '{}' --state-dir '{}' verify --session p --json",
            leash_bin().display(),
            state.display()
        ))
        .env_remove("LEASH_STATE_DIR")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(6),
        "{stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(v["answer"], "unavailable");
    assert!(
        stdout.contains("/proc"),
        "the evidence names /proc: {stdout}"
    );
    assert!(adapter.pid.alive());
    assert_eq!(adapter.signals(), "");
}
