//! A SIGSTOPped adapter that handles SIGTERM exits cleanly on a close or on its owner's death,
//! instead of sitting on the pending SIGTERM until the grace ends in SIGKILL (exit 137): every
//! SIGTERM, from `leash close` and from the wrapper's teardown, is followed by a SIGCONT to the
//! same target.
mod common;
use common::*;
use serde_json::Value;
use std::path::Path;

/// An adapter that exits 7 on SIGTERM (and writes `term`), after stopping itself.
fn stopping_adapter(dir: &Path) -> std::path::PathBuf {
    let d = dir.display();
    script(
        dir,
        "stopper.sh",
        &format!(
            r#"trap 'echo TERM > "{d}/term"; exit 7' TERM
echo $$ > '{d}/adapter.pid'
kill -STOP $$
while :; do sleep 1 & wait $!; done"#
        ),
    )
}

fn wait_stopped(p: Pid) {
    assert!(
        wait_for(|| stat_fields(p.pid).is_some_and(|f| f[0] == "T")),
        "the adapter never stopped itself"
    );
}

#[test]
fn close_wakes_a_stopped_adapter_so_it_exits_on_sigterm() {
    let tmp = TempDir::new("stopped-close");
    let state = tmp.join("state");
    let adapter = stopping_adapter(tmp.path());
    let mut guard = Guard::new();
    let child = guard.child(
        leash(&state)
            .args(["exec", "--session", "s", "--grace-ms", "20000", "--"])
            .arg(&adapter)
            .stdin(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    let wrapper = Pid::of(child.id() as i32).unwrap();
    let a = read_pid_file(&tmp.join("adapter.pid"));
    guard.add(a);
    wait_stopped(a);
    let out = run(&state, &["close", "--session", "s", "--json"]);
    assert_eq!(out.code, Some(0), "{}{}", out.stdout, out.stderr);
    let v: Value = serde_json::from_str(&out.stdout).unwrap();
    let o = &v[0];
    assert_eq!(o["result"], "closed", "{o}");
    assert!(
        !o["signals"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["signal"] == "SIGKILL"),
        "a stopped adapter needed SIGKILL: {o}"
    );
    assert_eq!(o["exitStatus"], 7, "the adapter's SIGTERM handler ran: {o}");
    assert!(tmp.join("term").exists());
    assert!(wait_for(|| !wrapper.alive() && !a.alive()));
}

#[test]
fn the_wrappers_teardown_wakes_a_stopped_adapter() {
    let tmp = TempDir::new("stopped-teardown");
    let state = tmp.join("state");
    let adapter = stopping_adapter(tmp.path());
    let d = tmp.path().display().to_string();
    let spawner_script = script(
        tmp.path(),
        "spawner.sh",
        &format!(
            "'{}' --state-dir '{}' exec --grace-ms 20000 --session s -- '{}' </dev/null &\necho $! > '{d}/wrapper.pid'\nwait",
            leash_bin().display(),
            state.display(),
            adapter.display()
        ),
    );
    let mut guard = Guard::new();
    let mut tree = Guard::new();
    let spawner = guard.child(std::process::Command::new(&spawner_script).spawn().unwrap());
    let spawner_pid = Pid::of(spawner.id() as i32).unwrap();
    let wrapper = read_pid_file(&tmp.join("wrapper.pid"));
    tree.add(wrapper);
    let a = read_pid_file(&tmp.join("adapter.pid"));
    tree.add(a);
    wait_stopped(a);
    // Where the report is, read while the lease is open (a `leases` after its end folds the
    // report into the row and removes it).
    let report_file = report_file_of(&state, &lease_of(&state, "s"));
    signal(spawner_pid, libc::SIGKILL);
    // PATIENCE (30 s) is longer than the 20 s grace: the assertions below, not the wait, tell a
    // SIGTERM acted on from a SIGKILL after the grace.
    assert!(wait_for(|| !wrapper.alive()), "wrapper never exited");
    assert!(!a.alive());
    assert!(
        tmp.join("term").exists(),
        "the stopped adapter never ran its SIGTERM handler (killed after the grace instead)"
    );
    let report = std::fs::read_to_string(&report_file).unwrap_or_default();
    assert!(report.contains("\"exitStatus\":7"), "{report}");
    let _ = spawner.wait();
}
