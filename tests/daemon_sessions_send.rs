//! `leash sessions send` checks visibility, then writes through the daemon (the only holder of the
//! adapter's stdin); a requester that may not see the session gets exit 5 and nothing is written.
//! The daemon's `sessions` op answers with the same visibility check.
mod common;
mod daemon_support;
use common::*;
use daemon_support::*;
use serde_json::json;
use std::process::Stdio;

#[test]
fn sessions_send_goes_through_the_daemon_after_the_visibility_check() {
    let mut s = OneSession::start(
        "d-sessions-send",
        "agent:codex:acp:child",
        "child.log",
        json!({"agent": "codex", "spawnedBy": "agent:main:main"}),
    );
    let OneSession {
        c,
        guard,
        daemon,
        state,
        log,
        ..
    } = &mut s;

    // Not visible to an unrelated requester: exit 5, nothing written.
    let out = run(
        state,
        &[
            "sessions",
            "send",
            "agent:codex:acp:child",
            "nope",
            "--as",
            "agent:other:main",
        ],
    );
    assert_eq!(out.code, Some(5), "{}", out.stderr);
    // Its spawner sees its cross-agent child under tree (and all, even with a2a off).
    for vis in ["tree", "all"] {
        let line = format!("{{\"hello\":\"{vis}\"}}");
        let out = run(
            state,
            &[
                "sessions",
                "send",
                "agent:codex:acp:child",
                &line,
                "--as",
                "agent:main:main",
                "--visibility",
                vis,
            ],
        );
        assert_eq!(out.code, Some(0), "{vis}: {}", out.stderr);
    }
    let lines = wait_lines(log, 2);
    assert_eq!(lines, vec!["{\"hello\":\"tree\"}", "{\"hello\":\"all\"}"]);

    let rows = c.call(
        "sessions",
        json!({"requesterSessionKey": "agent:main:main", "visibility": "all", "a2a": false}),
    );
    assert_eq!(rows.as_array().unwrap().len(), 1, "{rows}");
    assert_eq!(rows[0]["visibleAs"], "owned", "{rows}");
    assert_eq!(rows[0]["live"]["phase"], "running", "{rows}");
    let none = c.call(
        "sessions",
        json!({"requesterSessionKey": "agent:other:main", "visibility": "all", "a2a": false}),
    );
    assert_eq!(none, json!([]));

    // A visible session the daemon does not supervise (started by `leash exec`) has no stdin it
    // could write to. The answer says so — not "needs a running daemon" while one runs — and
    // exits 3 (a conflict with how the session runs), the wire code being not_supervised.
    let mut other = leash(state)
        .args([
            "exec",
            "--session",
            "agent:main:acp:own",
            "--spawned-by",
            "agent:main:main",
            "--",
            "sleep",
            "1000",
        ])
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let wrapper = Pid::of(other.id() as i32).unwrap();
    guard.add(wrapper);
    guard.add(adapter_of(wrapper));
    let out = run(
        state,
        &[
            "sessions",
            "send",
            "agent:main:acp:own",
            "x",
            "--as",
            "agent:main:main",
        ],
    );
    assert_eq!(out.code, Some(3), "{}", out.stderr);
    assert!(
        out.stderr
            .contains("only sessions started through the daemon (ensure) take input"),
        "{}",
        out.stderr
    );
    assert!(
        !out.stderr.contains("needs a running daemon"),
        "{}",
        out.stderr
    );
    let mut c = daemon.connect();
    let r = c.request(
        "send",
        json!({"session": "agent:main:acp:own", "line": "x"}),
    );
    assert_eq!(r["error"]["code"], "not_supervised", "{r}");
    assert_eq!(r["error"]["rootPid"], wrapper.pid, "{r}");
    let r = c.request("attach", json!({"session": "agent:main:acp:own"}));
    assert_eq!(r["error"]["code"], "not_supervised", "{r}");
    // An unknown session is not_found for events too, as for attach and send.
    assert_eq!(
        c.error_code("events", json!({"session": "nobody"})),
        "not_found"
    );
    assert_eq!(
        c.error_code("attach", json!({"session": "nobody"})),
        "not_found"
    );
    assert_eq!(
        c.error_code("send", json!({"session": "nobody", "line": "x"})),
        "not_found"
    );
    // A known session with nothing above `since` is an empty list, not an error.
    assert_eq!(
        c.call(
            "events",
            json!({"session": "agent:main:acp:own", "since": 1000})
        ),
        json!([])
    );
    signal(wrapper, libc::SIGTERM);
    let _ = other.wait();
}
