//! `leash serve --log-format json` writes one JSON object per line on stderr (what journald stores
//! as MESSAGE), with the event's and its spans' fields at the top level: a verify names its
//! `lease_id`, `session`, `pid` and `op`, and so does each signal of a close. Text stays the
//! default.
mod common;
mod daemon_support;
use common::*;
use daemon_support::*;
use serde_json::{json, Value};

#[test]
fn json_lines_carry_the_lease_fields() {
    let tmp = TempDir::new("jsonlog");
    let state = tmp.join("state");
    let mut d = Daemon::start(&state, &["--log-format", "json"]);
    let mut c = d.connect();
    let started = ensure(&mut c, "s", &["sleep", "1000"]);
    c.call("verify", json!({"session": "s"}));
    c.call("close", json!({"session": "s", "graceMs": 300}));
    assert_eq!(d.terminate().code(), Some(0));
    let log = d.log_text();
    let lines: Vec<Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    assert!(lines
        .iter()
        .all(|l| l["level"].is_string() && l["timestamp"].is_string()));
    let v = lines
        .iter()
        .find(|l| l["op"] == "verify")
        .unwrap_or_else(|| panic!("no verify line:\n{log}"));
    assert_eq!(v["lease_id"], started["leaseId"]);
    assert_eq!(v["session"], "s");
    assert_eq!(v["pid"], started["rootPid"]);
    assert_eq!(v["answer"], "owned");
    // A close's lines, logged deep in the controller and off the connection's thread, name the
    // request's op, the session and the lease.
    let signalled: Vec<&Value> = lines
        .iter()
        .filter(|l| l["message"] == "signalled")
        .collect();
    assert!(!signalled.is_empty(), "no signalled line:\n{log}");
    for l in &signalled {
        assert_eq!(l["op"], "close", "{l}");
        assert_eq!(l["session"], "s", "{l}");
        assert_eq!(l["lease_id"], started["leaseId"], "{l}");
        assert!(l["pid"].as_i64().is_some_and(|p| p > 1), "{l}");
    }
    let finished = lines
        .iter()
        .find(|l| l["message"] == "close finished")
        .unwrap_or_else(|| panic!("no close finished line:\n{log}"));
    assert_eq!(finished["op"], "close", "{finished}");
    assert_eq!(finished["session"], "s", "{finished}");
    assert_eq!(finished["lease_id"], started["leaseId"], "{finished}");
    assert!(lines.iter().any(|l| l["message"] == "leash serve stopped"));
}

#[test]
fn text_is_the_default() {
    let tmp = TempDir::new("textlog");
    let state = tmp.join("state");
    let mut d = Daemon::start(&state, &[]);
    assert_eq!(d.terminate().code(), Some(0));
    let log = d.log_text();
    assert!(log.contains("INFO"), "{log}");
    assert!(!log.trim_start().starts_with('{'), "{log}");
}
