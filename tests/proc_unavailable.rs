//! When the process table cannot be read, nothing can be verified and nothing is signalled: the
//! lease is left open with the reason. Staged live by running the reaper in a private mount
//! namespace where /proc is an empty tmpfs (root only).
mod common;
use common::*;

#[test]
fn an_unreadable_proc_leads_to_no_signal() {
    if !is_root() || !std::path::Path::new("/usr/bin/unshare").exists() {
        common::skip("needs root and unshare(1) to hide /proc");
        return;
    }
    let tmp = TempDir::new("noproc");
    let state = tmp.join("state");
    let trap = trap_script(tmp.path());
    let mut guard = Guard::new();
    let child = guard.child(
        leash(&state)
            .args(["exec", "--session", "p", "--"])
            .arg(&trap)
            .arg(tmp.join("a.log"))
            .spawn()
            .unwrap(),
    );
    let wrapper = Pid::of(child.id() as i32).unwrap();
    let adapter = Logged::wait_started(tmp.join("a.log"));
    let mut g2 = Guard::new();
    g2.add(adapter.pid);
    let id = lease_of(&state, "p")["leaseId"]
        .as_str()
        .unwrap()
        .to_string();

    let hidden = |args: &str| {
        std::process::Command::new("unshare")
            .args(["--mount", "--propagation", "private", "--", "sh", "-c"])
            .arg(format!(
                "mount -t tmpfs none /proc && exec '{}' --state-dir '{}' {args}",
                leash_bin().display(),
                state.display()
            ))
            .env_remove("LEASH_STATE_DIR")
            .output()
            .unwrap()
    };
    let out = hidden(&format!("close {id} --json --grace-ms 100"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(6),
        "{stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("unavailable"), "{stdout}");
    let out = hidden("reap --include-live --json --grace-ms 100");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("unavailable"),
        "{stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );

    assert!(wrapper.alive() && adapter.pid.alive());
    assert_eq!(
        adapter.signals(),
        "",
        "nothing may be signalled without a process table"
    );
    assert_eq!(lease_of(&state, "p")["state"], "open");
}
