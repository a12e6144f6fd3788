//! The session visibility matrix. visibility {self, tree, agent, all} × a2a {off, on, on for one
//! agent pair} × row kind × {sandboxed, not} × operation {list, history, send, status}, with every
//! expected answer written out (not computed) in `fixtures/visibility/matrix.json`, the table the
//! Node client's `canSeeSessionRow` is checked against too (clients/node/test/visibility.test.mjs):
//! a case on which the two disagree fails one of the suites. Each operation runs the code the
//! command line runs ([`Controller`] over a real SQLite store), so the matrix checks that all four
//! ask the same question and get the same answer; the table's single `cases` (directional and
//! wildcard a2a rules, unknown agents, agents from keys, tree edges, cycles) go through the pure
//! check.

use leash::controller::session_input::SessionsError;
use leash::controller::sessions::View;
use leash::controller::Controller;
use leash::proc::FixtureTable;
use leash::state::StateRoot;
use leash_core::visibility::{
    can_see_session_row, grant, A2aPolicy, Grant, Scope, SessionIndex, SessionMeta, Visibility,
};
use serde_json::Value;

/// The shared table (see the file's `about`).
fn table() -> Value {
    serde_json::from_str(include_str!("../fixtures/visibility/matrix.json"))
        .expect("fixtures/visibility/matrix.json is JSON")
}

/// The requester of the matrix: a top-level session of agent `main`.
const REQ: &str = "agent:main:req";

fn opt(v: &Value, k: &str) -> Option<String> {
    v.get(k).and_then(Value::as_str).map(str::to_owned)
}

fn meta(v: &Value) -> SessionMeta {
    SessionMeta {
        session_key: opt(v, "sessionKey").expect("a row has a sessionKey"),
        agent_id: opt(v, "agentId"),
        owner_session_key: opt(v, "ownerSessionKey"),
        spawned_by: opt(v, "spawnedBy"),
        parent_session_key: opt(v, "parentSessionKey"),
    }
}

/// The matrix's row kinds, in the order of each `expect`: (kind, row).
fn rows() -> Vec<(String, SessionMeta)> {
    let t = table();
    assert_eq!(t["requester"], REQ);
    t["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (opt(r, "kind").unwrap(), meta(r)))
        .collect()
}

/// (visibility, a2a name, sandboxed, marks: `Y` visible, `.` not), one mark per row kind.
fn expected() -> Vec<(String, String, bool, String)> {
    table()["matrix"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                opt(m, "visibility").unwrap(),
                opt(m, "a2a").unwrap(),
                m["sandboxed"].as_bool().unwrap(),
                opt(m, "expect").unwrap(),
            )
        })
        .collect()
}

fn a2a(name: &str) -> A2aPolicy {
    serde_json::from_value(table()["a2a"][name].clone())
        .unwrap_or_else(|e| panic!("a2a policy {name}: {e}"))
}

#[derive(Debug, Clone, Copy)]
enum Op {
    List,
    History,
    Send,
    Status,
}

const OPS: [Op; 4] = [Op::List, Op::History, Op::Send, Op::Status];

struct Fixture {
    _dir: TempDir,
    root: StateRoot,
}

struct TempDir(std::path::PathBuf);
impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A state root whose sessions table holds the matrix's rows (written as SQL rows, NULLs and all, the way
/// old rows look), each with one lifecycle event.
fn fixture() -> Fixture {
    let dir = std::env::temp_dir().join(format!(
        "leash-test-matrix-{}-{}",
        std::process::id(),
        uuid::Uuid::new_v4().simple()
    ));
    let root = StateRoot::open(&dir).unwrap();
    let table = FixtureTable::default();
    let s = Controller::open(root.clone(), &table).unwrap();
    let mut store = s.store();
    let gateway = store.gateway_instance_id().to_string();
    // Written with SQL of its own, the way an older leash left the rows.
    let raw = rusqlite::Connection::open(root.db_path()).unwrap();
    for (i, (_, m)) in rows().iter().enumerate() {
        raw.execute(
            "INSERT INTO sessions (session_key, agent_id, owner_session_key, spawned_by, \
                 parent_session_key, gateway_instance_id, created_at) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            rusqlite::params![
                m.session_key,
                m.agent_id,
                m.owner_session_key,
                m.spawned_by,
                m.parent_session_key,
                gateway,
                i as i64
            ],
        )
        .unwrap();
        store
            .record_event(
                &m.session_key,
                None,
                "spawned",
                Some(serde_json::json!({ "row": i })),
            )
            .unwrap();
    }
    Fixture {
        _dir: TempDir(dir),
        root,
    }
}

/// Runs `op` on `key` as the requester and says whether the session was visible, checking that
/// a visible session gets the operation's real answer and a hidden one gets `NotVisible`.
fn visible_through(s: &Controller<'_>, op: Op, view: &View, key: &str) -> bool {
    match op {
        Op::List => s
            .list(view)
            .unwrap()
            .sessions
            .iter()
            .any(|l| l.session.session_key == key),
        Op::History => match s.history(view, key) {
            Ok(h) => {
                assert_eq!(h.session_key, key);
                assert!(!h.events.is_empty(), "history of {key} is empty");
                assert!(h.events.iter().all(|e| e.session_key == key));
                true
            }
            Err(SessionsError::NotVisible { .. }) => false,
            Err(e) => panic!("history {key}: unexpected {e}"),
        },
        Op::Send => match s.send(view, key, "hello") {
            Ok(sent) => panic!("send {key}: no daemon runs for this root, yet it sent: {sent:?}"),
            Err(SessionsError::DaemonNeeded { key: k, .. }) => {
                assert_eq!(k, key);
                true
            }
            Err(SessionsError::NotVisible { .. }) => false,
            Err(e) => panic!("send {key}: unexpected {e}"),
        },
        Op::Status => match s.status(view, key) {
            Ok(st) => {
                assert_eq!(st.session.session_key, key);
                assert!(st.lease.is_none(), "the fixture rows have no lease");
                true
            }
            Err(SessionsError::NotVisible { .. }) => false,
            Err(e) => panic!("status {key}: unexpected {e}"),
        },
    }
}

#[test]
fn matrix() {
    let f = fixture();
    let table = FixtureTable::default();
    let s = Controller::open(f.root.clone(), &table).unwrap();
    let mut cells = 0;
    let mut failures = Vec::new();
    let rows = rows();
    let index = SessionIndex::new(rows.iter().map(|(_, m)| m.clone()));
    let requester = index.requester(REQ);
    let expected = expected();
    assert_eq!(
        expected.len(),
        24,
        "4 visibilities x 3 policies x sandboxed or not"
    );
    for (vis, a2a_name, sandboxed, marks) in &expected {
        let (vis, a2a_name, sandboxed) = (vis.as_str(), a2a_name.as_str(), *sandboxed);
        let marks: Vec<&str> = marks.split_whitespace().collect();
        assert_eq!(
            marks.len(),
            rows.len(),
            "row of the table: {vis} {a2a_name}"
        );
        let view = View::new(
            REQ,
            Scope::new(vis.parse().unwrap(), a2a(a2a_name), sandboxed),
        );
        for ((kind, m), mark) in rows.iter().zip(&marks) {
            let key = m.session_key.as_str();
            let want = match *mark {
                "Y" => true,
                "." => false,
                other => panic!("bad mark {other}"),
            };
            // The pure check the Node client ports, over the same rows.
            let pure = can_see_session_row(
                &requester,
                m,
                vis.parse().unwrap(),
                &a2a(a2a_name),
                sandboxed,
            );
            if pure != want {
                failures.push(format!(
                    "visibility {vis}, a2a {a2a_name}, sandboxed {sandboxed}, {kind} ({key}), \
                     can_see_session_row: expected {want}, got {pure}"
                ));
            }
            for op in OPS {
                cells += 1;
                let got = visible_through(&s, op, &view, key);
                if got != want {
                    failures.push(format!(
                        "visibility {vis}, a2a {a2a_name}, sandboxed {sandboxed}, {kind} ({key}), \
                         {op:?}: expected {want}, got {got}"
                    ));
                }
            }
        }
    }
    assert_eq!(cells, 24 * 8 * 4);
    assert!(
        failures.is_empty(),
        "{} of {cells} cells wrong:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn all_grants_the_owned_child_as_owned_not_through_a2a() {
    let f = fixture();
    let table = FixtureTable::default();
    let s = Controller::open(f.root.clone(), &table).unwrap();
    let view = View::new(
        REQ,
        Scope::new(Visibility::All, A2aPolicy::all_pairs(), false),
    );
    let listing = s.list(&view).unwrap();
    let grant_of = |key: &str| {
        listing
            .sessions
            .iter()
            .find(|l| l.session.session_key == key)
            .map(|l| l.visible_as)
    };
    assert_eq!(grant_of(REQ), Some(Grant::Requester));
    assert_eq!(grant_of("acp:child"), Some(Grant::Owned));
    assert_eq!(grant_of("acp:grandchild"), Some(Grant::Owned));
    assert_eq!(grant_of("agent:main:peer"), Some(Grant::SameAgent));
    assert_eq!(grant_of("agent:codex:c1"), Some(Grant::A2a));
    assert_eq!(
        s.history(&view, "acp:child").unwrap().visible_as,
        Grant::Owned
    );
}

#[test]
fn unknown_sessions_are_not_found_whatever_the_visibility() {
    let f = fixture();
    let table = FixtureTable::default();
    let s = Controller::open(f.root.clone(), &table).unwrap();
    for v in Visibility::ALL {
        let view = View::new(REQ, Scope::new(v, A2aPolicy::all_pairs(), false));
        assert!(matches!(
            s.history(&view, "nope"),
            Err(SessionsError::NotFound(_))
        ));
        assert!(matches!(
            s.status(&view, "nope"),
            Err(SessionsError::NotFound(_))
        ));
        assert!(matches!(
            s.send(&view, "nope", "x"),
            Err(SessionsError::NotFound(_))
        ));
    }
}

#[test]
fn a_requester_without_a_row_sees_its_agent_and_its_tree() {
    let f = fixture();
    let table = FixtureTable::default();
    let s = Controller::open(f.root.clone(), &table).unwrap();
    // The gateway's main chat session: leash never spawned it, so it has no row.
    let view = View::new(
        "agent:main:main",
        Scope::new(Visibility::Agent, A2aPolicy::Off, false),
    );
    let listing = s.list(&view).unwrap();
    assert_eq!(listing.requester_agent.as_deref(), Some("main"));
    let mut keys: Vec<&str> = listing
        .sessions
        .iter()
        .map(|l| l.session.session_key.as_str())
        .collect();
    keys.sort();
    assert_eq!(keys, ["agent:main:old", "agent:main:peer", REQ]);
    // As the child (a row, agent claude): its own tree is the grandchild.
    let view = View::new(
        "acp:child",
        Scope::new(Visibility::Tree, A2aPolicy::Off, false),
    );
    let keys: Vec<String> = s
        .list(&view)
        .unwrap()
        .sessions
        .into_iter()
        .map(|l| l.session.session_key)
        .collect();
    assert_eq!(keys, ["acp:child", "acp:grandchild"]);
    assert!(matches!(
        s.status(&view, REQ),
        Err(SessionsError::NotVisible { .. })
    ));
}

#[test]
fn send_refuses_multi_line_input_after_the_check() {
    let f = fixture();
    let table = FixtureTable::default();
    let s = Controller::open(f.root.clone(), &table).unwrap();
    let view = View::new(REQ, Scope::new(Visibility::Tree, A2aPolicy::Off, false));
    assert!(matches!(
        s.send(&view, "acp:child", "a\nb"),
        Err(SessionsError::MultiLine)
    ));
    // Not visible wins over bad input: the requester learns nothing about the session.
    assert!(matches!(
        s.send(&view, "agent:codex:c1", "a\nb"),
        Err(SessionsError::NotVisible { .. })
    ));
}

#[test]
fn the_shared_cases_hold_for_the_pure_check() {
    let t = table();
    let cases = t["cases"].as_array().unwrap();
    assert!(cases.len() >= 20, "the table lost its cases");
    let mut failures = Vec::new();
    for c in cases {
        let name = c["name"].as_str().unwrap();
        let rows: Vec<SessionMeta> = c["rows"].as_array().unwrap().iter().map(meta).collect();
        let index = SessionIndex::new(rows.clone());
        let req_key = c["requester"].as_str().unwrap();
        let requester = index.requester(req_key);
        let target = c["row"].as_str().unwrap();
        let row = rows
            .iter()
            .find(|r| r.session_key == target)
            .unwrap_or_else(|| panic!("{name}: row {target} is not among the case's rows"));
        let vis: Visibility = c["visibility"].as_str().unwrap().parse().unwrap();
        let policy: A2aPolicy = serde_json::from_value(c["a2a"].clone()).unwrap();
        let sandboxed = c["sandboxed"].as_bool().unwrap();
        let got = grant(&requester, row, vis, &policy, sandboxed);
        let want_visible = c["visible"].as_bool().unwrap();
        let want_grant = c["grant"].as_str();
        if got.is_some() != want_visible || got.map(Grant::as_str) != want_grant {
            failures.push(format!(
                "{name}: expected {want_grant:?}, got {:?}",
                got.map(Grant::as_str)
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
