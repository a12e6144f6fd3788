//! The gateway's cgroup directory (`<leash cgroup root>/<gateway id>`) goes with its last session
//! when no daemon runs: the wrapper that removes the last lease cgroup
//! removes the empty gateway directory too, and so does a close that removes the last one; while
//! another session's cgroup is in it, it stays; the next `leash exec` makes it again. With a
//! daemon serving the state root it stays for the daemon's life (its hold, `daemon-hold`, which
//! no sweep takes for a stray), and goes when the daemon stops, or, after a daemon that was
//! killed, with the next reap that finds no daemon serving. Live, as root with cgroup2, under
//! a cgroup root the test made (skipped, saying why, elsewhere).
mod common;
mod daemon_support;
use common::*;
use std::process::Stdio;

fn gateway_dir(cg: &CgroupRoot, state: &std::path::Path) -> std::path::PathBuf {
    let out = cg.leash(state).args(["status", "--json"]).output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let id = v["gatewayInstanceId"]
        .as_str()
        .or_else(|| v["root"]["gatewayInstanceId"].as_str())
        .unwrap_or_else(|| panic!("no gateway id in {v}"));
    cg.path().join(id)
}

#[test]
fn the_last_session_of_a_gateway_takes_its_cgroup_directory_along() {
    let Some(cg) = CgroupRoot::new("gwdir") else {
        return;
    };
    let tmp = TempDir::new("gwdir");
    let state = tmp.join("state");
    let mut guard = Guard::new();

    // One session that ends on its own: the wrapper removes its lease cgroup and the gateway's.
    let out = cg
        .leash(&state)
        .args(["exec", "--session", "short", "--", "true"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let gw = gateway_dir(&cg, &state);
    let lease = lease_of(&state, "short");
    let lease_cg = lease["cgroupPath"].as_str().expect("contained").to_string();
    assert!(lease_cg.starts_with(gw.to_str().unwrap()), "{lease}");
    assert!(!std::path::Path::new(&lease_cg).exists(), "{lease_cg}");
    assert!(
        !gw.exists(),
        "empty gateway directory left behind: {}",
        gw.display()
    );

    // A live session keeps the directory while a short one ends beside it.
    let child = guard.child(
        cg.leash(&state)
            .args(["exec", "--session", "long", "--", "sleep", "1000"])
            .stdin(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let wrapper = Pid::of(child.id() as i32).unwrap();
    guard.add(adapter_of(wrapper));
    assert!(
        gw.is_dir(),
        "the next exec makes the gateway directory again"
    );
    let out = cg
        .leash(&state)
        .args(["exec", "--session", "beside", "--", "true"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let long_cg = lease_of(&state, "long")["cgroupPath"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(gw.is_dir() && std::path::Path::new(&long_cg).is_dir());
    assert!(cgroup_procs(std::path::Path::new(&long_cg)).contains(&adapter_of(wrapper).pid));

    // The close of the last one removes it (leash close, not the wrapper, may get there first).
    let out = cg
        .leash(&state)
        .args(["close", "--session", "long", "--grace", "200ms"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(
        wait_for(|| !gw.exists()),
        "{} left after the close",
        gw.display()
    );

    // And a session after that is contained again, in a fresh gateway directory.
    let out = cg
        .leash(&state)
        .args([
            "exec",
            "--session",
            "again",
            "--",
            "cat",
            "/proc/self/cgroup",
        ])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let again = lease_of(&state, "again");
    let id = again["leaseId"].as_str().unwrap();
    let gw_name = gw.file_name().unwrap().to_str().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&format!("/{gw_name}/{id}")),
        "the adapter ran outside its lease cgroup: {text}"
    );
    assert!(!gw.exists());
}

/// A daemon of `state` containing under `cg`, and its gateway's directory, held.
fn contained_daemon(
    cg: &CgroupRoot,
    state: &std::path::Path,
) -> (daemon_support::Daemon, std::path::PathBuf) {
    let daemon = daemon_support::Daemon::start_with_env(
        state,
        &[],
        "info",
        &[
            ("LEASH_CGROUP_ROOT", cg.path().to_str().unwrap()),
            ("LEASH_CONTAINMENT", "on"),
        ],
    );
    let gw = gateway_dir(cg, state);
    let hold = gw.join("daemon-hold");
    assert!(hold.is_dir(), "no hold at {}", hold.display());
    (daemon, gw)
}

#[test]
fn a_daemon_keeps_its_gateway_directory_while_it_serves() {
    let Some(cg) = CgroupRoot::new("gwhold") else {
        return;
    };
    let tmp = TempDir::new("gwhold");
    let state = tmp.join("state");
    let (mut daemon, gw) = contained_daemon(&cg, &state);
    for round in 0..2 {
        let out = cg
            .leash(&state)
            .args(["exec", "--session", &format!("s{round}"), "--", "true"])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        let lease = lease_of(&state, &format!("s{round}"));
        let lease_cg = lease["cgroupPath"].as_str().expect("contained");
        assert!(lease_cg.starts_with(gw.to_str().unwrap()), "{lease}");
        assert!(!std::path::Path::new(lease_cg).exists(), "{lease_cg}");
        assert!(
            gw.is_dir(),
            "round {round}: the wrapper took the gateway directory"
        );
    }
    // A reap sees no stray in it, and leaves it.
    let plan = cg
        .leash(&state)
        .args(["reap", "--dry-run", "--json"])
        .output()
        .unwrap();
    assert!(plan.status.success(), "{plan:?}");
    let text = String::from_utf8_lossy(&plan.stdout);
    assert!(!text.contains("daemon-hold"), "{text}");
    assert!(daemon.terminate().success());
    assert!(
        !gw.exists(),
        "{} left after the daemon stopped",
        gw.display()
    );
}

/// A daemon that is SIGKILLed cannot remove its hold: the gateway's directory stays. With no
/// daemon serving the state root, `leash reap` removes the hold and the empty directory, as the
/// daemon would have when stopping; a reap while a daemon serves leaves its hold alone.
#[test]
fn a_killed_daemons_hold_is_removed_by_the_next_reap() {
    let Some(cg) = CgroupRoot::new("gwstale") else {
        return;
    };
    let tmp = TempDir::new("gwstale");
    let state = tmp.join("state");
    let (mut daemon, gw) = contained_daemon(&cg, &state);
    let hold = gw.join("daemon-hold");
    let reap = || {
        let out = cg
            .leash(&state)
            .args(["reap", "--json"])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
    };
    // Served: the reap (through the daemon or not) keeps the hold.
    reap();
    assert!(hold.is_dir(), "a reap took the serving daemon's hold");
    daemon.kill9();
    assert!(hold.is_dir(), "the hold went with a SIGKILLed daemon");
    reap();
    assert!(
        !gw.exists(),
        "{} left after a reap with no daemon serving",
        gw.display()
    );
}
