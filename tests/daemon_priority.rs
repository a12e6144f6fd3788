//! The daemon's connection threads run above the adapters, and nothing the daemon starts runs
//! raised: the wrapper and the adapter of a session ensured over a raised connection have the
//! daemon's own nice value (see `src/daemon/priority.rs`). Without `CAP_SYS_NICE` nothing is
//! raised, and the adapters' priority is checked all the same.
mod common;
mod daemon_support;
use common::*;
use daemon_support::*;
use serde_json::json;

/// The nice value of a task (`/proc/<pid>/task/<tid>/stat`, field 19).
fn nice_of(stat_path: &str) -> Option<i32> {
    let text = std::fs::read_to_string(stat_path).ok()?;
    // Fields after the command (which may hold spaces) start after the last ')'.
    let rest = &text[text.rfind(')')? + 2..];
    rest.split_whitespace().nth(16)?.parse().ok()
}

/// The ids of the daemon's threads.
fn tids(pid: i32) -> Vec<String> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect()
}

fn thread_nices(pid: i32) -> Vec<i32> {
    tids(pid)
        .iter()
        .filter_map(|tid| nice_of(&format!("/proc/{pid}/task/{tid}/stat")))
        .collect()
}

#[test]
fn connections_run_raised_and_sessions_start_at_the_daemons_priority() {
    let tmp = TempDir::new("d-priority");
    let state = tmp.join("state");
    let daemon = Daemon::start(&state, &[]);
    let own = nice_of(&format!("/proc/{0}/task/{0}/stat", daemon.pid.pid)).unwrap();
    let mut c = daemon.connect();
    let st = ensure(&mut c, "s", &["sleep", "600"]);
    let wrapper = Pid::of(st["rootPid"].as_i64().unwrap() as i32).unwrap();
    let adapter = adapter_of(wrapper);
    for (what, pid) in [("wrapper", wrapper.pid), ("adapter", adapter.pid)] {
        assert_eq!(
            nice_of(&format!("/proc/{pid}/task/{pid}/stat")),
            Some(own),
            "the {what} must run at the daemon's priority, not a connection's"
        );
    }
    let raised = (own - 10).max(-20);
    if is_root() {
        // The connection stays open: its thread is raised (a `ping` makes sure it is serving).
        c.call("ping", json!({}));
        let nices = thread_nices(daemon.pid.pid);
        assert!(
            nices.contains(&raised),
            "no connection thread runs raised: {nices:?}"
        );
        // The output readers run below the daemon (`LEASH_OUTPUT_NICE`, 10 by default).
        assert!(nices.iter().any(|&n| n > own), "{nices:?}");
    } else {
        common::skip("the raised-thread check: not root (no CAP_SYS_NICE)");
    }
    c.call("close", json!({"session": "s"}));
}

/// The nice value of the daemon's thread named `name`, if it has one.
fn thread_nice_named(pid: i32, name: &str) -> Option<i32> {
    for e in std::fs::read_dir(format!("/proc/{pid}/task"))
        .ok()?
        .flatten()
    {
        let tid = e.file_name().to_string_lossy().into_owned();
        let comm = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/comm")).ok()?;
        if comm.trim_end() == name {
            return nice_of(&format!("/proc/{pid}/task/{tid}/stat"));
        }
    }
    None
}

/// A session's stdout reader runs niced while nobody reads its output, at the daemon's own
/// priority (the adapter's: sessions start at it) while a live attach reads it, as does the
/// attach's streaming thread, and the reader runs niced again once that attach ends (a
/// niced reader on a busy host relayed at a tenth of a pipe's pace; one raised above the
/// adapter took the CPU from it for every few lines it wrote).
#[test]
fn an_attached_sessions_output_reader_runs_at_the_adapters_priority() {
    if !is_root() {
        common::skip("the attached reader's priority: not root (no CAP_SYS_NICE)");
        return;
    }
    let tmp = TempDir::new("d-priority-attach");
    let state = tmp.join("state");
    let daemon = Daemon::start(&state, &[]);
    let pid = daemon.pid.pid;
    let own = nice_of(&format!("/proc/{pid}/task/{pid}/stat")).unwrap();
    let mut c = daemon.connect();
    ensure(
        &mut c,
        "p",
        &["sh", "-c", "while :; do echo tick; sleep 0.02; done"],
    );
    let reader = || thread_nice_named(pid, "out:p");
    assert!(
        wait_for(|| reader() == Some(10)),
        "an unread session's reader runs niced: {:?}",
        reader()
    );
    let mut a = daemon.connect();
    let (id, r) = a.attach("p", 0);
    assert_eq!(r["ok"], true, "{r}");
    // Reading as it goes: the attach stays live and governs the output.
    assert!(
        wait_for(|| {
            let item = a.next_item(&id);
            assert!(item["seq"].is_i64(), "a stream item: {item}");
            reader() == Some(own)
        }),
        "the reader of an attached session runs at the daemon's (and the adapter's) priority ({own}): {:?}",
        reader()
    );
    // The attach's stream too, while its connection's thread stays raised.
    let streamer = thread_nice_named(pid, "attach:p");
    assert_eq!(
        streamer,
        Some(own),
        "the attach streams at the daemon's priority"
    );
    a.call("detach", json!({"attachId": id}));
    assert!(
        wait_for(|| reader() == Some(10)),
        "the reader runs niced again once the attach ended: {:?}",
        reader()
    );
    c.call("close", json!({"session": "p"}));
}

/// The ids of the daemon's connection threads (named `conn`).
fn conn_threads(pid: i32) -> Vec<String> {
    let mut out: Vec<String> = tids(pid)
        .into_iter()
        .filter(|tid| {
            std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/comm"))
                .is_ok_and(|c| c.trim_end() == "conn")
        })
        .collect();
    out.sort();
    out
}

/// A connection thread that is done with its connection waits for the next one instead of
/// exiting (a short request such as `leash exec`'s one `exec` is not preceded by a
/// thread's start and followed by its teardown), and it stays raised once, not a further
/// 10 nice steps per connection it serves.
#[test]
fn a_connections_thread_serves_the_next_connection_raised_once() {
    let tmp = TempDir::new("d-conn-reuse");
    let state = tmp.join("state");
    let daemon = Daemon::start(&state, &[]);
    let pid = daemon.pid.pid;
    let own = nice_of(&format!("/proc/{pid}/task/{pid}/stat")).unwrap();
    // Whatever served the start-up's probes is idle by now: one connection at a time from
    // here, each closed (and its end seen by the daemon) before the next is opened.
    std::thread::sleep(std::time::Duration::from_millis(200));
    let idle = conn_threads(pid);
    let mut served = Vec::new();
    for _ in 0..4 {
        let mut c = daemon.connect();
        c.call("ping", json!({}));
        served.push(conn_threads(pid));
        drop(c);
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let after = conn_threads(pid);
    assert!(
        !after.is_empty(),
        "no connection thread waits for the next connection (served by {served:?})"
    );
    assert!(
        served.iter().all(|s| s.iter().all(|t| after.contains(t))),
        "a connection got a thread of its own: idle before {idle:?}, while serving {served:?}, after {after:?}"
    );
    if is_root() {
        let raised = (own - 10).max(-20);
        for tid in &after {
            assert_eq!(
                nice_of(&format!("/proc/{pid}/task/{tid}/stat")),
                Some(raised),
                "connection thread {tid} after 4 connections"
            );
        }
    } else {
        common::skip("the raised-once check: not root (no CAP_SYS_NICE)");
    }
}
