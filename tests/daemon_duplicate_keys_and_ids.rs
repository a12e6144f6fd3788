//! A request with the same key twice is refused (`bad_request`) and changes nothing —
//! `{"op":"reap","dryRun":true,"dryRun":false}` once ran a real reap — and a numeric id that would
//! not read back exactly (above 2^64-1, or a fraction) is refused instead of being echoed as a
//! float the client cannot match.
mod common;
mod daemon_support;
use common::*;
use daemon_support::*;
use serde_json::{json, Value};
use std::io::BufRead;

#[test]
fn a_duplicate_dry_run_key_reaps_nothing() {
    let tmp = TempDir::new("d-dupkeys");
    let state = tmp.join("state");
    let daemon = Daemon::start(&state, &[]);
    let mut c = daemon.connect();
    let (started, log, adapter) = ensure_recorder(&mut c, tmp.path(), "s1", "rec.log", json!({}));

    let line = br#"{"id":41,"op":"reap","dryRun":true,"dryRun":false,"includeLive":true}"#;
    c.send_raw(line);
    c.send_raw(b"\n");
    let r = c.read_line();
    assert_eq!(r["ok"], false, "{r}");
    assert_eq!(r["error"]["code"], "bad_request", "{r}");
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap()
            .contains("duplicate key \"dryRun\""),
        "{r}"
    );
    // The id cannot be trusted either (which one?), so the reply carries none.
    assert_eq!(r["id"], Value::Null, "{r}");

    c.send_raw(b"{\"id\":1,\"id\":2,\"op\":\"status\"}\n");
    let r = c.read_line();
    assert_eq!(r["error"]["code"], "bad_request", "{r}");
    assert_eq!(r["id"], Value::Null, "{r}");

    // Nothing was reaped: the session runs, its adapter got no signal, the lease is open.
    assert!(adapter.alive());
    let st = session_status(&mut c, "s1").unwrap();
    assert_eq!(st["phase"], "running", "{st}");
    let lease = lease_row(&mut c, started["leaseId"].as_str().unwrap());
    assert_eq!(lease["state"], "open", "{lease}");
    let sigs = std::fs::read_to_string(format!("{}.signals", log.display())).unwrap_or_default();
    assert!(sigs.is_empty(), "the adapter was signalled: {sigs}");
}

#[test]
fn ids_that_do_not_read_back_are_refused_and_the_others_echo_exactly() {
    let tmp = TempDir::new("d-bigids");
    let state = tmp.join("state");
    let daemon = Daemon::start(&state, &[]);
    let mut c = daemon.connect();
    let mut raw = std::io::BufReader::new(c.stream.try_clone().unwrap());
    let mut reply_text = |c: &mut Conn, req: &str| -> String {
        c.send_raw(req.as_bytes());
        c.send_raw(b"\n");
        let mut s = String::new();
        raw.read_line(&mut s).unwrap();
        s
    };
    for id in ["18446744073709551616", "1e3", "1.5", "-9223372036854775809"] {
        let text = reply_text(&mut c, &format!("{{\"id\":{id},\"op\":\"status\"}}"));
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["ok"], false, "id {id}: {text}");
        assert_eq!(v["error"]["code"], "bad_request", "id {id}: {text}");
        assert_eq!(v["id"], Value::Null, "id {id}: {text}");
    }
    for id in ["18446744073709551615", "-9223372036854775808", "0", "\"x\""] {
        let text = reply_text(&mut c, &format!("{{\"id\":{id},\"op\":\"status\"}}"));
        assert!(
            text.starts_with(&format!("{{\"id\":{id},\"ok\":true")),
            "id {id} not echoed exactly: {}",
            &text[..text.len().min(120)]
        );
    }
}
