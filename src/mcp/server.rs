//! The MCP methods leash serves, over messages [`super::jsonrpc`] classified: `initialize`
//! (protocol version negotiation), `ping`, `tools/list`, `tools/call`, and the notifications a
//! client sends (`notifications/initialized`, `notifications/cancelled`), which get no reply.
//! Pure apart from the [`Tools`] it is given: one message in, at most one message out.
//!
//! A tool that refuses (a session that is not visible, no daemon to send through, a bad
//! argument) answers with a tool error (`isError: true`), never a JSON-RPC error: a model reads
//! tool errors and can act on them. JSON-RPC errors are for the protocol: `-32601` for a method
//! leash does not serve, `-32602` for params that are not what the method takes or a tool that
//! does not exist.

use super::jsonrpc::{self, Incoming, INVALID_PARAMS, METHOD_NOT_FOUND};
use super::tools::{self, Tools};
use serde_json::{json, Value};

/// Protocol versions served, newest first. `initialize` answers with the version the client
/// asks for when it is one of these, else with the newest (the client then decides whether it
/// can go on). The differences between them do not touch what leash uses: tools with
/// `structuredContent` (sent under every version; older clients ignore it).
pub const PROTOCOL_VERSIONS: [&str; 4] = ["2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"];

/// What the model is told about this server when it connects.
const INSTRUCTIONS: &str = "leash session tools. You act as one fixed session (the requester): \
sessions_list shows the sessions you may see, including the sessions you spawned for other \
agents; sessions_history, session_status and sessions_send take a sessionKey from that list. \
A session you may not see is reported as not visible.";

/// One connection's state: the negotiated version (once `initialize` was answered).
pub struct Server<'t> {
    tools: &'t mut dyn Tools,
    pub protocol_version: Option<&'static str>,
    /// The requester, for the `instructions` text.
    requester: String,
}

impl<'t> Server<'t> {
    pub fn new(tools: &'t mut dyn Tools, requester: &str) -> Server<'t> {
        Server {
            tools,
            protocol_version: None,
            requester: requester.to_string(),
        }
    }

    /// Handles one classified line: the reply to write, if any.
    pub fn handle(&mut self, msg: Incoming) -> Option<Value> {
        match msg {
            Incoming::Blank => None,
            Incoming::Invalid { reply } => Some(reply),
            Incoming::Response { id } => {
                tracing::debug!(%id, "ignoring a response: this server sends no requests");
                None
            }
            Incoming::Notification { method, .. } => {
                tracing::debug!(%method, "notification");
                None
            }
            Incoming::Request { id, method, params } => Some(self.request(&id, &method, params)),
        }
    }

    fn request(&mut self, id: &Value, method: &str, params: Option<Value>) -> Value {
        let params = match params {
            None | Some(Value::Null) => None,
            Some(Value::Object(m)) => Some(m),
            Some(other) => {
                return jsonrpc::error(
                    id,
                    INVALID_PARAMS,
                    format!("invalid params: params must be an object, not {other}"),
                )
            }
        };
        match method {
            "initialize" => self.initialize(id, params),
            "ping" => jsonrpc::result(id, json!({})),
            "tools/list" => {
                // One page holds every tool; a cursor is accepted and changes nothing.
                if let Some(c) = params.as_ref().and_then(|p| p.get("cursor")) {
                    if !c.is_string() && !c.is_null() {
                        return jsonrpc::error(
                            id,
                            INVALID_PARAMS,
                            "invalid params: cursor must be a string",
                        );
                    }
                }
                jsonrpc::result(id, json!({"tools": tools::definitions()}))
            }
            "tools/call" => self.call(id, params),
            other => jsonrpc::error(
                id,
                METHOD_NOT_FOUND,
                format!(
                    "method not found: '{other}' (this server offers initialize, ping, tools/list \
                     and tools/call)"
                ),
            ),
        }
    }

    fn initialize(&mut self, id: &Value, params: Option<serde_json::Map<String, Value>>) -> Value {
        let Some(asked) = params
            .as_ref()
            .and_then(|p| p.get("protocolVersion"))
            .and_then(Value::as_str)
        else {
            return jsonrpc::error(
                id,
                INVALID_PARAMS,
                "invalid params: initialize needs params.protocolVersion (a string such as \
                 \"2025-06-18\")",
            );
        };
        let version = PROTOCOL_VERSIONS
            .iter()
            .find(|v| **v == asked)
            .copied()
            .unwrap_or(PROTOCOL_VERSIONS[0]);
        if version != asked {
            tracing::info!(
                asked,
                answered = version,
                "client asked for an unknown protocol version"
            );
        }
        self.protocol_version = Some(version);
        jsonrpc::result(
            id,
            json!({
                "protocolVersion": version,
                "capabilities": {"tools": {"listChanged": false}},
                "serverInfo": {
                    "name": "leash",
                    "title": "leash session tools",
                    "version": env!("CARGO_PKG_VERSION")
                },
                "instructions": format!("{INSTRUCTIONS} You are session '{}'.", self.requester)
            }),
        )
    }

    fn call(&mut self, id: &Value, params: Option<serde_json::Map<String, Value>>) -> Value {
        let params = params.unwrap_or_default();
        let Some(name) = params.get("name").and_then(Value::as_str) else {
            return jsonrpc::error(
                id,
                INVALID_PARAMS,
                "invalid params: tools/call needs params.name (a tool from tools/list)",
            );
        };
        let arguments = match params.get("arguments") {
            None | Some(Value::Null) => None,
            Some(Value::Object(m)) => Some(m),
            Some(other) => {
                return jsonrpc::error(
                    id,
                    INVALID_PARAMS,
                    format!("invalid params: arguments must be an object, not {other}"),
                )
            }
        };
        match tools::parse_call(name, arguments) {
            None => jsonrpc::error(
                id,
                INVALID_PARAMS,
                format!(
                    "unknown tool '{name}' (tools: sessions_list, sessions_history, sessions_send, \
                     session_status)"
                ),
            ),
            Some(Err(e)) => jsonrpc::result(id, tools::failure(&e)),
            Some(Ok(call)) => {
                tracing::info!(
                    tool = name,
                    arguments = crate::logvalue::json(&arguments),
                    "tool call"
                );
                jsonrpc::result(id, tools::call(self.tools, &call))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::sessions::Listing;
    use crate::mcp::tools::{HistoryResult, SendResult, StatusResult, ToolError};

    /// Refuses everything and counts the calls that reached it.
    #[derive(Default)]
    struct Refuse(usize);

    impl Tools for Refuse {
        fn list(&mut self) -> Result<Listing, ToolError> {
            self.0 += 1;
            Err(ToolError("no".into()))
        }
        fn history(&mut self, _: &str, _: u64) -> Result<HistoryResult, ToolError> {
            self.0 += 1;
            Err(ToolError("no".into()))
        }
        fn send(&mut self, _: &str, _: &str) -> Result<SendResult, ToolError> {
            self.0 += 1;
            Err(ToolError("not visible".into()))
        }
        fn status(&mut self, _: &str) -> Result<StatusResult, ToolError> {
            self.0 += 1;
            Err(ToolError("no".into()))
        }
    }

    fn ask(s: &mut Server<'_>, line: &str) -> Option<Value> {
        s.handle(jsonrpc::classify(line.as_bytes()))
    }

    #[test]
    fn initialize_negotiates_the_version() {
        let mut t = Refuse::default();
        let mut s = Server::new(&mut t, "r");
        for v in PROTOCOL_VERSIONS {
            let line = format!(
                r#"{{"jsonrpc":"2.0","id":1,"method":"initialize","params":{{"protocolVersion":"{v}","capabilities":{{}},"clientInfo":{{"name":"t","version":"1"}}}}}}"#
            );
            let r = ask(&mut s, &line).unwrap();
            assert_eq!(r["result"]["protocolVersion"], v);
            assert_eq!(r["result"]["capabilities"]["tools"]["listChanged"], false);
        }
        let r = ask(&mut s, r#"{"jsonrpc":"2.0","id":2,"method":"initialize","params":{"protocolVersion":"1999-01-01"}}"#).unwrap();
        assert_eq!(r["result"]["protocolVersion"], PROTOCOL_VERSIONS[0]);
        let r = ask(
            &mut s,
            r#"{"jsonrpc":"2.0","id":3,"method":"initialize","params":{}}"#,
        )
        .unwrap();
        assert_eq!(r["error"]["code"], INVALID_PARAMS);
        assert_eq!(r["id"], 3);
    }

    #[test]
    fn methods_params_and_notifications() {
        let mut t = Refuse::default();
        let mut s = Server::new(&mut t, "r");
        let r = ask(&mut s, r#"{"jsonrpc":"2.0","id":"p","method":"ping"}"#).unwrap();
        assert_eq!(r, json!({"jsonrpc": "2.0", "id": "p", "result": {}}));
        let r = ask(
            &mut s,
            r#"{"jsonrpc":"2.0","id":4,"method":"resources/list"}"#,
        )
        .unwrap();
        assert_eq!(r["error"]["code"], METHOD_NOT_FOUND);
        let r = ask(
            &mut s,
            r#"{"jsonrpc":"2.0","id":5,"method":"ping","params":[1]}"#,
        )
        .unwrap();
        assert_eq!(r["error"]["code"], INVALID_PARAMS);
        for bad in [
            r#"{"jsonrpc":"2.0","id":6,"method":"tools/call","params":{}}"#,
            r#"{"jsonrpc":"2.0","id":6,"method":"tools/call","params":{"name":"sessions_list","arguments":[]}}"#,
            r#"{"jsonrpc":"2.0","id":6,"method":"tools/call","params":{"name":"rm_rf"}}"#,
        ] {
            let r = ask(&mut s, bad).unwrap();
            assert_eq!(r["error"]["code"], INVALID_PARAMS, "{bad}");
            assert_eq!(r["id"], 6);
        }
        // Notifications, known or not, well-formed or not: nothing.
        for n in [
            r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
            r#"{"jsonrpc":"2.0","method":"tools/call","params":{"name":"sessions_send"}}"#,
            r#"{"jsonrpc":"2.0","method":"no/such"}"#,
            r#"{"jsonrpc":"2.0","id":9,"result":{}}"#,
        ] {
            assert_eq!(ask(&mut s, n), None, "{n}");
        }
        let r = ask(&mut s, r#"{"jsonrpc":"2.0","id":7,"method":"tools/list"}"#).unwrap();
        assert_eq!(r["result"]["tools"].as_array().unwrap().len(), 4);
        drop(s);
        assert_eq!(t.0, 0, "nothing reached the tools");
    }

    #[test]
    fn refusals_are_tool_errors() {
        let mut t = Refuse::default();
        let mut s = Server::new(&mut t, "r");
        let r = ask(&mut s, r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"sessions_send","arguments":{"sessionKey":"k","message":"m"}}}"#).unwrap();
        assert_eq!(r["result"]["isError"], true);
        assert_eq!(r["result"]["content"][0]["text"], "not visible");
        let r = ask(&mut s, r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"session_status","arguments":{"sessionKey":"k","requester":"x"}}}"#).unwrap();
        assert_eq!(r["result"]["isError"], true);
        drop(s);
        assert_eq!(t.0, 1, "only the valid call reached the tools");
    }
}
