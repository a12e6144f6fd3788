//! Issue 24: when every lease is contained, `reap` reads only what its leases name — their roots,
//! owners and adapters, and the members their cgroups list — not the host. A counting
//! `ProcessTable` over the live table counts every `/proc` entry read through the trait while a
//! reap runs next to a thousand unrelated processes: no host-wide pass, and a few entries per
//! lease. The reap still does its work: the session whose wrapper was SIGKILLed is reaped through
//! its verified cgroup (its `setsid` escapee with it), the live sessions are skipped, a closed
//! lease's cgroup is gone, and every unrelated process survives. Real cgroups, real processes.
mod common;
use common::counting::Counting;
use common::*;
use leash::controller::{CloseResult, Controller};
use leash::state::StateRoot;
use leash_core::plan::ReapOptions;
use std::path::Path;
use std::process::{Command, Stdio};

/// Unrelated processes on the host: the test's own `sleep`s, of the reaper's uid (the costly
/// case: their environ is what a host-wide pass reads).
const UNRELATED: usize = 1000;

/// An adapter with a `setsid` child (out of the group, still in the lease's cgroup).
fn adapter(dir: &Path, key: &str) -> std::path::PathBuf {
    let d = dir.display();
    script(
        dir,
        &format!("adapter-{key}.sh"),
        &format!(
            "echo $$ > '{d}/{key}.adapter.pid'\nsetsid sleep 100000 & echo $! > '{d}/{key}.escapee.pid'\nexec sleep 100000"
        ),
    )
}

fn close(cg: &CgroupRoot, state: &Path, key: &str) {
    let out = cg
        .leash(state)
        .args(["close", "--session", key])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "close {key}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_reap_of_contained_leases_reads_their_members_not_the_host() {
    let Some(cg) = CgroupRoot::new("reapreads") else {
        return;
    };
    let tmp = TempDir::new("reapreads");
    let state = tmp.join("state");
    let mut guard = Guard::new();

    // Four contained sessions, owned by this (live) test process.
    let keys = ["a", "b", "c", "d"];
    let mut sessions = Vec::new();
    for key in keys {
        let child = cg
            .leash(&state)
            .args(["exec", "--grace-ms", "200", "--session", key, "--"])
            .arg(adapter(tmp.path(), key))
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        let wrapper = Pid::of(child.id() as i32).unwrap();
        guard.add(wrapper);
        let escapee = read_pid_file(&tmp.join(&format!("{key}.escapee.pid")));
        guard.add(escapee);
        sessions.push((child, wrapper, escapee));
    }
    let cgroup_of =
        |key: &str| std::path::PathBuf::from(lease_of(&state, key)["cgroupPath"].as_str().unwrap());
    for (key, (_, _, escapee)) in keys.iter().zip(&sessions) {
        assert!(
            cgroup_procs(&cgroup_of(key)).contains(&escapee.pid),
            "{key}'s escapee is in its cgroup"
        );
    }

    // "a": its wrapper is SIGKILLed, and then its adapter (the group's one member) exits, so
    // only the `setsid` escapee is left: in no tree and no group of the lease, only in its
    // cgroup. (A group still populated would bring the host-wide pass back, to prove the whole
    // group before a group signal: docs/security.md.)
    let a_adapter = read_pid_file(&tmp.join("a.adapter.pid"));
    guard.add(a_adapter);
    signal(sessions[0].1, libc::SIGKILL);
    sessions[0].0.wait().unwrap();
    signal(a_adapter, libc::SIGKILL);
    assert!(wait_for(|| !a_adapter.exists()), "a's adapter is gone");
    // "b": closed, so the store holds a closed contained lease (its escapees are looked for).
    let b_cgroup = cgroup_of("b");
    close(&cg, &state, "b");
    sessions[1].0.wait().unwrap();
    assert!(wait_for(|| !sessions[1].2.exists()), "b's escapee is gone");
    assert!(!b_cgroup.exists(), "b's cgroup was removed");

    // A thousand unrelated processes of the reaper's uid.
    let mut unrelated = Vec::new();
    for _ in 0..UNRELATED {
        let c = guard.child(
            Command::new("sleep")
                .arg("100000")
                .stdin(Stdio::null())
                .spawn()
                .unwrap(),
        );
        unrelated.push(Pid::of(c.id() as i32).unwrap());
    }

    let t = Counting::default();
    let settings = leash::cgroup::Settings {
        requested: leash::cgroup::Requested::On,
        root: Some(cg.path().to_path_buf()),
    };
    let c = Controller::open(StateRoot::open(&state).unwrap(), &t)
        .unwrap()
        .with_containment(&settings);
    assert!(c.containment().is_on(), "{:?}", c.containment());
    let report = c
        .reap(&ReapOptions {
            include_live: false,
            retention_ms: 3_600_000,
            now_ms: leash::lease::now_ms(),
            grace_ms: Some(500),
        })
        .unwrap();
    let (scans, entries) = (t.scans(), t.entries());
    drop(c);

    // It did its work: "a" reaped through its cgroup, "c" and "d" skipped as live sessions.
    let a = lease_of(&state, "a");
    let a_out = report
        .leases
        .iter()
        .find(|o| o.lease_id == a["leaseId"].as_str().unwrap())
        .unwrap_or_else(|| panic!("a was not reaped: {report:?}"));
    assert_eq!(a_out.result, CloseResult::Closed, "{a_out:?}");
    assert!(wait_for(|| !sessions[0].2.exists()), "a's escapee is gone");
    for (i, key) in [(2, "c"), (3, "d")] {
        assert!(
            report
                .skipped
                .iter()
                .any(|(id, _)| id == lease_of(&state, key)["leaseId"].as_str().unwrap()),
            "{key} skipped: {report:?}"
        );
        assert!(sessions[i].2.alive(), "{key}'s escapee untouched");
    }
    assert!(
        unrelated.iter().all(Pid::alive),
        "no unrelated process touched"
    );

    // And it read what its leases name, not the host.
    assert_eq!(
        scans, 0,
        "reap took a host-wide pass over {UNRELATED} unrelated processes"
    );
    assert!(
        entries <= 20 * keys.len(),
        "reap read {entries} /proc entries for {} leases",
        keys.len()
    );

    for (i, key) in [(2, "c"), (3, "d")] {
        close(&cg, &state, key);
        sessions[i].0.wait().unwrap();
    }
}
