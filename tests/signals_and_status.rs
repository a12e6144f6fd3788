//! SIGTERM to the wrapper reaches the adapter's whole group, and the adapter's exit status comes
//! back through `leash exec` (0, 42, and 143 for death by SIGTERM).
mod common;
use common::*;
use std::os::unix::process::ExitStatusExt;

#[test]
fn exit_codes_come_back() {
    let tmp = TempDir::new("status");
    let state = tmp.join("state");
    for code in [0, 42] {
        let out = run(&state, &["exec", "--", "sh", "-c", &format!("exit {code}")]);
        assert_eq!(out.code, Some(code), "{}", out.stderr);
        assert!(out.stdout.is_empty() && out.stderr.is_empty());
    }
}

#[test]
fn sigterm_reaches_the_group_and_143_comes_back() {
    let tmp = TempDir::new("term");
    let state = tmp.join("state");
    let got = tmp.join("member.got");
    let ready = tmp.join("member.ready");
    let member = format!(
        "trap 'echo term > \"{}\"; exit 7' TERM; touch '{}'; while :; do sleep 0.05; done",
        got.display(),
        ready.display()
    );
    let mut guard = Guard::new();
    let child = guard.child(
        leash(&state)
            .args(["exec", "--session", "t", "--", "sh", "-c"])
            .arg("sh -c \"$0\" & wait")
            .arg(&member)
            .spawn()
            .unwrap(),
    );
    let wrapper = Pid::of(child.id() as i32).unwrap();
    assert!(wait_for(|| ready.exists()), "group member never started");
    signal(wrapper, libc::SIGTERM);
    let status = child.wait().unwrap();
    assert_eq!(
        status.code(),
        Some(143),
        "{status:?} (signal {:?})",
        status.signal()
    );
    assert_eq!(
        std::fs::read_to_string(&got).unwrap().trim(),
        "term",
        "the group member got SIGTERM"
    );
}
