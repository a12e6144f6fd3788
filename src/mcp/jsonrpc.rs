//! JSON-RPC 2.0 over newline-delimited stdio, as MCP's stdio transport uses it: one message per
//! line. This module is pure — bytes in, values out — so every rule of the framing can be tested
//! without a process, and a fuzz target could call [`classify`] on arbitrary bytes.
//!
//! The rules (the whole contract of a stdio server, docs in docs/guide/agents.md):
//! - A line that is not UTF-8 or not JSON gets `-32700` with `id: null`; so does an object with
//!   the same key twice at any depth (which of the two is meant is not ours to guess).
//! - A JSON value that is not a message object (an array — MCP dropped batches in 2025-06-18 —,
//!   a number, an object without `jsonrpc: "2.0"` or with an `id` that is neither a string nor
//!   a number) gets `-32600`, with the `id` when one could be read, else `null`.
//! - A message with a `method` and an `id` is a request: it gets exactly one response.
//! - A message with a `method` and no `id` is a notification: it never gets a reply, not even
//!   when its method is unknown or its params are bad.
//! - A message with `result` or `error` and no `method` is a response to a request of ours; the
//!   server sends none, so it is dropped (logged).
//! - A line longer than [`MAX_LINE`] gets `-32600` with `id: null` (its id cannot be read
//!   without reading it); the server goes on with the next line.

use serde_json::{json, Map, Value};

/// The longest line accepted, newline excluded: 1 MiB, the same bound as the daemon's protocol.
pub const MAX_LINE: usize = crate::protocol::MAX_LINE;

/// JSON-RPC error codes used here.
pub const PARSE_ERROR: i64 = -32700;
pub const INVALID_REQUEST: i64 = -32600;
pub const METHOD_NOT_FOUND: i64 = -32601;
pub const INVALID_PARAMS: i64 = -32602;

/// A request id: JSON-RPC allows strings and numbers (MCP forbids `null`).
pub type Id = Value;

/// One line, classified.
#[derive(Debug, Clone, PartialEq)]
pub enum Incoming {
    /// A request: answer it exactly once.
    Request {
        id: Id,
        method: String,
        params: Option<Value>,
    },
    /// A notification: never answered.
    Notification {
        method: String,
        params: Option<Value>,
    },
    /// A response from the client (we send no requests, so nothing waits for it).
    Response { id: Id },
    /// The line cannot be processed; `reply` is the error response to write.
    Invalid { reply: Value },
    /// An empty line (or only whitespace): ignored.
    Blank,
}

/// A JSON-RPC error response.
pub fn error(id: &Id, code: i64, message: impl Into<String>) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message.into()}})
}

/// A JSON-RPC error response with `data`.
pub fn error_with(id: &Id, code: i64, message: impl Into<String>, data: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id,
           "error": {"code": code, "message": message.into(), "data": data}})
}

/// A JSON-RPC success response.
pub fn result(id: &Id, result: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "result": result})
}

/// The error for a line longer than [`MAX_LINE`].
pub fn too_long() -> Value {
    error_with(
        &Value::Null,
        INVALID_REQUEST,
        format!(
            "the line is longer than {MAX_LINE} bytes (1 MiB) and was discarded; send smaller \
             messages"
        ),
        json!({"maxLineBytes": MAX_LINE}),
    )
}

/// Classifies one line (without its newline).
pub fn classify(line: &[u8]) -> Incoming {
    let text = match std::str::from_utf8(line) {
        Ok(t) => t,
        Err(e) => {
            return Incoming::Invalid {
                reply: error(
                    &Value::Null,
                    PARSE_ERROR,
                    format!("parse error: the line is not valid UTF-8 ({e}); send UTF-8 JSON"),
                ),
            }
        }
    };
    if text.trim().is_empty() {
        return Incoming::Blank;
    }
    // Strict: an object with a key twice is refused, not read last-wins (`{"method":"ping",
    // "method":"tools/call"}` would run the call a reader of the first key took for a ping),
    // the same rule as the daemon's protocol.
    let value: Value = match crate::protocol::strict_json::parse(text) {
        Ok(v) => v,
        Err(e) => {
            return Incoming::Invalid {
                reply: error(
                    &Value::Null,
                    PARSE_ERROR,
                    format!(
                    "parse error: the line is not JSON ({e}); send one JSON-RPC message per line"
                ),
                ),
            }
        }
    };
    let Value::Object(msg) = value else {
        let what = if value.is_array() {
            "a batch (array); MCP sends one message per line, send them one by one"
        } else {
            "not a JSON-RPC message object"
        };
        return Incoming::Invalid {
            reply: error(
                &Value::Null,
                INVALID_REQUEST,
                format!("invalid request: {what}"),
            ),
        };
    };
    classify_object(msg)
}

fn classify_object(mut msg: Map<String, Value>) -> Incoming {
    // An id we can echo: a string or a number. Anything else cannot be echoed, so `null`.
    let id = match msg.get("id") {
        None => None,
        Some(v @ (Value::String(_) | Value::Number(_))) => Some(v.clone()),
        Some(other) => {
            return Incoming::Invalid {
                reply: error(
                    &Value::Null,
                    INVALID_REQUEST,
                    format!("invalid request: id must be a string or a number, not {other}"),
                ),
            }
        }
    };
    let invalid = |message: String| Incoming::Invalid {
        reply: error(
            id.as_ref().unwrap_or(&Value::Null),
            INVALID_REQUEST,
            message,
        ),
    };
    if msg.get("jsonrpc") != Some(&Value::String("2.0".into())) {
        // A notification never gets a reply, not even this one.
        return match (&id, msg.contains_key("method")) {
            (None, true) => Incoming::Notification {
                method: String::new(),
                params: None,
            },
            _ => invalid("invalid request: \"jsonrpc\" must be \"2.0\"".into()),
        };
    }
    let method = match msg.remove("method") {
        Some(Value::String(m)) => m,
        Some(other) => {
            return match id {
                None => Incoming::Notification {
                    method: String::new(),
                    params: None,
                },
                Some(_) => invalid(format!(
                    "invalid request: method must be a string, not {other}"
                )),
            }
        }
        None => {
            return match id {
                Some(id) if msg.contains_key("result") || msg.contains_key("error") => {
                    Incoming::Response { id }
                }
                _ => invalid("invalid request: no \"method\"".into()),
            }
        }
    };
    let params = msg.remove("params");
    match id {
        Some(id) => Incoming::Request { id, method, params },
        None => Incoming::Notification { method, params },
    }
}

/// One message as it goes on stdout: compact JSON, one line, newline-terminated. serde_json
/// escapes control characters (U+2028 included needs no escaping in JSON), so the rendered text
/// never contains a raw newline.
pub fn render(msg: &Value) -> Vec<u8> {
    let mut out = serde_json::to_vec(msg).expect("a Value always serialises");
    out.push(b'\n');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(i: Incoming) -> Value {
        match i {
            Incoming::Invalid { reply } => reply,
            other => panic!("expected an error reply, got {other:?}"),
        }
    }

    #[test]
    fn garbage_and_bad_utf8_are_parse_errors_with_null_id() {
        for line in [
            &b"not json"[..],
            b"{\"jsonrpc\":",
            b"\xff\xfe{}",
            b"{\"id\":1,\xc3}",
        ] {
            let r = reply(classify(line));
            assert_eq!(r["error"]["code"], PARSE_ERROR, "{line:?}");
            assert_eq!(r["id"], Value::Null);
            assert_eq!(r["jsonrpc"], "2.0");
        }
    }

    #[test]
    fn shapes_that_are_not_messages_are_invalid_requests() {
        for (line, id) in [
            (
                &b"[{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}]"[..],
                Value::Null,
            ),
            (b"42", Value::Null),
            (
                b"{\"jsonrpc\":\"2.0\",\"id\":null,\"method\":\"ping\"}",
                Value::Null,
            ),
            (
                b"{\"jsonrpc\":\"2.0\",\"id\":{},\"method\":\"ping\"}",
                Value::Null,
            ),
            (
                b"{\"jsonrpc\":\"1.0\",\"id\":7,\"method\":\"ping\"}",
                json!(7),
            ),
            (
                b"{\"jsonrpc\":\"2.0\",\"id\":\"a\",\"method\":3}",
                json!("a"),
            ),
            (b"{\"jsonrpc\":\"2.0\",\"id\":8}", json!(8)),
        ] {
            let r = reply(classify(line));
            assert_eq!(
                r["error"]["code"],
                INVALID_REQUEST,
                "{}",
                String::from_utf8_lossy(line)
            );
            assert_eq!(r["id"], id);
        }
    }

    #[test]
    fn requests_notifications_and_responses() {
        assert_eq!(
            classify(br#"{"jsonrpc":"2.0","id":"x","method":"ping"}"#),
            Incoming::Request {
                id: json!("x"),
                method: "ping".into(),
                params: None
            }
        );
        assert_eq!(
            classify(br#"{"jsonrpc":"2.0","method":"notifications/initialized","params":{}}"#),
            Incoming::Notification {
                method: "notifications/initialized".into(),
                params: Some(json!({}))
            }
        );
        assert_eq!(
            classify(br#"{"jsonrpc":"2.0","id":3,"result":{}}"#),
            Incoming::Response { id: json!(3) }
        );
        // Malformed notifications are still notifications: no reply.
        assert!(matches!(
            classify(br#"{"jsonrpc":"1.0","method":"x"}"#),
            Incoming::Notification { .. }
        ));
        assert!(matches!(
            classify(br#"{"jsonrpc":"2.0","method":5}"#),
            Incoming::Notification { .. }
        ));
        assert_eq!(classify(b"   "), Incoming::Blank);
        assert_eq!(classify(b""), Incoming::Blank);
    }

    #[test]
    fn rendered_messages_are_one_line() {
        let v = result(&json!(1), json!({"text": "a\nb\r\u{2028}c"}));
        let out = render(&v);
        assert_eq!(out.iter().filter(|&&b| b == b'\n').count(), 1);
        assert_eq!(out.last(), Some(&b'\n'));
        let back: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(back, v);
        assert_eq!(too_long()["id"], Value::Null);
    }
}
