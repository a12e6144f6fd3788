//! The daemon refuses bad values at the protocol edge with the CLI's rules (`bad_request`,
//! nothing started): cgroup limits of 0, a `waitMs` above its documented maximum, a negative
//! `since` for `events` as for `attach`. And a client that stops reading its attach is dropped
//! after the documented stall deadline, counted from when it stopped, not per write.
mod common;
mod daemon_support;
use common::*;
use daemon_support::*;
use serde_json::json;
use std::io::Write;
use std::time::{Duration, Instant};

#[test]
fn bad_limits_waits_and_seqs_are_bad_requests_that_start_nothing() {
    let tmp = TempDir::new("d-validate");
    let daemon = Daemon::start(&tmp.join("state"), &[]);
    let mut c = daemon.connect();
    for (field, value) in [
        ("pidsMax", json!(0)),
        ("memoryMax", json!(0)),
        ("cpuMax", json!("0")),
        ("waitMs", json!(60_001)),
    ] {
        let mut req = json!({"session": "v", "argv": ["cat"]});
        req[field] = value;
        let r = c.request("ensure", req);
        assert_eq!(r["error"]["code"], "bad_request", "{field}: {r}");
        assert!(
            r["error"]["message"].as_str().unwrap().contains(field),
            "{field}: {r}"
        );
    }
    assert_eq!(
        c.call("leases", json!({})),
        json!([]),
        "nothing was started"
    );
    c.call(
        "ensure",
        json!({"session": "v", "argv": ["cat"], "waitMs": 0}),
    );
    for op in ["events", "attach"] {
        let r = c.request(op, json!({"session": "v", "since": -5}));
        assert_eq!(r["error"]["code"], "bad_request", "{op}: {r}");
    }
    // The CLI refuses the same values by the same rule.
    let out = run(
        &tmp.join("cli"),
        &["exec", "--session", "x", "--pids-max", "0", "--", "true"],
    );
    assert_ne!(out.code, Some(0), "{}", out.stderr);
    assert!(
        out.stderr.contains("--pids-max must be at least 1"),
        "{}",
        out.stderr
    );
}

#[test]
fn a_client_that_stops_reading_is_dropped_at_the_stall_deadline() {
    const STALL_MS: u64 = 3_000;
    let tmp = TempDir::new("d-stall");
    let daemon = Daemon::start_with_env(
        &tmp.join("state"),
        &[],
        "info",
        &[("LEASH_CLIENT_STALL_MS", "3000")],
    );
    let mut c = daemon.connect();
    // 4 MB of output, far more than a socket buffer holds, then quiet.
    c.call(
        "ensure",
        json!({"session": "flood", "argv": ["sh", "-c", "head -c 4000000 /dev/zero | tr '\\0' x | fold -w 1000; exec cat"]}),
    );
    assert!(wait_daemon(&mut c, |c| session_status(c, "flood")
        .is_some_and(|s| s["outputLines"].as_u64() >= Some(3000))));
    // An attach whose client never reads a byte.
    let mut lazy = std::os::unix::net::UnixStream::connect(&daemon.socket).unwrap();
    lazy.write_all(b"{\"id\":1,\"op\":\"attach\",\"session\":\"flood\"}\n")
        .unwrap();
    let sent = Instant::now();
    assert!(wait_daemon(&mut c, |c| session_status(c, "flood")
        .is_some_and(|s| s["attached"] == 1)));
    assert!(
        wait_for_within(Duration::from_secs(60), || session_status(&mut c, "flood")
            .is_some_and(|s| s["attached"] == 0)),
        "the stalled client was never dropped"
    );
    let took = sent.elapsed();
    assert!(
        took >= Duration::from_millis(STALL_MS),
        "dropped after {took:?}, before the deadline"
    );
    assert!(
        took < Duration::from_millis(STALL_MS + 2_000),
        "dropped after {took:?}: the deadline is {STALL_MS} ms from when it stopped reading"
    );
    assert!(daemon.log_text().contains("stopped reading"));
    drop(lazy);
}
