//! An adapter that makes cgroups of its own inside its lease's cgroup (a nested service manager,
//! a sandbox) and moves itself into one: the lease's cgroup is still removed when the lease ends,
//! by the wrapper (the adapter exited on its own) and by `leash close` (the wrapper is gone).
//! Before the fix `rmdir` of the lease cgroup failed with EBUSY on every close, reap and
//! reconcile, for ever. Real cgroups under a root the test makes for itself (removed with
//! everything in it on drop, also when the test fails).
mod common;
use common::*;
use std::path::{Path, PathBuf};
use std::process::Stdio;

/// The adapter: makes `inner/deeper` inside its own cgroup, moves itself into `deeper`, writes
/// the lease cgroup's path and its pid to the marker, then exits (`exit`) or runs on (`stay`, as
/// `sleep`: the same pid).
fn nesting_adapter(dir: &Path) -> PathBuf {
    script(
        dir,
        "nest.sh",
        r#"m="$1"; marker="$2"; mode="$3"
cg=$(sed -n 's/^0:://p' /proc/self/cgroup)
mkdir "$m$cg/inner" "$m$cg/inner/deeper" || exit 3
echo $$ > "$m$cg/inner/deeper/cgroup.procs" || exit 4
printf '%s\n%s\n' "$m$cg" $$ > "$marker.tmp" && mv "$marker.tmp" "$marker"
if [ "$mode" = stay ]; then exec sleep 100000; fi
exit 0"#,
    )
}

/// The lease cgroup's path and the adapter's pid, from the marker.
fn read_marker(marker: &Path) -> (PathBuf, i32) {
    assert!(
        wait_for(|| marker.exists()),
        "the adapter never nested its cgroup"
    );
    let text = std::fs::read_to_string(marker).unwrap();
    let mut lines = text.lines();
    let path = PathBuf::from(lines.next().unwrap());
    (path, lines.next().unwrap().parse().unwrap())
}

#[test]
fn the_wrapper_removes_a_lease_cgroup_with_nested_cgroups() {
    let Some(cg) = CgroupRoot::new("nested-wrap") else {
        return;
    };
    let mount = cgroup2_mount().unwrap();
    let tmp = TempDir::new("nested-wrap");
    let state = tmp.join("state");
    let marker = tmp.join("lease-cgroup");
    let adapter = nesting_adapter(tmp.path());
    let out = cg
        .leash(&state)
        .args(["exec", "--session", "n", "--grace-ms", "200", "--"])
        .arg(&adapter)
        .arg(&mount)
        .arg(&marker)
        .arg("exit")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (lease_cg, _) = read_marker(&marker);
    assert!(
        lease_cg.starts_with(cg.path()),
        "{} is not under the test's cgroup root",
        lease_cg.display()
    );
    // The wrapper removed it (and what the adapter made in it) before it exited.
    assert!(
        !lease_cg.exists(),
        "the lease cgroup {} is left behind (nested: {:?})",
        lease_cg.display(),
        std::fs::read_dir(&lease_cg)
            .map(|rd| rd.flatten().filter(|e| e.path().is_dir()).count())
            .ok()
    );
}

#[test]
fn close_removes_a_lease_cgroup_with_nested_cgroups() {
    let Some(cg) = CgroupRoot::new("nested-close") else {
        return;
    };
    let mount = cgroup2_mount().unwrap();
    let tmp = TempDir::new("nested-close");
    let state = tmp.join("state");
    let marker = tmp.join("lease-cgroup");
    let adapter_script = nesting_adapter(tmp.path());
    let mut guard = Guard::new();
    let exec = guard.child(
        cg.leash(&state)
            .args(["exec", "--session", "n", "--grace-ms", "200", "--"])
            .arg(&adapter_script)
            .arg(&mount)
            .arg(&marker)
            .arg("stay")
            .stdin(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let wrapper = Pid::of(exec.id() as i32).unwrap();
    let (lease_cg, pid) = read_marker(&marker);
    assert!(cgroup_procs(&lease_cg.join("inner/deeper")).contains(&pid));
    // Not in the guard: the cgroup root's drop kills whatever is left in its tree.
    let adapter = Pid::of(pid).unwrap();
    // The wrapper dies without a word (SIGKILL): its adapter runs on in the nested cgroup, and
    // only `close` (through the lease's verified cgroup) can end it and remove the cgroup.
    signal(wrapper, libc::SIGKILL);
    exec.wait().unwrap();
    // (Whether the adapter outlived its wrapper or not, the nested cgroups are still there:
    // only the lease's cgroup removal can take them away.)
    assert!(lease_cg.join("inner/deeper").is_dir());

    let run_here = |args: &[&str]| {
        let out = cg
            .leash(&state)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert_eq!(
            out.status.code(),
            Some(0),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let closed = run_here(&["close", "--session", "n", "--json"]);
    assert!(
        wait_for(|| !adapter.alive()),
        "close left the adapter running"
    );
    assert!(
        !lease_cg.exists(),
        "close left the lease cgroup {}: {closed}",
        lease_cg.display(),
    );
    // Nothing is left for a reap to trip over.
    let reaped = run_here(&["reap", "--json"]);
    assert!(!reaped.contains("busy"), "{reaped}");
}
