//! `ensure` on a running session says whether its argv matches; the daemon keeps each session's
//! ensure spec (argv, cwd, env, ownership) in the state database, so `ensure {session}` re-spawns
//! it as it was, also after a daemon restart (`persistSpec: false` keeps none); and a connection
//! that asks for lifecycle events is pushed the sessions that were busy when the previous daemon
//! stopped (`resumable`), then `resumed` when one is ensured again.
mod common;
mod daemon_support;
use common::*;
use daemon_support::*;
use serde_json::json;

#[test]
fn ensure_reports_whether_the_running_argv_matches() {
    let tmp = TempDir::new("d-argv");
    let daemon = Daemon::start(&tmp.join("state"), &[]);
    let mut c = daemon.connect();
    let r = c.call("ensure", json!({"session": "a", "argv": ["cat"]}));
    assert_eq!(
        (r["created"].clone(), r["argvMatches"].clone()),
        (json!(true), json!(true))
    );
    let r = c.call("ensure", json!({"session": "a", "argv": ["cat"]}));
    assert_eq!(
        (r["created"].clone(), r["argvMatches"].clone()),
        (json!(false), json!(true))
    );
    let r = c.call("ensure", json!({"session": "a", "argv": ["cat", "-u"]}));
    assert_eq!(
        (r["created"].clone(), r["argvMatches"].clone()),
        (json!(false), json!(false))
    );
    // No argv: whatever runs is what is meant.
    let r = c.call("ensure", json!({"session": "a"}));
    assert_eq!(r["argvMatches"], true, "{r}");
}

#[test]
fn a_stored_spec_respawns_the_session_as_it_was_across_restarts() {
    let tmp = TempDir::new("d-spec");
    let state = tmp.join("state");
    let work = tmp.join("work");
    std::fs::create_dir(&work).unwrap();
    let mut daemon = Daemon::start(&state, &[]);
    let mut c = daemon.connect();
    let script = "echo \"$PWD|$SECRET_TOKEN|$OPENCLAW_ACPX_LEASE_ID\" >> seen; exec cat";
    let first = c.call(
        "ensure",
        json!({"session": "s", "argv": ["sh", "-c", script], "cwd": work,
               "env": {"SECRET_TOKEN": "t0k"}, "persistEnv": true, "agent": "codex", "graceMs": 400}),
    );
    assert_eq!(wait_lines(&work.join("seen"), 1).len(), 1);
    // The spec holds env values (persistEnv): the database is 0600 (inside the 0700 state root).
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(state.join("leash.db"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "{mode:o}");
    // Nothing needs the spec while it runs: ensure {session} returns the running one.
    let again = c.call("ensure", json!({"session": "s"}));
    assert_eq!(again["created"], false, "{again}");
    assert_eq!(again["leaseId"], first["leaseId"]);
    assert_eq!(daemon.terminate().code(), Some(0));

    let daemon = Daemon::start(&state, &[]);
    let mut c = daemon.connect();
    let resumed = c.call("ensure", json!({"session": "s"}));
    assert_eq!(resumed["created"], true, "{resumed}");
    assert_ne!(resumed["leaseId"], first["leaseId"]);
    let lines = wait_lines(&work.join("seen"), 2);
    let want = |lease: &serde_json::Value| {
        format!(
            "{}|t0k|{}",
            work.canonicalize().unwrap().display(),
            lease.as_str().unwrap()
        )
    };
    assert_eq!(lines[1], want(&resumed["leaseId"]), "{lines:?}");
    let row = c.call("sessions", json!({}));
    let row = row
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["sessionKey"] == "s")
        .cloned()
        .unwrap();
    assert_eq!(row["agentId"], "codex", "{row}");

    // persistSpec: false forgets it; ensure {session} then needs argv.
    c.call("close", json!({"session": "s"}));
    assert!(wait_daemon(&mut c, |c| session_status(c, "s")
        .is_some_and(|s| s["phase"] == "ended")));
    c.call(
        "ensure",
        json!({"session": "s", "argv": ["cat"], "persistSpec": false}),
    );
    c.call("close", json!({"session": "s"}));
    assert!(wait_daemon(&mut c, |c| session_status(c, "s")
        .is_some_and(|s| s["phase"] == "ended")));
    let r = c.request("ensure", json!({"session": "s"}));
    assert_eq!(r["error"]["code"], "not_found", "{r}");
    assert!(
        r["error"]["message"].as_str().unwrap().contains("argv"),
        "{r}"
    );
    assert_eq!(
        c.error_code("ensure", json!({"session": "never"})),
        "not_found"
    );
    // Spec fields without argv are ambiguous.
    assert_eq!(
        c.error_code("ensure", json!({"session": "s", "cwd": "/"})),
        "bad_request"
    );
}

#[test]
fn resumable_sessions_are_pushed_to_connections_that_ask() {
    let tmp = TempDir::new("d-push");
    let state = tmp.join("state");
    let mut daemon = Daemon::start(&state, &[]);
    let mut c = daemon.connect();
    let (_, log, _) = ensure_recorder(&mut c, tmp.path(), "busy", "rec.log", json!({}));
    c.call("send", json!({"session": "busy", "line": prompt("acp-1")}));
    wait_lines(&log, 1);
    ensure(&mut c, "idle", &["cat"]);
    assert_eq!(daemon.terminate().code(), Some(0));

    let daemon = Daemon::start(&state, &[]);
    let mut quiet = daemon.connect();
    let mut c = daemon.connect();
    let h = c.call("hello", json!({"events": true}));
    assert_eq!(h["events"], true, "{h}");
    let hello_id = json!(c.last_id());
    let item = c.next_item(&hello_id);
    assert_eq!(item["type"], "resumable", "{item}");
    assert_eq!(item["sessionKey"], "busy", "{item}");
    assert_eq!(item["hasSpec"], true, "{item}");
    assert_eq!(item["acpSessionIds"], json!(["acp-1"]), "{item}");
    assert!(item["eventSeq"].as_i64().unwrap() > 0, "{item}");
    // Ensured again (from its stored spec) on another connection: subscribers hear `resumed`.
    let r = quiet.call("ensure", json!({"session": "busy"}));
    assert_eq!(r["created"], true, "{r}");
    let item = c.next_item(&hello_id);
    assert_eq!(item["type"], "resumed", "{item}");
    assert_eq!(item["sessionKey"], "busy", "{item}");
    assert_eq!(item["leaseId"], r["leaseId"], "{item}");
    // A connection that did not ask got nothing but its replies.
    let p = quiet.call("ping", json!({}));
    assert_eq!(p["pong"], true);
}
