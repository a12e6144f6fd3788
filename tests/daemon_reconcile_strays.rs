//! The daemon's reconcile timer also sweeps stray cgroups under containment. A cgroup under this
//! gateway's cgroup root that no lease names (as a `leash exec` that died between its mkdir and its
//! commit leaves it), old enough that no commit can still be in flight, is removed within two
//! passes when it is empty, without anyone running `reap`; with a process inside (which leash
//! cannot have started: a wrapper starts only after its lease's commit) it is left, and so is the
//! process. A directory that is not named for a lease id is left alone too. The log
//! reports each stray once, not on every pass.
mod common;
mod daemon_support;
use common::*;
use daemon_support::*;
use serde_json::json;
use std::path::PathBuf;

fn passes(c: &mut Conn) -> u64 {
    let s = c.call("status", json!({}));
    s["daemon"]["reconcile"]["last"]["passes"]
        .as_u64()
        .unwrap_or(0)
}

#[test]
fn reconcile_removes_a_stray_cgroup_and_leaves_what_leash_did_not_make() {
    let Some(cg) = CgroupRoot::new("reconcile-stray") else {
        return;
    };
    let tmp = TempDir::new("reconcile-stray");
    let state = tmp.join("state");
    init_state_root(&state);
    let out = cg
        .leash(&state)
        .args(["status", "--json"])
        .output()
        .unwrap();
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let gw_root = PathBuf::from(
        status["containment"]["gatewayRoot"]
            .as_str()
            .unwrap_or_else(|| panic!("{status}")),
    );
    std::fs::create_dir_all(&gw_root).unwrap();

    let d = Daemon::start(
        &state,
        &[
            "--reconcile-interval",
            "300ms",
            "--containment",
            "on",
            "--cgroup-root",
            cg.path().to_str().unwrap(),
        ],
    );
    let mut c = d.connect();
    // Made after the start-up reap (which sweeps strays too): only the timer can take it.
    let mut guard = Guard::new();
    let mut put_sleep_in = |dir: &std::path::Path| {
        let child = std::process::Command::new("sleep")
            .arg("100000")
            .spawn()
            .unwrap();
        let pid = Pid::of(child.id() as i32).unwrap();
        guard.child(child);
        // The sleep is moved, never the test process itself.
        std::fs::write(dir.join("cgroup.procs"), pid.pid.to_string()).unwrap();
        pid
    };
    // Named for a UUIDv7 lease id from 2023: long past any commit still in flight.
    let stray = gw_root.join("01890000-0000-7000-8000-000000000000");
    std::fs::create_dir(&stray).unwrap();
    let populated = gw_root.join("01890000-0000-7000-8000-0000000000aa");
    std::fs::create_dir(&populated).unwrap();
    let inside = put_sleep_in(&populated);
    // Not named for a lease id: leash did not make it, so it never touches it.
    let foreign = gw_root.join("not-a-lease");
    std::fs::create_dir(&foreign).unwrap();
    let bystander = put_sleep_in(&foreign);

    let from = passes(&mut c);
    assert!(
        wait_for(|| passes(&mut c) >= from + 2),
        "no two reconcile passes"
    );
    assert!(!stray.exists(), "the empty stray cgroup was not removed");
    assert!(populated.exists(), "a populated stray cgroup was removed");
    assert!(
        inside.alive(),
        "a process in a stray cgroup (leash never started it) was killed"
    );
    assert!(foreign.exists(), "a cgroup leash did not make was removed");
    assert!(
        bystander.alive(),
        "a process leash did not start was killed"
    );
    // Every pass finds the two that stay; the log says so once per stray, with plain cgroup
    // ids and pids, never Rust's `Some(…)`.
    let from = passes(&mut c);
    assert!(
        wait_for(|| passes(&mut c) >= from + 3),
        "no three more reconcile passes"
    );
    let log = d.log_text();
    for dir in [&stray, &populated, &foreign] {
        let lines: Vec<&str> = log
            .lines()
            .filter(|l| l.contains(dir.to_str().unwrap()))
            .collect();
        assert_eq!(lines.len(), 1, "{}: {lines:#?}", dir.display());
    }
    assert!(
        log.lines()
            .any(|l| l.contains("populated stray cgroup left alone")
                && l.contains(&format!("pids={}", inside.pid))),
        "{log}"
    );
    assert!(!log.contains("Some(") && !log.contains("None"), "{log}");
    let last = c.call("status", json!({}));
    assert!(
        last["daemon"]["reconcile"]["last"]["straysRemoved"]
            .as_u64()
            .is_some(),
        "{last}"
    );
}
