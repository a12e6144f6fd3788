//! The daemon stays flat under churn. Thousands of sessions are started and ended one after another
//! on a few connections — a third closed, a third exiting by themselves, a third losing their
//! wrapper to SIGKILL — and after a warm-up the daemon's open descriptors, threads and resident
//! memory come back to their level once the churn is over, while `status` lists only the newest
//! ended sessions (their events stay in the database). No ended session keeps a database connection
//! (two descriptors) or memory (~125 KB each when they did). `LEASH_CHURN_SESSIONS` sets the number
//! of sessions (default 1200, about 40 s on a busy 2-core machine: each session is a `leash exec`,
//! a wrapper and an adapter).
mod common;
mod daemon_support;
use common::*;
use daemon_support::*;
use serde_json::json;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What the daemon holds: open descriptors, threads, resident KiB.
#[derive(Debug, Clone, Copy)]
struct Footprint {
    fds: usize,
    threads: usize,
    rss_kib: u64,
}

/// What the daemon's descriptors point at (for a failure message).
fn fd_targets(pid: i32) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| {
            d.flatten()
                .filter_map(|e| std::fs::read_link(e.path()).ok())
                .map(|p| p.display().to_string())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

fn footprint(pid: i32) -> Footprint {
    let count = |dir: String| std::fs::read_dir(dir).map(|d| d.count()).unwrap_or(0);
    let rss_kib = vm_rss_kib(pid).unwrap();
    Footprint {
        fds: count(format!("/proc/{pid}/fd")),
        threads: count(format!("/proc/{pid}/task")),
        rss_kib,
    }
}

/// Starts and ends sessions `from..to` on `workers` connections.
fn churn(daemon: &Daemon, quitter: &std::path::Path, from: usize, to: usize, workers: usize) {
    let next = Arc::new(AtomicUsize::new(from));
    std::thread::scope(|scope| {
        for _ in 0..workers {
            let next = next.clone();
            let mut c = daemon.connect();
            scope.spawn(move || loop {
                let i = next.fetch_add(1, Ordering::SeqCst);
                if i >= to {
                    return;
                }
                let key = format!("churn-{i}");
                let argv = match i % 3 {
                    1 => json!([quitter.to_str().unwrap()]),
                    _ => json!(["cat"]),
                };
                let started = c.call(
                    "ensure",
                    json!({"session": key, "argv": argv, "graceMs": 200}),
                );
                match i % 3 {
                    // Closed by a client.
                    0 => {
                        let out = c.call("close", json!({"session": key}));
                        assert_eq!(out[0]["result"], "closed", "{out}");
                    }
                    // Exits by itself once told to.
                    1 => {
                        c.call("send", json!({"session": key, "line": "bye"}));
                    }
                    // Its wrapper is SIGKILLed (the daemon is its parent).
                    _ => {
                        let wrapper = Pid::of(started["rootPid"].as_i64().unwrap() as i32).unwrap();
                        signal(wrapper, libc::SIGKILL);
                    }
                }
            });
        }
    });
}

/// Waits until no session runs and the daemon has pruned its ended sessions down to the bound.
fn settle(c: &mut Conn) -> usize {
    let mut listed = 0;
    let ok = wait_daemon(c, |c| {
        let st = c.call("status", json!({}));
        let sessions = st["daemon"]["sessions"].as_array().unwrap();
        listed = sessions.len();
        listed <= 64 && sessions.iter().all(|s| s["phase"] == "ended")
    });
    assert!(ok, "sessions never settled ({listed} listed)");
    listed
}

#[test]
fn fds_threads_and_memory_stay_flat_under_churn() {
    let total: usize = std::env::var("LEASH_CHURN_SESSIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1200);
    let warmup = 150.min(total / 2);
    let tmp = TempDir::new("d-churn");
    let state = tmp.join("state");
    let daemon = Daemon::start_logging(&state, &[], "warn");
    let quitter = script(tmp.path(), "quitter.sh", "read -r line; exit 0");
    let mut c = daemon.connect();

    churn(&daemon, &quitter, 0, warmup, 3);
    settle(&mut c);
    let before = footprint(daemon.pid.pid);
    let fds_before = fd_targets(daemon.pid.pid);

    let t = Instant::now();
    churn(&daemon, &quitter, warmup, total, 3);
    let churn_took = t.elapsed();
    let listed = settle(&mut c);
    // Threads of ended sessions finish a moment after the session is marked ended.
    let mut after = footprint(daemon.pid.pid);
    wait_for_within(Duration::from_secs(10), || {
        after = footprint(daemon.pid.pid);
        after.threads <= before.threads && after.fds <= before.fds
    });
    eprintln!(
        "churn: {} sessions in {churn_took:?}; before {before:?}, after {after:?}; {listed} ended sessions listed",
        total - warmup
    );
    // A little slack: SQLite keeps the descriptor of a closed connection open while another
    // connection of the process holds locks on the same file (closing it would drop those
    // POSIX locks) and reuses it for the next open; that pool follows the peak number of
    // concurrent connections, not the number of sessions.
    assert!(
        after.fds <= before.fds + 6,
        "descriptors grew: {before:?} -> {after:?}\nbefore: {fds_before:#?}\nafter: {:#?}",
        fd_targets(daemon.pid.pid)
    );
    assert!(
        after.threads <= before.threads,
        "threads grew: {before:?} -> {after:?}"
    );
    assert!(
        after.rss_kib <= before.rss_kib + 16 * 1024,
        "memory grew: {before:?} -> {after:?}"
    );
    // Pruned sessions keep their events in the database.
    let events = c.call("events", json!({"session": "churn-0"}));
    let kinds: Vec<&str> = events
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["kind"].as_str().unwrap())
        .collect();
    assert!(
        kinds.contains(&"spawned") && kinds.contains(&"exit"),
        "{kinds:?}"
    );
}
