//! Continuous reconcile. A daemon with `--reconcile-interval` settles, without anyone running
//! `reap`, the leases of sessions started with `leash exec` outside it: one whose owner died after
//! its wrapper was SIGKILLed (its escapee is verified by its markers and terminated), and one whose
//! owner lives but whose wrapper was SIGKILLed. A live session outside the daemon and the daemon's
//! own session are never touched. Passes are numbered in `status`, so the test waits for passes,
//! not for time: both leases must be settled by the second pass that started after they were
//! orphaned.
mod common;
mod daemon_support;
use common::*;
use daemon_support::*;
use serde_json::{json, Value};

fn passes(c: &mut Conn) -> u64 {
    let s = c.call("status", json!({}));
    s["daemon"]["reconcile"]["last"]["passes"]
        .as_u64()
        .unwrap_or(0)
}

fn lease_state(c: &mut Conn, session: &str) -> String {
    let rows = c.call("leases", json!({}));
    rows.as_array()
        .unwrap()
        .iter()
        .rev()
        .find(|l| l["sessionKey"] == session)
        .map(|l| l["state"].as_str().unwrap().to_string())
        .unwrap_or_default()
}

#[test]
fn orphans_outside_the_daemon_are_settled_and_live_sessions_untouched() {
    let tmp = TempDir::new("reconcile");
    let state = tmp.join("state");
    let d = Daemon::start(&state, &["--reconcile-interval", "400ms"]);
    let mut c = d.connect();
    let own = ensure(&mut c, "own", &["sleep", "1000"]);
    let mut guard = Guard::new();
    let (_, _, live) = outside_session(&mut guard, &state, tmp.path(), "live", "true");
    let (orphan_owner, orphan_wrapper, orphan) =
        outside_session(&mut guard, &state, tmp.path(), "orphan", "true");
    let (dead_owner_alive, dead_wrapper, stray) =
        outside_session(&mut guard, &state, tmp.path(), "stray", "exec sleep 1000");
    guard.add(dead_owner_alive);

    // The wrappers are SIGKILLed: their adapters die with them, the trap scripts linger. The
    // orphan's owner (its sh) then exits by itself; the stray's owner runs on.
    signal(orphan_wrapper, libc::SIGKILL);
    signal(dead_wrapper, libc::SIGKILL);
    assert!(
        wait_for(|| !orphan_owner.alive()),
        "the orphan's owner did not exit"
    );
    assert!(wait_for(
        || !orphan_wrapper.exists() && !dead_wrapper.alive()
    ));
    assert!(orphan.pid.alive() && stray.pid.alive(), "escapees expected");
    let from = passes(&mut c);

    assert!(
        wait_daemon(&mut c, |c| passes(c) >= from + 2),
        "no two reconcile passes:\n{}",
        d.log_text()
    );
    assert_eq!(lease_state(&mut c, "orphan"), "closed", "{}", d.log_text());
    assert_eq!(lease_state(&mut c, "stray"), "closed", "{}", d.log_text());
    assert!(wait_for(|| !orphan.pid.alive() && !stray.pid.alive()));
    assert!(
        orphan.signals().contains("TERM"),
        "SIGTERM first, then SIGKILL"
    );

    // Untouched: the live session outside the daemon and the daemon's own session.
    assert_eq!(lease_state(&mut c, "live"), "open");
    assert!(live.pid.alive());
    assert_eq!(live.signals(), "", "a live session was signalled");
    let own_state = c.call("leases", json!({}));
    let own_row: &Value = own_state
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["leaseId"] == own["leaseId"])
        .unwrap();
    assert_eq!(own_row["state"], "open");
    let last = c.call("status", json!({}))["daemon"]["reconcile"].clone();
    assert_eq!(last["intervalMs"], 400);
    let log = d.log_text();
    assert!(log.contains("reconcile settled a lease"), "{log}");

    // Each pass is counted: the passes in the metrics lie between the passes `status`
    // numbered before and after the scrape (a pass bumps the counter, then its number), and
    // the two settled leases are there by result.
    let before = passes(&mut c);
    let text = c.call("metrics", json!({}))["text"]
        .as_str()
        .unwrap()
        .to_string();
    let sample = |name: &str| -> f64 {
        text.lines()
            .filter(|l| l.starts_with(name))
            .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
            .sum()
    };
    let after = passes(&mut c);
    let counted = sample("leash_reconcile_passes_total{");
    assert!(
        counted >= before as f64 && counted <= after as f64 + 1.0,
        "passes: status {before}..{after}, metrics {counted}\n{text}"
    );
    assert!(
        sample("leash_reconcile_passes_total{result=\"acted\"}") >= 1.0,
        "{text}"
    );
    assert_eq!(
        sample("leash_reconcile_settled_total{result=\"closed\"}"),
        2.0,
        "{text}"
    );
    assert_eq!(
        sample("leash_reaps_total{result=\"closed\"}"),
        2.0,
        "{text}"
    );
    assert!(
        sample("leash_reconcile_duration_seconds_count") >= counted,
        "{text}"
    );
}

#[test]
fn zero_disables_reconcile() {
    let tmp = TempDir::new("reconcile-off");
    let state = tmp.join("state");
    let d = Daemon::start(&state, &["--reconcile-interval", "0"]);
    let mut c = d.connect();
    let s = c.call("status", json!({}));
    assert_eq!(s["daemon"]["reconcile"]["intervalMs"], Value::Null, "{s}");
    assert_eq!(s["daemon"]["reconcile"]["last"], Value::Null, "{s}");
}
