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
