//! A wrapper SIGKILLed under the daemon. The daemon is the wrapper's parent and learns of its death
//! at once; the surviving, TERM-ignoring member of its tree (it still holds the stdout pipe) is
//! terminated within the session's grace — without first waiting for that pipe to drain.
mod common;
mod daemon_support;
use common::*;
use daemon_support::*;
use serde_json::json;
use std::time::{Duration, Instant};

#[test]
fn a_sigkilled_wrapper_is_settled_within_the_grace() {
    let tmp = TempDir::new("d-wrapkill");
    let state = tmp.join("state");
    let daemon = Daemon::start(&state, &[]);
    let mut c = daemon.connect();
    let pidfile = tmp.join("stubborn.pid");
    // A member of the adapter's group that SIGTERM cannot stop (ignored signals stay ignored in
    // children) and that holds the adapter's stdout.
    let stubborn = script(
        tmp.path(),
        "stubborn.sh",
        r#"trap '' TERM; sleep 1000 & echo $! > "$1"; wait"#,
    );
    let started = c.call(
        "ensure",
        json!({"session": "s", "argv": [stubborn.to_str().unwrap(), pidfile.to_str().unwrap()], "graceMs": 300}),
    );
    let member = read_pid_file(&pidfile);
    let wrapper = Pid::of(started["rootPid"].as_i64().unwrap() as i32).unwrap();

    let t = Instant::now();
    signal(wrapper, libc::SIGKILL);
    assert!(wait_for(|| !member.alive()), "the group member survived");
    let took = t.elapsed();
    // Grace 300 ms, then SIGKILL; nothing waits 5 s for the dead wrapper's pipe first.
    assert!(
        took < Duration::from_millis(4000),
        "the tree outlived its wrapper by {took:?}"
    );
    assert!(wait_daemon(&mut c, |c| {
        session_status(c, "s").is_some_and(|s| s["phase"] == "ended")
    }));
    let lease = lease_row(&mut c, started["leaseId"].as_str().unwrap());
    assert_eq!(lease["state"], "closed", "{lease}");
}
