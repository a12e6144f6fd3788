//! `--owner-pid` closes the spawner-died-first race (nothing starts, the lease is lost with the
//! reason), and a session has at most one active lease.
mod common;
use common::*;

#[test]
fn wrong_owner_pid_starts_nothing_and_records_lost() {
    let tmp = TempDir::new("owner");
    let state = tmp.join("state");
    let marker = tmp.join("started");
    // Our parent is this test process, not pid 1.
    let out = run(
        &state,
        &[
            "exec",
            "--owner-pid",
            "1",
            "--session",
            "o",
            "--",
            "touch",
            marker.to_str().unwrap(),
        ],
    );
    assert_eq!(out.code, Some(125), "{}", out.stderr);
    assert!(
        out.stderr.contains("owner pid 1 is not our parent"),
        "{}",
        out.stderr
    );
    assert!(!marker.exists(), "the command must not have run");
    let leases = run_json(&state, &["leases", "--json"]);
    assert_eq!(leases[0]["state"], "lost");
    assert!(leases[0]["stateReason"]
        .as_str()
        .unwrap()
        .contains("nothing started"));
    // The right owner pid works.
    let me = std::process::id().to_string();
    let out = run(
        &state,
        &[
            "exec",
            "--owner-pid",
            &me,
            "--session",
            "o",
            "--",
            "touch",
            marker.to_str().unwrap(),
        ],
    );
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert!(marker.exists());
}

#[test]
fn second_exec_for_a_live_session_is_refused_then_allowed_once_it_is_gone() {
    let tmp = TempDir::new("session");
    let state = tmp.join("state");
    let mut guard = Guard::new();
    let first = guard.child(
        leash(&state)
            .args(["exec", "--session", "s", "--", "sleep", "1000"])
            .spawn()
            .unwrap(),
    );
    let first_pid = Pid::of(first.id() as i32).unwrap();
    assert!(wait_for(|| !children(first_pid.pid).is_empty()));
    let out = run(&state, &["exec", "--session", "s", "--", "true"]);
    assert_eq!(out.code, Some(125));
    assert!(
        out.stderr.contains("already has a live lease"),
        "{}",
        out.stderr
    );
    assert!(first_pid.alive(), "the first session is untouched");

    signal(first_pid, libc::SIGTERM);
    first.wait().unwrap();
    let out = run(&state, &["exec", "--session", "s", "--", "true"]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
}
