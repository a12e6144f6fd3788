//! Startup reap starts from open leases whose owner is gone — never from a command-line search. It
//! finds escapees of a SIGKILLed wrapper by their lease markers (a decoy with the same argv but no
//! markers survives, and logs no signal), terminates a verified tree whose wrapper is still
//! draining, and marks lost a lease whose processes are all gone.
mod common;
use common::*;
use serde_json::Value;

fn reap_json(state: &std::path::Path, extra: &[&str]) -> (Option<i32>, Value) {
    let out = run(
        state,
        &[&["reap", "--json", "--grace-ms", "300"], extra].concat(),
    );
    let v = serde_json::from_str(&out.stdout)
        .unwrap_or_else(|e| panic!("reap output ({e}): {} / {}", out.stdout, out.stderr));
    (out.code, v)
}

#[test]
fn escapee_of_a_killed_wrapper_is_reaped_by_its_markers_and_the_decoy_survives() {
    let tmp = TempDir::new("escapee");
    let state = tmp.join("state");
    let trap = trap_script(tmp.path());
    let d = tmp.path().display().to_string();
    let mut guard = Guard::new();
    // Same argv as the escapee will have, but started outside leash: no markers.
    let decoy = start_decoy(&mut guard, tmp.path(), "decoy");
    let adapter = script(
        tmp.path(),
        "adapter.sh",
        &format!(
            "setsid '{}' '{d}/escapee.log' &\nwhile :; do sleep 1; done",
            trap.display()
        ),
    );
    let spawner = script(
        tmp.path(),
        "spawner.sh",
        &format!(
            "'{}' --state-dir '{}' exec --session e -- '{}' &\necho $! > '{d}/wrapper.pid'\nwait",
            leash_bin().display(),
            state.display(),
            adapter.display()
        ),
    );
    let sp = guard.child(std::process::Command::new(&spawner).spawn().unwrap());
    let spawner_pid = Pid::of(sp.id() as i32).unwrap();
    let wrapper = read_pid_file(&tmp.join("wrapper.pid"));
    let escapee = Logged::wait_started(tmp.join("escapee.log"));
    let mut g2 = Guard::new();
    g2.add(wrapper);
    g2.add(escapee.pid);
    let adapter_pid = adapter_of(wrapper);

    // Kill the wrapper first (the adapter dies with it), then the owner.
    signal(wrapper, libc::SIGKILL);
    assert!(
        wait_for(|| !adapter_pid.alive()),
        "adapter died with its wrapper"
    );
    signal(spawner_pid, libc::SIGKILL);
    assert!(wait_for(|| !spawner_pid.alive()));
    assert!(
        escapee.pid.alive(),
        "the escapee outlived the wrapper: the reaper's job"
    );

    let (code, report) = reap_json(&state, &[]);
    assert_eq!(code, Some(0), "{report}");
    let o = &report["leases"][0];
    assert_eq!(o["result"], "closed", "{report}");
    assert!(
        o["signals"]
            .as_array()
            .unwrap()
            .iter()
            // Its markers prove it; under containment its cgroup proves it first (the stronger
            // evidence names the role).
            .any(|s| s["pid"] == escapee.pid.pid
                && (s["role"] == "marked" || s["role"] == "cgroupMember")),
        "{o}"
    );
    assert!(wait_for(|| !escapee.pid.alive()), "escapee reaped");
    assert!(
        decoy.pid.alive(),
        "decoy with the same argv but no markers survives"
    );
    assert_eq!(decoy.signals(), "", "decoy got no signal");
    assert_eq!(lease_of(&state, "e")["state"], "closed");
}

#[test]
fn reap_terminates_a_verified_tree_whose_wrapper_is_still_in_its_grace() {
    let tmp = TempDir::new("grace");
    let state = tmp.join("state");
    let trap = trap_script(tmp.path());
    let d = tmp.path().display().to_string();
    let spawner = script(
        tmp.path(),
        "spawner.sh",
        &format!(
            "'{}' --state-dir '{}' exec --grace-ms 600000 --session g -- '{}' '{d}/adapter.log' &\necho $! > '{d}/wrapper.pid'\nwait",
            leash_bin().display(),
            state.display(),
            trap.display()
        ),
    );
    let mut guard = Guard::new();
    let sp = guard.child(std::process::Command::new(&spawner).spawn().unwrap());
    let spawner_pid = Pid::of(sp.id() as i32).unwrap();
    let wrapper = read_pid_file(&tmp.join("wrapper.pid"));
    let adapter = Logged::wait_started(tmp.join("adapter.log"));
    let mut g2 = Guard::new();
    g2.add(wrapper);
    g2.add(adapter.pid);
    signal(spawner_pid, libc::SIGKILL);
    // The wrapper noticed its parent's death and sent SIGTERM (ignored); its grace is 10 minutes.
    assert!(wait_for(|| adapter.signals().contains("TERM")));
    let (code, report) = reap_json(&state, &[]);
    assert_eq!(code, Some(0), "{report}");
    assert_eq!(report["leases"][0]["result"], "closed", "{report}");
    assert!(!adapter.pid.alive());
    assert!(wait_for(|| !wrapper.alive()));
}

#[test]
fn live_sessions_are_left_alone_and_gone_ones_are_marked_lost() {
    let tmp = TempDir::new("live");
    let state = tmp.join("state");
    let mut guard = Guard::new();
    let live = guard.child(
        leash(&state)
            .args(["exec", "--session", "live", "--", "sleep", "1000"])
            .spawn()
            .unwrap(),
    );
    let live_wrapper = Pid::of(live.id() as i32).unwrap();
    let live_adapter = adapter_of(live_wrapper);
    let dead = guard.child(
        leash(&state)
            .args(["exec", "--session", "dead", "--", "sleep", "1000"])
            .spawn()
            .unwrap(),
    );
    let dead_wrapper = Pid::of(dead.id() as i32).unwrap();
    let dead_adapter = adapter_of(dead_wrapper);
    signal(dead_wrapper, libc::SIGKILL);
    assert!(wait_for(|| !dead_adapter.alive()));

    // The owner (this test) is alive: both leases are live sessions to a plain reap.
    let (_, report) = reap_json(&state, &[]);
    assert_eq!(report["skipped"].as_array().unwrap().len(), 2, "{report}");
    assert!(live_adapter.alive());
    // --include-live treats them as orphans: the dead one is lost, nothing signalled for it.
    let dead_id = lease_of(&state, "dead")["leaseId"]
        .as_str()
        .unwrap()
        .to_string();
    let (_, report) = reap_json(&state, &["--include-live"]);
    let o = report["leases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["leaseId"] == dead_id.as_str())
        .unwrap()
        .clone();
    assert_eq!(o["result"], "lost", "{report}");
    assert!(o["signals"].as_array().unwrap().is_empty());
    assert!(
        !live_adapter.alive(),
        "--include-live reaped the live one too"
    );
    assert_eq!(lease_of(&state, "live")["state"], "closed");
}

#[test]
fn ended_leases_past_the_retention_are_expired() {
    let tmp = TempDir::new("expire");
    let state = tmp.join("state");
    for i in 0..3 {
        assert_eq!(
            run(
                &state,
                &["exec", "--session", &format!("x{i}"), "--", "true"]
            )
            .code,
            Some(0)
        );
    }
    assert!(wait_for(|| leases(&state)
        .iter()
        .all(|l| l["state"] == "ended")));
    // Within the retention nothing is expired.
    let (_, report) = reap_json(&state, &["--retention", "1h"]);
    assert_eq!(report["expired"], 0, "{report}");
    assert_eq!(leases(&state).len(), 3);
    assert!(wait_for(|| {
        let (_, report) = reap_json(&state, &["--retention", "1ms"]);
        report["expired"].as_u64().unwrap() > 0 && leases(&state).is_empty()
    }));
}
