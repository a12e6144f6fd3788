//! CI's check of the default cgroup root (`.ci/default-cgroup-root.sh`) fails on the cgroups of
//! the tests' state roots and on nothing else: run against a root this test makes (standing in
//! for `<cgroup2 mount>/leash`), a gateway directory no test state root names (another leash on
//! the host) passes and is listed as not counted; a live session's cgroup of a state root the
//! tests recorded fails the check, named. The record itself is tests/common's: removing a
//! scratch directory appends the gateway id of each state root in it to `LEASH_TEST_GATEWAYS`.
mod common;
use common::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(".ci/default-cgroup-root.sh")
}

fn run_script(root: &Path, gateways: &Path, args: &[&Path]) -> Output {
    let mut cmd = Command::new("bash");
    cmd.arg(script())
        .args(args)
        .env("LEASH_CI_CGROUP_ROOT", root)
        .env(ENV_TEST_GATEWAYS, gateways);
    cmd.output().expect("run .ci/default-cgroup-root.sh")
}

fn check(root: &Path, gateways: &Path, before: &Path) -> (bool, String) {
    let out = run_script(root, gateways, &[Path::new("check"), before]);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[test]
fn only_the_tests_gateways_fail_the_default_root_check() {
    let Some(root) = CgroupRoot::new("ci-default-root") else {
        return;
    };
    let work = TempDir::new("ci-default-root");
    let gateways = work.join("gateways");
    std::fs::write(&gateways, "").unwrap();
    let before = work.join("before");
    let out = run_script(root.path(), &gateways, &[Path::new("snapshot"), &before]);
    assert!(out.status.success(), "{out:?}");

    // Another leash's gateway and lease directories appear during the run: not counted.
    let other_gateway = uuid::Uuid::new_v4().to_string();
    let other = root.path().join(&other_gateway);
    std::fs::create_dir(&other).unwrap();
    std::fs::create_dir(other.join(uuid::Uuid::new_v4().to_string())).unwrap();
    let (ok, text) = check(root.path(), &gateways, &before);
    assert!(ok, "another leash's cgroups failed the check:\n{text}");
    assert!(
        text.contains("not counted") && text.contains(&other_gateway),
        "{text}"
    );

    // A session of a test's state root, left in the default root.
    let scratch = TempDir::new("ci-default-root-state");
    let state = scratch.join("state");
    let mut guard = Guard::new();
    guard.child(
        root.leash(&state)
            .args(["exec", "--session", "left", "--", "sleep", "600"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    assert!(
        wait_for(|| state.join("leash.db").is_file()
            && std::fs::read_dir(root.path()).unwrap().flatten().any(|e| e
                .file_type()
                .unwrap()
                .is_dir()
                && e.file_name() != other_gateway.as_str())),
        "the session's cgroup never appeared under {}",
        root.path().display()
    );
    let gateway = gateway_id(&state.join("leash.db")).unwrap();
    assert!(root.path().join(&gateway).is_dir());

    // Not recorded (yet): counted as another leash's, so the record is what decides.
    let (ok, text) = check(root.path(), &gateways, &before);
    assert!(ok, "{text}");

    // Recorded the way a test's scratch directory records it when removed: the check fails and
    // names the test's gateway directory, and still not the other leash's.
    record_gateway_ids_into(scratch.path(), &gateways);
    assert_eq!(std::fs::read_to_string(&gateways).unwrap().trim(), gateway);
    let (ok, text) = check(root.path(), &gateways, &before);
    assert!(!ok, "a test's leftover cgroup passed the check:\n{text}");
    let failing = &text[text
        .find("the tests made cgroups")
        .unwrap_or_else(|| panic!("{text}"))..];
    assert!(
        failing.contains(&root.path().join(&gateway).display().to_string()),
        "{text}"
    );
    assert!(!failing.contains(&other_gateway), "{text}");
    drop(guard);
}

/// Removing a scratch directory records the gateway id of every state root in it into the file
/// `LEASH_TEST_GATEWAYS` names.
#[test]
fn removing_a_scratch_directory_records_its_state_roots_gateways() {
    let work = TempDir::new("ci-record");
    let log = work.join("gateways");
    let scratch = TempDir::new("ci-record-state");
    let (a, b) = (scratch.join("a"), scratch.join("nested/b"));
    init_state_root(&a);
    init_state_root(&b);
    let ids = [
        gateway_id(&a.join("leash.db")).unwrap(),
        gateway_id(&b.join("leash.db")).unwrap(),
    ];
    // The variable is this process's: other scratch directories removed meanwhile (this binary's
    // other test) may add their lines too.
    let outer = std::env::var_os(ENV_TEST_GATEWAYS);
    std::env::set_var(ENV_TEST_GATEWAYS, &log);
    drop(scratch);
    match outer {
        Some(v) => std::env::set_var(ENV_TEST_GATEWAYS, v),
        None => std::env::remove_var(ENV_TEST_GATEWAYS),
    }
    let recorded = std::fs::read_to_string(&log).unwrap_or_default();
    for id in ids {
        assert!(
            recorded.lines().any(|l| l == id),
            "{id} not in {recorded:?}"
        );
    }
}
