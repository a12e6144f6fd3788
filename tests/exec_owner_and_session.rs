//! `--owner-pid` closes the spawner-died-first race (nothing starts, nothing is recorded: the
//! refusal comes before any row), and a session has at most one active lease.
mod common;
use common::*;

#[test]
fn wrong_owner_pid_starts_nothing_and_records_nothing() {
    let tmp = TempDir::new("owner");
    let state = tmp.join("state");
    let marker = tmp.join("started");
    // Our parent is this test process, not pid 1; and no process has pid 99999999 (above the
    // kernel's pid_max).
    for (pid, why) in [
        ("1", "it names another process"),
        ("99999999", "no process has that pid"),
    ] {
        let out = run(
            &state,
            &[
                "exec",
                "--owner-pid",
                pid,
                "--session",
                "o",
                "--",
                "touch",
                marker.to_str().unwrap(),
            ],
        );
        assert_eq!(out.code, Some(125), "{}", out.stderr);
        assert!(
            out.stderr
                .contains(&format!("--owner-pid {pid} is not our parent")),
            "{}",
            out.stderr
        );
        assert!(out.stderr.contains(why), "{}", out.stderr);
        assert!(
            out.stderr.contains("nothing started, nothing recorded"),
            "{}",
            out.stderr
        );
        assert!(!marker.exists(), "the command must not have run");
        // Refused before anything was made: no state root, so no lease row.
        assert!(!state.exists(), "a refused exec made {}", state.display());
    }
    init_state_root(&state);
    let out = run(
        &state,
        &[
            "exec",
            "--owner-pid",
            "99999999",
            "--session",
            "o",
            "--",
            "true",
        ],
    );
    assert_eq!(out.code, Some(125), "{}", out.stderr);
    let leases = run_json(&state, &["leases", "--json"]);
    assert!(
        leases
            .as_array()
            .unwrap()
            .iter()
            .all(|l| l["sessionKey"] != "o"),
        "a refused exec recorded a lease: {leases}"
    );
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
