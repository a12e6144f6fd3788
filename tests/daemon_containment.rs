//! Containment through the daemon: sessions it spawns are contained in the daemon's cgroup root
//! (whatever a client's `env` says), its status carries the containment and each contained
//! session's totals, `ensure` with a limit the controllers cannot enforce is refused, and a close
//! through the daemon takes an env-less escapee; the gateway's cgroup directory stays, empty but
//! for the daemon's hold, after its last session, holds the next, and a daemon that stops leaves
//! none behind. The test binary's own cgroup root (see `tests/common`) is where the daemon puts
//! them.
mod common;
mod daemon_support;
use common::*;
use daemon_support::*;
use serde_json::json;

#[test]
fn daemon_sessions_are_contained_with_totals_limits_and_escapees() {
    let tmp = TempDir::new("d-contain");
    if std::env::var("LEASH_CONTAINMENT").as_deref() == Ok("off")
        || std::env::var_os("LEASH_CGROUP_ROOT").is_none()
    {
        common::skip(
            "containment is off for this run (no cgroup2, neither root nor a delegated subtree, or LEASH_TEST_CONTAINMENT=off)",
        );
        return;
    }
    let state = tmp.join("state");
    let d = tmp.path().display().to_string();
    let adapter = script(
        tmp.path(),
        "adapter.sh",
        &format!(
            "( setsid env -i /bin/sh -c 'trap \"\" TERM; echo $$ > \"{d}/escapee.pid\"; \
             exec sleep 100000' & )\nexec sleep 100000"
        ),
    );
    let mut daemon = Daemon::start(&state, &[]);
    let mut c = daemon.connect();
    let mut guard = Guard::new();
    // A client cannot switch containment off for its session (LEASH_* names are refused).
    assert_eq!(
        c.error_code(
            "ensure",
            json!({"session": "x", "argv": ["true"], "env": {"LEASH_CONTAINMENT": "off"}})
        ),
        "bad_request"
    );
    let started = c.call(
        "ensure",
        json!({"session": "s", "argv": [adapter.to_str().unwrap()], "graceMs": 200}),
    );
    let escapee = read_pid_file(&tmp.join("escapee.pid"));
    guard.add(escapee);
    let lease = lease_row(&mut c, started["leaseId"].as_str().unwrap());
    let cgroup = std::path::PathBuf::from(lease["cgroupPath"].as_str().expect("contained"));
    assert!(cgroup_procs(&cgroup).contains(&escapee.pid));

    let st = c.call("status", json!({}));
    assert_eq!(st["containment"]["mode"], "on", "{st}");
    let s = session_status(&mut c, "s").unwrap();
    assert_eq!(s["usage"]["processes"], 3, "wrapper, adapter, escapee: {s}");
    assert!(s["usage"]["rssBytes"].as_u64().unwrap() > 0, "{s}");

    let controllers = std::fs::read_to_string(cgroup.parent().unwrap().join("cgroup.controllers"))
        .unwrap_or_default();
    if !controllers.split_whitespace().any(|c| c == "memory") {
        let r = c.request(
            "ensure",
            json!({"session": "m", "argv": ["sleep", "100"], "memoryMax": 67108864}),
        );
        assert_eq!(r["error"]["code"], "spawn_failed", "{r}");
        assert!(
            r["error"]["message"]
                .as_str()
                .unwrap()
                .contains("memory controller"),
            "{r}"
        );
    }

    let out = run(
        &state,
        &["close", "--session", "s", "--grace-ms", "200", "--json"],
    );
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert!(
        wait_for(|| !escapee.alive()),
        "close through the daemon left the escapee"
    );
    assert!(wait_for(|| !cgroup.exists()), "cgroup not removed");
    // Without a daemon the gateway's directory goes with its last session (see
    // tests/cgroup_gateway_dir.rs); a serving daemon keeps it for its life, empty but for its
    // hold (no `leash exec` makes it again), and takes it along when it stops (below).
    let gateway_dir = cgroup.parent().unwrap().to_path_buf();
    let entries = |d: &std::path::Path| -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(d)
            .map(|r| {
                r.flatten()
                    .filter(|e| e.path().is_dir())
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        v.sort();
        v
    };
    assert!(
        wait_for(|| entries(&gateway_dir) == ["daemon-hold"]),
        "{} holds {:?} after its last session was closed",
        gateway_dir.display(),
        entries(&gateway_dir)
    );
    let next = c.call(
        "ensure",
        json!({"session": "t", "argv": ["sleep", "100000"], "graceMs": 200}),
    );
    let next = lease_row(&mut c, next["leaseId"].as_str().unwrap());
    let next_cg = std::path::PathBuf::from(next["cgroupPath"].as_str().expect("contained"));
    assert_eq!(next_cg.parent(), Some(gateway_dir.as_path()), "{next}");
    assert!(
        gateway_dir.is_dir(),
        "the gateway's directory holds the sessions' cgroups"
    );
    let status = daemon.terminate();
    assert!(status.success(), "{status:?}");
    // A stopping daemon leaves no empty directory of its gateway behind in the hierarchy.
    assert!(
        !gateway_dir.exists(),
        "{} is left after the daemon stopped with no session",
        gateway_dir.display()
    );
}
