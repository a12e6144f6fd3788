//! A daemon that runs in the leash cgroup root itself (as under systemd with `Delegate=yes`, where
//! the service's cgroup is the root) moves into `<root>/leash-daemon` at start, so that the root
//! holds no process and controllers can be enabled for the session cgroups; its sessions' cgroups
//! are still made under `<root>/<gateway id>/`. The move into the root is staged by the shell that
//! starts the daemon (a child process), never by the test.
mod common;
mod daemon_support;
use common::*;
use daemon_support::*;
use serde_json::json;
use std::process::Stdio;

fn cgroup_of(pid: i32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("0::").map(str::to_owned))
        .unwrap_or_default()
}

#[test]
fn a_daemon_in_the_root_moves_into_its_leaf_and_contains_its_sessions() {
    let Some(cg) = CgroupRoot::new("leaf") else {
        return;
    };
    let tmp = TempDir::new("d-leaf");
    let state = tmp.join("state");
    let mut guard = Guard::new();
    let mut serve = std::process::Command::new("/bin/sh")
        .arg("-c")
        .arg(format!(
            "echo $$ > '{}/cgroup.procs' && exec '{}' --state-dir '{}' serve",
            cg.path().display(),
            leash_bin().display(),
            state.display()
        ))
        .env("LEASH_CGROUP_ROOT", cg.path())
        .env("LEASH_CONTAINMENT", "on")
        .env_remove("LEASH_STATE_DIR")
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let daemon = Pid::of(serve.id() as i32).unwrap();
    guard.add(daemon);
    let mount = cgroup2_mount().unwrap();
    let rel_root = format!("/{}", cg.path().strip_prefix(&mount).unwrap().display());
    let leaf = format!("{rel_root}/leash-daemon");
    assert!(
        wait_for(|| cgroup_of(daemon.pid) == leaf),
        "daemon in {} not {leaf}",
        cgroup_of(daemon.pid)
    );
    assert!(wait_for(|| std::os::unix::net::UnixStream::connect(
        state.join("leash.sock")
    )
    .is_ok()));
    let mut c = Conn::open(&state.join("leash.sock"));
    let started = c.call(
        "ensure",
        json!({"session": "s", "argv": ["sleep", "100000"], "graceMs": 200}),
    );
    let lease = lease_row(&mut c, started["leaseId"].as_str().unwrap());
    let path = lease["cgroupPath"].as_str().expect("contained").to_string();
    assert!(
        path.starts_with(&cg.path().display().to_string()) && !path.contains("leash-daemon"),
        "{path}"
    );
    assert!(
        cgroup_procs(cg.path()).is_empty(),
        "the root holds no process"
    );
    signal(daemon, libc::SIGTERM);
    let _ = serve.wait();
}
