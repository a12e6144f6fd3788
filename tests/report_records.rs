//! What leash believes of a wrapper's report, and when it removes it. A line another process
//! (same uid) adds to a running lease's report, claiming an exit, is not the lease's exit: the
//! open lease shows none, and the real death (143) is what the ended lease records. Executing a
//! session key again ends the previous lease `ended` with the exit status its report holds, not
//! `lost`, and removes that report. A lease closed or reaped without its report being read (the
//! report is unreadable) has its report removed all the same. Real `leash exec` processes and
//! signals; every report directory is the test's own.
mod common;
use common::*;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// A private reports directory of the test's own (`LEASH_RUNTIME_DIR`).
fn runtime_dir(tmp: &Path) -> PathBuf {
    use std::os::unix::fs::DirBuilderExt;
    let dir = tmp.join("rt");
    std::fs::DirBuilder::new().mode(0o700).create(&dir).unwrap();
    dir
}

fn exec(state: &Path, rt: &Path, lease_id: &str, session: &str, cmd: &[&str]) -> Command {
    let mut c = leash(state);
    c.env("LEASH_RUNTIME_DIR", rt)
        .args([
            "--no-daemon",
            "exec",
            "--lease-id",
            lease_id,
            "--session",
            session,
        ])
        .arg("--")
        .args(cmd)
        .stdin(Stdio::null());
    c
}

fn new_id() -> String {
    uuid::Uuid::new_v4().hyphenated().to_string()
}

fn find_row(state: &Path, lease_id: &str) -> Option<Value> {
    db_leases(state)
        .into_iter()
        .find(|l| l["leaseId"] == lease_id)
}

fn row(state: &Path, lease_id: &str) -> Value {
    find_row(state, lease_id).unwrap_or_else(|| panic!("no lease {lease_id}"))
}

/// Starts `sleep 600` under a lease in the background and waits until its report's start record
/// is folded into the row; returns the child (the wrapper), the adapter and the report file.
fn start_sleeper(
    state: &Path,
    rt: &Path,
    lease_id: &str,
    session: &str,
    guard: &mut Guard,
) -> (Pid, Pid, PathBuf) {
    let child: Child = exec(state, rt, lease_id, session, &["sleep", "600"])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let wrapper = Pid::of(child.id() as i32).unwrap();
    guard.child(child);
    let mut adapter = None;
    let ok = wait_for(|| {
        adapter = find_row(state, lease_id)
            .and_then(|l| l["adapterPid"].as_i64())
            .and_then(|p| Pid::of(p as i32));
        adapter.is_some()
    });
    assert!(
        ok,
        "the adapter never started: {:?}",
        find_row(state, lease_id)
    );
    let adapter = adapter.unwrap();
    guard.add(adapter);
    (wrapper, adapter, rt.join(format!("{lease_id}.json")))
}

/// Puts a file that is no report at `report` in the place of the wrapper's (which keeps writing
/// to its own, unlinked): nothing of it can be read, whatever the wrapper writes after.
fn unreadable(report: &Path) {
    let other = report.with_extension("other");
    std::fs::write(&other, "not a report\n").unwrap();
    std::fs::rename(&other, report).unwrap();
}

#[test]
fn a_line_added_to_a_running_leases_report_is_not_its_exit() {
    let tmp = TempDir::new("report-forged");
    let (state, rt) = (tmp.join("state"), runtime_dir(tmp.path()));
    let mut guard = Guard::new();
    let id = new_id();
    let (wrapper, adapter, report) = start_sleeper(&state, &rt, &id, "forged", &mut guard);
    // Same uid: append a record claiming the adapter exited 0.
    let text = std::fs::read_to_string(&report).unwrap();
    let start = text.lines().next().unwrap();
    let forged = start.replace("\"exitStatus\":null", "\"exitStatus\":0");
    assert_ne!(forged, start);
    use std::io::Write;
    std::fs::OpenOptions::new()
        .append(true)
        .open(&report)
        .unwrap()
        .write_all(format!("{forged}\n").as_bytes())
        .unwrap();
    let l = row(&state, &id);
    assert_eq!(l["state"], "open", "{l}");
    assert!(l["exitStatus"].is_null(), "a forged exit shows: {l}");
    // The real death: SIGTERM to the adapter, 143.
    signal(adapter, libc::SIGTERM);
    assert!(wait_for(|| !wrapper.alive()), "the wrapper did not end");
    let l = row(&state, &id);
    assert_eq!(l["state"], "ended", "{l}");
    assert_eq!(l["exitStatus"], 143, "{l}");
    assert!(!report.exists(), "the settled lease's report stays");
}

#[test]
fn executing_a_session_again_ends_the_old_lease_with_its_reported_exit() {
    let tmp = TempDir::new("report-supersede");
    let (state, rt) = (tmp.join("state"), runtime_dir(tmp.path()));
    let first = new_id();
    let out = exec(&state, &rt, &first, "again", &["sh", "-c", "exit 3"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    // Nothing has read the report yet: the lease is open, its report holds the exit.
    let report = rt.join(format!("{first}.json"));
    assert!(report.exists());
    let second = new_id();
    let out = exec(&state, &rt, &second, "again", &["true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let l = row(&state, &first);
    assert_eq!(l["state"], "ended", "{l}");
    assert_eq!(l["exitStatus"], 3, "{l}");
    let reason = l["stateReason"].as_str().unwrap();
    assert!(
        reason.contains("status 3") && reason.contains(&second),
        "{reason}"
    );
    assert!(!report.exists(), "the superseded lease's report stays");
}

#[test]
fn a_lease_closed_without_its_report_read_has_it_removed() {
    let tmp = TempDir::new("report-close-unread");
    let (state, rt) = (tmp.join("state"), runtime_dir(tmp.path()));
    let mut guard = Guard::new();
    let id = new_id();
    let (wrapper, _adapter, report) = start_sleeper(&state, &rt, &id, "unread", &mut guard);
    unreadable(&report);
    let out = run(&state, &["--no-daemon", "close", "--session", "unread"]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert!(wait_for(|| !wrapper.alive()));
    let l = row(&state, &id);
    assert_eq!(l["state"], "closed", "{l}");
    assert!(!report.exists(), "the closed lease's unread report stays");
}

#[test]
fn a_lease_reaped_without_its_report_read_has_it_removed() {
    use std::io::Write;
    let tmp = TempDir::new("report-reap-unread");
    let (state, rt) = (tmp.join("state"), runtime_dir(tmp.path()));
    let mut guard = Guard::new();
    let id = new_id();
    // The lease's owner is a shell that waits on its stdin: closing it ends the owner, and the
    // wrapper takes its tree down.
    let owner = Command::new("sh")
        .args(["-c", "\"$@\" </dev/null >/dev/null & read x", "sh"])
        .arg(leash_bin())
        .arg("--state-dir")
        .arg(&state)
        .args([
            "--no-daemon",
            "exec",
            "--lease-id",
            &id,
            "--session",
            "reaped",
        ])
        .args(["--", "sleep", "600"])
        .env("LEASH_RUNTIME_DIR", &rt)
        .env_remove("LEASH_STATE_DIR")
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    let mut owner = owner;
    let stdin = owner.stdin.take().unwrap();
    guard.child(owner);
    let mut root = None;
    let ok = wait_for(|| {
        let Some(l) = find_row(&state, &id) else {
            return false;
        };
        root = l["rootPid"].as_i64().and_then(|p| Pid::of(p as i32));
        root.is_some() && l["adapterPid"].as_i64().is_some()
    });
    assert!(ok, "the adapter never started");
    let wrapper = root.unwrap();
    guard.add(wrapper);
    let report = rt.join(format!("{id}.json"));
    unreadable(&report);
    (&stdin).write_all(b"\n").unwrap();
    drop(stdin);
    assert!(
        wait_for(|| !wrapper.alive()),
        "the wrapper outlived its owner"
    );
    assert_eq!(row(&state, &id)["state"], "open", "nothing read the report");
    let out = run(&state, &["--no-daemon", "reap"]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let l = row(&state, &id);
    assert!(l["state"] == "closed" || l["state"] == "lost", "{l}");
    assert!(!report.exists(), "the reaped lease's unread report stays");
}
