//! A wrapper whose lease cgroup is removed under it (a `close` or `reap` that emptied the cgroup
//! with `cgroup.kill` and then `rmdir`ed it, before the wrapper looked) still ends once its own
//! children are gone. A removed cgroup has no members: the kernel refuses to remove a populated
//! one. Before the fix the wrapper read `cgroup.events` through its held directory, got ENOENT,
//! counted that as "populated", and swept an empty cgroup every 20 ms for ever (seen: a wrapper
//! alive 3 h after its adapter and its owner were gone). Real cgroups under a root the test makes
//! for itself; the only process moved between cgroups is one the test started.
mod common;
use common::*;
use std::process::Stdio;
use std::time::Duration;

#[test]
fn wrapper_ends_when_its_emptied_cgroup_is_removed_under_it() {
    let Some(cg) = CgroupRoot::new("wrapcgrm") else {
        return;
    };
    let tmp = TempDir::new("wrapcgrm");
    let lease_cg = cg.path().join("lease");
    let parking = cg.path().join("parking");
    std::fs::create_dir(&lease_cg).unwrap();
    std::fs::create_dir(&parking).unwrap();
    let mut guard = Guard::new();

    let adapter_pid_file = tmp.join("adapter.pid");
    let mut wrapper = std::process::Command::new(wrap_bin())
        .args(["--grace-ms", "3000", "--cgroup"])
        .arg(&lease_cg)
        .args(["--", "sh", "-c"])
        .arg(format!(
            "echo $$ > '{}'; exec sleep 100000",
            adapter_pid_file.display()
        ))
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let wrapper_pid = Pid::of(wrapper.id() as i32).unwrap();
    guard.add(wrapper_pid);
    let adapter = read_pid_file(&adapter_pid_file);
    guard.add(adapter);
    assert!(
        cgroup_procs(&lease_cg).contains(&adapter.pid),
        "the adapter runs in the lease cgroup"
    );
    // A TERM-logging process the test starts after the wrapper and then moves into the lease's
    // cgroup: a member that is not the wrapper's descendant but passes the wrapper's member
    // check (younger than the wrapper, its uid, no other lease's id), so the wrapper keeps
    // draining the cgroup after its adapter has exited. (One older than the wrapper would be a
    // bystander the wrapper leaves alone.)
    let wrapper_start = start_time(wrapper_pid.pid).unwrap();
    assert!(wait_for(|| {
        let out = std::process::Command::new("sh")
            .args(["-c", "cat /proc/self/stat"])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let rest = &text[text.rfind(')').unwrap() + 1..];
        rest.split_whitespace()
            .nth(19)
            .unwrap()
            .parse::<u64>()
            .unwrap()
            > wrapper_start
    }));
    let member = start_decoy(&mut guard, tmp.path(), "member");
    std::fs::write(lease_cg.join("cgroup.procs"), member.pid.pid.to_string()).unwrap();

    // The adapter exits; the wrapper finds the foreign member left and sends it SIGTERM, which
    // it logs and survives: the wrapper is now inside the 3 s grace.
    signal(adapter, libc::SIGKILL);
    assert!(
        wait_for(|| member.signals().contains("TERM")),
        "the wrapper drains the cgroup after its adapter exited (member log: {:?})",
        member.signals()
    );
    assert!(wrapper_pid.alive(), "the wrapper waits out the grace");

    // What a close does from outside, minus the kill: the cgroup is emptied (the member moved
    // out) and removed.
    std::fs::write(parking.join("cgroup.procs"), member.pid.pid.to_string()).unwrap();
    assert!(
        wait_for(|| std::fs::remove_dir(&lease_cg).is_ok()),
        "the emptied lease cgroup can be removed"
    );

    // At the end of the grace the wrapper finds no cgroup, hence no member, and ends.
    assert!(
        wait_for_within(Duration::from_secs(20), || !wrapper_pid.alive()),
        "the wrapper is still running 20 s after its cgroup was removed; the grace was 3 s"
    );
    let status = wrapper.wait().unwrap().code();
    assert_eq!(
        status,
        Some(137),
        "the wrapper reports the adapter's SIGKILL as 128+9"
    );
    assert!(
        member.pid.alive(),
        "the moved-out member is not the wrapper's to kill"
    );
}
