//! Busy tracking from the JSON-RPC stream. A `session/prompt` request sent to the adapter makes the
//! session busy until a response with the same id comes back — also when the adapter answers at
//! once (the request is tracked before it is written) — and a response to another id, or a prompt
//! without an id (a notification: no response will come), changes nothing.
mod common;
mod daemon_support;
use common::*;
use daemon_support::*;
use serde_json::json;

#[test]
fn prompts_are_busy_until_their_response() {
    let tmp = TempDir::new("d-busy");
    let state = tmp.join("state");
    // Answers every request line at once with a response to its id (an error for id 2).
    let answerer = script(
        tmp.path(),
        "answerer.sh",
        r#"echo $$ > "$1"
while IFS= read -r line; do
  case "$line" in
    *'"id":2,'*) printf '%s\n' '{"jsonrpc":"2.0","id":2,"error":{"code":-32000,"message":"nope"}}' ;;
    *'"id":'*) id=${line#*\"id\":}; id=${id%%,*}; printf '{"jsonrpc":"2.0","id":%s,"result":{"stopReason":"end_turn"}}\n' "$id" ;;
  esac
done"#,
    );
    let recorder = recorder_script(tmp.path());
    let daemon = Daemon::start(&state, &[]);
    let mut guard = Guard::new();
    let mut c = daemon.connect();
    let pid_file = tmp.join("fast.pid");
    ensure(
        &mut c,
        "fast",
        &[answerer.to_str().unwrap(), pid_file.to_str().unwrap()],
    );
    guard.add(read_pid_file(&pid_file));
    let log = tmp.join("slow.log");
    ensure(
        &mut c,
        "slow",
        &[recorder.to_str().unwrap(), log.to_str().unwrap()],
    );
    guard.add(read_pid_file(&tmp.join("slow.log.pid")));

    let busy = |c: &mut Conn, s: &str| session_status(c, s).unwrap()["busy"].clone();

    // Answered at once, many times over: never left busy.
    for i in 0..50 {
        let p = json!({"jsonrpc": "2.0", "id": 100 + i, "method": "session/prompt",
                       "params": {"sessionId": "f", "prompt": []}});
        c.call("send", json!({"session": "fast", "line": p.to_string()}));
    }
    let p2 = json!({"jsonrpc": "2.0", "id": 2, "method": "session/prompt", "params": {"sessionId": "f"}});
    c.call("send", json!({"session": "fast", "line": p2.to_string()}));
    assert!(
        wait_daemon(&mut c, |c| session_status(c, "fast").unwrap()
            ["outputLines"]
            == 51),
        "the answerer did not answer"
    );
    assert_eq!(
        busy(&mut c, "fast"),
        false,
        "{}",
        session_status(&mut c, "fast").unwrap()
    );

    // The slow one: busy until its own response.
    c.call("send", json!({"session": "slow", "line": prompt("s")}));
    assert_eq!(busy(&mut c, "slow"), true);
    let st = session_status(&mut c, "slow").unwrap();
    assert_eq!(st["pendingPrompts"][0]["id"], 1, "{st}");
    assert_eq!(st["pendingPrompts"][0]["acpSessionId"], "s", "{st}");
    // A notification-shaped prompt (no id) expects no response: not tracked.
    let notif = json!({"jsonrpc": "2.0", "method": "session/prompt", "params": {"sessionId": "s"}});
    c.call(
        "send",
        json!({"session": "slow", "line": notif.to_string()}),
    );
    assert_eq!(
        session_status(&mut c, "slow").unwrap()["pendingPrompts"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    // The recorder answers id 1 when told to respond.
    c.call(
        "send",
        json!({"session": "slow", "line": "{\"respond\":true}"}),
    );
    assert!(wait_daemon(&mut c, |c| busy(c, "slow") == false));
}
