//! Session visibility: which session rows a requester may see, decided by one pure check over row
//! metadata.
//!
//! The incumbent rebuilt ownership at check time with a second, hidden lookup
//! (`sessions.list({ spawnedBy })`), and got it wrong in both directions: under `tree` a
//! requester's own cross-agent ACP children were rejected while `all` showed them. Here a row
//! belongs to a requester because *the rows say so*: [`SessionIndex`] is built from the rows the
//! caller already loaded, [`SessionIndex::requester`] derives the requester's agent and the keys
//! of its session tree from them, and [`can_see_session_row`] only compares fields. Nothing in
//! this module reads the store, so every operation (list, history, send, status) asks the same
//! question and gets the same answer.
//!
//! # Rules (the seed's, made exact)
//!
//! - The requester's own session is visible under every visibility.
//! - `self`: nothing else.
//! - `tree`: rows the requester owns or that were spawned from it, transitively. A row points at
//!   the sessions it belongs to through `ownerSessionKey`, `spawnedBy` and `parentSessionKey`; the
//!   requester's tree is every row from which following those fields reaches the requester.
//! - `agent`: rows of the requester's agent, plus the requester's tree (the "explicit owner
//!   relation" of the seed).
//! - `all`: rows of the requester's agent, cross-agent rows the a2a policy allows, plus the
//!   requester's tree whatever the a2a policy says.
//! - A sandboxed requester is clamped to `tree` (`self` stays `self`).
//!
//! So `self ⊆ tree ⊆ agent ⊆ all` for every requester, row set and a2a policy: `all` is never
//! weaker than `tree`, and an owned child is visible wherever the configured visibility includes
//! the requester's tree.
//!
//! # Decisions where the seed is silent
//!
//! - **All three fields are ownership edges.** `parentSessionKey` names the session a row was
//!   spawned from as much as `spawnedBy` does; a gateway that fills only one of them still gets
//!   the tree right.
//! - **Old rows** (written before ownership metadata, or by `leash exec` without the flags) keep
//!   working without cleanup, fail-safe: a row with no ownership fields belongs to nobody's tree
//!   but its own, so it is never shown through a relation it does not state. Its agent is its
//!   `agentId`, else the agent named by a gateway-style key `agent:<id>:…`, else unknown.
//! - **An unknown agent matches no agent**, not even another unknown one: such a row is never a
//!   "same agent" row. Under `all` it is shown only by an a2a policy that allows every pair (`--a2a
//!   on` without rules, or a `*` pattern on its side); a named pattern never matches it.
//! - **The requester's own row may be missing** (a gateway's main chat session is not a session
//!   leash spawned). Its agent then comes from its key (`agent:<id>:…`), else it is unknown; its
//!   tree is still found, because the children's rows name it.
//! - **Cycles and dangling keys** (an owner row that was deleted) are harmless: the tree walk
//!   visits each key once, and a row is in the tree only if its edges reach the requester.
//! - **a2a rules are directional** (`FROM:TO` lets requesters of agent FROM see rows of agent TO);
//!   write both directions for a symmetric rule. Patterns are agent ids with `*` wildcards,
//!   case-sensitive like agent ids everywhere else in leash. Rows of the requester's own agent
//!   never need a rule.

use crate::kind::{HasKind, Kind};
use crate::model::SessionRow;
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, HashSet};
use std::fmt;
use std::str::FromStr;

/// How far a requester may see. Ordered from narrowest to widest: each visibility shows a superset
/// of the one before it, which is what makes clamping a sandboxed requester a `min`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Visibility {
    #[serde(rename = "self")]
    SelfOnly,
    #[serde(rename = "tree")]
    Tree,
    #[serde(rename = "agent")]
    Agent,
    #[serde(rename = "all")]
    All,
}

impl Visibility {
    pub const ALL: [Visibility; 4] = [
        Visibility::SelfOnly,
        Visibility::Tree,
        Visibility::Agent,
        Visibility::All,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Visibility::SelfOnly => "self",
            Visibility::Tree => "tree",
            Visibility::Agent => "agent",
            Visibility::All => "all",
        }
    }

    /// The visibility that applies: a sandboxed requester never sees beyond its own tree.
    pub fn effective(self, sandboxed: bool) -> Visibility {
        if sandboxed {
            self.min(Visibility::Tree)
        } else {
            self
        }
    }
}

impl fmt::Display for Visibility {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PolicyError {
    Visibility(String),
    Rule(String),
}

impl fmt::Display for PolicyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PolicyError::Visibility(v) => write!(
                f,
                "unknown visibility '{v}' (expected self, tree, agent or all)"
            ),
            PolicyError::Rule(r) => write!(
                f,
                "a2a rule '{r}' is not FROM:TO (agent ids or patterns with *, e.g. main:codex or \
                 main:*)"
            ),
        }
    }
}

/// A visibility or a2a rule that does not parse is bad usage.
impl HasKind for PolicyError {
    fn kind(&self) -> Kind {
        Kind::Usage
    }
}

impl std::error::Error for PolicyError {}

impl FromStr for Visibility {
    type Err = PolicyError;
    fn from_str(s: &str) -> Result<Self, PolicyError> {
        match s {
            "self" => Ok(Visibility::SelfOnly),
            "tree" => Ok(Visibility::Tree),
            "agent" => Ok(Visibility::Agent),
            "all" => Ok(Visibility::All),
            other => Err(PolicyError::Visibility(other.to_string())),
        }
    }
}

/// An agent id, or a pattern where `*` stands for any run of characters. The bare `*` also
/// matches a row whose agent is unknown; any other pattern needs a known agent.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
#[serde(transparent)]
pub struct AgentPattern(String);

impl AgentPattern {
    pub fn new(p: &str) -> Option<AgentPattern> {
        let ok = !p.is_empty() && !p.contains(':') && !p.chars().any(char::is_whitespace);
        ok.then(|| AgentPattern(p.to_string()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn matches(&self, agent: Option<&str>) -> bool {
        if self.0 == "*" {
            return true;
        }
        agent.is_some_and(|a| glob(&self.0, a))
    }
}

/// `*`-only glob, iterative with one backtrack point (linear enough for agent ids).
fn glob(pattern: &str, text: &str) -> bool {
    let (p, t) = (pattern.as_bytes(), text.as_bytes());
    let (mut pi, mut ti) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        if pi < p.len() && p[pi] == b'*' {
            star = Some((pi, ti));
            pi += 1;
        } else if pi < p.len() && p[pi] == t[ti] {
            pi += 1;
            ti += 1;
        } else if let Some((sp, st)) = star {
            pi = sp + 1;
            ti = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == b'*')
}

/// One directional agent-to-agent permission: requesters of agent `from` may see rows of agent
/// `to`. Written (and serialised) `FROM:TO`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct A2aRule {
    pub from: AgentPattern,
    pub to: AgentPattern,
}

impl FromStr for A2aRule {
    type Err = PolicyError;
    fn from_str(s: &str) -> Result<Self, PolicyError> {
        let bad = || PolicyError::Rule(s.to_string());
        let (from, to) = s.split_once(':').ok_or_else(bad)?;
        Ok(A2aRule {
            from: AgentPattern::new(from).ok_or_else(bad)?,
            to: AgentPattern::new(to).ok_or_else(bad)?,
        })
    }
}

impl Serialize for A2aRule {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for A2aRule {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

impl fmt::Display for A2aRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.from.0, self.to.0)
    }
}

/// Whether a requester may see sessions of *other* agents (the seed's `AgentToAgentPolicy`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "mode", rename_all = "camelCase")]
pub enum A2aPolicy {
    /// No cross-agent rows, except those in the requester's tree.
    Off,
    /// Cross-agent rows are allowed: all of them when `rules` is empty, otherwise those whose
    /// (requester agent, row agent) pair some rule matches.
    On { rules: Vec<A2aRule> },
}

impl A2aPolicy {
    pub fn all_pairs() -> A2aPolicy {
        A2aPolicy::On { rules: Vec::new() }
    }

    /// Whether a requester of agent `from` may see a row of agent `to` (a different agent).
    pub fn allows(&self, from: Option<&str>, to: Option<&str>) -> bool {
        match self {
            A2aPolicy::Off => false,
            A2aPolicy::On { rules } if rules.is_empty() => true,
            A2aPolicy::On { rules } => rules
                .iter()
                .any(|r| r.from.matches(from) && r.to.matches(to)),
        }
    }
}

impl fmt::Display for A2aPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            A2aPolicy::Off => f.write_str("off"),
            A2aPolicy::On { rules } if rules.is_empty() => f.write_str("on (every agent pair)"),
            A2aPolicy::On { rules } => {
                let r: Vec<String> = rules.iter().map(ToString::to_string).collect();
                write!(f, "on ({})", r.join(", "))
            }
        }
    }
}

/// The ownership metadata the check reads: the seed's `SessionVisibilityInput.row`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionMeta {
    pub session_key: String,
    pub agent_id: Option<String>,
    pub owner_session_key: Option<String>,
    pub spawned_by: Option<String>,
    pub parent_session_key: Option<String>,
}

impl From<&SessionRow> for SessionMeta {
    fn from(r: &SessionRow) -> SessionMeta {
        SessionMeta {
            session_key: r.session_key.clone(),
            agent_id: r.agent_id.clone(),
            owner_session_key: r.owner_session_key.clone(),
            spawned_by: r.spawned_by.clone(),
            parent_session_key: r.parent_session_key.clone(),
        }
    }
}

/// An empty string in a row means "not recorded", like NULL.
fn present(v: &Option<String>) -> Option<&str> {
    v.as_deref().filter(|s| !s.is_empty())
}

/// The agent a gateway-style session key names: `agent:<id>:<rest>`.
pub fn agent_from_key(key: &str) -> Option<&str> {
    let rest = key.strip_prefix("agent:")?;
    let (id, tail) = rest.split_once(':')?;
    (!id.is_empty() && !tail.is_empty()).then_some(id)
}

impl SessionMeta {
    /// The row's agent: `agentId`, else the one its key names, else unknown.
    pub fn agent(&self) -> Option<&str> {
        present(&self.agent_id).or_else(|| agent_from_key(&self.session_key))
    }

    /// The sessions this row says it belongs to (owner, spawner, parent), without repeats and
    /// without itself.
    pub fn belongs_to(&self) -> impl Iterator<Item = &str> {
        let o = present(&self.owner_session_key);
        let s = present(&self.spawned_by).filter(|s| Some(*s) != o);
        let p = present(&self.parent_session_key).filter(|p| Some(*p) != o && Some(*p) != s);
        [o, s, p]
            .into_iter()
            .flatten()
            .filter(move |k| *k != self.session_key)
    }
}

/// Rows by key, and the reverse ownership edges, built once from rows the caller already loaded.
#[derive(Debug, Clone, Default)]
pub struct SessionIndex {
    rows: HashMap<String, SessionMeta>,
    /// owner/spawner/parent key → keys of the rows that name it.
    members: HashMap<String, Vec<String>>,
}

impl SessionIndex {
    pub fn new(rows: impl IntoIterator<Item = SessionMeta>) -> SessionIndex {
        let mut index = SessionIndex::default();
        for row in rows {
            index.rows.insert(row.session_key.clone(), row);
        }
        for row in index.rows.values() {
            for up in row.belongs_to() {
                index
                    .members
                    .entry(up.to_string())
                    .or_default()
                    .push(row.session_key.clone());
            }
        }
        index
    }

    pub fn from_rows<'a>(rows: impl IntoIterator<Item = &'a SessionRow>) -> SessionIndex {
        SessionIndex::new(rows.into_iter().map(SessionMeta::from))
    }

    pub fn get(&self, key: &str) -> Option<&SessionMeta> {
        self.rows.get(key)
    }

    pub fn len(&self) -> usize {
        self.rows.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// The requester as the rows describe it: its agent and its tree.
    pub fn requester(&self, key: &str) -> Requester {
        let agent = match self.rows.get(key) {
            Some(row) => row.agent().map(str::to_string),
            None => agent_from_key(key).map(str::to_string),
        };
        let mut tree = HashSet::new();
        let mut stack = vec![key];
        while let Some(k) = stack.pop() {
            for m in self.members.get(k).into_iter().flatten() {
                if m != key && tree.insert(m.clone()) {
                    stack.push(m);
                }
            }
        }
        Requester {
            key: key.to_string(),
            agent,
            tree,
        }
    }
}

/// The requester of a check: its session key, its agent, and the keys of the rows in its tree
/// (derived from rows by [`SessionIndex::requester`]; never looked up during the check).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Requester {
    key: String,
    agent: Option<String>,
    tree: HashSet<String>,
}

impl Requester {
    pub fn key(&self) -> &str {
        &self.key
    }

    pub fn agent(&self) -> Option<&str> {
        self.agent.as_deref()
    }

    /// Whether `row` is in the requester's tree: the index put it there, or its own fields name
    /// the requester or a session of its tree (a row the index did not contain).
    pub fn owns(&self, row: &SessionMeta) -> bool {
        row.session_key != self.key
            && (self.tree.contains(&row.session_key)
                || row
                    .belongs_to()
                    .any(|k| k == self.key || self.tree.contains(k)))
    }

    /// The keys of the requester's tree, excluding itself.
    pub fn tree(&self) -> impl Iterator<Item = &str> {
        self.tree.iter().map(String::as_str)
    }
}

/// Why a row is visible (shown to operators, so a surprising answer can be traced to a field).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Grant {
    /// It is the requester's own session.
    Requester,
    /// It is in the requester's tree (owned or spawned, transitively).
    Owned,
    /// It belongs to the requester's agent.
    SameAgent,
    /// The a2a policy allows the requester's agent to see the row's agent.
    A2a,
}

impl Grant {
    pub fn as_str(self) -> &'static str {
        match self {
            Grant::Requester => "requester",
            Grant::Owned => "owned",
            Grant::SameAgent => "same agent",
            Grant::A2a => "a2a",
        }
    }
}

/// The check, with its reason: `None` means not visible.
pub fn grant(
    requester: &Requester,
    row: &SessionMeta,
    visibility: Visibility,
    a2a: &A2aPolicy,
    sandboxed: bool,
) -> Option<Grant> {
    if row.session_key == requester.key {
        return Some(Grant::Requester);
    }
    let v = visibility.effective(sandboxed);
    if v == Visibility::SelfOnly {
        return None;
    }
    // Checked before the agent rules so that `agent` and `all` can never hide what `tree` shows.
    if requester.owns(row) {
        return Some(Grant::Owned);
    }
    if v == Visibility::Tree {
        return None;
    }
    let row_agent = row.agent();
    let same_agent = matches!((requester.agent(), row_agent), (Some(a), Some(b)) if a == b);
    if same_agent {
        return Some(Grant::SameAgent);
    }
    if v == Visibility::All && a2a.allows(requester.agent(), row_agent) {
        return Some(Grant::A2a);
    }
    None
}

/// The seed's `canSeeSessionRow`: pure, over row metadata only.
pub fn can_see_session_row(
    requester: &Requester,
    row: &SessionMeta,
    visibility: Visibility,
    a2a: &A2aPolicy,
    sandboxed: bool,
) -> bool {
    grant(requester, row, visibility, a2a, sandboxed).is_some()
}

/// A requester's configured view: what every sessions operation is checked against.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Scope {
    pub visibility: Visibility,
    pub a2a: A2aPolicy,
    pub sandboxed: bool,
}

impl Scope {
    pub fn new(visibility: Visibility, a2a: A2aPolicy, sandboxed: bool) -> Scope {
        Scope {
            visibility,
            a2a,
            sandboxed,
        }
    }

    pub fn effective(&self) -> Visibility {
        self.visibility.effective(self.sandboxed)
    }

    pub fn grant(&self, requester: &Requester, row: &SessionMeta) -> Option<Grant> {
        grant(requester, row, self.visibility, &self.a2a, self.sandboxed)
    }
}

/// The rows `requester_key` may see, in their order, each with its grant. This is what `list`
/// shows; the single-session operations ask [`Scope::grant`] of one row of the same index.
pub fn visible_rows<'r>(
    rows: &'r [SessionRow],
    requester_key: &str,
    scope: &Scope,
) -> Vec<(&'r SessionRow, Grant)> {
    let index = SessionIndex::from_rows(rows);
    let requester = index.requester(requester_key);
    rows.iter()
        .filter_map(|r| {
            let meta = index.get(&r.session_key)?;
            scope.grant(&requester, meta).map(|g| (r, g))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(key: &str, agent: Option<&str>, owner: Option<&str>) -> SessionMeta {
        SessionMeta {
            session_key: key.into(),
            agent_id: agent.map(Into::into),
            owner_session_key: owner.map(Into::into),
            ..Default::default()
        }
    }

    #[test]
    fn visibility_parses_and_orders() {
        for v in Visibility::ALL {
            assert_eq!(v.as_str().parse::<Visibility>().unwrap(), v);
        }
        assert!("everything".parse::<Visibility>().is_err());
        assert!(Visibility::SelfOnly < Visibility::Tree);
        assert!(Visibility::Agent < Visibility::All);
        assert_eq!(Visibility::All.effective(true), Visibility::Tree);
        assert_eq!(Visibility::Agent.effective(true), Visibility::Tree);
        assert_eq!(Visibility::SelfOnly.effective(true), Visibility::SelfOnly);
        assert_eq!(Visibility::All.effective(false), Visibility::All);
    }

    #[test]
    fn agent_comes_from_the_row_then_the_key() {
        assert_eq!(agent_from_key("agent:main:main"), Some("main"));
        assert_eq!(agent_from_key("agent:codex:acp:1"), Some("codex"));
        assert_eq!(agent_from_key("agent::x"), None);
        assert_eq!(agent_from_key("agent:main"), None);
        assert_eq!(agent_from_key("lease:123"), None);
        assert_eq!(row("agent:main:x", None, None).agent(), Some("main"));
        assert_eq!(
            row("agent:main:x", Some("codex"), None).agent(),
            Some("codex")
        );
        assert_eq!(row("agent:main:x", Some(""), None).agent(), Some("main"));
        assert_eq!(row("plain", None, None).agent(), None);
    }

    #[test]
    fn globs() {
        assert!(glob("*", ""));
        assert!(glob("codex*", "codex-acp"));
        assert!(glob("*acp", "codex-acp"));
        assert!(glob("c*x*p", "codex-acp"));
        assert!(!glob("c*x*q", "codex-acp"));
        assert!(!glob("codex", "codex-acp"));
        assert!(glob("a*a*a", "aaaa"));
        assert!(!glob("a*a*a", "aa"));
    }

    #[test]
    fn a2a_rules_are_directional_and_named_patterns_need_a_known_agent() {
        let p = A2aPolicy::On {
            rules: vec!["main:codex".parse().unwrap(), "ops:*".parse().unwrap()],
        };
        assert!(p.allows(Some("main"), Some("codex")));
        assert!(!p.allows(Some("codex"), Some("main")));
        assert!(p.allows(Some("ops"), Some("anything")));
        assert!(p.allows(Some("ops"), None));
        assert!(!p.allows(None, Some("codex")));
        assert!(A2aPolicy::all_pairs().allows(None, None));
        assert!(!A2aPolicy::Off.allows(Some("a"), Some("b")));
        for bad in ["main", ":codex", "main:", "a:b:c", "a b:c"] {
            assert!(bad.parse::<A2aRule>().is_err(), "{bad}");
        }
    }

    #[test]
    fn tree_is_transitive_and_survives_cycles_and_dangling_keys() {
        let index = SessionIndex::new([
            row("a", Some("x"), Some("req")),
            SessionMeta {
                spawned_by: Some("a".into()),
                ..row("b", Some("y"), None)
            },
            SessionMeta {
                parent_session_key: Some("b".into()),
                ..row("c", Some("z"), None)
            },
            // A cycle that does not reach the requester.
            row("p", Some("x"), Some("q")),
            row("q", Some("x"), Some("p")),
            // Another cycle; one row of it is also spawned from the requester's tree, which
            // brings that row (and only that row) into the tree.
            row("d", Some("x"), Some("e")),
            row("e", Some("x"), Some("d")),
            row("f", Some("x"), Some("d")),
            SessionMeta {
                spawned_by: Some("a".into()),
                ..row("d2", None, Some("e"))
            },
            row("orphan", Some("x"), Some("deleted-owner")),
        ]);
        let req = index.requester("req");
        let mut tree: Vec<&str> = req.tree().collect();
        tree.sort();
        assert_eq!(tree, ["a", "b", "c", "d2"]);
        // The requester has no row: its agent is unknown, its tree is still found.
        assert_eq!(req.agent(), None);
        let off = A2aPolicy::Off;
        for v in [Visibility::Tree, Visibility::Agent, Visibility::All] {
            assert!(can_see_session_row(
                &req,
                index.get("c").unwrap(),
                v,
                &off,
                false
            ));
            assert!(!can_see_session_row(
                &req,
                index.get("p").unwrap(),
                v,
                &off,
                false
            ));
        }
        // A requester inside a cycle does not own itself, and sees its cycle partner.
        let d = index.requester("d");
        assert!(!d.tree().any(|k| k == "d"));
        assert!(d.tree().any(|k| k == "e"));
    }

    #[test]
    fn a_row_outside_the_index_is_judged_by_its_own_fields() {
        let index = SessionIndex::new([row("child", Some("y"), Some("req"))]);
        let req = index.requester("req");
        let grandchild = SessionMeta {
            spawned_by: Some("child".into()),
            ..row("late", Some("z"), None)
        };
        assert_eq!(
            grant(&req, &grandchild, Visibility::Tree, &A2aPolicy::Off, false),
            Some(Grant::Owned)
        );
    }

    #[test]
    fn old_rows_without_metadata() {
        let index = SessionIndex::new([
            row("agent:main:req", None, None),
            row("agent:main:old", None, None),
            row("lease:old", None, None),
        ]);
        let req = index.requester("agent:main:req");
        assert_eq!(req.agent(), Some("main"));
        let old_main = index.get("agent:main:old").unwrap();
        let opaque = index.get("lease:old").unwrap();
        let g = |row, v, a2a: &A2aPolicy| grant(&req, row, v, a2a, false);
        assert_eq!(g(old_main, Visibility::Tree, &A2aPolicy::Off), None);
        assert_eq!(
            g(old_main, Visibility::Agent, &A2aPolicy::Off),
            Some(Grant::SameAgent)
        );
        assert_eq!(g(opaque, Visibility::All, &A2aPolicy::Off), None);
        assert_eq!(
            g(opaque, Visibility::All, &A2aPolicy::all_pairs()),
            Some(Grant::A2a)
        );
        let named = A2aPolicy::On {
            rules: vec!["main:codex*".parse().unwrap()],
        };
        assert_eq!(g(opaque, Visibility::All, &named), None);
        // Two unknown agents are not the same agent.
        let index = SessionIndex::new([row("r", None, None), row("s", None, None)]);
        let r = index.requester("r");
        assert_eq!(
            grant(
                &r,
                index.get("s").unwrap(),
                Visibility::Agent,
                &A2aPolicy::Off,
                false
            ),
            None
        );
        assert_eq!(
            grant(
                &r,
                index.get("r").unwrap(),
                Visibility::SelfOnly,
                &A2aPolicy::Off,
                false
            ),
            Some(Grant::Requester)
        );
    }
}
