//! Properties of the visibility check over random session forests (and, to be safe, arbitrary
//! graphs with cycles and dangling keys): `self ⊆ tree ⊆ agent ⊆ all` for every requester and a2a
//! policy, a sandboxed requester never sees more than `tree`, and `tree` is exactly the transitive
//! closure of the ownership fields (computed here by a different algorithm: an upward fixed point
//! instead of the index's downward walk). For random forests, requesters and scopes, the keys
//! `sessions_list` returns through `leash mcp` equal the keys `leash sessions list` returns (both
//! real processes over the same state root).

mod common;
mod mcp_support;

use leash::controller::sessions::View;
use leash::controller::Controller;
use leash::proc::FixtureTable;
use leash::state::StateRoot;
use leash_core::model::SessionRow;
use leash_core::visibility::{visible_rows, A2aPolicy, A2aRule, Scope, Visibility};
use mcp_support::{initialize, mcp_once, tool_call};
use proptest::prelude::*;
use std::collections::BTreeSet;

const AGENTS: [Option<&str>; 4] = [None, Some("a1"), Some("a2"), Some("a3")];
const PATTERNS: [&str; 6] = ["a1", "a2", "a3", "*", "a*", "*3"];

#[derive(Debug, Clone)]
struct GenRow {
    agent: usize,
    /// Key names an agent (`agent:aK:sI`) instead of an opaque `sI`.
    prefixed_key: Option<usize>,
    /// Each ownership field: None, or an index into the rows (`n` means a key with no row).
    owner: Option<usize>,
    spawned_by: Option<usize>,
    parent: Option<usize>,
}

fn gen_rows() -> impl Strategy<Value = Vec<SessionRow>> {
    (1usize..10, any::<bool>()).prop_flat_map(|(n, forest)| {
        let edge = proptest::option::weighted(0.5, 0..=n);
        let row = (
            0..4usize,
            proptest::option::of(1..4usize),
            edge.clone(),
            edge.clone(),
            edge,
        )
            .prop_map(|(agent, prefixed_key, owner, spawned_by, parent)| GenRow {
                agent,
                prefixed_key,
                owner,
                spawned_by,
                parent,
            });
        proptest::collection::vec(row, n).prop_map(move |gen| build(&gen, forest))
    })
}

fn build(gen: &[GenRow], forest: bool) -> Vec<SessionRow> {
    let n = gen.len();
    let key = |i: usize| -> String {
        match gen.get(i) {
            None => "ghost".to_string(),
            Some(g) => match g.prefixed_key {
                Some(k) => format!("agent:a{k}:s{i}"),
                None => format!("s{i}"),
            },
        }
    };
    gen.iter()
        .enumerate()
        .map(|(i, g)| {
            // In a forest every edge points at an earlier row (or at a key without a row);
            // otherwise edges go anywhere, cycles included.
            let edge = |e: Option<usize>| -> Option<String> {
                let j = e?;
                if forest && j < n && j >= i {
                    return None;
                }
                Some(key(j))
            };
            SessionRow {
                session_key: key(i),
                agent_id: AGENTS[g.agent].map(str::to_string),
                owner_session_key: edge(g.owner),
                spawned_by: edge(g.spawned_by),
                parent_session_key: edge(g.parent),
                backend: "acpx".into(),
                gateway_instance_id: "g".into(),
                created_at: i as i64,
                lease_id: None,
            }
        })
        .collect()
}

fn gen_a2a() -> impl Strategy<Value = A2aPolicy> {
    let rule = (0..PATTERNS.len(), 0..PATTERNS.len()).prop_map(|(f, t)| {
        format!("{}:{}", PATTERNS[f], PATTERNS[t])
            .parse::<A2aRule>()
            .unwrap()
    });
    prop_oneof![
        Just(A2aPolicy::Off),
        Just(A2aPolicy::all_pairs()),
        proptest::collection::vec(rule, 1..4).prop_map(|rules| A2aPolicy::On { rules }),
    ]
}

fn requesters(rows: &[SessionRow]) -> Vec<String> {
    let mut r: Vec<String> = rows.iter().map(|r| r.session_key.clone()).collect();
    r.push("ghost".into());
    r.push("agent:a1:nobody".into());
    r
}

fn keys(rows: &[SessionRow], requester: &str, scope: &Scope) -> BTreeSet<String> {
    visible_rows(rows, requester, scope)
        .into_iter()
        .map(|(r, _)| r.session_key.clone())
        .collect()
}

/// The requester and every row from which the ownership fields lead to it: grown upward until
/// nothing changes.
fn closure(rows: &[SessionRow], requester: &str) -> BTreeSet<String> {
    let mut set: BTreeSet<String> = BTreeSet::from([requester.to_string()]);
    loop {
        let before = set.len();
        for r in rows {
            let edges = [&r.owner_session_key, &r.spawned_by, &r.parent_session_key];
            if edges
                .iter()
                .any(|e| e.as_deref().is_some_and(|k| set.contains(k)))
            {
                set.insert(r.session_key.clone());
            }
        }
        if set.len() == before {
            break;
        }
    }
    let present: BTreeSet<String> = rows.iter().map(|r| r.session_key.clone()).collect();
    set.intersection(&present).cloned().collect()
}

/// A state root at `dir` whose sessions table holds `rows`.
fn stage<'t>(
    dir: &std::path::Path,
    rows: &[SessionRow],
    table: &'t FixtureTable,
) -> Controller<'t> {
    let root = StateRoot::open(dir).unwrap();
    let raw = rusqlite::Connection::open(root.db_path()).unwrap();
    let s = Controller::open(root, table).unwrap();
    for r in rows {
        raw.execute(
            "INSERT INTO sessions (session_key, agent_id, owner_session_key, spawned_by, \
                 parent_session_key, gateway_instance_id, created_at) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            rusqlite::params![
                r.session_key,
                r.agent_id,
                r.owner_session_key,
                r.spawned_by,
                r.parent_session_key,
                r.gateway_instance_id,
                r.created_at
            ],
        )
        .unwrap();
    }
    s
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn visibilities_nest_and_sandbox_clamps_to_tree(rows in gen_rows(), a2a in gen_a2a()) {
        for req in requesters(&rows) {
            let scope = |v, sandboxed| Scope::new(v, a2a.clone(), sandboxed);
            let seen: Vec<BTreeSet<String>> = Visibility::ALL
                .iter()
                .map(|&v| keys(&rows, &req, &scope(v, false)))
                .collect();
            let (own, tree, agent, all) = (&seen[0], &seen[1], &seen[2], &seen[3]);
            prop_assert!(own.is_subset(tree), "self ⊄ tree for {req}: {own:?} {tree:?}");
            prop_assert!(tree.is_subset(agent), "tree ⊄ agent for {req}: {tree:?} {agent:?}");
            prop_assert!(tree.is_subset(all), "tree ⊄ all for {req}: {tree:?} {all:?}");
            prop_assert!(agent.is_subset(all), "agent ⊄ all for {req}: {agent:?} {all:?}");
            prop_assert_eq!(tree, &closure(&rows, &req), "tree of {} is not the closure", req);
            for v in Visibility::ALL {
                let boxed = keys(&rows, &req, &scope(v, true));
                prop_assert!(boxed.is_subset(tree), "sandboxed {v} shows more than tree for {req}");
                let clamped = keys(&rows, &req, &scope(v.min(Visibility::Tree), false));
                prop_assert_eq!(&boxed, &clamped);
            }
        }
    }
}

proptest! {
    // Each case builds a real state root, so fewer of them.
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn list_through_the_store_keeps_tree_within_all(rows in gen_rows(), a2a in gen_a2a()) {
        let dir = common::TempDir::new("props");
        let table = FixtureTable::default();
        let s = stage(dir.path(), &rows, &table);
        for req in requesters(&rows) {
            let listed = |s: &Controller<'_>, v| -> BTreeSet<String> {
                s.list(&View::new(&req, Scope::new(v, a2a.clone(), false)))
                    .unwrap()
                    .sessions
                    .into_iter()
                    .map(|l| l.session.session_key)
                    .collect()
            };
            let tree = listed(&s, Visibility::Tree);
            let all = listed(&s, Visibility::All);
            prop_assert!(tree.is_subset(&all), "tree ⊄ all for {req}: {tree:?} {all:?}");
            prop_assert_eq!(&tree, &closure(&rows, &req));
        }
    }
}

/// The flags of `leash sessions list` and `leash mcp` for a scope.
fn scope_args(v: Visibility, a2a: &A2aPolicy, sandboxed: bool) -> Vec<String> {
    let mut args = vec!["--visibility".to_string(), v.as_str().to_string()];
    match a2a {
        A2aPolicy::Off => args.extend(["--a2a".into(), "off".into()]),
        A2aPolicy::On { rules } if rules.is_empty() => args.extend(["--a2a".into(), "on".into()]),
        A2aPolicy::On { rules } => {
            for r in rules {
                args.extend(["--a2a-allow".into(), r.to_string()]);
            }
        }
    }
    if sandboxed {
        args.push("--sandboxed".into());
    }
    args
}

proptest! {
    // Two real processes per requester: few cases.
    #![proptest_config(ProptestConfig::with_cases(12))]

    #[test]
    fn mcp_sessions_list_equals_leash_sessions_list(
        rows in gen_rows(),
        a2a in gen_a2a(),
        v in 0..4usize,
        sandboxed in any::<bool>(),
    ) {
        let dir = common::TempDir::new("props-mcp");
        let table = FixtureTable::default();
        drop(stage(dir.path(), &rows, &table));
        let scope = scope_args(Visibility::ALL[v], &a2a, sandboxed);
        for req in requesters(&rows) {
            let mut args: Vec<&str> = vec!["sessions", "list", "--json", "--as", &req];
            args.extend(scope.iter().map(String::as_str));
            let cli = common::run_json(dir.path(), &args);
            let from_cli: BTreeSet<String> = cli["sessions"]
                .as_array()
                .unwrap()
                .iter()
                .map(|s| s["sessionKey"].as_str().unwrap().to_string())
                .collect();

            let mut args: Vec<&str> = vec!["--as", &req];
            args.extend(scope.iter().map(String::as_str));
            let (out, code) = mcp_once(
                dir.path(),
                &args,
                &[initialize(1, "2025-11-25"), tool_call(2, "sessions_list", serde_json::json!({}))],
            );
            prop_assert_eq!(code, Some(0));
            prop_assert_eq!(out.len(), 2);
            let listed = &out[1]["result"]["structuredContent"]["sessions"];
            let from_mcp: BTreeSet<String> = listed
                .as_array()
                .unwrap_or_else(|| panic!("sessions_list failed: {}", out[1]))
                .iter()
                .map(|s| s["sessionKey"].as_str().unwrap().to_string())
                .collect();
            prop_assert_eq!(&from_mcp, &from_cli, "requester {} scope {:?}", req, scope);
            // The whole listing is the same document.
            prop_assert_eq!(&out[1]["result"]["structuredContent"], &cli);
        }
    }
}
