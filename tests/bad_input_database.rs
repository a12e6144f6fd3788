//! Bad input: a corrupt, a truncated and a locked state database. Every command ends in a clear
//! error (exit 1; `leash exec` exits 125 and starts nothing), signals nothing (a live session's
//! adapter traps and logs every signal and stays alive), and leaves the database file as it was.
mod common;
use common::*;
use std::path::{Path, PathBuf};

/// What every command says of a database file that is not a leash database.
const CORRUPT: &str = "is corrupt or not a leash database";

/// A live session whose adapter traps and logs every signal, with its database checkpointed
/// into the main file (so the main file alone holds the leases, and damaging it means
/// something).
struct Live {
    _guard: Guard,
    _g2: Guard,
    wrapper: Pid,
    adapter: Logged,
    lease: String,
}

fn live_session(tmp: &TempDir, state: &Path) -> Live {
    let trap = trap_script(tmp.path());
    let mut guard = Guard::new();
    let c = guard.child(
        leash(state)
            .args(["exec", "--session", "s", "--"])
            .arg(&trap)
            .arg(tmp.join("adapter.log"))
            .spawn()
            .unwrap(),
    );
    let wrapper = Pid::of(c.id() as i32).unwrap();
    let adapter = Logged::wait_started(tmp.join("adapter.log"));
    let mut g2 = Guard::new();
    g2.add(adapter.pid);
    let lease = lease_of(state, "s")["leaseId"]
        .as_str()
        .unwrap()
        .to_string();
    let conn = rusqlite::Connection::open(state.join("leash.db")).unwrap();
    conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
        .unwrap();
    drop(conn);
    for side in ["leash.db-wal", "leash.db-shm"] {
        let _ = std::fs::remove_file(state.join(side));
    }
    Live {
        _guard: guard,
        _g2: g2,
        wrapper,
        adapter,
        lease,
    }
}

/// Runs every command that touches the database against the damaged one; each must fail with
/// `expect` in its message, start nothing, signal nothing and leave the file unchanged. With
/// `reads_may_succeed` (a locked database, which WAL still lets readers read), commands that only
/// read may instead succeed.
fn every_command_fails_cleanly(
    tmp: &TempDir,
    state: &Path,
    live: &Live,
    expect: &str,
    envs: &[(&str, &str)],
    reads_may_succeed: bool,
) {
    let db = state.join("leash.db");
    // Compared by cmp(1) in a child process: in this process, opening and closing the database
    // file would drop the POSIX locks a test's own SQLite connection holds on it.
    let before = tmp.join("before.db");
    if !before.exists() {
        std::fs::copy(&db, &before).unwrap();
    }
    let unchanged = || {
        std::process::Command::new("cmp")
            .arg("-s")
            .arg(&before)
            .arg(&db)
            .status()
            .unwrap()
            .success()
    };
    let marker = tmp.join("started.mark");
    let touch = format!("touch '{}'", marker.display());
    let commands: Vec<Vec<&str>> = vec![
        vec!["reap", "--include-live", "--grace-ms", "100"],
        vec!["reap", "--dry-run", "--include-live"],
        vec!["close", &live.lease, "--grace-ms", "100"],
        vec!["close", "--session", "s", "--grace-ms", "100"],
        vec!["cancel", "--session", "s"],
        vec!["leases"],
        vec!["status"],
        vec!["legacy", "list"],
        vec!["exec", "--session", "new", "--", "sh", "-c", &touch],
    ];
    for args in commands {
        let out = leash(state)
            .args(&args)
            .envs(envs.iter().copied())
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        let reads_only = matches!(args[..2.min(args.len())], ["reap", "--dry-run"])
            || matches!(args[0], "leases" | "status" | "legacy");
        if reads_may_succeed && reads_only && out.status.code() == Some(0) {
            assert!(unchanged(), "leash {args:?} changed the database");
            continue;
        }
        let want = if args[0] == "exec" { 125 } else { 1 };
        assert_eq!(
            out.status.code(),
            Some(want),
            "leash {args:?}: {stderr} / {}",
            String::from_utf8_lossy(&out.stdout)
        );
        assert!(
            stderr.starts_with("leash: ") && stderr.contains(expect),
            "leash {args:?} must say '{expect}': {stderr}"
        );
        assert_eq!(
            stderr.lines().count(),
            1,
            "one clear line, not a backtrace: {stderr}"
        );
        if args[0] == "exec" {
            assert!(stderr.contains("nothing started"), "{stderr}");
        }
        assert!(out.stdout.is_empty() || args[0] != "exec");
        assert!(!marker.exists(), "leash {args:?} started the command");
        assert!(unchanged(), "leash {args:?} changed the database");
        assert!(
            live.wrapper.alive() && live.adapter.pid.alive(),
            "leash {args:?}: the live session must survive"
        );
        assert_eq!(
            live.adapter.signals(),
            "",
            "leash {args:?} signalled the adapter"
        );
    }
}

/// A live session (see [`live_session`]) in `<tmp>/state`; its database file is written as
/// `damage` turns its bytes, and every command must refuse it as [`CORRUPT`], cleanly.
fn damaged_database_is_refused(tmp: &TempDir, damage: impl FnOnce(&mut Vec<u8>)) {
    let state = tmp.join("state");
    let live = live_session(tmp, &state);
    let (db, mut bytes) = database_of(&state);
    damage(&mut bytes);
    std::fs::write(&db, &bytes).unwrap();
    every_command_fails_cleanly(tmp, &state, &live, CORRUPT, &[], false);
}

/// The database file of `state` and its bytes.
fn database_of(state: &Path) -> (PathBuf, Vec<u8>) {
    let db = state.join("leash.db");
    let bytes = std::fs::read(&db).unwrap();
    (db, bytes)
}

#[test]
fn a_corrupt_header_is_a_clear_error_and_no_signal() {
    damaged_database_is_refused(&TempDir::new("corrupt-header"), |bytes| {
        for (i, b) in bytes.iter_mut().take(4096).enumerate() {
            *b = (i as u8).wrapping_mul(31) ^ 0x5a;
        }
    });
}

#[test]
fn corrupt_pages_behind_a_valid_header_are_a_clear_error_and_no_signal() {
    damaged_database_is_refused(&TempDir::new("corrupt-pages"), |bytes| {
        assert!(bytes.len() > 8192, "the database has more than one page");
        for (i, b) in bytes.iter_mut().enumerate().skip(4096) {
            *b = (i as u8).wrapping_mul(131) ^ 0xa5;
        }
    });
}

#[test]
fn a_truncated_database_is_a_clear_error_and_no_signal() {
    let tmp = TempDir::new("truncated");
    let state = tmp.join("state");
    let live = live_session(&tmp, &state);
    let (db, full) = database_of(&state);
    // Mid-header, mid-first-page, and half the file. (A zero-length file is what SQLite itself
    // leaves when a first open dies before its first commit: leash treats it as a new database.)
    for len in [50, 1000, full.len() / 2] {
        std::fs::write(&db, &full[..len]).unwrap();
        let _ = std::fs::remove_file(tmp.join("before.db"));
        every_command_fails_cleanly(&tmp, &state, &live, CORRUPT, &[], false);
    }
}

#[test]
fn a_database_locked_by_another_writer_waits_the_busy_timeout_then_fails_clearly() {
    let tmp = TempDir::new("locked");
    let state = tmp.join("state");
    let live = live_session(&tmp, &state);
    std::fs::copy(state.join("leash.db"), tmp.join("before.db")).unwrap();
    let mut holder = rusqlite::Connection::open(state.join("leash.db")).unwrap();
    let tx = holder
        .transaction_with_behavior(rusqlite::TransactionBehavior::Exclusive)
        .unwrap();
    every_command_fails_cleanly(
        &tmp,
        &state,
        &live,
        "is locked by another writer (waited 300 ms)",
        &[("LEASH_BUSY_TIMEOUT_MS", "300")],
        true,
    );
    // The lease was never touched: once the writer lets go, a close works.
    tx.rollback().unwrap();
    drop(holder);
    let out = run(&state, &["close", "--session", "s", "--grace-ms", "200"]);
    assert_eq!(out.code, Some(0), "{} {}", out.stdout, out.stderr);
    assert!(wait_for(|| !live.adapter.pid.alive()));
    assert_eq!(lease_of(&state, "s")["state"], "closed");
}

#[test]
fn an_unreadable_database_file_is_a_clear_error() {
    // Not a database at all: a directory where the file should be.
    let tmp = TempDir::new("dir-db");
    let state = tmp.join("state");
    std::fs::create_dir_all(state.join("leash.db")).unwrap();
    for args in [vec!["status"], vec!["reap"], vec!["leases"]] {
        let out = run(&state, &args);
        assert_eq!(out.code, Some(1), "{args:?}: {}", out.stderr);
        assert!(
            out.stderr.starts_with("leash: state database") && out.stderr.lines().count() == 1,
            "{args:?}: {}",
            out.stderr
        );
    }
    assert!(state.join("leash.db").is_dir(), "nothing replaced it");
}
