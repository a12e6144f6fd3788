//! `leash mcp` driven by the official MCP Python SDK over stdio, against a forest of sessions
//! started through a real `leash serve`: the requester, a same-agent peer, an owned cross-agent
//! child and grandchild, and a stranger. Every tool is called on every session under self, tree,
//! agent and all, with a2a off, on and with rules, and sandboxed; the visible sets are the ones the
//! visibility rules give (written out here by hand), `all` is never narrower than `tree`, a line
//! sent to a visible session reaches its adapter and nothing reaches an invisible one. Without a
//! daemon, `sessions_send` is a tool error that says how to start one.
mod common;
mod daemon_support;
mod mcp_support;
use common::*;
use daemon_support::*;
use mcp_support::*;
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};

const R: &str = "agent:main:req";
const P: &str = "agent:main:peer";
const C: &str = "agent:codex:child";
const G: &str = "agent:claude:grand";
const S: &str = "agent:ops:stranger";
const MISSING: &str = "agent:codex:ghost";
const KEYS: [&str; 5] = [R, P, C, G, S];

/// (id, flags, the keys visible).
fn matrix() -> Vec<(&'static str, Vec<&'static str>, Vec<&'static str>)> {
    vec![
        ("self", vec!["--as", R, "--visibility", "self"], vec![R]),
        ("tree", vec!["--as", R], vec![R, C, G]),
        (
            "agent",
            vec!["--as", R, "--visibility", "agent"],
            vec![R, P, C, G],
        ),
        (
            "all-off",
            vec!["--as", R, "--visibility", "all", "--a2a", "off"],
            vec![R, P, C, G],
        ),
        (
            "all-on",
            vec!["--as", R, "--visibility", "all", "--a2a", "on"],
            KEYS.to_vec(),
        ),
        (
            "all-allow-ops",
            vec!["--as", R, "--visibility", "all", "--a2a-allow", "main:ops"],
            KEYS.to_vec(),
        ),
        (
            "all-allow-codex",
            vec![
                "--as",
                R,
                "--visibility",
                "all",
                "--a2a-allow",
                "main:codex",
            ],
            vec![R, P, C, G],
        ),
        (
            "sandboxed-all-on",
            vec![
                "--as",
                R,
                "--visibility",
                "all",
                "--a2a",
                "on",
                "--sandboxed",
            ],
            vec![R, C, G],
        ),
        (
            "sandboxed-self",
            vec!["--as", R, "--visibility", "self", "--sandboxed"],
            vec![R],
        ),
        ("child-tree", vec!["--as", C], vec![C, G]),
        (
            "child-all-off",
            vec!["--as", C, "--visibility", "all"],
            vec![C, G],
        ),
        ("stranger-tree", vec!["--as", S], vec![S]),
        (
            "stranger-all-on",
            vec!["--as", S, "--visibility", "all", "--a2a", "on"],
            KEYS.to_vec(),
        ),
    ]
}

/// (a tree configuration, the wider ones of the same requester): `all` ⊇ `tree` always.
const NESTED: [(&str, &[&str]); 3] = [
    (
        "tree",
        &[
            "agent",
            "all-off",
            "all-on",
            "all-allow-ops",
            "all-allow-codex",
        ],
    ),
    ("child-tree", &["child-all-off"]),
    ("stranger-tree", &["stranger-all-on"]),
];

fn listed(seen: &Value) -> BTreeSet<String> {
    seen["list"]["ok"]["sessions"]
        .as_array()
        .unwrap_or_else(|| panic!("sessions_list failed: {}", seen["list"]))
        .iter()
        .map(|s| s["sessionKey"].as_str().unwrap().to_string())
        .collect()
}

fn error_text(v: &Value) -> &str {
    v["error"]
        .as_str()
        .unwrap_or_else(|| panic!("expected a tool error, got {v}"))
}

#[test]
fn the_sdk_sees_what_the_visibility_rules_allow_and_sends_only_there() {
    let tmp = TempDir::new("mcp-sdk");
    let state = tmp.join("state");
    let mut daemon = Daemon::start(&state, &[]);
    let mut guard = Guard::new();
    let mut c = daemon.connect();
    let fields = [
        (R, json!({"agent": "main"})),
        (P, json!({"agent": "main"})),
        (C, json!({"agent": "codex", "spawnedBy": R})),
        (G, json!({"agent": "claude", "parent": C})),
        (S, json!({"agent": "ops"})),
    ];
    let mut logs = BTreeMap::new();
    for (i, (key, extra)) in fields.into_iter().enumerate() {
        let (_, log, adapter) =
            ensure_recorder(&mut c, tmp.path(), key, &format!("s{i}.log"), extra);
        guard.add(adapter);
        logs.insert(key, log);
    }

    let matrix = matrix();
    let configs: Vec<Value> = matrix
        .iter()
        .map(|(id, args, _)| {
            let mut cfg = json!({"id": id, "args": args});
            if *id == "tree" {
                cfg["probe_output"] = json!(C);
            }
            cfg
        })
        .collect();
    let plan = json!({
        "leash": leash_bin(), "state": state, "keys": KEYS, "missing": MISSING, "configs": configs,
    });
    let results = drive_sdk(tmp.path(), &plan);
    let results = results.as_array().unwrap();
    assert_eq!(results.len(), matrix.len());

    let mut by_id = BTreeMap::new();
    for ((id, _, visible), seen) in matrix.iter().zip(results) {
        assert_eq!(seen["id"], *id);
        assert_eq!(seen["protocolVersion"], "2025-11-25", "{id}");
        assert_eq!(
            seen["tools"],
            json!([
                "session_status",
                "sessions_history",
                "sessions_list",
                "sessions_send"
            ])
        );
        let visible: BTreeSet<String> = visible.iter().map(|k| k.to_string()).collect();
        assert_eq!(listed(seen), visible, "{id}: sessions_list");
        let hidden_text = |key: &str| error_text(&seen["status"][key]).replace(key, "KEY");
        for key in KEYS {
            let status = &seen["status"][key];
            let history = &seen["history"][key];
            let send = &seen["send"][key];
            if visible.contains(key) {
                let st = &status["ok"];
                assert_eq!(st["sessionKey"], key, "{id} {key}: {status}");
                assert_eq!(st["phase"], "running", "{id} {key}: {status}");
                assert_eq!(st["leaseState"], "open", "{id} {key}: {status}");
                assert_eq!(st["busy"], false, "{id} {key}: {status}");
                assert_eq!(st["supervised"], true, "{id} {key}: {status}");
                assert!(st["lastSeq"].as_i64().unwrap() >= 1, "{id} {key}: {status}");
                assert!(
                    st["resources"]["processes"].as_u64().unwrap() >= 1
                        && st["resources"]["rssBytes"].as_u64().unwrap() > 0,
                    "{id} {key}: {status}"
                );
                let items = history["ok"]["items"]
                    .as_array()
                    .unwrap_or_else(|| panic!("{id} {key}: {history}"));
                assert!(
                    items
                        .iter()
                        .any(|i| i["type"] == "event" && i["kind"] == "spawned"),
                    "{id} {key}: {history}"
                );
                let line = format!("mcp:{id}:{key}");
                assert_eq!(send["ok"]["bytes"], line.len() + 1, "{id} {key}: {send}");
            } else {
                for (what, v) in [("status", status), ("history", history), ("send", send)] {
                    let text = error_text(v);
                    assert!(text.contains("not visible"), "{id} {key} {what}: {text}");
                    assert!(
                        text.contains("Nothing was read or sent"),
                        "{id} {key} {what}: {text}"
                    );
                }
                // The same words as for a session that does not exist: nothing leaks.
                assert_eq!(hidden_text(key), hidden_text(MISSING), "{id} {key}");
            }
        }
        for what in ["status", "history", "send"] {
            assert!(
                error_text(&seen[what][MISSING]).contains("not visible"),
                "{id}"
            );
        }
        assert!(
            error_text(&seen["override"]).contains("fixed when this server starts"),
            "{id}: {}",
            seen["override"]
        );
        by_id.insert(id.to_string(), (listed(seen), seen.clone()));
    }
    for (tree, wider) in NESTED {
        for w in wider {
            assert!(
                by_id[tree].0.is_subset(&by_id[*w].0),
                "{w} is narrower than {tree}: {:?} vs {:?}",
                by_id[*w].0,
                by_id[tree].0
            );
        }
    }
    // Why each is visible, as the rules say.
    let tree_list = &by_id["tree"].1["list"]["ok"]["sessions"];
    let grant = |k: &str| {
        tree_list
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["sessionKey"] == k)
            .unwrap()["visibleAs"]
            .clone()
    };
    assert_eq!(grant(R), "requester");
    assert_eq!(grant(C), "owned");
    assert_eq!(grant(G), "owned");

    // The recorder answered the probe line; its answer is in the child's history as output.
    let probe = &by_id["tree"].1;
    assert_eq!(
        probe["probe_send"]["ok"]["sessionKey"], C,
        "{}",
        probe["probe_send"]
    );
    let items = probe["probe_history"]["ok"]["items"].as_array().unwrap();
    assert!(
        items.iter().any(|i| i["type"] == "output"
            && i["line"]
                .as_str()
                .unwrap()
                .contains("\"stopReason\":\"end_turn\"")),
        "{items:?}"
    );
    let seqs: Vec<i64> = items.iter().map(|i| i["seq"].as_i64().unwrap()).collect();
    assert!(
        seqs.windows(2).all(|w| w[0] < w[1]),
        "history not in seq order: {seqs:?}"
    );

    // Each adapter got exactly the lines sent while it was visible, in order, then the fence
    // (written through the daemon after everything else): nothing reached an invisible one.
    for key in KEYS {
        c.call("send", json!({"session": key, "line": "fence"}));
    }
    for key in KEYS {
        let mut expected: Vec<String> = Vec::new();
        for (id, _, visible) in &matrix {
            if visible.contains(&key) {
                expected.push(format!("mcp:{id}:{key}"));
            }
            if *id == "tree" && key == C {
                expected.push("{\"respond\":1}".into());
            }
        }
        expected.push("fence".into());
        let lines = wait_lines(&logs[key], expected.len());
        assert_eq!(lines, expected, "{key}");
    }

    // Without a daemon: reading still works from the database, sending says how to start one.
    daemon.terminate();
    let plan = json!({
        "leash": leash_bin(), "state": state, "keys": [R], "missing": MISSING,
        "configs": [{"id": "no-daemon", "args": ["--as", R]}],
    });
    let seen = &drive_sdk(tmp.path(), &plan)[0];
    let send = error_text(&seen["send"][R]);
    assert!(
        send.contains("leash serve") && send.contains("nothing was sent"),
        "{send}"
    );
    assert_eq!(
        seen["status"][R]["ok"]["supervised"], false,
        "{}",
        seen["status"][R]
    );
    assert_eq!(
        seen["status"][R]["ok"]["phase"], "ended",
        "{}",
        seen["status"][R]
    );
    assert_eq!(
        seen["history"][R]["ok"]["supervised"], false,
        "{}",
        seen["history"][R]
    );
    assert_eq!(
        listed(seen),
        BTreeSet::from([R.to_string(), C.to_string(), G.to_string()])
    );
}
