//! An ordinary user whose process sits outside the cgroup subtree delegated to it cannot start a
//! contained session: the kernel refuses to move the adapter into the lease's cgroup (that needs
//! write access to `cgroup.procs` of the common ancestor, which only root has here). `leash exec`
//! then says so — the refused move, the process's own cgroup, and how to fix it — and exits 125
//! (the wrapper could not do its job), not 126 "not executable (permission denied)", whether the
//! wrapper starts the adapter with clone3's CLONE_INTO_CGROUP or writes `cgroup.procs` itself;
//! the lease ends with that reason, and `--error-format json` gives `spawn_failed`. The same
//! user with its process inside the delegated subtree runs the same command. As root (it makes
//! the delegation: a cgroup under the test's own root, chowned to `nobody` with its
//! `cgroup.procs`, `cgroup.threads` and `cgroup.subtree_control`, as systemd's `Delegate=yes`
//! does), dropping to `nobody` with setpriv; skipped elsewhere.
mod common;
use common::*;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output};

const NOBODY: u32 = 65534;

/// `sh -c 'echo $$ > CG/cgroup.procs && exec setpriv … leash ARGS'`: the process moves into `cg`
/// as root, then runs leash as `nobody` with containment on under `root`.
fn leash_as_nobody_in(
    cg: &Path,
    root: &Path,
    work: &Path,
    env: &[(&str, &str)],
    args: &[&str],
) -> Output {
    let mut cmd = Command::new("/bin/sh");
    cmd.arg("-c")
        .arg(r#"echo $$ > "$0/cgroup.procs" && shift && exec "$@""#)
        .arg(cg)
        .arg("-")
        .args([
            "setpriv",
            "--reuid",
            "65534",
            "--regid",
            "65534",
            "--clear-groups",
        ])
        .args(["--no-new-privs", "--reset-env", "--", "env"])
        .arg(format!("LEASH_RUNTIME_DIR={}", work.join("u/rt").display()))
        .arg(format!("LEASH_CGROUP_ROOT={}", root.display()))
        .arg("LEASH_CONTAINMENT=on");
    for (k, v) in env {
        cmd.arg(format!("{k}={v}"));
    }
    cmd.arg(work.join("bin/leash"))
        .arg("--state-dir")
        .arg(work.join("u/state"))
        .args(args);
    cmd.output().expect("run leash as nobody")
}

/// Makes `dir` a cgroup delegated to `nobody`, as systemd's `Delegate=yes` leaves it.
fn delegate(dir: &Path) {
    std::fs::create_dir(dir).unwrap();
    for f in [
        "",
        "cgroup.procs",
        "cgroup.threads",
        "cgroup.subtree_control",
    ] {
        std::os::unix::fs::chown(dir.join(f), Some(NOBODY), Some(NOBODY)).unwrap();
    }
}

#[test]
fn a_refused_move_into_the_lease_cgroup_is_told_with_its_fix() {
    if !is_root() {
        skip("a refused cgroup move: making a delegated cgroup and dropping to nobody needs root");
        return;
    }
    if !Path::new("/usr/bin/setpriv").is_file() {
        skip("a refused cgroup move: setpriv (util-linux) is not installed");
        return;
    }
    let Some(base) = CgroupRoot::new("move-refused") else {
        return;
    };
    // base (root's) holds the user's process (outside/) and its delegated subtree (delegated/).
    let outside = base.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    let delegated = base.path().join("delegated");
    delegate(&delegated);
    let leash_root = delegated.join("leash");
    delegate(&leash_root);

    // What nobody reaches: the binaries side by side, and its own state and reports directories.
    let scratch = TempDir::new("move-refused");
    let work = scratch.path();
    std::fs::set_permissions(work, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::create_dir(work.join("bin")).unwrap();
    std::fs::copy(leash_bin(), work.join("bin/leash")).unwrap();
    std::fs::copy(wrap_bin(), work.join("bin/leash-wrap")).unwrap();
    std::fs::create_dir(work.join("u")).unwrap();
    std::os::unix::fs::chown(work.join("u"), Some(NOBODY), Some(NOBODY)).unwrap();

    // The process's own cgroup as /proc/self/cgroup names it (from the mount).
    let rel = format!(
        "from this process's cgroup /{}",
        outside
            .strip_prefix(cgroup2_mount().unwrap())
            .unwrap()
            .display()
    );
    for (path, env) in [
        ("clone3", &[][..]),
        (
            "cgroup.procs",
            &[("LEASH_WRAP_CGROUP_PROCS_WRITE", "1")][..],
        ),
    ] {
        let out = leash_as_nobody_in(
            &outside,
            &leash_root,
            work,
            env,
            &["exec", "--", "/usr/bin/true"],
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(125), "{path}: {err}");
        for says in [
            "could not be started in its cgroup",
            "refused to move it",
            &rel,
            "common ancestor",
            "systemd-run --user --scope -p Delegate=yes",
        ] {
            assert!(err.contains(says), "{path}: no {says:?} in: {err}");
        }
        assert!(!err.contains("not executable"), "{path}: {err}");
    }

    // The lease ended with that reason.
    let out = leash_as_nobody_in(&outside, &leash_root, work, &[], &["leases", "--json"]);
    assert!(out.status.success(), "{out:?}");
    let leases: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let leases = leases.as_array().unwrap();
    assert_eq!(leases.len(), 2, "{leases:?}");
    for l in leases {
        assert_eq!(l["state"], "ended", "{l}");
        assert!(
            l["stateReason"]
                .as_str()
                .unwrap_or_default()
                .contains("refused to move it"),
            "{l}"
        );
    }

    // The JSON error line names the cause a gateway branches on.
    let out = leash_as_nobody_in(
        &outside,
        &leash_root,
        work,
        &[],
        &["--error-format", "json", "exec", "--", "/usr/bin/true"],
    );
    assert_eq!(out.status.code(), Some(125), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    let line: serde_json::Value = err
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str(l).ok())
        .unwrap_or_else(|| panic!("no JSON error line in: {err}"));
    assert_eq!(line["error"]["code"], "spawn_failed", "{line}");
    assert_eq!(line["error"]["exitCode"], 125, "{line}");

    // From inside the delegated subtree, the same user and command run contained.
    let inside = delegated.join("shell");
    delegate(&inside);
    let out = leash_as_nobody_in(
        &inside,
        &leash_root,
        work,
        &[],
        &["exec", "--", "/usr/bin/true"],
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
