//! The stdio contract of `leash mcp`, checked on the raw pipe without an SDK: a garbage line gets
//! -32700 with id null, an unknown method -32601, bad params -32602, a notification nothing, a line
//! over 1 MiB an error after which the server goes on, invalid UTF-8 a -32700, EOF exit 0 — and
//! stdout carries nothing but JSON-RPC responses throughout.
mod common;
mod mcp_support;
use common::*;
use mcp_support::*;
use serde_json::{json, Value};
use std::time::Duration;

fn ping(id: u64) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "ping"})
}

#[test]
fn every_bad_line_gets_exactly_its_reply_and_the_server_goes_on() {
    let tmp = TempDir::new("mcp-framing");
    let state = tmp.join("state");
    init_state_root(&state);
    let mut p = McpProc::start(&state, &["--as", "agent:main:main"]);

    let r = p.request(&initialize(1, "2025-06-18"));
    assert_eq!(r["result"]["protocolVersion"], "2025-06-18");
    assert_eq!(r["result"]["serverInfo"]["name"], "leash");
    p.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));

    // Garbage: parse error, id null.
    p.send_raw(b"this is not json\n");
    let r = p.next();
    assert_eq!(r["error"]["code"], -32700, "{r}");
    assert_eq!(r["id"], Value::Null);

    // Invalid UTF-8 (in a line that would otherwise be a valid request): parse error, id null.
    p.send_raw(
        b"{\"jsonrpc\":\"2.0\",\"id\":5,\"method\":\"ping\",\"params\":{\"x\":\"\xff\xfe\"}}\n",
    );
    let r = p.next();
    assert_eq!(r["error"]["code"], -32700, "{r}");
    assert_eq!(r["id"], Value::Null);

    // Unknown method: -32601 with the request's id.
    let r = p.request(&json!({"jsonrpc": "2.0", "id": "u", "method": "resources/list"}));
    assert_eq!(r["error"]["code"], -32601, "{r}");

    // Bad params: -32602.
    let r = p.request(
        &json!({"jsonrpc": "2.0", "id": 6, "method": "tools/call", "params": {"arguments": {}}}),
    );
    assert_eq!(r["error"]["code"], -32602, "{r}");
    let r = p.request(
        &json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "rm"}}),
    );
    assert_eq!(r["error"]["code"], -32602, "{r}");
    let r = p.request(&json!({"jsonrpc": "2.0", "id": 8, "method": "initialize", "params": {}}));
    assert_eq!(r["error"]["code"], -32602, "{r}");

    // Notifications get nothing, whatever they are; the ping after them is the next line.
    p.send(
        &json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 1}}),
    );
    p.send(&json!({"jsonrpc": "2.0", "method": "no/such/method"}));
    p.send(
        &json!({"jsonrpc": "2.0", "method": "tools/call", "params": {"name": "sessions_send",
                   "arguments": {"sessionKey": "agent:main:main", "message": "x"}}}),
    );
    let r = p.request(&ping(9));
    assert_eq!(r["result"], json!({}), "{r}");

    // A line over 1 MiB: refused with id null, and the server reads the next line normally.
    let mut big = br#"{"jsonrpc":"2.0","id":10,"method":"ping","params":{"pad":""#.to_vec();
    big.extend(std::iter::repeat_n(b'a', 2 << 20));
    big.extend(b"\"}}\n");
    p.send_raw(&big);
    let r = p.next();
    assert_eq!(r["error"]["code"], -32600, "{r}");
    assert_eq!(r["id"], Value::Null);
    assert_eq!(r["error"]["data"]["maxLineBytes"], 1 << 20);
    let r = p.request(&ping(11));
    assert_eq!(r["result"], json!({}));
    // Just under the bound is a normal line.
    let mut fits = br#"{"jsonrpc":"2.0","id":12,"method":"ping","params":{"pad":""#.to_vec();
    let pad = (1 << 20) - fits.len() - 3;
    fits.extend(std::iter::repeat_n(b'a', pad));
    fits.extend(b"\"}}\n");
    assert_eq!(fits.len(), (1 << 20) + 1);
    p.send_raw(&fits);
    assert_eq!(p.next()["id"], 12);

    // A batch is not served (MCP dropped batches): one error, id null.
    p.send_raw(b"[{\"jsonrpc\":\"2.0\",\"id\":13,\"method\":\"ping\"}]\n");
    let r = p.next();
    assert_eq!(r["error"]["code"], -32600, "{r}");
    assert_eq!(r["id"], Value::Null);

    // A refusal is a tool error, never -32603.
    let r = p.request(&tool_call(
        14,
        "session_status",
        json!({"sessionKey": "nope"}),
    ));
    assert_eq!(r["result"]["isError"], true, "{r}");

    // Blank lines and CRLF are fine.
    p.send_raw(b"\n\r\n{\"jsonrpc\":\"2.0\",\"id\":15,\"method\":\"ping\"}\r\n");
    assert_eq!(p.next()["id"], 15);
    assert!(
        p.quiet_for(Duration::from_millis(200)),
        "a reply nobody asked for"
    );

    // EOF: exit 0, nothing more written.
    let before = p.seen.len();
    assert_eq!(p.close_and_wait(), Some(0));
    assert_eq!(p.seen.len(), before, "wrote after EOF");
    p.assert_pure_jsonrpc();
}

#[test]
fn eof_before_anything_exits_zero_and_a_final_line_without_newline_is_answered() {
    let tmp = TempDir::new("mcp-eof");
    let state = tmp.join("state");
    init_state_root(&state);
    let (out, code) = mcp_once(&state, &["--as", "k"], &[]);
    assert_eq!(code, Some(0));
    assert!(out.is_empty(), "{out:?}");

    let mut p = McpProc::start(&state, &["--as", "k"]);
    p.send_raw(br#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#);
    assert_eq!(p.close_and_wait(), Some(0));
    p.assert_pure_jsonrpc();
    assert_eq!(p.seen.len(), 1);
}

#[test]
fn bad_flags_are_refused_before_serving() {
    let tmp = TempDir::new("mcp-flags");
    let state = tmp.join("state");
    init_state_root(&state);
    for args in [
        vec!["mcp"],
        vec!["mcp", "--as", ""],
        vec!["mcp", "--as", "k", "--visibility", "everything"],
        vec!["mcp", "--as", "k", "--a2a", "off", "--a2a-allow", "a:b"],
        vec!["mcp", "--as", "k", "--a2a-allow", "nocolon"],
    ] {
        let out = run(&state, &args);
        assert_eq!(out.code, Some(2), "{args:?}: {}", out.stderr);
        assert!(
            out.stdout.is_empty(),
            "{args:?} wrote to stdout: {}",
            out.stdout
        );
    }
    // A state root that does not exist is not created: exit 4 before serving, stdout empty.
    let missing = tmp.join("nowhere");
    let out = run(&missing, &["mcp", "--as", "k"]);
    assert_eq!(out.code, Some(4), "{}", out.stderr);
    assert!(out.stdout.is_empty(), "{}", out.stdout);
    assert!(out.stderr.contains("does not exist"), "{}", out.stderr);
    assert!(!missing.exists(), "leash mcp created a state root");
}

/// One rule for keys and one for JSON, at every edge: `--as` refuses what `sessions --as`
/// refuses (control characters, keys over the length bound), a tool's over-long `sessionKey` is
/// refused without being echoed whole, and an object with a key twice is a parse error (-32700,
/// id null), never read last-wins: `{"method":"ping","method":"tools/call"}` runs nothing.
#[test]
fn keys_and_duplicate_json_keys_follow_the_daemon_rules() {
    let tmp = TempDir::new("mcp-keys");
    let state = tmp.join("state");
    init_state_root(&state);
    let long = "k".repeat(100_000);
    for bad in ["a\nb", "a\u{1b}b", long.as_str()] {
        for verb in [
            &["mcp", "--as", bad][..],
            &["sessions", "list", "--as", bad][..],
        ] {
            let out = run(&state, verb);
            let said: String = out.stderr.chars().take(400).collect();
            assert_eq!(out.code, Some(2), "{} {}: {said}", verb[0], bad.len());
            assert!(out.stdout.is_empty(), "{} {}: {said}", verb[0], bad.len());
            assert!(
                out.stderr.len() < 2_000,
                "{}: the refusal echoes the key whole ({} bytes): {said}",
                verb[0],
                out.stderr.len()
            );
        }
    }

    let mut p = McpProc::start(&state, &["--as", "agent:main:main"]);
    let r = p.request(&initialize(1, "2025-06-18"));
    assert_eq!(r["result"]["protocolVersion"], "2025-06-18");
    p.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));

    // Last-wins would run the call; the message is malformed instead.
    p.send_raw(
        br#"{"jsonrpc":"2.0","id":2,"method":"ping","method":"tools/call","params":{"name":"sessions_list","arguments":{}}}"#,
    );
    p.send_raw(b"\n");
    let r = p.next();
    assert_eq!(r["error"]["code"], -32700, "{r}");
    assert_eq!(r["id"], Value::Null, "{r}");
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap()
            .contains("duplicate key \"method\""),
        "{r}"
    );
    // At any depth: a tool argument given twice.
    p.send_raw(
        br#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"session_status","arguments":{"sessionKey":"a","sessionKey":"agent:main:main"}}}"#,
    );
    p.send_raw(b"\n");
    let r = p.next();
    assert_eq!(r["error"]["code"], -32700, "{r}");
    assert!(r.get("result").is_none(), "{r}");

    // An over-long key a tool is asked for: refused as not visible, shown shortened.
    let r = p.request(&tool_call(
        4,
        "session_status",
        json!({ "sessionKey": long }),
    ));
    assert_eq!(r["result"]["isError"], true, "{r}");
    let text = r["result"]["content"][0]["text"].as_str().unwrap();
    assert!(text.contains("not visible"), "{text}");
    assert!(text.contains("shortened"), "{text}");
    assert!(
        text.len() < 1_000,
        "the refusal echoes the key ({} bytes)",
        text.len()
    );
    // A duplicated long key is named shortened too.
    let mut dup = br#"{"jsonrpc":"2.0","id":5,"method":"ping","params":{""#.to_vec();
    dup.extend(long.as_bytes());
    dup.extend(br#"":1,""#);
    dup.extend(long.as_bytes());
    dup.extend(b"\":2}}\n");
    p.send_raw(&dup);
    let r = p.next();
    assert_eq!(r["error"]["code"], -32700, "{r}");
    assert!(
        r["error"]["message"].as_str().unwrap().len() < 1_000,
        "the parse error echoes the key whole"
    );
    let r = p.request(&ping(6));
    assert_eq!(r["result"], json!({}), "{r}");
    assert_eq!(p.close_and_wait(), Some(0));
    p.assert_pure_jsonrpc();
}
