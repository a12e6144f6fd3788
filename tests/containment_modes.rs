//! Containment is on by default where leash can create cgroups, `--containment off` (and
//! `LEASH_CONTAINMENT=off`) behaves as before, an unusable setup is reported by `leash status` with
//! the reason and never stops a session from starting, and limits are applied or refused, never
//! ignored: on this host the v2 hierarchy has no memory or pids controller, so the refusal is what
//! is checked live (the write path is unit-tested on a fake directory).
mod common;
use common::*;
use serde_json::Value;
use std::path::Path;
use std::process::Stdio;

fn status(cmd: &mut std::process::Command) -> Value {
    let out = cmd.args(["status", "--json"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn own_cgroup_of(pid: i32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("0::").map(str::to_owned))
        .unwrap_or_default()
}

#[test]
fn status_reports_the_mode_the_root_and_why_not() {
    let Some(cg) = CgroupRoot::new("status") else {
        return;
    };
    let tmp = TempDir::new("cg-status");
    let state = tmp.join("state");
    init_state_root(&state);
    let on = status(&mut cg.leash(&state));
    assert_eq!(on["containment"]["mode"], "on", "{on}");
    assert_eq!(on["containment"]["root"], cg.path().display().to_string());
    let gw = on["gatewayInstanceId"].as_str().unwrap();
    assert_eq!(
        on["containment"]["gatewayRoot"],
        cg.path().join(gw).display().to_string()
    );
    let text = cg.leash(&state).arg("status").output().unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("containment       on"), "{text}");

    let off = status(cg.leash(&state).args(["--containment", "off"]));
    assert_eq!(off["containment"]["mode"], "off", "{off}");
    let off_env = status(cg.leash(&state).env("LEASH_CONTAINMENT", "off"));
    assert_eq!(off_env["containment"]["mode"], "off", "{off_env}");

    let outside = status(
        cg.leash(&state)
            .env("LEASH_CGROUP_ROOT", "/tmp/not-a-cgroup"),
    );
    assert_eq!(outside["containment"]["mode"], "unavailable", "{outside}");
    assert!(
        outside["containment"]["reason"]
            .as_str()
            .unwrap()
            .contains("not an absolute path under the cgroup2 mount"),
        "{outside}"
    );
    let bad = cg
        .leash(&state)
        .args(["--containment", "maybe", "status"])
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2), "a bad mode is bad usage");
}

/// With containment off, or unavailable, a session starts and ends as it did before cgroups:
/// no cgroup recorded, the adapter stays in the caller's cgroup, and nothing is created.
#[test]
fn off_and_unavailable_start_sessions_as_before() {
    let Some(cg) = CgroupRoot::new("off") else {
        return;
    };
    let tmp = TempDir::new("cg-off");
    let state = tmp.join("state");
    let mut guard = Guard::new();
    for (key, setting) in [
        ("off", ("LEASH_CONTAINMENT", "off")),
        ("unavailable", ("LEASH_CGROUP_ROOT", "/tmp/not-a-cgroup")),
    ] {
        let mut child = cg
            .leash(&state)
            .env(setting.0, setting.1)
            .args([
                "exec",
                "--grace-ms",
                "200",
                "--session",
                key,
                "--",
                "sleep",
                "100000",
            ])
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        let wrapper = Pid::of(child.id() as i32).unwrap();
        guard.add(wrapper);
        let adapter = adapter_of(wrapper);
        guard.add(adapter);
        let lease = lease_of(&state, key);
        assert!(lease["cgroupPath"].is_null(), "{lease}");
        assert_eq!(
            own_cgroup_of(adapter.pid),
            own_cgroup_of(std::process::id() as i32),
            "the adapter stays in its caller's cgroup"
        );
        let out = cg
            .leash(&state)
            .env(setting.0, setting.1)
            .args(["close", "--json", "--session", key])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0));
        assert!(!adapter.alive());
        child.wait().unwrap();
    }
    let made: Vec<_> = std::fs::read_dir(cg.path())
        .unwrap()
        .flatten()
        .filter(|e| e.path().is_dir())
        .collect();
    assert!(made.is_empty(), "nothing made under the root: {made:?}");
}

fn leases_in(state: &Path) -> usize {
    leases(state).len()
}

#[test]
fn limits_are_refused_where_the_controller_is_missing_and_nothing_starts() {
    let Some(cg) = CgroupRoot::new("limits") else {
        return;
    };
    let tmp = TempDir::new("cg-limits");
    let state = tmp.join("state");
    let controllers =
        std::fs::read_to_string(cg.path().join("cgroup.controllers")).unwrap_or_default();
    if controllers.split_whitespace().any(|c| c == "memory") {
        skip("this host's cgroup2 has the memory controller; the refusal needs one without");
        return;
    }
    let marker = tmp.join("ran");
    let out = cg
        .leash(&state)
        .args([
            "exec",
            "--memory-max",
            "64M",
            "--session",
            "m",
            "--",
            "touch",
        ])
        .arg(&marker)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{err}");
    assert!(err.contains("memory controller"), "{err}");
    assert!(err.contains("Delegate=yes"), "{err}");
    assert!(!marker.exists(), "the command ran despite the refusal");
    assert_eq!(leases_in(&state), 0, "no lease for a refused start");
    let gw_dirs: usize = std::fs::read_dir(cg.path())
        .unwrap()
        .flatten()
        .filter(|e| e.path().is_dir())
        .map(|e| {
            std::fs::read_dir(e.path())
                .unwrap()
                .flatten()
                .filter(|e| e.path().is_dir())
                .count()
        })
        .sum();
    assert_eq!(gw_dirs, 0, "the refused session's cgroup was removed");

    let out = cg
        .leash(&state)
        .args([
            "--containment",
            "off",
            "exec",
            "--pids-max",
            "10",
            "--",
            "touch",
        ])
        .arg(&marker)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{err}");
    assert!(err.contains("containment is off"), "{err}");
    assert!(!marker.exists());

    let out = cg
        .leash(&state)
        .args(["exec", "--memory-max", "lots", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(125),
        "a bad size is a failure of exec itself"
    );
}

/// The adapter starts inside its cgroup both ways: clone3(CLONE_INTO_CGROUP), and the fallback
/// for kernels without it (the child writes itself into cgroup.procs before its exec), which
/// `LEASH_WRAP_CGROUP_PROCS_WRITE=1` forces here. The wrapper stays outside either way.
#[test]
fn the_adapter_starts_inside_its_cgroup_with_clone3_and_with_the_fallback() {
    let Some(cg) = CgroupRoot::new("spawn") else {
        return;
    };
    let tmp = TempDir::new("cg-spawn");
    let state = tmp.join("state");
    let mut guard = Guard::new();
    for (key, force) in [("clone3", "0"), ("procs", "1")] {
        let mut child = cg
            .leash(&state)
            .env("LEASH_WRAP_CGROUP_PROCS_WRITE", force)
            .args(["exec", "--session", key, "--", "sleep", "100000"])
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        let wrapper = Pid::of(child.id() as i32).unwrap();
        guard.add(wrapper);
        let adapter = adapter_of(wrapper);
        guard.add(adapter);
        let lease = lease_of(&state, key);
        let path = lease["cgroupPath"].as_str().unwrap().to_string();
        let mount = cgroup2_mount().unwrap();
        let rel = path.strip_prefix(mount.to_str().unwrap()).unwrap();
        // Once it runs the command (with the fallback it joins between fork and exec).
        assert!(wait_for(|| std::fs::read_to_string(format!(
            "/proc/{}/cmdline",
            adapter.pid
        ))
        .is_ok_and(|c| c.starts_with("sleep"))));
        assert_eq!(
            own_cgroup_of(adapter.pid),
            rel,
            "{key}: adapter in the lease's cgroup"
        );
        assert_ne!(
            own_cgroup_of(wrapper.pid),
            rel,
            "{key}: the wrapper stays outside"
        );
        let ino = std::fs::metadata(&path).map(|m| std::os::unix::fs::MetadataExt::ino(&m));
        assert_eq!(
            ino.unwrap(),
            lease["cgroupId"].as_u64().unwrap(),
            "id = inode"
        );
        let out = cg
            .leash(&state)
            .args(["close", "--json", "--session", key, "--grace-ms", "200"])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0));
        child.wait().unwrap();
        assert!(
            wait_for(|| !Path::new(&path).exists()),
            "{key}: cgroup removed"
        );
    }
}
