//! `leash status | leases | cancel | close | reap` go through the daemon when one serves the state
//! root (same output, same exit codes), work on the database directly with `--no-daemon` or when no
//! daemon runs, and a close through the daemon ends its session.
mod common;
mod daemon_support;
use common::*;
use daemon_support::*;
use serde_json::json;

#[test]
fn cli_commands_go_through_a_running_daemon() {
    let mut s = OneSession::start("d-thin", "chat", "chat.log", json!({"graceMs": 500}));
    let OneSession {
        c,
        daemon,
        state,
        log,
        lease_id,
        adapter,
        ..
    } = &mut s;

    let st = run_json(state, &["status", "--json"]);
    assert_eq!(
        st["daemon"]["pid"], daemon.pid.pid,
        "status via the daemon: {st}"
    );
    assert_eq!(st["daemon"]["sessions"][0]["sessionKey"], "chat");
    let direct = run_json(state, &["--no-daemon", "status", "--json"]);
    assert!(direct.get("daemon").is_none(), "{direct}");
    assert_eq!(direct["gatewayInstanceId"], st["gatewayInstanceId"]);
    assert_eq!(direct["leases"], st["leases"]);
    let human = run(state, &["status"]);
    assert!(
        human.stdout.contains("daemon            pid"),
        "{}",
        human.stdout
    );

    let via = run_json(state, &["leases", "--json"]);
    let direct = run_json(state, &["--no-daemon", "leases", "--json"]);
    assert_eq!(via, direct, "leases through the daemon are the store's");
    let human = run(state, &["leases"]);
    assert!(human.stdout.contains(lease_id.as_str()), "{}", human.stdout);

    let plan = run_json(state, &["reap", "--dry-run", "--json"]);
    let lp = plan["leases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["leaseId"] == lease_id.as_str())
        .cloned()
        .unwrap();
    assert_eq!(lp["ownerAlive"], true, "the daemon owns its sessions: {lp}");
    assert_eq!(lp["decision"]["action"], "skip", "{lp}");

    // cancel through the daemon writes the notification.
    let out = run(
        state,
        &["cancel", "--session", "chat", "--acp-session", "acp-1"],
    );
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert!(
        out.stdout.contains("session/cancel written"),
        "{}",
        out.stdout
    );
    assert!(wait_lines(log, 1)[0].contains("\"session/cancel\""));

    // Unknown targets keep their exit codes.
    assert_eq!(run(state, &["close", "--session", "nobody"]).code, Some(4));
    assert_eq!(run(state, &["cancel", "--session", "nobody"]).code, Some(4));

    // close through the daemon: closed, and the daemon's session ends.
    let out = run(
        state,
        &["close", "--session", "chat", "--grace-ms", "300", "--json"],
    );
    assert_eq!(out.code, Some(0), "{}{}", out.stdout, out.stderr);
    let outcomes: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(outcomes[0]["result"], "closed", "{outcomes}");
    assert!(
        daemon.log_text().contains("closing session"),
        "the close did not go through the daemon:\n{}",
        daemon.log_text()
    );
    assert!(wait_for(|| !adapter.alive()));
    assert!(wait_daemon(c, |c| session_status(c, "chat").unwrap()
        ["phase"]
        == "ended"));
    let r = c.request("send", json!({"session": "chat", "line": "x"}));
    assert_eq!(r["error"]["code"], "not_running", "{r}");

    // With the daemon gone the same commands work on the database.
    c.stream.shutdown(std::net::Shutdown::Both).unwrap();
    assert_eq!(daemon.terminate().code(), Some(0));
    let st = run_json(state, &["status", "--json"]);
    assert!(st.get("daemon").is_none(), "{st}");
    assert_eq!(run_json(state, &["leases", "--json"])[0]["state"], "closed");
    // An explicit socket that nothing answers on is an error, not a silent fallback.
    let out = run(
        state,
        &["--socket", daemon.socket.to_str().unwrap(), "status"],
    );
    assert_eq!(out.code, Some(7), "{}", out.stderr);
}

#[test]
fn sessions_list_history_and_status_go_through_the_daemon() {
    let mut s = OneSession::start_with(
        "d-thin-sessions",
        |state| Daemon::start_logging(state, &[], "debug"),
        "agent:codex:acp:child",
        "child.log",
        json!({"agent": "codex", "spawnedBy": "agent:main:main"}),
    );
    let OneSession { daemon, state, .. } = &mut s;

    let key = "agent:codex:acp:child";
    let asks: [&[&str]; 3] = [
        &["sessions", "list", "--as", "agent:main:main", "--json"],
        &[
            "sessions",
            "history",
            key,
            "--as",
            "agent:main:main",
            "--json",
        ],
        &[
            "sessions",
            "status",
            key,
            "--as",
            "agent:main:main",
            "--json",
        ],
    ];
    for args in asks {
        let via = run_json(state, args);
        let direct = run_json(state, &[&["--no-daemon"], args].concat());
        assert_eq!(
            via, direct,
            "{args:?}: the daemon answers as the database does"
        );
    }
    // The daemon did the answering (its log shows the queries) ...
    assert!(
        wait_for(|| daemon.log_text().contains("\"query\":\"status\"")),
        "{}",
        daemon.log_text()
    );
    // ... with the same gate: not visible 5, unknown 4, both through the daemon.
    let out = run(
        state,
        &["sessions", "history", key, "--as", "agent:other:main"],
    );
    assert_eq!(out.code, Some(5), "{}", out.stderr);
    assert!(out.stdout.is_empty());
    let out = run(
        state,
        &["sessions", "status", "nope", "--as", "agent:main:main"],
    );
    assert_eq!(out.code, Some(4), "{}", out.stderr);
    let human = run(state, &["sessions", "list", "--as", "agent:main:main"]);
    assert_eq!(human.code, Some(0), "{}", human.stderr);
    assert!(human.stdout.contains(key), "{}", human.stdout);
    // A named socket that does not answer is an error, not a silent fallback.
    let out = run(
        state,
        &[
            "--socket",
            "/nonexistent/leash.sock",
            "sessions",
            "list",
            "--as",
            "x",
        ],
    );
    assert_eq!(out.code, Some(7), "{}", out.stderr);
}
