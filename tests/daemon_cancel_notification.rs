//! `cancel` writes exactly one well-formed ACP `session/cancel` notification (no id) to the
//! adapter's stdin, records the intent, and signals nothing: the adapter (which logs every
//! catchable signal) keeps running and the lease stays open. Without an explicit ACP session id the
//! daemon uses the one of the unanswered prompt.
mod common;
mod daemon_support;
use daemon_support::*;
use serde_json::{json, Value};

#[test]
fn cancel_writes_one_notification_and_signals_nothing() {
    let mut s = OneSession::start("d-cancel", "chat", "stdin.log", json!({"graceMs": 500}));
    let OneSession {
        c,
        log,
        tmp,
        lease_id,
        adapter,
        ..
    } = &mut s;

    // A turn is running: the prompt names the ACP session.
    let sent = c.call("send", json!({"session": "chat", "line": prompt("acp-7")}));
    assert_eq!(sent["busy"], true, "{sent}");

    let r = c.call("cancel", json!({"session": "chat"}));
    assert_eq!(r["notified"], true, "{r}");
    assert_eq!(r["acpSessionId"], "acp-7", "{r}");
    assert_eq!(r["leaseId"], lease_id.as_str());
    let explicit = c.call(
        "cancel",
        json!({"lease": lease_id, "acpSessionId": "acp-other"}),
    );
    assert_eq!(explicit["acpSessionId"], "acp-other", "{explicit}");

    // A sentinel after the cancels: once it is in the log, everything before it is too.
    c.call(
        "send",
        json!({"session": "chat", "line": "{\"sentinel\":true}"}),
    );
    let lines = wait_lines(log, 4);
    assert_eq!(lines.len(), 4, "{lines:?}");
    let parsed: Vec<Value> = lines
        .iter()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    assert_eq!(parsed[0]["method"], "session/prompt");
    for (line, acp) in [(&parsed[1], "acp-7"), (&parsed[2], "acp-other")] {
        assert_eq!(
            line,
            &json!({"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": acp}}),
            "the cancel notification is exactly this (no id: it gets no response)"
        );
    }
    assert_eq!(parsed[3], json!({"sentinel": true}));
    let cancels = lines
        .iter()
        .filter(|l| l.contains("session/cancel"))
        .count();
    assert_eq!(cancels, 2, "one notification per cancel");

    // Nothing was signalled; the adapter and its lease live on.
    let signals = std::fs::read_to_string(tmp.join("stdin.log.signals")).unwrap_or_default();
    assert!(signals.is_empty(), "the adapter got signals: {signals}");
    assert!(adapter.alive());
    assert_eq!(lease_row(c, lease_id)["state"], "open");
    let st = session_status(c, "chat").unwrap();
    assert_eq!(st["phase"], "running", "{st}");
    assert_eq!(
        st["busy"], true,
        "the turn ends with its response, not with the cancel: {st}"
    );

    // The intents are recorded, with the same seq in the store and in the stream.
    let events = c.call("events", json!({"session": "chat"}));
    let cancel_events: Vec<&Value> = events
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "cancel")
        .collect();
    assert_eq!(cancel_events.len(), 2, "{events}");
    assert_eq!(cancel_events[0]["seq"], r["seq"]);
    assert_eq!(cancel_events[0]["detail"]["acpSessionId"], "acp-7");
    let (id, _) = c.attach("chat", 0);
    let mut streamed = Vec::new();
    while streamed.len() < 2 {
        let item = c.next_item(&id);
        if item["type"] == "event" && item["kind"] == "cancel" {
            streamed.push(item["seq"].clone());
        }
    }
    assert_eq!(streamed, vec![r["seq"].clone(), explicit["seq"].clone()]);
}

#[test]
fn cancel_without_a_known_acp_session_records_the_intent_and_writes_nothing() {
    // A cancel answers the same with or without a daemon. With no ACP session to
    // notify, the intent is recorded (as `leash cancel --no-daemon` does) and `notified: false`
    // says that nothing was written.
    let mut s = OneSession::start(
        "d-cancel-noid",
        "quiet",
        "stdin.log",
        json!({"graceMs": 500}),
    );
    let OneSession { c, log, .. } = &mut s;
    let r = c.call("cancel", json!({"session": "quiet"}));
    assert_eq!(r["notified"], false, "{r}");
    assert_eq!(r["supervised"], true, "{r}");
    assert!(r["acpSessionId"].is_null(), "{r}");
    c.call("send", json!({"session": "quiet", "line": "sentinel"}));
    assert_eq!(
        wait_lines(log, 1),
        vec!["sentinel".to_string()],
        "nothing but the sentinel was written"
    );
    assert!(event_kinds(c, "quiet").contains(&"cancel".to_string()));
}
