//! The four session tools as MCP describes them: names, descriptions written for a model, JSON
//! Schema inputs, argument parsing, the typed results, and how a result becomes a
//! `tools/call` answer. Pure: the effects (the store, the daemon) are behind [`Tools`], which
//! `effects.rs` implements over [`crate::controller::Controller`] — the same operations `leash
//! sessions` runs, so both answer alike.
//!
//! A tool argument can never change who asks or how far it may see: the requester, the
//! visibility and the a2a policy are fixed when the server starts, and the input schemas do not
//! allow other properties (an argument named `requester`, `visibility`, … is refused with a tool
//! error that says so).

use crate::controller::sessions::{Listing, SessionStatus};
use crate::store::Event;
use leash_core::visibility::Grant;
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

pub const SESSIONS_LIST: &str = "sessions_list";
pub const SESSIONS_HISTORY: &str = "sessions_history";
pub const SESSIONS_SEND: &str = "sessions_send";
pub const SESSION_STATUS: &str = "session_status";

/// `sessions_history` returns this many items when `limit` is not given.
pub const DEFAULT_HISTORY_LIMIT: u64 = 100;
/// The largest `limit` accepted.
pub const MAX_HISTORY_LIMIT: u64 = 1_000;
/// An adapter output line is cut to this many bytes in a history (the daemon keeps lines up to
/// 8 MiB; a model needs the start of a line, and the reply must stay a sane size).
pub const MAX_HISTORY_LINE: usize = 16 * 1024;

/// A validated tool call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolCall {
    List,
    History {
        session_key: String,
        limit: u64,
    },
    Send {
        session_key: String,
        message: String,
    },
    Status {
        session_key: String,
    },
}

/// Why a tool call did not do what was asked: shown to the model as a tool error
/// (`isError: true`), never as a JSON-RPC error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ToolError(pub String);

/// The effects behind the tools, for one fixed requester.
pub trait Tools {
    fn list(&mut self) -> Result<Listing, ToolError>;
    fn history(&mut self, session_key: &str, limit: u64) -> Result<HistoryResult, ToolError>;
    fn send(&mut self, session_key: &str, message: &str) -> Result<SendResult, ToolError>;
    fn status(&mut self, session_key: &str) -> Result<StatusResult, ToolError>;
}

/// One item of a session's history, in seq order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "camelCase")]
pub enum HistoryItem {
    /// A lifecycle event (from the database).
    #[serde(rename_all = "camelCase")]
    Event {
        seq: i64,
        kind: String,
        lease_id: Option<String>,
        detail: Option<Value>,
        at: i64,
    },
    /// A line of the adapter's stdout that the daemon still holds in its replay buffer.
    #[serde(rename_all = "camelCase")]
    Output {
        seq: i64,
        line: String,
        /// The line was not valid UTF-8 (invalid bytes replaced by U+FFFD).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        lossy: bool,
        /// The line was cut (here at [`MAX_HISTORY_LINE`] bytes, or by the daemon at 8 MiB).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        truncated: bool,
    },
}

impl HistoryItem {
    pub fn seq(&self) -> i64 {
        match self {
            HistoryItem::Event { seq, .. } | HistoryItem::Output { seq, .. } => *seq,
        }
    }

    pub fn from_event(e: Event) -> HistoryItem {
        HistoryItem::Event {
            seq: e.seq,
            kind: e.kind,
            lease_id: e.lease_id,
            detail: e.detail,
            at: e.at,
        }
    }

    /// An output line, cut at [`MAX_HISTORY_LINE`] bytes (on a character boundary).
    pub fn output(seq: i64, mut line: String, lossy: bool, truncated: bool) -> HistoryItem {
        let mut cut = truncated;
        if line.len() > MAX_HISTORY_LINE {
            let mut end = MAX_HISTORY_LINE;
            while !line.is_char_boundary(end) {
                end -= 1;
            }
            line.truncate(end);
            cut = true;
        }
        HistoryItem::Output {
            seq,
            line,
            lossy,
            truncated: cut,
        }
    }
}

/// Merges the database's events with the daemon's output lines: seq order, one item per seq,
/// then the newest `limit` of them.
pub fn merge_history(
    events: Vec<Event>,
    output: Vec<HistoryItem>,
    limit: u64,
) -> (Vec<HistoryItem>, usize) {
    let mut items: Vec<HistoryItem> = events.into_iter().map(HistoryItem::from_event).collect();
    items.extend(output);
    items.sort_by_key(HistoryItem::seq);
    items.dedup_by_key(|i| i.seq());
    let total = items.len();
    let keep = usize::try_from(limit).unwrap_or(usize::MAX).min(total);
    (items.split_off(total - keep), total)
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HistoryResult {
    pub session_key: String,
    pub visible_as: Grant,
    /// Newest last; at most `limit` items.
    pub items: Vec<HistoryItem>,
    /// How many items there were before `limit` was applied.
    pub total: usize,
    /// Whether a daemon supervises the session (only then are output lines available).
    pub supervised: bool,
    /// When `supervised`: the oldest seq the daemon still holds (older output is gone).
    pub oldest_buffered_seq: Option<i64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SendResult {
    pub session_key: String,
    pub bytes: u64,
    /// Whether the session is busy with a prompt after this line.
    pub busy: bool,
}

/// Resource totals of a session's live processes, where they are known.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Resources {
    /// Where the figures come from (`verified tree`: the processes verification proved to
    /// belong to the lease, read from /proc).
    pub source: String,
    pub processes: usize,
    pub rss_bytes: u64,
    pub cpu_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StatusResult {
    pub session_key: String,
    pub visible_as: Grant,
    /// `starting`, `running`, `closing`, `ended` (the daemon's phase when it supervises the
    /// session; else from the lease: open → running, closing → closing, closed/ended/lost → ended;
    /// `none` without a lease).
    pub phase: String,
    /// The newest lease's state (`open`, `closing`, `closed`, `lost`), or null.
    pub lease_state: Option<String>,
    /// Busy with a prompt (null when no daemon supervises the session: unknown).
    pub busy: Option<bool>,
    /// The last seq of the session (the daemon's, else the last persisted event's).
    pub last_seq: Option<i64>,
    pub supervised: bool,
    /// Null when nothing of the session is alive (or nothing could be verified).
    pub resources: Option<Resources>,
    /// The daemon's session object (as in its `status` op), when it supervises the session.
    pub live: Option<Value>,
    /// Everything `leash sessions status --json` shows.
    pub detail: SessionStatus,
}

/// The tools as `tools/list` returns them.
pub fn definitions() -> Value {
    let key = json!({
        "type": "string",
        "minLength": 1,
        "description": "The session key, exactly as sessions_list shows it (sessionKey)."
    });
    json!([
        {
            "name": SESSIONS_LIST,
            "title": "List visible sessions",
            "description": "List the sessions you may see: your own session, the sessions you \
                spawned or own (also those of other agents, and their children), and — depending \
                on how this server was started — other sessions of your agent or of agents you \
                are allowed to see. Each entry has sessionKey, agentId, ownerSessionKey, \
                spawnedBy, parentSessionKey, leaseState (open, closing, closed, ended, lost or null) and \
                visibleAs (requester, owned, sameAgent, a2a: why you may see it). Use the \
                sessionKey values with the other session tools. Takes no arguments.",
            "inputSchema": {"type": "object", "properties": {}, "additionalProperties": false},
            "annotations": {"readOnlyHint": true, "openWorldHint": false}
        },
        {
            "name": SESSIONS_HISTORY,
            "title": "Read a session's history",
            "description": "Read what happened in a session you may see: its lifecycle events \
                (spawned, cancel, closing, closed, ended, lost, exit, …) and the lines its adapter \
                wrote to stdout that the supervisor still holds, in order, newest last. Each \
                item has type (event or output), seq and either kind/detail/at or line. Returns \
                at most `limit` items (default 100, at most 1000); `total` says how many there \
                were. A session you may not see gives an error saying it is not visible.",
            "inputSchema": {
                "type": "object",
                "properties": {
                    "sessionKey": key,
                    "limit": {"type": "integer", "minimum": 1, "maximum": MAX_HISTORY_LIMIT,
                              "description": "How many of the newest items to return (default 100)."}
                },
                "required": ["sessionKey"],
                "additionalProperties": false
            },
            "annotations": {"readOnlyHint": true, "openWorldHint": false}
        },
        {
            "name": SESSIONS_SEND,
            "title": "Send a line to a session",
            "description": "Write one line to the stdin of a session's adapter (an ACP agent \
                speaks JSON-RPC, one message per line), through the running leash supervisor. \
                The message must be a single line (no newline characters). Returns the number of \
                bytes written and whether the session is now busy with a prompt. A session you \
                may not see gives an error saying it is not visible, and nothing is sent.",
            "inputSchema": {
                "type": "object",
                "properties": {
                    "sessionKey": key,
                    "message": {"type": "string",
                                "description": "One line of input for the adapter, without a newline."}
                },
                "required": ["sessionKey", "message"],
                "additionalProperties": false
            },
            "annotations": {"readOnlyHint": false, "destructiveHint": false,
                            "idempotentHint": false, "openWorldHint": false}
        },
        {
            "name": SESSION_STATUS,
            "title": "Check a session's status",
            "description": "Check a session you may see: phase (starting, running, closing, \
                ended, none), leaseState, busy (working on a prompt; null if unknown), lastSeq, \
                and resources (processes, rssBytes, cpuMs of its live processes) where they are \
                known, plus the full detail (lease, root and adapter processes, verified live \
                tree).",
            "inputSchema": {
                "type": "object",
                "properties": {"sessionKey": key},
                "required": ["sessionKey"],
                "additionalProperties": false
            },
            "annotations": {"readOnlyHint": true, "openWorldHint": false}
        }
    ])
}

/// Arguments that look like an attempt to pick the requester or the scope.
const FIXED: [&str; 8] = [
    "requester",
    "requesterSessionKey",
    "as",
    "visibility",
    "a2a",
    "a2aAllow",
    "sandboxed",
    "scope",
];

/// Validates `arguments` for tool `name`. `Ok(None)`: no such tool (a protocol error, -32602);
/// `Err`: the arguments are wrong (a tool error the model can act on).
pub fn parse_call(
    name: &str,
    arguments: Option<&Map<String, Value>>,
) -> Option<Result<ToolCall, ToolError>> {
    let allowed: &[&str] = match name {
        SESSIONS_LIST => &[],
        SESSIONS_HISTORY => &["sessionKey", "limit"],
        SESSIONS_SEND => &["sessionKey", "message"],
        SESSION_STATUS => &["sessionKey"],
        _ => return None,
    };
    let empty = Map::new();
    let args = arguments.unwrap_or(&empty);
    Some(parse_args(name, allowed, args))
}

fn parse_args(
    name: &str,
    allowed: &[&str],
    args: &Map<String, Value>,
) -> Result<ToolCall, ToolError> {
    for k in args.keys() {
        if FIXED.contains(&k.as_str()) {
            return Err(ToolError(format!(
                "{name}: the argument '{k}' is not accepted: the requester, its visibility and \
                 the agent-to-agent policy are fixed when this server starts; call {name} without it"
            )));
        }
        if !allowed.contains(&k.as_str()) {
            let expected = if allowed.is_empty() {
                "no arguments".to_string()
            } else {
                allowed.join(", ")
            };
            return Err(ToolError(format!(
                "{name}: unknown argument '{k}' (it takes {expected})"
            )));
        }
    }
    let key = || -> Result<String, ToolError> {
        match args.get("sessionKey") {
            Some(Value::String(s)) if !s.is_empty() => Ok(s.clone()),
            Some(Value::String(_)) | None => Err(ToolError(format!(
                "{name}: sessionKey is required (a session key from sessions_list)"
            ))),
            Some(other) => Err(ToolError(format!(
                "{name}: sessionKey must be a string, not {other}"
            ))),
        }
    };
    Ok(match name {
        SESSIONS_LIST => ToolCall::List,
        SESSIONS_HISTORY => {
            let limit = match args.get("limit") {
                None | Some(Value::Null) => DEFAULT_HISTORY_LIMIT,
                Some(v) => v
                    .as_u64()
                    .filter(|n| (1..=MAX_HISTORY_LIMIT).contains(n))
                    .ok_or_else(|| {
                        ToolError(format!(
                            "{name}: limit must be an integer from 1 to {MAX_HISTORY_LIMIT}, not {v}"
                        ))
                    })?,
            };
            ToolCall::History {
                session_key: key()?,
                limit,
            }
        }
        SESSIONS_SEND => {
            let message = match args.get("message") {
                Some(Value::String(s)) => s.clone(),
                None => {
                    return Err(ToolError(format!(
                        "{name}: message is required (one line for the adapter)"
                    )))
                }
                Some(other) => {
                    return Err(ToolError(format!(
                        "{name}: message must be a string, not {other}"
                    )))
                }
            };
            let session_key = key()?;
            if message.contains('\n') || message.contains('\r') {
                return Err(ToolError(format!(
                    "{name}: message contains a newline; send one line at a time (nothing was sent)"
                )));
            }
            ToolCall::Send {
                session_key,
                message,
            }
        }
        _ => ToolCall::Status {
            session_key: key()?,
        },
    })
}

/// Runs a validated call and renders the `tools/call` result: `structuredContent` plus its JSON
/// as text (what the spec asks for clients that read only `content`), or a tool error.
pub fn call(tools: &mut dyn Tools, call: &ToolCall) -> Value {
    fn ok<T: Serialize>(v: Result<T, ToolError>) -> Result<Value, ToolError> {
        v.map(|t| serde_json::to_value(t).expect("tool results serialise"))
    }
    let out = match call {
        ToolCall::List => ok(tools.list()),
        ToolCall::History { session_key, limit } => ok(tools.history(session_key, *limit)),
        ToolCall::Send {
            session_key,
            message,
        } => ok(tools.send(session_key, message)),
        ToolCall::Status { session_key } => ok(tools.status(session_key)),
    };
    match out {
        Ok(structured) => success(structured),
        Err(e) => failure(&e),
    }
}

pub fn success(structured: Value) -> Value {
    let text = serde_json::to_string(&structured).expect("a Value always serialises");
    json!({
        "content": [{"type": "text", "text": text}],
        "structuredContent": structured,
        "isError": false
    })
}

pub fn failure(e: &ToolError) -> Value {
    json!({
        "content": [{"type": "text", "text": e.0}],
        "isError": true
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn arguments_are_validated_and_the_scope_cannot_be_picked() {
        assert_eq!(parse_call("nope", None), None);
        assert_eq!(parse_call(SESSIONS_LIST, None), Some(Ok(ToolCall::List)));
        for bad in ["requester", "visibility", "a2a", "sandboxed"] {
            let e = parse_call(SESSIONS_LIST, Some(&args(json!({bad: "x"}))))
                .unwrap()
                .unwrap_err();
            assert!(e.0.contains("fixed when this server starts"), "{e}");
        }
        let e = parse_call(
            SESSION_STATUS,
            Some(&args(json!({"sessionKey": "k", "x": 1}))),
        )
        .unwrap()
        .unwrap_err();
        assert!(e.0.contains("unknown argument 'x'"), "{e}");
        assert!(parse_call(SESSION_STATUS, Some(&args(json!({}))))
            .unwrap()
            .is_err());
        assert!(
            parse_call(SESSION_STATUS, Some(&args(json!({"sessionKey": 3}))))
                .unwrap()
                .is_err()
        );
        assert_eq!(
            parse_call(SESSIONS_HISTORY, Some(&args(json!({"sessionKey": "k"})))),
            Some(Ok(ToolCall::History {
                session_key: "k".into(),
                limit: DEFAULT_HISTORY_LIMIT
            }))
        );
        for bad in [json!(0), json!(1001), json!(-1), json!(2.5), json!("3")] {
            let a = args(json!({"sessionKey": "k", "limit": bad}));
            assert!(
                parse_call(SESSIONS_HISTORY, Some(&a)).unwrap().is_err(),
                "{bad}"
            );
        }
        let multi = args(json!({"sessionKey": "k", "message": "a\nb"}));
        assert!(parse_call(SESSIONS_SEND, Some(&multi)).unwrap().is_err());
        let one = args(json!({"sessionKey": "k", "message": ""}));
        assert!(parse_call(SESSIONS_SEND, Some(&one)).unwrap().is_ok());
    }

    #[test]
    fn every_definition_has_a_closed_object_schema() {
        let defs = definitions();
        let names: Vec<&str> = defs
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d["name"].as_str().unwrap())
            .collect();
        assert_eq!(
            names,
            [
                SESSIONS_LIST,
                SESSIONS_HISTORY,
                SESSIONS_SEND,
                SESSION_STATUS
            ]
        );
        for d in defs.as_array().unwrap() {
            assert_eq!(d["inputSchema"]["type"], "object");
            assert_eq!(d["inputSchema"]["additionalProperties"], false);
            assert!(d["description"].as_str().unwrap().len() > 80);
        }
    }

    #[test]
    fn history_merges_by_seq_and_keeps_the_newest() {
        let ev = |seq| Event {
            session_key: "k".into(),
            lease_id: None,
            seq,
            kind: "spawned".into(),
            detail: None,
            at: 0,
        };
        let out = |seq| HistoryItem::output(seq, format!("l{seq}"), false, false);
        let (items, total) = merge_history(vec![ev(1), ev(9)], vec![out(3), out(2), out(9)], 3);
        assert_eq!(total, 4);
        let seqs: Vec<i64> = items.iter().map(HistoryItem::seq).collect();
        assert_eq!(seqs, [2, 3, 9]);
        assert!(matches!(items[2], HistoryItem::Event { .. }));
        let long = HistoryItem::output(1, "é".repeat(MAX_HISTORY_LINE), false, false);
        match long {
            HistoryItem::Output {
                line, truncated, ..
            } => {
                assert!(truncated);
                assert!(line.len() <= MAX_HISTORY_LINE);
            }
            _ => unreachable!(),
        }
    }
}
