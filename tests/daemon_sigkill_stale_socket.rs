//! After `kill -9` of the daemon, the wrappers it spawned see their parent die and take their
//! adapters down (a stubborn adapter that ignores SIGTERM, and its child, included); the socket
//! file is left behind, stale; a new daemon detects that nothing answers on it, replaces it, and
//! its startup reap settles the dead daemon's leases.
mod common;
mod daemon_support;
use common::*;
use daemon_support::*;
use serde_json::json;
use std::os::unix::net::UnixStream;

#[test]
fn sessions_die_with_a_killed_daemon_and_a_new_daemon_takes_the_stale_socket() {
    let tmp = TempDir::new("d-kill9");
    let state = tmp.join("state");
    let d = tmp.path().display().to_string();
    let stubborn = script(
        tmp.path(),
        "stubborn.sh",
        &format!(
            r#"trap '' TERM
echo $$ > '{d}/'"$1".pid
sh -c 'trap "" TERM; sleep 1000 & echo $! > "{d}/'"$1"'.child.pid"; wait' &
exec cat"#
        ),
    );
    let mut guard = Guard::new();
    let mut daemon = Daemon::start(&state, &[]);
    let mut c = daemon.connect();
    let mut tree = Vec::new();
    let mut leases = Vec::new();
    for name in ["s1", "s2"] {
        let r = c.call(
            "ensure",
            json!({"session": name, "argv": [stubborn.to_str().unwrap(), name], "graceMs": 300}),
        );
        leases.push(r["leaseId"].as_str().unwrap().to_string());
        let wrapper = Pid::of(r["rootPid"].as_i64().unwrap() as i32).unwrap();
        let adapter = read_pid_file(&tmp.join(&format!("{name}.pid")));
        let child = read_pid_file(&tmp.join(&format!("{name}.child.pid")));
        for p in [wrapper, adapter, child] {
            guard.add(p);
            tree.push(p);
        }
    }
    drop(c);

    daemon.kill9();
    for p in &tree {
        assert!(
            wait_for(|| !p.alive()),
            "pid {} outlived the SIGKILLed daemon",
            p.pid
        );
    }
    assert!(
        daemon.socket.exists(),
        "a SIGKILLed daemon cannot remove its socket"
    );
    assert!(
        UnixStream::connect(&daemon.socket).is_err(),
        "nothing should answer on the stale socket"
    );
    // Without a daemon, the CLI falls back to the database (no daemon section in status).
    let st = run_json(&state, &["status", "--json"]);
    assert!(st.get("daemon").is_none(), "{st}");

    let next = Daemon::start(&state, &[]);
    assert!(
        next.log_text().contains("replacing a stale socket"),
        "{}",
        next.log_text()
    );
    let mut c = next.connect();
    for id in &leases {
        let l = lease_row(&mut c, id);
        assert!(
            l["state"] == "lost" || l["state"] == "closed" || l["state"] == "ended",
            "lease of the killed daemon not settled by the startup reap: {l}"
        );
    }
    let st = c.call("status", json!({}));
    assert_eq!(st["leases"]["open"], 0, "{st}");
    assert_eq!(st["daemon"]["pid"], next.pid.pid);
}
