//! Stored ensure specs and the secrets in them, read straight from the state
//! database: a spec keeps the names of its env but not the values unless the ensure asks for them
//! (`persistEnv: true`), and a resume then needs the values again; `persistSpec: false` deletes
//! the stored spec also when the session is found running; a close with
//! `discardPersistentState` deletes it; and a spec goes with its session's last lease when the
//! retention expires it (churned keys leave no rows behind).
mod common;
mod daemon_support;
use common::*;
use daemon_support::*;
use serde_json::json;
use std::path::Path;

/// Every stored spec, as (session key, spec text), read from the database itself.
fn stored_specs(state: &Path) -> Vec<(String, String)> {
    let conn = rusqlite::Connection::open(state.join("leash.db")).unwrap();
    let mut stmt = conn
        .prepare("SELECT key, value FROM meta WHERE key LIKE 'session.spec.%' ORDER BY key")
        .unwrap();
    let rows = stmt
        .query_map([], |r| {
            let k: String = r.get(0)?;
            Ok((k["session.spec.".len()..].to_string(), r.get(1)?))
        })
        .unwrap();
    rows.map(Result::unwrap).collect()
}

fn spec_of(state: &Path, session: &str) -> Option<String> {
    stored_specs(state)
        .into_iter()
        .find(|(k, _)| k == session)
        .map(|(_, v)| v)
}

fn closed(c: &mut Conn, session: &str) {
    c.call("close", json!({"session": session}));
    assert!(wait_daemon(c, |c| session_status(c, session)
        .is_some_and(|s| s["phase"] == "ended")));
}

#[test]
fn env_values_are_stored_only_when_asked_and_a_resume_gives_them_again() {
    let tmp = TempDir::new("spec-env");
    let state = tmp.join("state");
    let seen = tmp.join("seen");
    let script = format!("echo \"$API_TOKEN\" >> {}; exec cat", seen.display());
    let mut daemon = Daemon::start(&state, &[]);
    let mut c = daemon.connect();
    c.call(
        "ensure",
        json!({"session": "s", "argv": ["sh", "-c", script], "env": {"API_TOKEN": "sk-live-123"}}),
    );
    assert_eq!(wait_lines(&seen, 1), ["sk-live-123"]);
    let text = spec_of(&state, "s").expect("a spec is stored");
    assert!(
        !text.contains("sk-live-123"),
        "the value was stored: {text}"
    );
    assert!(text.contains("API_TOKEN"), "the name was not kept: {text}");
    // Nowhere else in the database either.
    let raw = std::fs::read(state.join("leash.db")).unwrap();
    let wal = std::fs::read(state.join("leash.db-wal")).unwrap_or_default();
    for bytes in [&raw, &wal] {
        assert!(!bytes.windows(11).any(|w| w == b"sk-live-123"));
    }
    assert_eq!(daemon.terminate().code(), Some(0));

    // After a restart: the spec alone cannot start it (the value is missing), and says so.
    let mut daemon = Daemon::start(&state, &[]);
    let mut c = daemon.connect();
    let r = c.request("ensure", json!({"session": "s"}));
    assert_eq!(r["error"]["code"], "bad_request", "{r}");
    let msg = r["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("API_TOKEN") && msg.contains("persistEnv"),
        "{msg}"
    );
    assert!(c
        .call("leases", json!({"state": "open"}))
        .as_array()
        .unwrap()
        .is_empty());
    // Given the values, the stored spec does the rest.
    let r = c.call(
        "ensure",
        json!({"session": "s", "env": {"API_TOKEN": "sk-live-456"}}),
    );
    assert_eq!(r["created"], true, "{r}");
    assert_eq!(wait_lines(&seen, 2)[1], "sk-live-456");
    assert!(!spec_of(&state, "s").unwrap().contains("sk-live-456"));
    closed(&mut c, "s");

    // persistEnv: true stores the value, and a resume needs nothing more.
    c.call(
        "ensure",
        json!({"session": "s", "argv": ["sh", "-c", script], "env": {"API_TOKEN": "sk-kept"},
               "persistEnv": true}),
    );
    assert_eq!(wait_lines(&seen, 3)[2], "sk-kept");
    assert!(spec_of(&state, "s").unwrap().contains("sk-kept"));
    assert_eq!(daemon.terminate().code(), Some(0));
    let daemon = Daemon::start(&state, &[]);
    let mut c = daemon.connect();
    assert_eq!(c.call("ensure", json!({"session": "s"}))["created"], true);
    assert_eq!(wait_lines(&seen, 4)[3], "sk-kept");
    // A contradiction is refused, and nothing starts.
    assert_eq!(
        c.error_code(
            "ensure",
            json!({"session": "t", "argv": ["cat"], "persistEnv": true, "persistSpec": false})
        ),
        "bad_request"
    );
    assert!(spec_of(&state, "t").is_none());
}

#[test]
fn persist_spec_false_on_a_running_session_deletes_its_spec() {
    let tmp = TempDir::new("spec-running");
    let state = tmp.join("state");
    let daemon = Daemon::start(&state, &[]);
    let mut c = daemon.connect();
    ensure(&mut c, "s", &["cat"]);
    assert!(spec_of(&state, "s").is_some());
    let r = c.call(
        "ensure",
        json!({"session": "s", "argv": ["cat"], "persistSpec": false}),
    );
    assert_eq!(r["created"], false, "{r}");
    assert_eq!(spec_of(&state, "s"), None);
}

#[test]
fn close_with_discard_persistent_state_deletes_the_spec() {
    let tmp = TempDir::new("spec-discard");
    let state = tmp.join("state");
    let daemon = Daemon::start(&state, &[]);
    let mut c = daemon.connect();
    ensure(&mut c, "keep", &["cat"]);
    ensure(&mut c, "drop", &["cat"]);
    closed(&mut c, "keep");
    let out = c.call(
        "close",
        json!({"session": "drop", "discardPersistentState": true}),
    );
    assert_eq!(out[0]["result"], "closed", "{out}");
    assert_eq!(spec_of(&state, "drop"), None);
    // A plain close keeps it for a resume.
    assert!(spec_of(&state, "keep").is_some());
    // And a session that no longer runs can still have its spec discarded.
    let r = c.request(
        "close",
        json!({"session": "keep", "discardPersistentState": true}),
    );
    assert!(r.get("error").is_some() || r["result"].is_array(), "{r}");
    assert_eq!(spec_of(&state, "keep"), None);
}

#[test]
fn a_spec_is_pruned_with_its_sessions_last_lease() {
    let tmp = TempDir::new("spec-prune");
    let state = tmp.join("state");
    let daemon = Daemon::start(&state, &[]);
    let mut c = daemon.connect();
    // Churned keys: each started with a secret, then closed.
    for i in 0..5 {
        let key = format!("churn-{i}");
        c.call(
            "ensure",
            json!({"session": key, "argv": ["cat"], "env": {"K": "v"}, "graceMs": 200}),
        );
        closed(&mut c, &key);
    }
    ensure(&mut c, "live", &["cat"]);
    assert_eq!(stored_specs(&state).len(), 6);
    // The retention expires the closed leases: their specs go with them; the live one stays.
    let r = c.call("reap", json!({"retentionMs": 0}));
    assert!(r["expired"].as_u64().unwrap() >= 5, "{r}");
    let left: Vec<String> = stored_specs(&state).into_iter().map(|(k, _)| k).collect();
    assert_eq!(left, ["live"]);
}

#[test]
fn a_resumable_push_names_the_env_a_resume_must_give() {
    let tmp = TempDir::new("spec-push");
    let state = tmp.join("state");
    let mut daemon = Daemon::start(&state, &[]);
    let mut c = daemon.connect();
    let (_, log, _) = ensure_recorder(
        &mut c,
        tmp.path(),
        "busy",
        "rec.log",
        json!({"env": {"API_TOKEN": "sk-x", "OTHER": "y"}}),
    );
    c.call("send", json!({"session": "busy", "line": prompt("acp-1")}));
    wait_lines(&log, 1);
    assert_eq!(daemon.terminate().code(), Some(0));

    let daemon = Daemon::start(&state, &[]);
    let mut c = daemon.connect();
    c.call("hello", json!({"events": true}));
    let hello_id = json!(c.last_id());
    let item = c.next_item(&hello_id);
    assert_eq!(item["type"], "resumable", "{item}");
    assert_eq!(item["hasSpec"], true, "{item}");
    assert_eq!(item["needsEnv"], json!(["API_TOKEN", "OTHER"]), "{item}");
}
