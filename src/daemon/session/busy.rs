//! Busy classification: which lines written to the adapter are JSON-RPC requests that await a
//! response (`session/prompt` makes the session busy; `session/new` and `session/load` teach
//! it the ACP session ids, with the `cwd` and `mcpServers` they were opened with, so that a
//! resume restores them), and which lines it writes back are their responses. The
//! classification is pure ([`classify_outgoing`], [`classify_incoming`]); the bookkeeping is
//! under the session's lock.

use super::base::*;
use super::supervised::*;

impl Inner {
    pub(super) fn is_busy(&self) -> bool {
        !self.pending.is_empty()
    }
}

impl Supervised {
    /// Records a request that expects a response; returns its tracking key.
    pub(super) fn track_outgoing(&self, out: Outgoing) -> Option<String> {
        let mut g = self.lock();
        if !matches!(out, Outgoing::Other) {
            self.tracking.store(true, AtomicOrdering::SeqCst);
        }
        match out {
            Outgoing::Prompt { id, acp_session } => {
                if let Some(a) = &acp_session {
                    g.note_acp_session(a.clone(), None);
                }
                if g.pending.len() >= MAX_TRACKED {
                    return None;
                }
                let key = id.to_string();
                g.pending.insert(
                    key.clone(),
                    PendingPrompt {
                        id,
                        acp_session_id: acp_session,
                        since: now_ms(),
                    },
                );
                Some(key)
            }
            Outgoing::Opens {
                id,
                acp_session,
                setup,
            } => {
                if let Some(a) = &acp_session {
                    g.note_acp_session(a.clone(), None);
                }
                if g.opening.len() >= MAX_TRACKED {
                    return None;
                }
                let key = id.to_string();
                g.opening.insert(key.clone(), (acp_session, setup));
                Some(key)
            }
            Outgoing::Other => None,
        }
    }

    /// The ACP session a `cancel` without an explicit id is meant for: the one of the only
    /// unanswered prompt, else the only ACP session seen.
    pub fn infer_acp_session(&self) -> Option<String> {
        let g = self.lock();
        let prompts: BTreeSet<&String> = g
            .pending
            .values()
            .filter_map(|p| p.acp_session_id.as_ref())
            .collect();
        if prompts.len() == 1 {
            return prompts.into_iter().next().cloned();
        }
        if g.acp_sessions.len() == 1 {
            return g.acp_sessions.iter().next().cloned();
        }
        None
    }
}

// ---------------------------------------------------------------------------------------------
// JSON-RPC classification (pure)

/// What a line written to the adapter means for busy tracking.
#[derive(Debug, Clone, PartialEq)]
pub enum Outgoing {
    /// A `session/prompt` request: the session is busy until its response.
    Prompt {
        id: Value,
        acp_session: Option<String>,
    },
    /// A `session/new` or `session/load` request: its response names the ACP session.
    Opens {
        id: Value,
        acp_session: Option<String>,
        /// The `cwd` and `mcpServers` of its params (the members present), recorded for the ACP
        /// session once the response names it: what a resume must open it with again.
        setup: Option<Value>,
    },
    Other,
}

/// What a line from the adapter means for busy tracking.
#[derive(Debug, Clone, PartialEq)]
pub enum Incoming {
    /// A response (`result` or `error`, no `method`) to the request with this id.
    Response {
        id: Value,
        session_id: Option<String>,
    },
    Other,
}

pub fn classify_outgoing(line: &str) -> Outgoing {
    if !line.contains("session/") {
        return Outgoing::Other;
    }
    let Ok(Value::Object(m)) = serde_json::from_str::<Value>(line) else {
        return Outgoing::Other;
    };
    // A request has an id; a notification (no id member) gets no response.
    let Some(id) = m.get("id").filter(|v| !v.is_null()).cloned() else {
        return Outgoing::Other;
    };
    let acp_session = m
        .get("params")
        .and_then(|p| p.get("sessionId"))
        .and_then(Value::as_str)
        .map(str::to_owned);
    match m.get("method").and_then(Value::as_str) {
        Some("session/prompt") => Outgoing::Prompt { id, acp_session },
        Some("session/new" | "session/load") => {
            let mut setup = serde_json::Map::new();
            for k in ["cwd", "mcpServers"] {
                if let Some(v) = m.get("params").and_then(|p| p.get(k)) {
                    setup.insert(k.to_string(), v.clone());
                }
            }
            Outgoing::Opens {
                id,
                acp_session,
                setup: (!setup.is_empty()).then_some(Value::Object(setup)),
            }
        }
        _ => Outgoing::Other,
    }
}

pub fn classify_incoming(line: &str) -> Incoming {
    if !line.contains("\"id\"") {
        return Incoming::Other;
    }
    let Ok(Value::Object(m)) = serde_json::from_str::<Value>(line) else {
        return Incoming::Other;
    };
    if m.contains_key("method") || !(m.contains_key("result") || m.contains_key("error")) {
        return Incoming::Other;
    }
    let Some(id) = m.get("id").cloned() else {
        return Incoming::Other;
    };
    let session_id = m
        .get("result")
        .and_then(|r| r.get("sessionId"))
        .and_then(Value::as_str)
        .map(str::to_owned);
    Incoming::Response { id, session_id }
}

/// The ACP `session/cancel` notification for one ACP session: no `id`, so no response.
pub fn cancel_notification(acp_session_id: &str) -> String {
    format!(
        "{{\"jsonrpc\":\"2.0\",\"method\":\"session/cancel\",\"params\":{{\"sessionId\":{}}}}}",
        serde_json::to_string(acp_session_id).expect("strings serialise")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    pub(super) fn prompts_and_their_responses_are_recognised() {
        let p = r#"{"jsonrpc":"2.0","id":7,"method":"session/prompt","params":{"sessionId":"a1","prompt":[]}}"#;
        assert_eq!(
            classify_outgoing(p),
            Outgoing::Prompt {
                id: json!(7),
                acp_session: Some("a1".into())
            }
        );
        let notif = r#"{"jsonrpc":"2.0","method":"session/prompt","params":{}}"#;
        assert_eq!(
            classify_outgoing(notif),
            Outgoing::Other,
            "no id: no response expected"
        );
        assert_eq!(
            classify_outgoing(r#"{"jsonrpc":"2.0","id":1,"method":"session/new","params":{}}"#),
            Outgoing::Opens {
                id: json!(1),
                acp_session: None,
                setup: None
            }
        );
        let load = r#"{"jsonrpc":"2.0","id":2,"method":"session/load","params":{"sessionId":"a1","cwd":"/w","mcpServers":[{"name":"m","command":"x","args":[],"env":[]}],"other":1}}"#;
        assert_eq!(
            classify_outgoing(load),
            Outgoing::Opens {
                id: json!(2),
                acp_session: Some("a1".into()),
                setup: Some(
                    json!({"cwd":"/w","mcpServers":[{"name":"m","command":"x","args":[],"env":[]}]})
                )
            }
        );
        assert_eq!(
            classify_outgoing("not json session/prompt"),
            Outgoing::Other
        );
        assert_eq!(
            classify_incoming(r#"{"jsonrpc":"2.0","id":7,"result":{"stopReason":"end_turn"}}"#),
            Incoming::Response {
                id: json!(7),
                session_id: None
            }
        );
        assert_eq!(
            classify_incoming(r#"{"jsonrpc":"2.0","id":1,"result":{"sessionId":"s9"}}"#),
            Incoming::Response {
                id: json!(1),
                session_id: Some("s9".into())
            }
        );
        // The agent's own requests carry a method and an id of the agent's choosing.
        assert_eq!(
            classify_incoming(
                r#"{"jsonrpc":"2.0","id":7,"method":"session/request_permission","params":{}}"#
            ),
            Incoming::Other
        );
        assert_eq!(
            classify_incoming(r#"{"jsonrpc":"2.0","method":"session/update","params":{"id":1}}"#),
            Incoming::Other
        );
        // 7 and "7" are different ids.
        let Incoming::Response { id, .. } =
            classify_incoming(r#"{"jsonrpc":"2.0","id":"7","error":{"code":-1}}"#)
        else {
            panic!()
        };
        assert_ne!(id.to_string(), json!(7).to_string());
    }

    #[test]
    pub(super) fn cancel_is_a_notification() {
        let line = cancel_notification("se\"ss");
        let v: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(
            v,
            json!({"jsonrpc":"2.0","method":"session/cancel","params":{"sessionId":"se\"ss"}})
        );
        assert!(v.get("id").is_none());
        assert!(!line.contains('\n'));
    }
}
