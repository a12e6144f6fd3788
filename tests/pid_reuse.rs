//! Live PID reuse. As root, a dead wrapper's pid is handed to a decoy (or to another gateway's
//! wrapper) through /proc/sys/kernel/ns_last_pid; `close` and `reap` must leave it alive,
//! unsignalled, and say why. The tests in this file force pids, so they run one at a time.
mod common;
use common::*;
use std::process::{Command, Stdio};

fn skip_unless_root() -> bool {
    if !is_root() {
        common::skip("forcing pids through ns_last_pid needs root");
        return true;
    }
    false
}

#[test]
fn a_decoy_on_a_reused_root_pid_survives_close_and_reap() {
    if skip_unless_root() {
        return;
    }
    let _serial = FORCING_PIDS.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = TempDir::new("reuse");
    let state = tmp.join("state");
    let trap = trap_script(tmp.path());
    let mut guard = Guard::new();
    for (round, how) in [(0, "close"), (1, "reap")] {
        let mut decoy = None;
        for _attempt in 0..10 {
            let (id, dead) = dead_session(&state, &format!("s{round}-{_attempt}"));
            let log = tmp.join(&format!("decoy{round}.log"));
            if let Some(c) =
                spawn_with_pid(dead, Command::new(&trap).arg(&log).stdin(Stdio::null()))
            {
                guard.child(c);
                decoy = Some((id, Logged::wait_started(log)));
                break;
            }
        }
        let (id, decoy) = decoy.expect("could not hand a dead root's pid to a decoy in 10 tries");
        let out = if how == "close" {
            run(&state, &["close", &id, "--json", "--grace-ms", "200"])
        } else {
            run(
                &state,
                &["reap", "--include-live", "--json", "--grace-ms", "200"],
            )
        };
        assert_eq!(out.code, Some(0), "{}: {} {}", how, out.stdout, out.stderr);
        assert!(
            out.stdout.contains("pid was reused"),
            "{how} must say why: {}",
            out.stdout
        );
        let l = leases(&state)
            .into_iter()
            .find(|l| l["leaseId"] == id.as_str())
            .unwrap();
        assert_eq!(l["state"], "lost", "{how}: {l}");
        assert!(
            decoy.pid.alive(),
            "{how}: the decoy on the reused pid {} was killed",
            decoy.pid.pid
        );
        assert_eq!(decoy.signals(), "", "{how}: the decoy was signalled");
    }
}

#[test]
fn another_gateways_wrapper_on_a_reused_root_pid_survives() {
    if skip_unless_root() {
        return;
    }
    let _serial = FORCING_PIDS.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = TempDir::new("reuse-gw");
    let (a, b) = (tmp.join("a"), tmp.join("b"));
    let trap = trap_script(tmp.path());
    let mut guard = Guard::new();
    let log = tmp.join("b.log");
    let mut found = None;
    for attempt in 0..10 {
        let (id, dead) = dead_session(&a, &format!("a{attempt}"));
        let mut cmd = leash(&b);
        cmd.args(["exec", "--session", "b", "--"])
            .arg(&trap)
            .arg(&log);
        if let Some(c) = spawn_with_pid(dead, &mut cmd) {
            let w = Pid::of(c.id() as i32).unwrap();
            guard.child(c);
            found = Some((id, w));
            break;
        }
    }
    let (id, b_wrapper) = found.expect("could not hand a dead root's pid to gateway B in 10 tries");
    let b_adapter = Logged::wait_started(log);
    let mut g2 = Guard::new();
    g2.add(b_adapter.pid);

    let out = run(&a, &["close", &id, "--json", "--grace-ms", "200"]);
    assert_eq!(out.code, Some(0), "{} {}", out.stdout, out.stderr);
    assert!(out.stdout.contains("pid was reused"), "{}", out.stdout);
    let out = run(
        &a,
        &["reap", "--include-live", "--json", "--grace-ms", "200"],
    );
    assert_eq!(out.code, Some(0), "{} {}", out.stdout, out.stderr);
    assert!(
        b_wrapper.alive() && b_adapter.pid.alive(),
        "gateway B's session was killed"
    );
    assert_eq!(b_adapter.signals(), "");
    assert_eq!(lease_of(&b, "b")["state"], "open");
}
