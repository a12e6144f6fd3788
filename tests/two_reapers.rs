//! Two reapers at once on one state root never both act on a lease: the transition to `closing` is
//! claimed in one SQLite transaction, and the loser reports the lease as skipped.
mod common;
use common::*;
use std::collections::HashMap;
use std::process::Stdio;

#[test]
fn racing_reapers_act_on_each_lease_exactly_once() {
    let tmp = TempDir::new("reapers");
    let state = tmp.join("state");
    let trap = trap_script(tmp.path());
    let mut guard = Guard::new();
    let mut adapters = Vec::new();
    for i in 0..6 {
        let log = tmp.join(&format!("a{i}.log"));
        guard.child(
            leash(&state)
                .args(["exec", "--session", &format!("r{i}"), "--"])
                .arg(&trap)
                .arg(&log)
                .spawn()
                .unwrap(),
        );
        adapters.push(Logged::wait_started(log));
    }
    let mut g2 = Guard::new();
    for a in &adapters {
        g2.add(a.pid);
    }
    let spawn = || {
        leash(&state)
            .args(["reap", "--include-live", "--json", "--grace-ms", "300"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let (r1, r2) = (spawn(), spawn());
    let outs = [
        r1.wait_with_output().unwrap(),
        r2.wait_with_output().unwrap(),
    ];
    let mut acted: HashMap<String, usize> = HashMap::new();
    for o in &outs {
        let v: serde_json::Value = serde_json::from_slice(&o.stdout)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&o.stderr)));
        for l in v["leases"].as_array().unwrap() {
            if l["result"] == "closed" || l["result"] == "lost" {
                *acted
                    .entry(l["leaseId"].as_str().unwrap().to_string())
                    .or_default() += 1;
            }
        }
    }
    assert_eq!(acted.len(), 6, "every lease acted on: {acted:?}");
    assert!(
        acted.values().all(|&n| n == 1),
        "no lease acted on twice: {acted:?}"
    );
    assert!(adapters.iter().all(|a| !a.pid.alive()));
    assert!(leases(&state).iter().all(|l| l["state"] == "closed"));
}
