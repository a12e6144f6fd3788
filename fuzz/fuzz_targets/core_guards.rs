//! Fuzz target: the pure core alone (`leash_core`, no leash library, no database, no process
//! table): the visibility check over arbitrary session rows, and the signal guard over arbitrary
//! pids. Whatever the rows (cycles, dangling and self-referencing owners, unknown agents, empty
//! fields), visibility must only widen from `self` to `tree` to `agent` to `all`, the requester's
//! own row is always visible, a sandboxed requester never sees more than `tree`, and nothing
//! loops. Whatever the pids, the guard never lets through pid ≤ 1, the caller, the caller's
//! group leader, another uid, or a group ≤ 1 or the caller's own.
#![no_main]

use arbitrary::Arbitrary;
use leash_core::guard::{check_group, check_process, Caller};
use leash_core::model::SessionRow;
use leash_core::visibility::{visible_rows, A2aPolicy, Scope, Visibility};
use libfuzzer_sys::fuzz_target;
use std::collections::BTreeSet;

#[derive(Debug, Arbitrary)]
struct Row {
    key: u8,
    agent: Option<u8>,
    owner: Option<u8>,
    spawned_by: Option<u8>,
    parent: Option<u8>,
}

#[derive(Debug, Arbitrary)]
struct Input {
    rows: Vec<Row>,
    requester: u8,
    a2a: bool,
    target_pid: i32,
    target_uid: u32,
    pgid: i32,
    caller: (i32, i32, u32),
}

/// Few distinct keys and agents, so that edges, cycles and shared agents are the rule. Key 7 is
/// gateway-style, naming its agent in the key.
fn key(k: u8) -> String {
    match k % 8 {
        7 => "agent:a1:main".to_string(),
        n => format!("s{n}"),
    }
}

fn agent(a: u8) -> String {
    match a % 4 {
        3 => String::new(), // recorded as empty: unknown
        n => format!("a{n}"),
    }
}

fn seen(rows: &[SessionRow], requester: &str, scope: &Scope) -> BTreeSet<String> {
    visible_rows(rows, requester, scope)
        .into_iter()
        .map(|(r, _)| r.session_key.clone())
        .collect()
}

fuzz_target!(|input: Input| {
    let mut rows: Vec<SessionRow> = Vec::new();
    for r in input.rows.iter().take(32) {
        let k = key(r.key);
        if rows.iter().any(|x| x.session_key == k) {
            continue; // session_key is the table's primary key
        }
        rows.push(SessionRow {
            session_key: k,
            agent_id: r.agent.map(agent),
            owner_session_key: r.owner.map(key),
            spawned_by: r.spawned_by.map(key),
            parent_session_key: r.parent.map(key),
            ..Default::default()
        });
    }
    let requester = key(input.requester);
    let a2a = if input.a2a {
        A2aPolicy::all_pairs()
    } else {
        A2aPolicy::Off
    };
    let mut previous: Option<BTreeSet<String>> = None;
    for v in Visibility::ALL {
        let now = seen(&rows, &requester, &Scope::new(v, a2a.clone(), false));
        if rows.iter().any(|r| r.session_key == requester) {
            assert!(now.contains(&requester), "{v}: own row hidden");
        }
        if let Some(p) = &previous {
            assert!(p.is_subset(&now), "{v} sees less than the narrower visibility");
        }
        let sandboxed = seen(&rows, &requester, &Scope::new(v, a2a.clone(), true));
        let tree = seen(&rows, &requester, &Scope::new(Visibility::Tree, a2a.clone(), false));
        assert!(sandboxed.is_subset(&tree), "{v}: a sandboxed requester sees beyond its tree");
        previous = Some(now);
    }

    let caller = Caller {
        pid: input.caller.0,
        pgid: input.caller.1,
        uid: input.caller.2,
    };
    if check_process(input.target_pid, input.target_uid, &caller).is_ok() {
        assert!(input.target_pid > 1);
        assert_ne!(input.target_pid, caller.pid);
        assert_ne!(input.target_pid, caller.pgid);
        assert_eq!(input.target_uid, caller.uid);
    }
    if check_group(input.pgid, &caller).is_ok() {
        assert!(input.pgid > 1);
        assert_ne!(input.pgid, caller.pgid);
    }
});
