//! The guides' shell blocks run as written. For each page of docs/guide/ below, every fenced
//! block whose info string is exactly `sh` runs, in order, in one bash with `set -e` (a failing
//! command fails the test), the binaries under test first on PATH, and the page's
//! `/tmp/leash-…` paths swapped for a scratch directory. A block a reader should not run as it
//! stands (it installs into the system, or needs an npm package) is tagged `sh no-run` and says
//! which test covers it; this test also checks that no other shell tag slips in untested.
//! Whatever a script left running (a daemon after a failed command, a session) is stopped by pid
//! and start time, and its leases reaped, so a failure leaves nothing behind.
mod common;
use common::docs::{doc_shell, fenced_blocks, read_doc};
use common::*;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

/// The pages whose `sh` blocks this test runs.
const PAGES: &[&str] = &[
    "docs/guide/operating.md",
    "docs/guide/gateway.md",
    "docs/guide/agents.md",
];

/// Stops what a script may have left behind under `scratch`: each state root's daemon (by the
/// pid its lock names, re-identified by start time) and every lease still open (`leash reap
/// --include-live`, which signals only what it verifies as the lease's).
fn clean_up(scratch: &Path) {
    let Ok(entries) = std::fs::read_dir(scratch) else {
        return;
    };
    for e in entries.flatten() {
        let state = e.path();
        if !state.join("leash.db").exists() {
            continue;
        }
        let lock = std::fs::read_to_string(state.join("daemon.lock")).unwrap_or_default();
        if let Some(pid) = serde_json::from_str::<Value>(&lock)
            .ok()
            .and_then(|v| v["pid"].as_i64())
            .and_then(|p| Pid::of(p as i32))
        {
            let mut g = Guard::new();
            g.add(pid);
        }
        let _ = leash(&state)
            .args(["--no-daemon", "reap", "--include-live"])
            .output();
    }
}

fn run_page(page: &str, socat_dir: Option<&Path>) {
    let doc = read_doc(page);
    let script: String = fenced_blocks(&doc)
        .into_iter()
        .filter(|(info, _)| info == "sh")
        .map(|(_, body)| body)
        .collect();
    assert!(!script.is_empty(), "{page} has no `sh` block to run");
    let tmp = TempDir::new("guide");
    let scratch = tmp.path().to_str().unwrap().to_string();
    let script = format!(
        "set -e\n{}",
        script.replace("/tmp/leash-", &format!("{scratch}/leash-"))
    );
    let out_file = tmp.join("out.txt");
    let extra: Vec<&Path> = socat_dir.into_iter().collect();
    let mut guard = Guard::new();
    let child = guard.child(
        doc_shell(&script, &extra)
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&out_file).unwrap())
            .stderr(std::fs::File::create(tmp.join("err.txt")).unwrap())
            .spawn()
            .expect("run bash"),
    );
    let deadline = Instant::now() + Duration::from_secs(180);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if Instant::now() > deadline {
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let printed = std::fs::read_to_string(&out_file).unwrap_or_default();
    let errors = std::fs::read_to_string(tmp.join("err.txt")).unwrap_or_default();
    drop(guard);
    clean_up(tmp.path());
    let status = status.unwrap_or_else(|| {
        panic!("{page}: its blocks did not finish in 180 s:\n{printed}\n{errors}")
    });
    assert!(
        status.success(),
        "{page}: its `sh` blocks failed ({status}):\n--- stdout\n{printed}\n--- stderr\n{errors}"
    );
}

/// `socat`'s directory, when a page needs it and it can be had.
fn socat_dir() -> Result<PathBuf, String> {
    apt::tool("socat", "socat").map(|p| p.parent().unwrap().to_path_buf())
}

#[test]
fn the_operating_guide_runs_as_written() {
    run_page("docs/guide/operating.md", None);
}

#[test]
fn the_gateway_guide_runs_as_written() {
    match socat_dir() {
        Ok(d) => run_page("docs/guide/gateway.md", Some(&d)),
        Err(why) => skip(format!(
            "the gateway guide's one-off request needs socat: {why}"
        )),
    }
}

#[test]
fn the_agents_guide_runs_as_written() {
    run_page("docs/guide/agents.md", None);
}

#[test]
fn every_shell_block_is_run_or_marked() {
    // A shell block is `sh` (run above or by the README's tour), `sh no-run` (covered elsewhere,
    // as its page says) or a sample (`console`, `text`). Any other shell tag would go untested.
    let mut pages: Vec<String> = PAGES.iter().map(|s| s.to_string()).collect();
    pages.push("README.md".into());
    for page in &pages {
        for (info, body) in fenced_blocks(&read_doc(page)) {
            let lang = info.split_whitespace().next().unwrap_or("");
            if ["bash", "shell", "zsh", "sh"].contains(&lang) {
                assert!(
                    info == "sh" || info == "sh no-run",
                    "{page}: a shell block tagged {info:?} is neither run (`sh`) nor marked \
                     (`sh no-run`):\n{body}"
                );
            }
        }
    }
    // Every page of the guide that has runnable blocks is one this test runs.
    for e in std::fs::read_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/guide")).unwrap() {
        let name = format!("docs/guide/{}", e.unwrap().file_name().to_string_lossy());
        if PAGES.contains(&name.as_str()) || !name.ends_with(".md") {
            continue;
        }
        let runnable = fenced_blocks(&read_doc(&name))
            .iter()
            .filter(|(i, _)| i == "sh")
            .count();
        if runnable > 0 {
            skip(format!(
                "{name}: {runnable} `sh` block(s) not run by this test (the page's own test runs them)"
            ));
        }
    }
}
