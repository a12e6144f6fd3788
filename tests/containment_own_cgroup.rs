//! Without `LEASH_CGROUP_ROOT`, leash takes its own cgroup as the leash cgroup root: what a
//! gateway started by systemd with `Delegate=yes` gets (its service's cgroup, which the unit's
//! user owns). Here a shell moves itself into a cgroup the test made and execs leash with no root
//! given: `leash status` says containment is on with that cgroup as the root, a session's cgroup
//! is made under it and `close` takes the session's env-less `setsid` escapee; a daemon started
//! so moves into its leaf and reports containment on; after its SIGKILL the escapee is gone with
//! the lease's cgroup and the next daemon settles the lease. As root the test cgroup is
//! under the cgroup2 mount; run as an ordinary user in a delegated subtree (`.ci/rootless.sh`)
//! it is under that subtree, which is the path an unprivileged gateway takes.
mod common;
mod daemon_support;
use common::*;
use daemon_support::*;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// `sh -c 'echo $$ > <cg>/cgroup.procs && exec leash --state-dir STATE ARGS…'` with neither
/// `LEASH_CGROUP_ROOT` nor `LEASH_CONTAINMENT` set: leash resolves containment by itself.
fn leash_in(cg: &Path, state: &Path, args: &[&str]) -> Command {
    let mut c = Command::new("/bin/sh");
    c.arg("-c")
        .arg(r#"echo $$ > "$0/cgroup.procs" && shift && exec "$@""#)
        .arg(cg)
        .arg("-")
        .arg(leash_bin())
        .arg("--state-dir")
        .arg(state)
        .args(args)
        .env_remove("LEASH_CGROUP_ROOT")
        .env_remove("LEASH_CONTAINMENT")
        .env_remove("LEASH_STATE_DIR")
        .env_remove("LEASH_LOG")
        .stdin(Stdio::null());
    c
}

fn json_of(cmd: &mut Command) -> Value {
    let out = cmd.output().expect("run leash");
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{cmd:?}: bad JSON ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

/// An adapter whose escapee double-forks, calls setsid, clears its environment and ignores TERM.
fn escapee_adapter(dir: &Path) -> PathBuf {
    let d = dir.display();
    script(
        dir,
        "adapter.sh",
        &format!(
            "( setsid env -i /bin/sh -c 'trap \"\" TERM; echo $$ > \"{d}/escapee.pid\"; \
             exec sleep 100000' & )\nexec sleep 100000"
        ),
    )
}

#[test]
fn leash_in_its_own_cgroup_contains_there_and_close_takes_the_escapee() {
    let Some(cg) = CgroupRoot::new("own") else {
        return;
    };
    let tmp = TempDir::new("own-cg");
    let state = tmp.join("state");
    init_state_root(&state);
    let st = json_of(leash_in(cg.path(), &state, &["status", "--json"]).stdout(Stdio::piped()));
    assert_eq!(st["containment"]["mode"], "on", "{st}");
    assert_eq!(
        st["containment"]["root"],
        cg.path().display().to_string(),
        "{st}"
    );

    let mut guard = Guard::new();
    let adapter = escapee_adapter(tmp.path());
    let child = guard.child(
        leash_in(
            cg.path(),
            &state,
            &["exec", "--session", "s", "--grace-ms", "200", "--"],
        )
        .arg(&adapter)
        .spawn()
        .unwrap(),
    );
    let wrapper = Pid::of(child.id() as i32).unwrap();
    let escapee = read_pid_file(&tmp.join("escapee.pid"));
    guard.add(escapee);
    let lease = lease_of(&state, "s");
    let cgroup = PathBuf::from(lease["cgroupPath"].as_str().expect("contained"));
    let gw = st["gatewayInstanceId"].as_str().unwrap();
    assert_eq!(
        cgroup.parent(),
        Some(cg.path().join(gw).as_path()),
        "{lease}"
    );
    assert!(cgroup_procs(&cgroup).contains(&escapee.pid));

    let out = leash_in(cg.path(), &state, &["close", "--session", "s"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(wait_for(|| !escapee.alive()), "close left the escapee");
    assert!(wait_for(|| !wrapper.alive()), "the wrapper did not exit");
    assert!(wait_for(|| !cgroup.exists()), "the lease cgroup is left");
}

#[test]
fn a_daemon_in_its_own_cgroup_contains_and_its_sigkill_is_settled_by_the_next() {
    let Some(cg) = CgroupRoot::new("own-d") else {
        return;
    };
    let tmp = TempDir::new("own-cg-d");
    let state = tmp.join("state");
    let adapter = escapee_adapter(tmp.path());
    let mut guard = Guard::new();
    let serve = |guard: &mut Guard| {
        let child = guard.child(
            leash_in(cg.path(), &state, &["serve"])
                .stderr(Stdio::null())
                .spawn()
                .unwrap(),
        );
        let pid = Pid::of(child.id() as i32).unwrap();
        assert!(
            wait_for(|| std::os::unix::net::UnixStream::connect(state.join("leash.sock")).is_ok()),
            "the daemon never listened"
        );
        pid
    };
    let daemon = serve(&mut guard);
    // It moved into its leaf, and resolved containment from there (the leaf stripped).
    assert!(cgroup_procs(&cg.path().join("leash-daemon")).contains(&daemon.pid));
    let mut c = Conn::open(&state.join("leash.sock"));
    let st = c.call("status", json!({}));
    assert_eq!(st["containment"]["mode"], "on", "{st}");
    assert_eq!(
        st["containment"]["root"],
        cg.path().display().to_string(),
        "{st}"
    );
    let started = c.call(
        "ensure",
        json!({"session": "s", "argv": [adapter.to_str().unwrap()], "graceMs": 200}),
    );
    let escapee = read_pid_file(&tmp.join("escapee.pid"));
    guard.add(escapee);
    let lease = lease_row(&mut c, started["leaseId"].as_str().unwrap());
    let cgroup = PathBuf::from(lease["cgroupPath"].as_str().expect("contained"));
    assert!(cgroup.starts_with(cg.path()) && !cgroup.starts_with(cg.path().join("leash-daemon")));
    assert!(cgroup_procs(&cgroup).contains(&escapee.pid));

    // SIGKILL: the wrapper sees its parent die and kills its lease's cgroup, escapee included;
    // the next daemon, started the same way, settles the lease and removes the cgroup.
    drop(c);
    signal(daemon, libc::SIGKILL);
    assert!(wait_for(|| !daemon.alive()), "the daemon did not die");
    assert!(
        wait_for(|| !escapee.alive()),
        "the escapee outlived the SIGKILLed daemon"
    );
    let next = serve(&mut guard);
    let mut c = Conn::open(&state.join("leash.sock"));
    let l = lease_row(&mut c, started["leaseId"].as_str().unwrap());
    assert!(
        l["state"] == "lost" || l["state"] == "closed" || l["state"] == "ended",
        "lease of the killed daemon not settled by the start-up reap: {l}"
    );
    assert!(wait_for(|| !cgroup.exists()), "the lease cgroup is left");
    let st = c.call("status", json!({}));
    assert_eq!(st["containment"]["mode"], "on", "{st}");
    drop(c);
    signal(next, libc::SIGTERM);
    assert!(wait_for(|| !next.alive()), "the daemon did not stop");
}
