//! A full disk never leaves an operator without leash. The state root lives on a small tmpfs
//! the test mounts and fills (after checkpointing the WAL to nothing: not one free byte, no
//! frame to reuse) while a lease runs. Reading needs no room: `leases`, `status`, `verify`, `ps`
//! and `reap --dry-run` answer, directly and through the daemon. A close of a verified tree
//! still happens and is recorded: the store keeps a reserve beside the database and gives it
//! back when a write that ends a lease finds the disk full. Through the daemon, an `ensure` on
//! the full disk names the cause (leash exec's message, not a bare exit 125 with empty stderr).
//! A close whose end cannot be recorded even so ends the tree and says what was not recorded.
//! Needs root (mount); skips with the reason otherwise.
mod common;
mod daemon_support;
use common::tmpfs::{self, Tmpfs};
use common::*;
use daemon_support::*;
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::Stdio;

/// Checkpoints the WAL to nothing, then fills the filesystem of `dir` until it takes no byte.
fn fill(state: &Path, dir: &Path) -> PathBuf {
    let db = rusqlite::Connection::open(state.join("leash.db")).unwrap();
    db.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
        .unwrap();
    drop(db);
    std::fs::create_dir_all(dir).unwrap();
    tmpfs::fill(dir)
}

fn mounted(tmp: &TempDir) -> Option<(Tmpfs, PathBuf)> {
    if !is_root() {
        common::skip("mounting a tmpfs needs root");
        return None;
    }
    let Some(mnt) = Tmpfs::mount(&tmp.join("fs"), "8m") else {
        common::skip("cannot mount a tmpfs here");
        return None;
    };
    let state = mnt.0.join("state");
    Some((mnt, state))
}

/// Every reading command answers (exit 0) on the full disk.
fn reads_answer(state: &Path, session: &str) {
    for args in [
        vec!["leases", "--json"],
        vec!["status", "--json"],
        vec!["verify", "--session", session],
        vec!["ps"],
        vec!["reap", "--dry-run", "--json"],
    ] {
        let out = run(state, &args);
        assert_eq!(
            out.code,
            Some(0),
            "leash {args:?} on a full disk: {}",
            out.stderr
        );
    }
}

#[test]
fn reads_and_a_close_work_on_a_full_disk() {
    let tmp = TempDir::new("full-disk-cli");
    let Some((mnt, state)) = mounted(&tmp) else {
        return;
    };
    let mut guard = Guard::new();
    let mut child = leash(&state)
        .args(["exec", "--session", "S", "--", "sleep", "600"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    guard.add(Pid::of(child.id() as i32).unwrap());
    assert!(wait_for(
        || db_lease_of(&state, "S").is_some_and(|l| l["adapterPid"].is_number())
    ));
    let lease = lease_of(&state, "S");
    let adapter = Pid::of(lease["adapterPid"].as_i64().unwrap() as i32).unwrap();
    guard.add(adapter);
    assert!(state.join("leash.db-reserve").is_file(), "no reserve kept");

    let filler = fill(&state, &mnt.0);
    reads_answer(&state, "S");
    // The close happens, and is recorded.
    let out = run_json(&state, &["close", "--json", "--session", "S"]);
    assert_eq!(out[0]["result"], "closed", "{out}");
    assert!(wait_for(|| !adapter.alive()), "the adapter still runs");
    let _ = child.wait();
    let rows = run_json(&state, &["leases", "--json"]);
    assert_eq!(rows[0]["state"], "closed", "{rows}");
    // The reserve was given back for it; with room again, the next store keeps one again.
    assert!(!state.join("leash.db-reserve").exists());
    std::fs::remove_file(filler).unwrap();
    run_json(&state, &["leases", "--json"]);
    assert!(
        state.join("leash.db-reserve").is_file(),
        "the reserve is not kept again"
    );
}

#[test]
fn reads_a_close_and_an_ensure_through_the_daemon_on_a_full_disk() {
    let tmp = TempDir::new("full-disk-daemon");
    let Some((mnt, state)) = mounted(&tmp) else {
        return;
    };
    let daemon = Daemon::start(&state, &[]);
    let mut guard = Guard::new();
    let mut c = daemon.connect();
    let r = c.call(
        "ensure",
        json!({"session": "d", "argv": ["cat"], "graceMs": 500}),
    );
    let wrapper = Pid::of(r["rootPid"].as_i64().unwrap() as i32).unwrap();
    guard.add(wrapper);

    let filler = fill(&state, &mnt.0);
    reads_answer(&state, "d");
    // Through the daemon: its leases op, then the close.
    let rows = c.call("leases", json!({}));
    assert!(
        rows.as_array()
            .unwrap()
            .iter()
            .any(|l| l["sessionKey"] == "d"),
        "{rows}"
    );
    let out = run_json(&state, &["close", "--json", "--session", "d"]);
    assert_eq!(out[0]["result"], "closed", "{out}");
    assert!(wait_for(|| !wrapper.alive()), "the wrapper still runs");
    // Full again (the room the close had is taken): an ensure that cannot record its lease
    // says why.
    let more = fill(&state, &mnt.0.join("more"));
    let r = c.request("ensure", json!({"session": "e", "argv": ["cat"]}));
    assert_eq!(r["error"]["code"], "spawn_failed", "{r}");
    let msg = r["error"]["message"].as_str().unwrap();
    assert!(msg.contains("disk is full"), "{r}");
    assert!(r["error"]["cause"].is_string(), "{r}");
    std::fs::remove_file(filler).unwrap();
    std::fs::remove_file(more).unwrap();
}

/// A close whose end cannot be recorded (the disk filled up again during its grace, after the
/// reserve gave it room for its claim) still ends the tree, and its answer says what was not
/// recorded; a later close, with room, records it.
#[test]
fn a_close_that_cannot_record_its_end_says_so() {
    let tmp = TempDir::new("full-disk-unrecorded");
    let Some((mnt, state)) = mounted(&tmp) else {
        return;
    };
    let mut guard = Guard::new();
    let pid_file = tmp.join("adapter.pid");
    let stubborn = script(
        tmp.path(),
        "stubborn.sh",
        &format!(
            "trap '' TERM\necho $$ > '{}'\nexec sleep 600\n",
            pid_file.display()
        ),
    );
    let mut exec = leash(&state)
        .args(["exec", "--session", "T", "--"])
        .arg(&stubborn)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    guard.add(Pid::of(exec.id() as i32).unwrap());
    let adapter = read_pid_file(&pid_file);
    guard.add(adapter);
    assert!(wait_for(
        || db_lease_of(&state, "T").is_some_and(|l| l["adapterPid"].is_number())
    ));

    let first = fill(&state, &mnt.0);
    let close = leash(&state)
        .args(["close", "--json", "--grace-ms", "3000", "--session", "T"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Claimed (with the reserve's room): then the disk is taken again, during the grace. A read
    // that meets the close's own write on the full disk may fail (SQLite grows the WAL index
    // of a reader's connection, `-shm`, on that disk): the poll reads again. Once the close is
    // done, reads must succeed (below).
    assert!(wait_for(|| {
        let out = leash(&state).args(["leases", "--json"]).output().unwrap();
        out.status.success()
            && serde_json::from_slice::<serde_json::Value>(&out.stdout)
                .is_ok_and(|v| v[0]["state"] == "closing")
    }));
    let second = fill(&state, &mnt.0.join("more"));
    let out = close.wait_with_output().unwrap();
    let answer: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{e}: {} {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    assert_eq!(answer[0]["result"], "closed", "{answer}");
    let reason = answer[0]["reason"].as_str().unwrap();
    assert!(
        reason.contains("not recorded") && reason.contains("disk is full"),
        "{answer}"
    );
    assert!(wait_for(|| !adapter.alive()), "the adapter still runs");
    let _ = exec.wait();
    assert_eq!(
        run_json(&state, &["leases", "--json"])[0]["state"],
        "closing"
    );
    // With room again, a close records it.
    std::fs::remove_file(first).unwrap();
    std::fs::remove_file(second).unwrap();
    run(&state, &["close", "--json", "--session", "T"]);
    let state_now = run_json(&state, &["leases", "--json"])[0]["state"].clone();
    assert!(state_now == "closed" || state_now == "lost", "{state_now}");
}
