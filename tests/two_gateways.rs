//! Closing an old, stale or tampered lease never terminates another gateway's process. Two state
//! roots on one host, each with a live session; root A's lease row is rewritten to name gateway B's
//! live wrapper (its exact pid and start time): A refuses, and B's tree lives on.
mod common;
use common::*;

#[test]
fn a_lease_naming_another_gateways_wrapper_is_refused() {
    let tmp = TempDir::new("twogw");
    let (a, b) = (tmp.join("a"), tmp.join("b"));
    let trap = trap_script(tmp.path());
    let mut guard = Guard::new();
    let ca = guard.child(
        leash(&a)
            .args(["exec", "--session", "s", "--"])
            .arg(&trap)
            .arg(tmp.join("a.log"))
            .spawn()
            .unwrap(),
    );
    let wa = Pid::of(ca.id() as i32).unwrap();
    let aa = Logged::wait_started(tmp.join("a.log"));
    let cb = guard.child(
        leash(&b)
            .args(["exec", "--session", "s", "--"])
            .arg(&trap)
            .arg(tmp.join("b.log"))
            .spawn()
            .unwrap(),
    );
    let wb = Pid::of(cb.id() as i32).unwrap();
    let ab = Logged::wait_started(tmp.join("b.log"));
    let mut g2 = Guard::new();
    g2.add(aa.pid);
    g2.add(ab.pid);

    // A's session ends; its lease row is then rewritten to name B's live wrapper.
    let a_id = lease_of(&a, "s")["leaseId"].as_str().unwrap().to_string();
    signal(wa, libc::SIGKILL);
    assert!(wait_for(|| !aa.pid.alive()));
    tamper(
        &a,
        &a_id,
        "root_pid = ?2, root_start_time = ?3, root_pidfs_ino = ?4",
        // The forger copies B's pidfs inode as well: only the remaining evidence can refuse it.
        &[
            wb.pid as i64,
            wb.start as i64,
            leash::proc::pidfs_ino_of(wb.pid).map_or(0, |i| i as i64),
        ],
    );

    let out = run(&a, &["close", &a_id, "--json", "--grace-ms", "200"]);
    assert_eq!(
        out.code,
        Some(6),
        "unverified: {} {}",
        out.stdout,
        out.stderr
    );
    let v: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(v[0]["result"], "leftOpen");
    assert!(
        v[0]["reason"]
            .as_str()
            .unwrap()
            .contains("not under this gateway's wrapper root"),
        "{v}"
    );
    assert!(v[0]["signals"].as_array().unwrap().is_empty());
    // A reap of A, even treating live owners as gone, leaves B alone too.
    let out = run(
        &a,
        &["reap", "--include-live", "--json", "--grace-ms", "200"],
    );
    assert!(out.code == Some(6) || out.code == Some(0), "{}", out.stderr);
    assert!(
        wb.alive() && ab.pid.alive(),
        "gateway B's session must survive"
    );
    assert_eq!(ab.signals(), "", "gateway B's adapter got no signal");
    assert_eq!(lease_of(&b, "s")["state"], "open");

    // B can still close its own session.
    let out = run(&b, &["close", "--session", "s", "--grace-ms", "200"]);
    assert_eq!(out.code, Some(0), "{} {}", out.stdout, out.stderr);
    assert!(!ab.pid.alive());
}
