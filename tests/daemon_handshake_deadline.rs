//! The handshake deadline (the incumbent's #147352: a peer that never answers
//! `initialize` hung the gateway and left a process per retry). `ensure` with `initialize`
//! makes the daemon send that request to the new adapter and wait for its response within
//! `handshakeTimeoutMs`: the reply carries the response, or the ensure fails `handshake_timeout`
//! with the adapter's last stderr lines and the session is closed (TERM, grace, KILL) before the
//! reply, so nothing of it is left. Live: a silent binary, `cat` (echoes the request: a line
//! with a method is no response), one that ignores SIGTERM, five retries, two same-key ensures
//! in flight, an adapter that answers, and bad fields refused at the edge.
mod common;
mod daemon_support;
use common::*;
use daemon_support::*;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// An adapter script that records its pid and a long-lived child's pid (one per line) in
/// `<dir>/<name>.pids`, says something on stderr, then runs `body` (which never answers).
fn adapter(dir: &Path, name: &str, body: &str) -> (PathBuf, PathBuf) {
    let pids = dir.join(format!("{name}.pids"));
    let p = script(
        dir,
        &format!("{name}.sh"),
        &format!(
            r#"sleep 1000 &
echo $$ >> '{pids}'
echo $! >> '{pids}'
echo "{name}: loading, pid $$" >&2
{body}"#,
            pids = pids.display()
        ),
    );
    (p, pids)
}

/// Every pid the adapter scripts recorded (each still identified by its start time).
fn recorded(pids: &Path, guard: &mut Guard) -> Vec<Pid> {
    let text = std::fs::read_to_string(pids).unwrap_or_default();
    let found: Vec<Pid> = text
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .filter_map(Pid::of)
        .collect();
    for p in &found {
        guard.add(*p);
    }
    found
}

fn init_params() -> Value {
    json!({"protocolVersion": 1, "clientCapabilities": {"fs": {"readTextFile": false, "writeTextFile": false}, "terminal": false}})
}

fn ensure_hs(c: &mut Conn, session: &str, argv: &[&str], ms: u64, grace: u64) -> Value {
    c.request(
        "ensure",
        json!({"session": session, "argv": argv, "graceMs": grace,
               "initialize": init_params(), "handshakeTimeoutMs": ms}),
    )
}

/// The reply failed `handshake_timeout`, carries the stderr tail, and left nothing running: the
/// recorded processes are gone, the session has ended, its lease is settled.
fn assert_timed_out(
    c: &mut Conn,
    r: &Value,
    session: &str,
    pids: &Path,
    guard: &mut Guard,
    stderr_word: &str,
) {
    assert_eq!(r["ok"], false, "{r}");
    let e = &r["error"];
    assert_eq!(e["code"], "handshake_timeout", "{r}");
    let tail: Vec<&str> = e["stderr"]
        .as_array()
        .expect("stderr tail")
        .iter()
        .map(|l| l.as_str().unwrap())
        .collect();
    assert!(
        tail.iter().any(|l| l.contains(stderr_word)),
        "stderr tail {tail:?} lacks {stderr_word}"
    );
    assert!(
        e["message"]
            .as_str()
            .unwrap()
            .contains("did not answer initialize"),
        "{r}"
    );
    let lease = e["leaseId"].as_str().expect("leaseId").to_string();
    // Nothing left at the reply: checked at once, no wait.
    let left: Vec<i32> = recorded(pids, guard)
        .iter()
        .filter(|p| p.alive())
        .map(|p| p.pid)
        .collect();
    assert!(
        left.is_empty(),
        "processes left after handshake_timeout: {left:?}"
    );
    if let Some(s) = session_status(c, session) {
        assert_eq!(s["phase"], "ended", "{s}");
    }
    let row = lease_row(c, &lease);
    assert_ne!(row["state"], "open", "{row}");
}

#[test]
fn a_silent_adapter_times_out_and_is_closed() {
    let tmp = TempDir::new("hs-silent");
    let daemon = Daemon::start(&tmp.join("state"), &[]);
    let mut guard = Guard::new();
    let mut c = daemon.connect();
    let (silent, pids) = adapter(tmp.path(), "silent", "while :; do sleep 1 & wait $!; done");
    let started = Instant::now();
    let r = ensure_hs(&mut c, "s", &[silent.to_str().unwrap()], 400, 500);
    let took = started.elapsed();
    assert_timed_out(&mut c, &r, "s", &pids, &mut guard, "silent: loading");
    assert!(
        took >= Duration::from_millis(400),
        "answered before the deadline: {took:?}"
    );
    assert!(
        took < Duration::from_secs(15),
        "the deadline did not bound the ensure: {took:?}"
    );
    let kinds = event_kinds(&mut c, "s");
    assert!(
        kinds
            .iter()
            .any(|k| k == "exit" || k == "closed" || k == "close"),
        "{kinds:?}"
    );
}

#[test]
fn cat_is_no_acp_peer_and_times_out() {
    let tmp = TempDir::new("hs-cat");
    let daemon = Daemon::start(&tmp.join("state"), &[]);
    let mut guard = Guard::new();
    let mut c = daemon.connect();
    // cat writes the request back: a line with a method and our id is no response.
    let (cat, pids) = adapter(tmp.path(), "echoer", "exec cat");
    let r = ensure_hs(&mut c, "c", &[cat.to_str().unwrap()], 300, 500);
    assert_timed_out(&mut c, &r, "c", &pids, &mut guard, "echoer: loading");
}

#[test]
fn an_adapter_that_ignores_sigterm_is_killed_after_the_grace() {
    let tmp = TempDir::new("hs-term");
    let daemon = Daemon::start(&tmp.join("state"), &[]);
    let mut guard = Guard::new();
    let mut c = daemon.connect();
    let (stubborn, pids) = adapter(
        tmp.path(),
        "stubborn",
        "trap '' TERM INT HUP\nwhile :; do sleep 1 & wait $!; done",
    );
    let started = Instant::now();
    let r = ensure_hs(&mut c, "t", &[stubborn.to_str().unwrap()], 300, 700);
    let took = started.elapsed();
    assert_timed_out(&mut c, &r, "t", &pids, &mut guard, "stubborn: loading");
    // TERM was ignored: only the KILL after the grace ended it.
    assert!(
        took >= Duration::from_millis(300 + 700),
        "no grace before the KILL: {took:?}"
    );
}

#[test]
fn five_retries_leave_no_process() {
    let tmp = TempDir::new("hs-retry");
    let daemon = Daemon::start(&tmp.join("state"), &[]);
    let mut guard = Guard::new();
    let mut c = daemon.connect();
    let (silent, pids) = adapter(tmp.path(), "retry", "while :; do sleep 1 & wait $!; done");
    for i in 0..5 {
        let r = ensure_hs(&mut c, "r", &[silent.to_str().unwrap()], 200, 300);
        assert_timed_out(&mut c, &r, "r", &pids, &mut guard, "retry: loading");
        let all = recorded(&pids, &mut guard);
        assert_eq!(
            std::fs::read_to_string(&pids).unwrap().lines().count(),
            2 * (i + 1),
            "one adapter (and its child) per retry"
        );
        assert!(all.iter().all(|p| !p.alive()), "retry {i}: {all:?}");
    }
    let st = c.call("status", json!({}));
    let live: Vec<&Value> = st["daemon"]["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["phase"] != "ended")
        .collect();
    assert!(live.is_empty(), "{live:?}");
    let open: Vec<Value> = c
        .call("leases", json!({}))
        .as_array()
        .unwrap()
        .iter()
        .filter(|l| l["state"] == "open")
        .cloned()
        .collect();
    assert!(open.is_empty(), "{open:?}");
}

#[test]
fn same_key_ensures_each_get_their_own_handshake() {
    let tmp = TempDir::new("hs-queue");
    let daemon = Daemon::start(&tmp.join("state"), &[]);
    let mut guard = Guard::new();
    let (silent, pids) = adapter(tmp.path(), "queued", "while :; do sleep 1 & wait $!; done");
    let socket = daemon.socket.clone();
    let argv = silent.to_str().unwrap().to_string();
    let first = std::thread::spawn(move || {
        ensure_hs(&mut Conn::open(&socket), "q", &[argv.as_str()], 400, 300)
    });
    // b arrives while a's handshake is in flight (a's adapter runs): it queues, and a's failure
    // is not its answer.
    assert!(wait_for(|| std::fs::read_to_string(&pids)
        .unwrap_or_default()
        .lines()
        .count()
        >= 2));
    let mut b = daemon.connect();
    let rb = ensure_hs(&mut b, "q", &[silent.to_str().unwrap()], 400, 300);
    let ra = first.join().unwrap();
    let mut c = daemon.connect();
    assert_timed_out(&mut c, &ra, "q", &pids, &mut guard, "queued: loading");
    assert_timed_out(&mut c, &rb, "q", &pids, &mut guard, "queued: loading");
    assert_ne!(
        ra["error"]["leaseId"], rb["error"]["leaseId"],
        "each ensure started its own adapter"
    );
    assert_eq!(std::fs::read_to_string(&pids).unwrap().lines().count(), 4);
}

#[test]
fn an_adapter_that_answers_is_running_and_the_reply_has_its_response() {
    let tmp = TempDir::new("hs-ok");
    let daemon = Daemon::start(&tmp.join("state"), &[]);
    let mut guard = Guard::new();
    let mut c = daemon.connect();
    let log = tmp.join("requests.log");
    // Answers each request with the id it was sent (read from the line), records the lines.
    let (agent, pids) = adapter(
        tmp.path(),
        "agent",
        &format!(
            r#"while IFS= read -r l; do
  printf '%s\n' "$l" >> '{log}'
  id=$(printf '%s' "$l" | sed -n 's/.*"id":\("[^"]*"\).*/\1/p')
  printf '{{"jsonrpc":"2.0","id":%s,"result":{{"protocolVersion":1,"agentCapabilities":{{"loadSession":true}}}}}}\n' "$id"
done"#,
            log = log.display()
        ),
    );
    let h = c.call("hello", json!({"client": "test/1", "protocol": 1}));
    assert!(
        h["features"]
            .as_array()
            .unwrap()
            .contains(&json!("ensure.handshake")),
        "{h}"
    );
    let r = ensure_hs(&mut c, "a", &[agent.to_str().unwrap()], 5_000, 300);
    assert_eq!(r["ok"], true, "{r}");
    let res = &r["result"];
    assert_eq!(res["created"], true, "{r}");
    assert_eq!(res["initialize"]["id"], "leash-handshake", "{r}");
    assert_eq!(
        res["initialize"]["result"]["agentCapabilities"]["loadSession"], true,
        "{r}"
    );
    let sent: Value = serde_json::from_str(
        std::fs::read_to_string(&log)
            .unwrap()
            .lines()
            .next()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(sent["method"], "initialize");
    assert_eq!(sent["params"], init_params());
    recorded(&pids, &mut guard);
    assert_eq!(session_status(&mut c, "a").unwrap()["phase"], "running");
    // A second ensure finds it running: no second initialize is sent, no response in the reply.
    let again = ensure_hs(&mut c, "a", &[agent.to_str().unwrap()], 5_000, 300);
    assert_eq!(again["result"]["created"], false, "{again}");
    assert!(again["result"].get("initialize").is_none(), "{again}");
    c.call(
        "send",
        json!({"session": "a", "line": "{\"jsonrpc\":\"2.0\",\"id\":\"x\",\"method\":\"ping\"}"}),
    );
    assert!(wait_for(|| std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .count()
        == 2));
    let lines = std::fs::read_to_string(&log).unwrap();
    assert_eq!(lines.matches("\"initialize\"").count(), 1, "{lines}");
    c.call("close", json!({"session": "a"}));
}

#[test]
fn a_close_during_the_handshake_answers_closed_at_once() {
    let tmp = TempDir::new("hs-close");
    let daemon = Daemon::start(&tmp.join("state"), &[]);
    let mut guard = Guard::new();
    let (silent, pids) = adapter(tmp.path(), "closing", "while :; do sleep 1 & wait $!; done");
    let socket = daemon.socket.clone();
    let argv = silent.to_str().unwrap().to_string();
    let started = Instant::now();
    let first = std::thread::spawn(move || {
        ensure_hs(&mut Conn::open(&socket), "x", &[argv.as_str()], 60_000, 300)
    });
    assert!(wait_for(|| std::fs::read_to_string(&pids)
        .unwrap_or_default()
        .lines()
        .count()
        >= 2));
    let mut c = daemon.connect();
    let out = c.call("close", json!({"session": "x"}));
    assert_eq!(out[0]["result"], "closed", "{out}");
    let r = first.join().unwrap();
    assert_eq!(r["error"]["code"], "closed", "{r}");
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "the close did not end the wait"
    );
    let all = recorded(&pids, &mut guard);
    assert!(wait_for(|| all.iter().all(|p| !p.alive())), "{all:?}");
}

#[test]
fn bad_handshake_fields_are_refused_and_start_nothing() {
    let tmp = TempDir::new("hs-bad");
    let daemon = Daemon::start(&tmp.join("state"), &[]);
    let mut c = daemon.connect();
    let marker = tmp.join("ran");
    let argv = json!([
        "sh",
        "-c",
        format!("touch '{}'; exec cat", marker.display())
    ]);
    for (fields, why) in [
        (json!({"handshakeTimeoutMs": 100}), "initialize"),
        (
            json!({"initialize": [1], "handshakeTimeoutMs": 100}),
            "must be an object",
        ),
        (json!({"initialize": "x"}), "must be an object"),
        (
            json!({"initialize": {}, "handshakeTimeoutMs": 0}),
            "handshakeTimeoutMs",
        ),
        (
            json!({"initialize": {}, "handshakeTimeoutMs": 600_001}),
            "handshakeTimeoutMs",
        ),
        (
            json!({"initialize": {}, "handshakeTimeoutMs": "5"}),
            "expected u64",
        ),
    ] {
        let mut req = json!({"session": "b", "argv": argv});
        req.as_object_mut()
            .unwrap()
            .extend(fields.as_object().unwrap().clone());
        let r = c.request("ensure", req.clone());
        assert_eq!(r["error"]["code"], "bad_request", "{req}: {r}");
        assert!(
            r["error"]["message"].as_str().unwrap().contains(why),
            "{req}: {r}"
        );
    }
    assert!(!marker.exists(), "a refused ensure started the adapter");
    assert!(c.call("leases", json!({})).as_array().unwrap().is_empty());
}
