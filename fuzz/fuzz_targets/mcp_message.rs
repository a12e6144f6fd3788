//! Fuzz target: one line as `leash mcp` reads it from stdin (`leash::mcp::jsonrpc::classify`, then
//! the MCP method dispatch in `leash::mcp::server::Server`), with tools that refuse everything.
//! Any bytes must give what the stdio contract says, never a panic: a request exactly one
//! response carrying its id, a notification or a client's response nothing, anything else one
//! error response whose id is null or the request's own string or number id, and every reply is
//! a single JSON-RPC 2.0 line.
#![no_main]

use leash::mcp::jsonrpc::{classify, render, Incoming};
use leash::mcp::server::Server;
use leash::mcp::tools::{HistoryResult, SendResult, StatusResult, ToolError, Tools};
use leash::controller::sessions::Listing;
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

struct Refuse;

impl Tools for Refuse {
    fn list(&mut self) -> Result<Listing, ToolError> {
        Err(ToolError("refused".into()))
    }
    fn history(&mut self, _: &str, _: u64) -> Result<HistoryResult, ToolError> {
        Err(ToolError("refused".into()))
    }
    fn send(&mut self, _: &str, _: &str) -> Result<SendResult, ToolError> {
        Err(ToolError("refused".into()))
    }
    fn status(&mut self, _: &str) -> Result<StatusResult, ToolError> {
        Err(ToolError("refused".into()))
    }
}

fuzz_target!(|data: &[u8]| {
    let msg = classify(data);
    assert_eq!(msg, classify(data), "classifying is deterministic");
    let expect_id = match &msg {
        Incoming::Request { id, .. } => Some(id.clone()),
        Incoming::Invalid { reply } => Some(reply["id"].clone()),
        _ => None,
    };
    let mut tools = Refuse;
    let mut server = Server::new(&mut tools, "fuzz");
    let invalid = matches!(msg, Incoming::Invalid { .. });
    let reply = server.handle(msg);
    match (expect_id, reply) {
        (None, None) => {}
        (Some(id), Some(r)) => {
            assert_eq!(r["jsonrpc"], "2.0");
            if invalid {
                // null, or the id of a request that could be read but not served
                assert!(
                    matches!(r["id"], Value::Null | Value::String(_) | Value::Number(_)),
                    "{r}"
                );
                assert!(r["error"]["code"].is_i64(), "{r}");
            } else {
                assert_eq!(r["id"], id, "{r}");
                assert!(matches!(r["id"], Value::String(_) | Value::Number(_)), "{r}");
            }
            assert!(r.get("result").is_some() ^ r.get("error").is_some(), "{r}");
            if let Some(code) = r["error"]["code"].as_i64() {
                assert!([-32700, -32600, -32601, -32602].contains(&code), "{r}");
            }
            let line = render(&r);
            assert_eq!(line.iter().filter(|&&b| b == b'\n').count(), 1);
        }
        (expect, got) => panic!("expected a reply for {expect:?}, got {got:?}"),
    }
});
