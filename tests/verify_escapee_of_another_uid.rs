//! A process of another uid that carries a lease's markers (its wrapper gone) is one that
//! `leash reap` leaves alone: the signalling guards never let leash signal another uid's
//! process. `leash verify` gives the same verdict, never "an escapee that reap terminates".
//! Needs root (to start a process as another uid); skipped otherwise.
mod common;
use common::*;
use std::process::{Command, Stdio};

#[test]
fn verify_and_reap_agree_on_another_uids_marked_process() {
    if !is_root() {
        skip("verify_escapee_of_another_uid: needs root to start a process as another uid");
        return;
    }
    let tmp = TempDir::new("verify-other-uid");
    let state = tmp.join("state");
    let mut guard = Guard::new();
    // A session whose wrapper is SIGKILLed: the lease stays open, its root gone.
    let child = guard.child(
        leash(&state)
            .args(["exec", "--containment", "off", "--session", "s", "--"])
            .args(["sleep", "1000"])
            .stdin(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let wrapper = Pid::of(child.id() as i32).unwrap();
    let adapter = adapter_of(wrapper);
    let row = lease_of(&state, "s");
    let (lease, gw) = (
        row["leaseId"].as_str().unwrap().to_string(),
        row["gatewayInstanceId"].as_str().unwrap().to_string(),
    );
    signal(wrapper, libc::SIGKILL);
    child.wait().unwrap();
    assert!(wait_for(|| !adapter.alive()));

    // A process of uid 65534 carrying the lease's markers.
    let stranger = guard.child(
        Command::new("setpriv")
            .args([
                "--reuid",
                "65534",
                "--regid",
                "65534",
                "--clear-groups",
                "env",
            ])
            .arg(format!("OPENCLAW_ACPX_LEASE_ID={lease}"))
            .arg(format!("OPENCLAW_GATEWAY_INSTANCE_ID={gw}"))
            .args(["sleep", "600"])
            .stdin(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let stranger = Pid::of(stranger.id() as i32).unwrap();
    assert!(wait_for(|| {
        std::fs::read(format!("/proc/{}/environ", stranger.pid))
            .is_ok_and(|e| String::from_utf8_lossy(&e).contains(&lease))
    }));

    // `dead` exits 8 (docs: the verify exit codes); the answer is on stdout either way.
    let out = run(&state, &["verify", "--json", "--session", "s"]);
    assert_eq!(out.code, Some(8), "{}", out.stderr);
    let v: serde_json::Value =
        serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", out.stdout));
    let evidence = v["evidence"].to_string();
    assert_eq!(v["answer"], "dead", "{v}");
    assert!(!evidence.contains("terminates them"), "{v}");
    assert!(
        evidence.contains(&format!("pid {} carries the lease's markers", stranger.pid))
            && evidence.contains("leaves it alone"),
        "{v}"
    );

    // Reap's plan for the same lease: nothing signalled (reap reads no other uid's markers at
    // all), and a real reap leaves the process running.
    let plan = run_json(&state, &["reap", "--dry-run", "--include-live", "--json"]);
    let mine = plan["leases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["leaseId"] == lease.as_str())
        .unwrap_or_else(|| panic!("{plan}"))
        .clone();
    assert!(
        mine["signals"].as_array().is_none_or(|s| s.is_empty()),
        "{mine}"
    );
    assert_ne!(mine["decision"]["action"], "terminate", "{mine}");
    let out = run(&state, &["reap", "--include-live", "--json"]);
    assert!(out.code == Some(0) || out.code == Some(6), "{}", out.stderr);
    assert!(
        !out.stdout.contains(&format!("\"pid\":{}", stranger.pid)),
        "reap signalled the stranger: {}",
        out.stdout
    );
    assert!(stranger.alive(), "another uid's process survives the reap");
}
