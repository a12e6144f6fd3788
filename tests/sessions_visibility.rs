//! Session visibility, live: sessions spawned with `leash exec` and ownership flags, then listed,
//! read and sent to through `leash sessions` as different requesters with different visibilities. A
//! session the requester may not see exits 5 for history, status and send (never an empty success);
//! an unknown one exits 4; `send` to a visible session without a daemon exits 7.
mod common;
use common::*;
use serde_json::Value;
use std::collections::BTreeSet;
use std::path::Path;

const ROOT: &str = "agent:main:root";

fn exec_true(state: &Path, flags: &[&str]) {
    let mut args = vec!["exec"];
    args.extend_from_slice(flags);
    args.extend_from_slice(&["--", "true"]);
    let out = run(state, &args);
    assert_eq!(out.code, Some(0), "leash {args:?}: {}", out.stderr);
}

fn listed(state: &Path, requester: &str, extra: &[&str]) -> BTreeSet<String> {
    let mut args = vec!["sessions", "list", "--as", requester, "--json"];
    args.extend_from_slice(extra);
    let v = run_json(state, &args);
    v["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["sessionKey"].as_str().unwrap().to_string())
        .collect()
}

fn set(keys: &[&str]) -> BTreeSet<String> {
    keys.iter().map(|k| k.to_string()).collect()
}

#[test]
fn requesters_see_what_their_rows_allow_and_nothing_else() {
    let tmp = TempDir::new("sessions-vis");
    let state = tmp.join("state");
    let mut guard = Guard::new();

    // A top-level session of agent main, its cross-agent ACP child and grandchild, a peer of the
    // same agent, another agent's session, and an old-style row without any ownership flags.
    exec_true(&state, &["--session", ROOT, "--agent", "main"]);
    exec_true(
        &state,
        &[
            "--session",
            "acp:child",
            "--agent",
            "claude",
            "--owner",
            ROOT,
            "--spawned-by",
            ROOT,
            "--parent",
            ROOT,
        ],
    );
    exec_true(
        &state,
        &[
            "--session",
            "acp:grand",
            "--agent",
            "gemini",
            "--spawned-by",
            "acp:child",
        ],
    );
    exec_true(&state, &["--session", "agent:main:peer", "--agent", "main"]);
    exec_true(
        &state,
        &["--session", "agent:codex:other", "--agent", "codex"],
    );
    exec_true(&state, &["--session", "old-session"]);
    // One live session, owned by the root, for status.
    let live = guard.child(
        leash(&state)
            .args([
                "exec",
                "--session",
                "acp:live",
                "--agent",
                "claude",
                "--owner",
                ROOT,
                "--",
                "sleep",
                "1000",
            ])
            .spawn()
            .unwrap(),
    );
    let wrapper = Pid::of(live.id() as i32).unwrap();
    let mut status = Value::Null;
    assert!(
        wait_for(|| {
            // Until the spawned `leash exec` has committed its row, the session is unknown (4).
            let out = run(
                &state,
                &["sessions", "status", "acp:live", "--as", ROOT, "--json"],
            );
            if out.code != Some(0) {
                assert_eq!(out.code, Some(4), "{}", out.stderr);
                return false;
            }
            status = serde_json::from_str(&out.stdout).unwrap();
            status["adapter"]["alive"] == true
        }),
        "the live session's adapter never showed up: {status}"
    );
    let adapter = Pid::of(status["adapter"]["pid"].as_i64().unwrap() as i32).unwrap();
    guard.add(adapter);

    // status of the live session: the lease, the root and adapter alive, the verified tree.
    assert_eq!(status["lease"]["state"], "open");
    assert_eq!(status["visibleAs"], "owned");
    assert_eq!(status["root"]["pid"], wrapper.pid);
    assert_eq!(status["root"]["alive"], true);
    assert_eq!(status["tree"]["verdict"], "owned", "{status}");
    let procs = status["tree"]["processes"].as_array().unwrap();
    assert!(
        procs
            .iter()
            .any(|p| p["pid"] == adapter.pid && p["role"] == "adapter"),
        "{status}"
    );

    // list, as different requesters and visibilities.
    let tree = set(&[ROOT, "acp:child", "acp:grand", "acp:live"]);
    assert_eq!(listed(&state, ROOT, &["--visibility", "tree"]), tree);
    assert_eq!(listed(&state, ROOT, &[]), tree, "tree is the default");
    assert_eq!(
        listed(&state, ROOT, &["--visibility", "self"]),
        set(&[ROOT])
    );
    let mut agent = tree.clone();
    agent.insert("agent:main:peer".into());
    assert_eq!(listed(&state, ROOT, &["--visibility", "agent"]), agent);
    assert_eq!(listed(&state, ROOT, &["--visibility", "all"]), agent);
    let mut with_codex = agent.clone();
    with_codex.insert("agent:codex:other".into());
    assert_eq!(
        listed(
            &state,
            ROOT,
            &["--visibility", "all", "--a2a-allow", "main:codex"]
        ),
        with_codex
    );
    let mut everything = with_codex.clone();
    everything.insert("old-session".into());
    assert_eq!(
        listed(&state, ROOT, &["--visibility", "all", "--a2a", "on"]),
        everything
    );
    assert_eq!(
        listed(
            &state,
            ROOT,
            &["--visibility", "all", "--a2a", "on", "--sandboxed"]
        ),
        tree
    );
    assert_eq!(
        listed(&state, "acp:child", &["--visibility", "tree"]),
        set(&["acp:child", "acp:grand"])
    );
    assert_eq!(
        listed(&state, "agent:codex:other", &["--visibility", "agent"]),
        set(&["agent:codex:other"])
    );
    assert_eq!(
        listed(&state, "old-session", &["--visibility", "agent"]),
        set(&["old-session"]),
        "a row without an agent shares it with nobody"
    );
    let sandboxed = run_json(
        &state,
        &[
            "sessions",
            "list",
            "--as",
            ROOT,
            "--visibility",
            "all",
            "--sandboxed",
            "--json",
        ],
    );
    assert_eq!(sandboxed["visibility"], "all");
    assert_eq!(sandboxed["effectiveVisibility"], "tree");
    let human = run(&state, &["sessions", "list", "--as", ROOT]);
    assert_eq!(human.code, Some(0));
    assert!(
        human.stdout.contains("acp:grand") && human.stdout.contains("owned"),
        "{}",
        human.stdout
    );

    // history of a visible session: its lifecycle events, in order.
    let h = run_json(
        &state,
        &[
            "sessions",
            "history",
            "acp:child",
            "--as",
            ROOT,
            "--visibility",
            "tree",
            "--json",
        ],
    );
    let events = h["events"].as_array().unwrap();
    assert_eq!(events[0]["kind"], "spawned", "{h}");
    let seqs: Vec<i64> = events.iter().map(|e| e["seq"].as_i64().unwrap()).collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");
    assert_eq!(seqs[0], 1);

    // A session that ran `true` has no live root any more.
    let done = run_json(
        &state,
        &["sessions", "status", "acp:child", "--as", ROOT, "--json"],
    );
    assert_eq!(done["root"]["alive"], false, "{done}");

    // Not visible: exit 5 for history, status and send, with nothing on stdout.
    for (requester, vis) in [
        ("agent:codex:other", "tree"),
        ("agent:codex:other", "all"),
        ("agent:main:peer", "agent"),
        (ROOT, "self"),
    ] {
        for op in [
            vec!["history", "acp:child"],
            vec!["status", "acp:child"],
            vec!["send", "acp:child", "hello"],
        ] {
            let mut args = vec!["sessions"];
            args.extend_from_slice(&op);
            args.extend_from_slice(&["--as", requester, "--visibility", vis]);
            let out = run(&state, &args);
            assert_eq!(out.code, Some(5), "{args:?}: {}", out.stderr);
            assert!(out.stderr.contains("not visible"), "{}", out.stderr);
            assert!(out.stdout.is_empty(), "{args:?} printed {}", out.stdout);
        }
    }
    // Sandboxed: even `all` with a2a on cannot reach outside the tree.
    let out = run(
        &state,
        &[
            "sessions",
            "history",
            "agent:main:peer",
            "--as",
            ROOT,
            "--visibility",
            "all",
            "--a2a",
            "on",
            "--sandboxed",
        ],
    );
    assert_eq!(out.code, Some(5), "{}", out.stderr);
    assert!(out.stderr.contains("sandboxed"), "{}", out.stderr);

    // Unknown session: 4, for every operation.
    for op in [
        vec!["history", "nope"],
        vec!["status", "nope"],
        vec!["send", "nope", "x"],
    ] {
        let mut args = vec!["sessions"];
        args.extend_from_slice(&op);
        args.extend_from_slice(&["--as", ROOT, "--visibility", "all"]);
        let out = run(&state, &args);
        assert_eq!(out.code, Some(4), "{args:?}: {}", out.stderr);
    }

    // send to a visible session: no daemon here, so exit 7 and the live adapter is untouched.
    let out = run(
        &state,
        &["sessions", "send", "acp:live", "hello", "--as", ROOT],
    );
    assert_eq!(out.code, Some(7), "{}", out.stderr);
    assert!(out.stderr.contains("leash serve"), "{}", out.stderr);
    assert!(adapter.alive() && wrapper.alive());

    signal(wrapper, libc::SIGTERM);
    assert!(
        wait_for(|| !adapter.alive()),
        "the adapter outlived its wrapper"
    );
}
