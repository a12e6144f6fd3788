//! A reports directory that cannot take a report (out of space and inodes: a 64 KiB tmpfs with
//! 8 inodes, filled) is the wrapper's problem alone: a daemon `ensure` starts the session and
//! answers at once, an adapter that exits is told as its exit (status 7), `leash exec` returns
//! the adapter's status and its lease ends `ended` with it (not `lost`): the wrapper writes the
//! report to the state root's `run/`, and the daemon logs and counts it. With `run/` full too,
//! the daemon's `ensure` still answers at once and its wait for the wrapper gives the lease its
//! exit status, also for an adapter that exits at once. Real tmpfs mounts (as root; skipped otherwise), on directories of the test's
//! own, unmounted on drop.
mod common;
mod daemon_support;
use common::*;
use daemon_support::*;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// A tmpfs of 64 KiB and 8 inodes mounted on a directory of the test's own, mode 0700, filled
/// until it takes neither another file nor another byte; unmounted (and its directory removed)
/// on drop, also when the test fails.
struct FullTmpfs(PathBuf);

impl FullTmpfs {
    /// `None`, with the skip recorded, where this process cannot mount one (not root).
    fn new(dir: &Path) -> Option<FullTmpfs> {
        if !is_root() {
            skip("a full reports directory: mounting a tmpfs needs root");
            return None;
        }
        std::fs::create_dir_all(dir).unwrap();
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=64k,nr_inodes=8,mode=0700"])
            .arg("leash-test-full")
            .arg(dir)
            .output()
            .expect("run mount");
        if !out.status.success() {
            skip(format!(
                "a full reports directory: cannot mount a tmpfs: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
            return None;
        }
        let full = FullTmpfs(dir.to_path_buf());
        full.fill();
        Some(full)
    }

    fn fill(&self) {
        use std::io::Write;
        let mut files = 0;
        loop {
            let Ok(mut f) = std::fs::File::create(self.0.join(format!("fill-{files}"))) else {
                break;
            };
            files += 1;
            let chunk = [b'x'; 4096];
            while f.write_all(&chunk).is_ok() {}
            while f.write_all(b"x").is_ok() {}
            assert!(files < 100, "the tmpfs never filled up");
        }
        let probe = std::fs::File::create(self.0.join("probe"));
        assert!(probe.is_err(), "the tmpfs still takes a file");
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for FullTmpfs {
    fn drop(&mut self) {
        let ok = Command::new("umount")
            .arg(&self.0)
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        }
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// The lease row of `session` (read with `--no-daemon`: the reports are folded in).
fn row_of(state: &Path, session: &str) -> Value {
    db_leases(state)
        .into_iter()
        .find(|l| l["sessionKey"] == session)
        .unwrap_or_else(|| panic!("no lease of session {session}"))
}

#[test]
fn leash_exec_with_a_full_reports_directory_ends_its_lease_with_the_exit_status() {
    let tmp = TempDir::new("full-rt-exec");
    let Some(full) = FullTmpfs::new(&tmp.join("rt")) else {
        return;
    };
    let state = tmp.join("state");
    let started = Instant::now();
    let out = leash(&state)
        .env("LEASH_RUNTIME_DIR", full.path())
        .args(["--no-daemon", "exec", "--session", "x", "--"])
        .args(["sh", "-c", "exit 3"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("cannot write report"), "{stderr}");
    let l = row_of(&state, "x");
    assert_eq!(l["reportDir"], full.path().to_str().unwrap(), "{l}");
    assert_eq!(l["state"], "ended", "{l}");
    assert_eq!(l["exitStatus"], 3, "{l}");
    // Read and settled: the fallback report is gone too.
    let id = l["leaseId"].as_str().unwrap();
    assert!(!state.join("run").join(format!("{id}.json")).exists());
}

#[test]
fn a_daemon_ensure_with_a_full_reports_directory_starts_at_once_and_counts_it() {
    let tmp = TempDir::new("full-rt-ensure");
    let Some(full) = FullTmpfs::new(&tmp.join("rt")) else {
        return;
    };
    let state = tmp.join("state");
    let daemon = Daemon::start_with_env(
        &state,
        &[],
        "info",
        &[("LEASH_RUNTIME_DIR", full.path().to_str().unwrap())],
    );
    let mut c = daemon.connect();

    // A long-running adapter: started, and the answer comes at once (no start timeout).
    let t = Instant::now();
    let r = c.request(
        "ensure",
        json!({"session": "long", "argv": ["sleep", "600"], "graceMs": 500}),
    );
    let took = t.elapsed();
    assert_eq!(r["ok"], true, "{r}");
    assert_eq!(r["result"]["phase"], "running", "{r}");
    assert!(took < Duration::from_secs(10), "ensure took {took:?}");
    let long = r["result"]["leaseId"].as_str().unwrap().to_string();
    let l = lease_row(&mut c, &long);
    assert_eq!(l["reportDir"], full.path().to_str().unwrap(), "{l}");
    assert!(l["adapterPid"].as_i64().is_some(), "{l}");
    let fallback = state.join("run").join(format!("{long}.json"));
    assert!(fallback.exists(), "the report is in run/");

    // An adapter that exits 7: started, and its end is its exit, not a failed start.
    // (An ensure that waited for a report it never saw would end in `spawn_failed` "did not
    // start within 20s", not ok.)
    let r = c.request(
        "ensure",
        json!({"session": "seven", "argv": ["sh", "-c", "exit 7"], "graceMs": 500}),
    );
    assert_eq!(r["ok"], true, "{r}");
    let seven = r["result"]["leaseId"].as_str().unwrap().to_string();
    assert_ends_with(&mut c, &seven, 7);
    assert!(!state.join("run").join(format!("{seven}.json")).exists());

    // Logged and counted, once per session.
    assert_report_failures(&mut c, 2);
    assert!(
        daemon.log_text().contains("could not write its report"),
        "{}",
        daemon.log_text()
    );

    // Closed: its report files go.
    let r = c.request("close", json!({"session": "long"}));
    assert_eq!(r["ok"], true, "{r}");
    assert!(
        wait_for(|| !fallback.exists()),
        "the closed lease's report stays"
    );
}

#[test]
fn with_run_full_too_an_ensure_starts_at_once_and_the_daemons_wait_gives_the_exit() {
    let tmp = TempDir::new("full-rt-and-run");
    let Some(full) = FullTmpfs::new(&tmp.join("rt")) else {
        return;
    };
    let state = tmp.join("state");
    // The state root made (its run/ among it), then run/ is a full tmpfs too.
    init_state_root(&state);
    let Some(_run) = FullTmpfs::new(&state.join("run")) else {
        return;
    };
    let daemon = Daemon::start_with_env(
        &state,
        &[],
        "info",
        &[("LEASH_RUNTIME_DIR", full.path().to_str().unwrap())],
    );
    let mut c = daemon.connect();

    let t = Instant::now();
    let r = c.request(
        "ensure",
        json!({"session": "long", "argv": ["sleep", "600"], "graceMs": 500}),
    );
    let took = t.elapsed();
    assert_eq!(r["ok"], true, "{r}");
    assert_eq!(r["result"]["phase"], "running", "{r}");
    assert!(took < Duration::from_secs(10), "ensure took {took:?}");

    // Started (its wrapper's child), then exits 7: the lease ends with the daemon's wait's 7.
    let r = c.request(
        "ensure",
        json!({"session": "seven", "argv": ["sh", "-c", "sleep 5; exit 7"], "graceMs": 500}),
    );
    assert_eq!(r["ok"], true, "{r}");
    let seven = r["result"]["leaseId"].as_str().unwrap().to_string();
    assert_ends_with(&mut c, &seven, 7);

    // One that exits 7 at once, its wrapper gone before the daemon could see the adapter: the
    // daemon's own wait for the wrapper says the adapter ran (an adapter's status, not the
    // wrapper's 125-127), so the ensure answers as it does for any adapter that exits at once,
    // and the lease ends with the 7.
    // (An ensure that waited for a start it never saw would end in `spawn_failed` "did not
    // start within 20s", not ok.)
    let r = c.request(
        "ensure",
        json!({"session": "quick", "argv": ["sh", "-c", "exit 7"], "graceMs": 500}),
    );
    assert_eq!(r["ok"], true, "{r}");
    let quick = r["result"]["leaseId"].as_str().unwrap().to_string();
    assert_ends_with(&mut c, &quick, 7);

    // A command that cannot be executed is still a failed start (the wrapper's 126); its wrapper
    // could not write its report either, and is counted with the others.
    let script = tmp.join("not-executable");
    std::fs::write(&script, "#!/bin/sh\nexit 0\n").unwrap();
    let r = c.request(
        "ensure",
        json!({"session": "noexec", "argv": [script.to_str().unwrap()], "graceMs": 500}),
    );
    assert_eq!(r["ok"], false, "{r}");
    assert_eq!(r["error"]["code"], "spawn_failed", "{r}");
    assert_eq!(r["error"]["exitStatus"], 126, "{r}");

    assert_report_failures(&mut c, 4);
    assert!(
        daemon.log_text().contains("could write its report neither"),
        "{}",
        daemon.log_text()
    );
    let r = c.request("close", json!({"session": "long"}));
    assert_eq!(r["ok"], true, "{r}");
}

/// The lease ends (`ended`) with the adapter's exit status `status`, within the daemon tests'
/// deadline.
fn assert_ends_with(c: &mut Conn, lease: &str, status: i64) {
    let ended = wait_daemon(c, |c| lease_row(c, lease)["state"] == "ended");
    let l = lease_row(c, lease);
    assert!(ended, "{l}");
    assert_eq!(l["exitStatus"], status, "{l}");
}

/// The daemon's metrics count `n` reports that could not be written.
fn assert_report_failures(c: &mut Conn, n: u32) {
    let text = c.call("metrics", json!({}))["text"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        text.contains(&format!("leash_report_write_failures_total {n}\n")),
        "{}",
        text.lines()
            .filter(|l| l.contains("report_write_failures"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}
