//! Every numeric input is checked against its real range at the edge (`leash exec`, `ensure`'s
//! `graceMs`), nothing that would not read back is stored, the wrapper's grace arithmetic
//! saturates, and a row that does not read never makes a live tree unkillable: `close` (and `reap`)
//! repair it when its evidence reads, and refuse it, signalling nothing, when it does not.
mod common;
mod daemon_support;
use common::*;
use daemon_support::*;
use serde_json::{json, Value};

const HUGE: &str = "18446744073709551615";

#[test]
fn exec_refuses_an_oversize_grace_and_stores_nothing() {
    let tmp = TempDir::new("grace-exec");
    let state = tmp.join("state");
    for args in [
        vec!["--grace-ms", HUGE],
        vec!["--grace-ms", "9223372036854775808"],
        vec!["--grace-ms", "3600001"],
        vec!["--grace", "2h"],
        vec!["--grace", "1000000000000d"],
    ] {
        let mut full = vec!["exec", "--session", "s"];
        full.extend(args.iter().copied());
        full.extend(["--", "sleep", "1000"]);
        let out = run(&state, &full);
        assert_eq!(out.code, Some(125), "{args:?}: {}", out.stderr);
        assert!(
            out.stderr.contains("at most 1h") || out.stderr.contains("not a duration"),
            "{args:?}: the error names the range: {}",
            out.stderr
        );
    }
    assert!(
        !state.join("leash.db").exists(),
        "a refused exec stores nothing"
    );
}

#[test]
fn ensure_refuses_an_oversize_grace_with_the_range() {
    let tmp = TempDir::new("grace-ensure");
    let state = tmp.join("state");
    let daemon = Daemon::start(&state, &[]);
    let mut c = daemon.connect();
    for grace in [
        json!(9_223_372_036_854_775_808u64),
        json!(u64::MAX),
        json!(3_600_001),
    ] {
        let r = c.request(
            "ensure",
            json!({"session": "s", "argv": ["sleep", "1000"], "graceMs": grace}),
        );
        assert_eq!(r["ok"], false, "{r}");
        assert_eq!(r["error"]["code"], "bad_request", "{r}");
        let msg = r["error"]["message"].as_str().unwrap();
        assert!(msg.contains("graceMs") && msg.contains("3600000"), "{msg}");
    }
    assert_eq!(c.call("leases", json!({})), json!([]), "nothing stored");
    let r = c.request("close", json!({"session": "s", "graceMs": u64::MAX}));
    assert_eq!(r["error"]["code"], "bad_request", "{r}");
}

/// A session whose adapter ignores SIGTERM; returns (wrapper, adapter, lease id).
fn stubborn(
    guard: &mut Guard,
    tmp: &TempDir,
    state: &std::path::Path,
    key: &str,
) -> (Pid, Pid, String) {
    let (wrapper, adapter) = exec_trap(guard, state, tmp.path(), key, &["--grace", "200ms"]);
    let adapter = adapter.pid;
    guard.add(adapter);
    let id = lease_of(state, key)["leaseId"]
        .as_str()
        .unwrap()
        .to_string();
    (wrapper, adapter, id)
}

fn unreadable(state: &std::path::Path) -> bool {
    leases(state).iter().any(|l| l.get("error").is_some())
}

#[test]
fn close_repairs_a_row_it_cannot_read_but_whose_root_it_verifies() {
    let tmp = TempDir::new("grace-repair");
    let state = tmp.join("state");
    let mut guard = Guard::new();
    let (wrapper, adapter, id) = stubborn(&mut guard, &tmp, &state, "s");
    // What an unchecked --grace-ms 2^64-1 would store: a negative grace.
    tamper(&state, &id, "grace_ms = ?2", &[-1]);
    assert!(unreadable(&state), "the tampered row does not read");

    let out = run(&state, &["close", "--session", "s", "--json"]);
    assert_eq!(out.code, Some(0), "{}{}", out.stdout, out.stderr);
    let v: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(v[0]["result"], "closed", "{v}");
    assert!(wait_for(|| !wrapper.alive() && !adapter.alive()));
    assert!(!unreadable(&state), "the row reads again");
    let l = lease_of(&state, "s");
    assert_eq!(l["state"], "closed");
    assert_eq!(l["graceMs"], 3000, "the grace was reset to the default");
    let hist = run_json(
        &state,
        &[
            "sessions",
            "history",
            "s",
            "--as",
            "s",
            "--visibility",
            "all",
            "--json",
        ],
    );
    let kinds: Vec<&str> = hist["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["kind"].as_str())
        .collect();
    assert!(kinds.contains(&"repaired"), "{hist}");
}

#[test]
fn reap_repairs_an_unreadable_row_too() {
    let tmp = TempDir::new("grace-reap");
    let state = tmp.join("state");
    let mut guard = Guard::new();
    let (wrapper, adapter, id) = stubborn(&mut guard, &tmp, &state, "r");
    tamper(&state, &id, "grace_ms = ?2, adapter_pid = ?3", &[-5, -7]);
    let out = run(&state, &["reap", "--include-live", "--json"]);
    assert_eq!(out.code, Some(0), "{}{}", out.stdout, out.stderr);
    assert!(wait_for(|| !wrapper.alive() && !adapter.alive()));
    assert_eq!(lease_of(&state, "r")["state"], "closed");
}

#[test]
fn a_row_whose_evidence_does_not_read_is_refused_and_nothing_is_signalled() {
    let tmp = TempDir::new("grace-evidence");
    let state = tmp.join("state");
    let mut guard = Guard::new();
    let (wrapper, adapter, id) = stubborn(&mut guard, &tmp, &state, "e");
    tamper(
        &state,
        &id,
        "root_start_time = ?2, grace_ms = ?3",
        &[-1, -1],
    );
    let out = run(&state, &["close", "--session", "e"]);
    assert_eq!(out.code, Some(1), "{}{}", out.stdout, out.stderr);
    assert!(
        out.stderr
            .contains("cannot be verified and nothing is signalled"),
        "{}",
        out.stderr
    );
    assert!(wrapper.alive() && adapter.alive(), "nothing was signalled");
    assert_eq!(
        std::fs::read_to_string(tmp.join("e.log")).unwrap_or_default(),
        "",
        "the adapter got no signal"
    );
}
