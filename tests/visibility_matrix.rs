//! The session visibility matrix. visibility {self, tree, agent, all} × a2a {off, on, on for one
//! agent pair} × row kind × {sandboxed, not} × operation {list, history, send, status}, with every
//! expected answer written out below (not computed). Each operation runs the code the command line
//! runs ([`Controller`] over a real SQLite store), so the matrix checks that all four ask the same
//! question and get the same answer.

use leash::lifecycle::Controller;
use leash::proc::FixtureTable;
use leash::sessions::{SessionsError, View};
use leash::state::StateRoot;
use leash::visibility::{A2aPolicy, Grant, Scope, Visibility};

/// The requester: a top-level session of agent `main`.
const REQ: &str = "agent:main:req";

/// The row kinds, in the column order of [`EXPECTED`]: (column, key, agent, owner, spawned by,
/// parent).
#[allow(clippy::type_complexity)]
const ROWS: [(
    &str,
    &str,
    Option<&str>,
    Option<&str>,
    Option<&str>,
    Option<&str>,
); 8] = [
    // the requester itself
    ("requester", REQ, Some("main"), None, None, None),
    // a session of the same agent that belongs to someone else
    (
        "same-agent",
        "agent:main:peer",
        Some("main"),
        Some("agent:main:someone"),
        None,
        None,
    ),
    // a session of another agent, related to nobody
    (
        "cross-agent",
        "agent:codex:c1",
        Some("codex"),
        None,
        None,
        None,
    ),
    // an ACP session of another agent that the requester spawned and owns
    (
        "owned-child",
        "acp:child",
        Some("claude"),
        Some(REQ),
        Some(REQ),
        Some(REQ),
    ),
    // spawned by that child, with no field naming the requester: visible only transitively
    (
        "grandchild",
        "acp:grandchild",
        Some("gemini"),
        Some("acp:child"),
        Some("acp:child"),
        None,
    ),
    // another agent's session spawned by the unrelated codex session
    (
        "unrelated",
        "acp:stranger",
        Some("claude"),
        Some("agent:codex:c1"),
        Some("agent:codex:c1"),
        None,
    ),
    // an old row: no ownership fields, no agent, opaque key
    ("old-opaque", "lease:0190-old", None, None, None, None),
    // an old row whose gateway-style key names agent main
    ("old-main-key", "agent:main:old", None, None, None, None),
];

/// (visibility, a2a, sandboxed, expected per row kind in [`ROWS`] order: `Y` visible, `.` not).
/// a2a `main:codex` is on with the single rule "requesters of main may see codex".
const EXPECTED: [(&str, &str, bool, &str); 24] = [
    //                           req same cross child grand unrel old old-main
    ("self", "off", false, /*  */ "Y . . . . . . ."),
    ("self", "on", false, /*   */ "Y . . . . . . ."),
    ("self", "main:codex", false, "Y . . . . . . ."),
    ("tree", "off", false, /*  */ "Y . . Y Y . . ."),
    ("tree", "on", false, /*   */ "Y . . Y Y . . ."),
    ("tree", "main:codex", false, "Y . . Y Y . . ."),
    ("agent", "off", false, /* */ "Y Y . Y Y . . Y"),
    ("agent", "on", false, /*  */ "Y Y . Y Y . . Y"),
    ("agent", "main:codex", false, "Y Y . Y Y . . Y"),
    ("all", "off", false, /*   */ "Y Y . Y Y . . Y"),
    ("all", "on", false, /*    */ "Y Y Y Y Y Y Y Y"),
    ("all", "main:codex", false, "Y Y Y Y Y . . Y"),
    // sandboxed: clamped to tree (self stays self)
    ("self", "off", true, /*   */ "Y . . . . . . ."),
    ("self", "on", true, /*    */ "Y . . . . . . ."),
    ("self", "main:codex", true, "Y . . . . . . ."),
    ("tree", "off", true, /*   */ "Y . . Y Y . . ."),
    ("tree", "on", true, /*    */ "Y . . Y Y . . ."),
    ("tree", "main:codex", true, "Y . . Y Y . . ."),
    ("agent", "off", true, /*  */ "Y . . Y Y . . ."),
    ("agent", "on", true, /*   */ "Y . . Y Y . . ."),
    ("agent", "main:codex", true, "Y . . Y Y . . ."),
    ("all", "off", true, /*    */ "Y . . Y Y . . ."),
    ("all", "on", true, /*     */ "Y . . Y Y . . ."),
    ("all", "main:codex", true, "Y . . Y Y . . ."),
];

#[derive(Debug, Clone, Copy)]
enum Op {
    List,
    History,
    Send,
    Status,
}

const OPS: [Op; 4] = [Op::List, Op::History, Op::Send, Op::Status];

fn a2a(name: &str) -> A2aPolicy {
    match name {
        "off" => A2aPolicy::Off,
        "on" => A2aPolicy::all_pairs(),
        rule => A2aPolicy::On {
            rules: vec![rule.parse().unwrap()],
        },
    }
}

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

/// A state root whose sessions table holds [`ROWS`] (written as SQL rows, NULLs and all, the way
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
    for (i, (_, key, agent, owner, spawned_by, parent)) in ROWS.iter().enumerate() {
        raw.execute(
            "INSERT INTO sessions (session_key, agent_id, owner_session_key, spawned_by, \
                 parent_session_key, gateway_instance_id, created_at) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            rusqlite::params![key, agent, owner, spawned_by, parent, gateway, i as i64],
        )
        .unwrap();
        store
            .record_event(key, None, "spawned", Some(serde_json::json!({ "row": i })))
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
            Ok(sent) => panic!("send {key}: no daemon runs for this root, yet it sent: {sent}"),
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
    for (vis, a2a_name, sandboxed, expected) in EXPECTED {
        let marks: Vec<&str> = expected.split_whitespace().collect();
        assert_eq!(
            marks.len(),
            ROWS.len(),
            "row of the table: {vis} {a2a_name}"
        );
        let view = View::new(
            REQ,
            Scope::new(vis.parse().unwrap(), a2a(a2a_name), sandboxed),
        );
        for ((kind, key, ..), mark) in ROWS.iter().zip(&marks) {
            let want = match *mark {
                "Y" => true,
                "." => false,
                other => panic!("bad mark {other}"),
            };
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
