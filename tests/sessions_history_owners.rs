//! History is scoped per lease, not per key: a session key reused by a new owner
//! shows the new owner only its own leases' events, and the previous owner still reads its own
//! (argv included), through `leash sessions history` and through `leash mcp`'s
//! `sessions_history` tool (the same controller function), which merges a running daemon's live
//! output only for the owner of the key's current lease. Real `leash exec` leases, a real
//! database, a real daemon.
mod common;
mod daemon_support;
mod mcp_support;
use common::*;
use daemon_support::{Conn, Daemon};
use mcp_support::*;
use serde_json::{json, Value};
use std::path::Path;

const KEY: &str = "acp:reused";
const A: &str = "agent:alpha:main";
const B: &str = "agent:beta:main";

fn exec_as(state: &Path, owner: &str, word: &str) {
    let out = run(
        state,
        &[
            "exec",
            "--session",
            KEY,
            "--owner",
            owner,
            "--",
            "/bin/echo",
            word,
        ],
    );
    assert_eq!(out.code, Some(0), "{}", out.stderr);
}

fn history(state: &Path, requester: &str) -> Output {
    run(
        state,
        &["sessions", "history", KEY, "--as", requester, "--json"],
    )
}

/// The argv words of the `spawned` events, and the lease ids of every event.
fn spawned_words(events: &[Value]) -> Vec<String> {
    events
        .iter()
        .filter(|e| e["kind"] == "spawned")
        .map(|e| e["detail"]["command"][1].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn a_reused_key_shows_each_owner_only_its_own_leases() {
    let tmp = TempDir::new("hist-owners");
    let state = tmp.join("state");
    exec_as(&state, A, "alpha-secret-argv");
    exec_as(&state, A, "alpha-second");
    exec_as(&state, B, "beta-argv");
    let leases = leases(&state);
    let ids: Vec<&str> = leases
        .iter()
        .map(|l| l["leaseId"].as_str().unwrap())
        .collect();
    assert_eq!(ids.len(), 3);

    let b = history(&state, B);
    assert_eq!(b.code, Some(0), "{}", b.stderr);
    assert!(
        !b.stdout.contains("alpha"),
        "B reads A's events: {}",
        b.stdout
    );
    let bh: Value = serde_json::from_str(&b.stdout).unwrap();
    let events = bh["events"].as_array().unwrap();
    assert_eq!(spawned_words(events), ["beta-argv"]);
    assert!(!events.is_empty());
    assert!(events.iter().all(|e| e["leaseId"] == ids[2]), "{bh}");

    let a = history(&state, A);
    assert_eq!(
        a.code,
        Some(0),
        "A cannot read its own events: {}",
        a.stderr
    );
    let ah: Value = serde_json::from_str(&a.stdout).unwrap();
    let events = ah["events"].as_array().unwrap();
    assert_eq!(spawned_words(events), ["alpha-secret-argv", "alpha-second"]);
    assert!(
        !a.stdout.contains("beta"),
        "A reads B's events: {}",
        a.stdout
    );
    assert_eq!(ah["visibleAs"], "owned", "{ah}");

    // A third party sees nothing of either (and is told so, as for any hidden session).
    let c = history(&state, "agent:gamma:main");
    assert_eq!(c.code, Some(5), "{} {}", c.stdout, c.stderr);
    assert!(c.stdout.is_empty());

    // The same through `leash mcp`.
    for (who, want, never) in [
        (A, vec!["alpha-secret-argv", "alpha-second"], "beta"),
        (B, vec!["beta-argv"], "alpha"),
    ] {
        let mut p = McpProc::start(&state, &["--as", who]);
        let r = p.request(&initialize(1, "2025-06-18"));
        assert!(r.get("result").is_some(), "{r}");
        p.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        let r = p.request(&tool_call(
            2,
            "sessions_history",
            json!({"sessionKey": KEY}),
        ));
        let text = r.to_string();
        assert!(
            !text.contains(never),
            "{who} reads another owner's events: {text}"
        );
        let items = r["result"]["structuredContent"]["items"]
            .as_array()
            .unwrap_or_else(|| panic!("{r}"));
        let words: Vec<String> = items
            .iter()
            .filter(|i| i["kind"] == "spawned")
            .map(|i| i["detail"]["command"][1].as_str().unwrap().to_string())
            .collect();
        assert_eq!(words, want, "{who}: {r}");
        p.close_and_wait();
    }
}

/// `leash mcp --as WHO`'s `sessions_history` of [`KEY`], as text.
fn mcp_history(state: &Path, who: &str) -> Value {
    let mut p = McpProc::start(state, &["--as", who]);
    let r = p.request(&initialize(1, "2025-06-18"));
    assert!(r.get("result").is_some(), "{r}");
    p.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    let r = p.request(&tool_call(
        2,
        "sessions_history",
        json!({"sessionKey": KEY}),
    ));
    p.close_and_wait();
    r
}

#[test]
fn the_daemons_live_output_goes_only_to_the_owner_of_the_current_lease() {
    let tmp = TempDir::new("hist-live");
    let state = tmp.join("state");
    exec_as(&state, A, "alpha-secret-argv");
    let daemon = Daemon::start(&state, &[]);
    let mut c: Conn = daemon.connect();
    c.call(
        "ensure",
        json!({"session": KEY, "owner": B, "graceMs": 300,
               "argv": ["/bin/sh", "-c", "echo beta-live-output; exec /bin/cat"]}),
    );
    // The line is in the daemon's replay buffer once an attach from 0 shows it.
    let (id, _) = c.attach(KEY, 0);
    loop {
        let item = c.next_item(&id);
        if item["type"] == "output" && item["line"] == "beta-live-output" {
            break;
        }
        assert_ne!(item["type"], "end", "{item}");
    }
    let b = mcp_history(&state, B).to_string();
    assert!(b.contains("beta-live-output"), "{b}");
    assert!(!b.contains("alpha"), "{b}");
    let a = mcp_history(&state, A);
    let text = a.to_string();
    assert!(!text.contains("beta"), "A reads B's live output: {text}");
    assert!(text.contains("alpha-secret-argv"), "{text}");
}
