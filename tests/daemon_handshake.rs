//! `hello` names the protocol version, the daemon's ops and features; `ping` answers; `detach` ends
//! one attach of a connection (with an `end` item of reason `detached`) and leaves the connection
//! and the session's other attaches alone; an attach whose `since` lies above the last seq is
//! clamped to it (and says so) instead of stalling.
mod common;
mod daemon_support;
use common::*;
use daemon_support::*;
use serde_json::json;

#[test]
fn hello_and_ping_answer_and_refuse_unknown_fields() {
    let tmp = TempDir::new("d-hello");
    let daemon = Daemon::start(&tmp.join("state"), &[]);
    let mut c = daemon.connect();
    let h = c.call("hello", json!({"client": "test/1", "protocol": 1}));
    assert_eq!(h["protocol"], 1, "{h}");
    assert_eq!(h["daemonPid"], daemon.pid.pid, "{h}");
    let ops: Vec<&str> = h["ops"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o.as_str().unwrap())
        .collect();
    for op in ["status", "ensure", "attach", "hello", "ping", "detach"] {
        assert!(ops.contains(&op), "{op} missing from {ops:?}");
    }
    let features = h["features"].as_array().unwrap();
    for f in [
        "detach",
        "attach.stderr",
        "attach.sinceClamp",
        "ensure.storedSpec",
    ] {
        assert!(features.contains(&json!(f)), "{f} missing: {h}");
    }
    let p = c.call("ping", json!({}));
    assert_eq!(p["pong"], true, "{p}");
    assert!(p["at"].as_i64().unwrap() > 0, "{p}");
    assert_eq!(c.error_code("ping", json!({"x": 1})), "bad_request");
    assert_eq!(
        c.error_code("hello", json!({"events": "yes"})),
        "bad_request"
    );
}

#[test]
fn detach_ends_one_attach_and_keeps_the_connection() {
    let tmp = TempDir::new("d-detach");
    let daemon = Daemon::start(&tmp.join("state"), &[]);
    let mut c = daemon.connect();
    ensure(&mut c, "d", &["cat"]);
    let (a1, r1) = c.attach("d", 0);
    let (a2, r2) = c.attach("d", 0);
    assert_eq!(
        (r1["ok"].clone(), r2["ok"].clone()),
        (json!(true), json!(true))
    );
    let r = c.call("detach", json!({"attachId": a1}));
    assert_eq!(r["detached"], 1, "{r}");
    loop {
        let item = c.next_item(&a1);
        if item["type"] == "end" {
            assert_eq!(item["reason"], "detached", "{item}");
            break;
        }
    }
    // Detaching it again: it is gone.
    assert_eq!(c.error_code("detach", json!({"attachId": a1})), "not_found");
    // The other attach still streams.
    c.call("send", json!({"session": "d", "line": "still here"}));
    loop {
        let item = c.next_item(&a2);
        assert_ne!(item["type"], "end", "{item}");
        if item["type"] == "output" {
            assert_eq!(item["line"], "still here");
            break;
        }
    }
    // A detach on another connection does not reach this connection's attaches.
    let mut other = daemon.connect();
    assert_eq!(
        other.error_code("detach", json!({"attachId": a2})),
        "not_found"
    );
}

#[test]
fn since_above_the_last_seq_is_clamped_and_new_output_flows() {
    let tmp = TempDir::new("d-clamp");
    let daemon = Daemon::start(&tmp.join("state"), &[]);
    let mut c = daemon.connect();
    ensure(&mut c, "c", &["cat"]);
    let (id, reply) = c.attach("c", 1_000_000_000);
    assert_eq!(reply["ok"], true, "{reply}");
    let r = &reply["result"];
    assert_eq!(r["clamped"], true, "{reply}");
    assert_eq!(r["requestedSince"], 1_000_000_000i64, "{reply}");
    assert_eq!(r["since"], r["lastSeq"], "{reply}");
    c.call("send", json!({"session": "c", "line": "fresh"}));
    let item = loop {
        let item = c.next_item(&id);
        if item["type"] == "output" {
            break item;
        }
    };
    assert_eq!(item["line"], "fresh");
    assert!(item["seq"].as_i64().unwrap() > r["lastSeq"].as_i64().unwrap());
    // An ordinary since is not marked.
    let (_, reply) = c.attach("c", 0);
    assert!(reply["result"].get("clamped").is_none(), "{reply}");
}
