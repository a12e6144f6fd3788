//! A `leash --no-daemon close` that is killed mid-grace leaves the lease `closing` under a dead
//! claimant. The daemon notices that its session's lease changed underneath it: the session stops
//! taking input (phase `closing`, `send` answers `not_running`), and the daemon finishes the close
//! itself (the dead closer's claim is stale).
mod common;
mod daemon_support;
use common::*;
use daemon_support::*;
use serde_json::json;

#[test]
fn the_daemon_takes_over_a_close_whose_closer_died() {
    let tmp = TempDir::new("d-underneath");
    let state = tmp.join("state");
    let daemon = Daemon::start(&state, &[]);
    let mut c = daemon.connect();
    let (lease_id, adapter) = ensure_trap(&mut c, tmp.path(), "s", 300);

    let mut guard = Guard::new();
    let closer = guard.child(
        leash(&state)
            .args([
                "--no-daemon",
                "close",
                "--session",
                "s",
                "--grace-ms",
                "600000",
            ])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    let closer_pid = Pid::of(closer.id() as i32).unwrap();
    // Mid-grace: the lease is claimed and the adapter got its SIGTERM (which it ignores).
    assert!(wait_for(|| adapter.signals().contains("TERM")));
    assert_eq!(lease_row(&mut c, &lease_id)["state"], "closing");
    signal(closer_pid, libc::SIGKILL);
    closer.wait().unwrap();

    let noticed = wait_daemon(&mut c, |c| {
        session_status(c, "s").is_some_and(|s| s["phase"] != "running")
    });
    assert!(noticed, "the daemon still shows the session running");
    let r = c.request("send", json!({"session": "s", "line": "{}"}));
    assert_eq!(r["error"]["code"], "not_running", "{r}");

    // The daemon finishes the close with the lease's own grace.
    assert!(wait_for(|| !adapter.pid.alive()), "the adapter survived");
    assert!(wait_daemon(&mut c, |c| {
        session_status(c, "s").is_some_and(|s| s["phase"] == "ended")
    }));
    let lease = lease_row(&mut c, &lease_id);
    assert_eq!(lease["state"], "closed", "{lease}");
}

/// A lease `ended` by another process is the wrapper's report of the adapter's own exit, read by
/// whoever ingested it first (the session's own waiter, another session's settle): nothing was
/// closed, so the daemon does not take the session over, and a silent adapter's exit is still its
/// start failure. (Seen in CI: the waiter ingested the report, housekeeping saw the row `ended`
/// before the waiter had classified the exit, took the session over, and the session ended
/// `ended` instead of `start_failed`.) A lease another closer left `closing` is taken over in the
/// same round: that one is the sentinel that the daemon looked at the rows.
#[test]
fn a_lease_ended_elsewhere_is_not_taken_over() {
    let tmp = TempDir::new("d-underneath-ended");
    let state = tmp.join("state");
    let daemon = Daemon::start(&state, &[]);
    let mut c = daemon.connect();
    let quiet = c.call(
        "ensure",
        json!({"session": "quiet", "graceMs": 300, "argv": ["sh", "-c",
            "read l; echo 'bad config: no model' >&2; exit 2"]}),
    );
    let quiet_lease = quiet["leaseId"].as_str().unwrap().to_string();
    let (sentinel_lease, sentinel) = ensure_trap(&mut c, tmp.path(), "sentinel", 300);
    // The adapter's start is recorded (a start failure needs it).
    assert!(wait_daemon(&mut c, |c| !lease_row(c, &quiet_lease)
        ["adapterPid"]
        .is_null()));

    // A claimant that is gone: a child of ours, reaped.
    let mut gone = std::process::Command::new("true").spawn().unwrap();
    let gone_pid = gone.id() as i64;
    gone.wait().unwrap();
    {
        let mut db = rusqlite::Connection::open(state.join("leash.db")).unwrap();
        db.busy_timeout(std::time::Duration::from_secs(10)).unwrap();
        let tx = db.transaction().unwrap();
        tx.execute(
            "UPDATE leases SET state = 'ended' WHERE lease_id = ?1",
            [&quiet_lease],
        )
        .unwrap();
        tx.execute(
            "UPDATE leases SET state = 'closing', claimed_by_pid = ?1, claimed_by_start = 1 \
             WHERE lease_id = ?2",
            rusqlite::params![gone_pid, sentinel_lease],
        )
        .unwrap();
        tx.commit().unwrap();
    }
    let noticed = wait_daemon(&mut c, |c| {
        session_status(c, "sentinel").is_some_and(|s| s["phase"] != "running")
    });
    assert!(noticed, "the daemon never noticed the sentinel's lease");
    assert!(wait_for(|| !sentinel.pid.alive()), "the sentinel survived");
    let s = session_status(&mut c, "quiet").unwrap();
    assert_eq!(s["phase"], "running", "taken over: {s}");

    // The adapter reads its line and exits without a line of output: a start failure.
    c.call("send", json!({"session": "quiet", "line": "go"}));
    let (id, reply) = c.attach("quiet", 0);
    assert_eq!(reply["ok"], true, "{reply}");
    let end = loop {
        let item = c.next_item(&id);
        if item["type"] == "end" {
            break item;
        }
    };
    assert_eq!(end["reason"], "start_failed", "{end}");
    assert_eq!(end["error"]["exitStatus"], 2, "{end}");
}
