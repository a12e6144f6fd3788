//! `leash serve --log-format json` writes one JSON object per line on stderr (what journald stores
//! as MESSAGE), with the event's and its spans' fields at the top level: a verify names its
//! `lease_id`, `session`, `pid` and `op`, and so does each signal of a close. Text stays the
//! default. Every field is the protocol's value: numbers as numbers, enums by their serde names,
//! an argv as an array and a summary as an object, never a string holding Rust or JSON text.
mod common;
mod daemon_support;
use common::*;
use daemon_support::*;
use serde_json::{json, Value};

#[test]
fn json_lines_carry_the_lease_fields() {
    let tmp = TempDir::new("jsonlog");
    let state = tmp.join("state");
    let mut d = Daemon::start(&state, &["--log-format", "json"]);
    let mut c = d.connect();
    let started = ensure(&mut c, "s", &["sleep", "1000"]);
    c.call("verify", json!({"session": "s"}));
    c.call("close", json!({"session": "s", "graceMs": 300}));
    assert_eq!(d.terminate().code(), Some(0));
    let log = d.log_text();
    let lines: Vec<Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    assert!(lines
        .iter()
        .all(|l| l["level"].is_string() && l["timestamp"].is_string()));
    let v = lines
        .iter()
        .find(|l| l["op"] == "verify")
        .unwrap_or_else(|| panic!("no verify line:\n{log}"));
    assert_eq!(v["lease_id"], started["leaseId"]);
    assert_eq!(v["session"], "s");
    assert_eq!(v["pid"], started["rootPid"]);
    assert_eq!(v["answer"], "owned");
    // A close's lines, logged deep in the controller and off the connection's thread, name the
    // request's op, the session and the lease.
    let signalled: Vec<&Value> = lines
        .iter()
        .filter(|l| l["message"] == "signalled")
        .collect();
    assert!(!signalled.is_empty(), "no signalled line:\n{log}");
    for l in &signalled {
        assert_eq!(l["op"], "close", "{l}");
        assert_eq!(l["session"], "s", "{l}");
        assert_eq!(l["lease_id"], started["leaseId"], "{l}");
        assert!(l["pid"].as_i64().is_some_and(|p| p > 1), "{l}");
    }
    let finished = lines
        .iter()
        .find(|l| l["message"] == "close finished")
        .unwrap_or_else(|| panic!("no close finished line:\n{log}"));
    assert_eq!(finished["op"], "close", "{finished}");
    assert_eq!(finished["session"], "s", "{finished}");
    assert_eq!(finished["lease_id"], started["leaseId"], "{finished}");
    assert!(lines.iter().any(|l| l["message"] == "leash serve stopped"));
}

#[test]
fn text_is_the_default() {
    let tmp = TempDir::new("textlog");
    let state = tmp.join("state");
    let mut d = Daemon::start(&state, &[]);
    let mut c = d.connect();
    ensure(&mut c, "s", &["cat"]);
    c.call("close", json!({"session": "s", "graceMs": 2000}));
    let ended = |d: &Daemon| d.log_text().contains("session ended");
    assert!(wait_for(|| ended(&d)), "{}", d.log_text());
    assert_eq!(d.terminate().code(), Some(0));
    let log = d.log_text();
    assert!(log.contains("INFO"), "{log}");
    assert!(!log.trim_start().starts_with('{'), "{log}");
    // The same values as the JSON log, compact: no `Some(143)`, no `Adapter`.
    assert!(log.contains("status=143"), "{log}");
    assert!(log.contains("role=adapter"), "{log}");
    assert!(log.contains(r#"argv=["cat"]"#), "{log}");
    assert!(!log.contains("Some("), "{log}");
}

/// A field value that is a string holding another value's text: Rust's `Debug` of an `Option`,
/// or JSON text (`"[\"cat\"]"`, `"{…}"`). The `message` is prose and may say anything.
fn smuggled(key: &str, v: &Value) -> bool {
    let Some(s) = v.as_str() else { return false };
    key != "message"
        && (s.starts_with("Some(") || s == "None" || s.starts_with('[') || s.starts_with('{'))
}

#[test]
fn every_field_is_the_protocols_json_value() {
    let tmp = TempDir::new("jsonlog-values");
    let state = tmp.join("state");
    // debug: every request and the hello are logged too.
    let mut d = Daemon::start_logging(
        &state,
        &["--log-format", "json", "--metrics", "127.0.0.1:0"],
        "debug",
    );
    let mut c = d.connect();
    c.call(
        "hello",
        json!({"client": "json-logs-test/1", "protocol": 1}),
    );
    let started = ensure(&mut c, "s", &["cat"]);
    // The same key with another argv: the daemon logs both argvs.
    let again = c.request(
        "ensure",
        json!({"session": "s", "argv": ["cat", "-u"], "graceMs": 500}),
    );
    assert!(again.get("ok").is_some(), "{again}");
    // Output: the adapter echoes the line back (a reader on attach sees it).
    c.call("send", json!({"session": "s", "line": "{\"hi\":1}"}));
    let (attach_id, _) = c.attach("s", 0);
    // Lifecycle events first, then the output line (the read times out if it never comes).
    while !c.next_item(&attach_id).to_string().contains("hi") {}
    let mut c = d.connect();
    c.call("cancel", json!({"session": "s"}));
    // Signals: close sends the adapter SIGTERM; cat dies of it (status 143).
    c.call("close", json!({"session": "s", "graceMs": 2000}));
    // A session whose adapter exits on its own: the lease settles after the wrapper exits.
    let own = ensure(&mut c, "own", &["sh", "-c", "read x; exit 3"]);
    c.call("send", json!({"session": "own", "line": "go"}));
    // A wrapper SIGKILLed (by the test, by pid): the daemon settles its lease.
    let killed = ensure(&mut c, "killed", &["sleep", "1000"]);
    let wrapper = Pid::of(killed["rootPid"].as_i64().unwrap() as i32).expect("wrapper runs");
    signal(wrapper, libc::SIGKILL);
    // A session still running at shutdown is closed by the daemon.
    let last = ensure(&mut c, "last", &["sleep", "1000"]);
    let ended = |d: &Daemon, n: usize| {
        d.log_text()
            .lines()
            .filter(|l| l.contains("\"session ended\""))
            .count()
            >= n
    };
    assert!(
        wait_for(|| ended(&d, 3)),
        "sessions never ended:\n{}",
        d.log_text()
    );
    let settled = |d: &Daemon| {
        d.log_text()
            .contains("lease settled after the wrapper exited")
    };
    assert!(wait_for(|| settled(&d)), "no settle:\n{}", d.log_text());
    assert_eq!(d.terminate().code(), Some(0));

    let log = d.log_text();
    let lines: Vec<Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    for l in &lines {
        for (k, v) in l.as_object().unwrap() {
            assert!(!smuggled(k, v), "field {k} holds text, not a value: {l}");
        }
        // Enums by their protocol (serde) names: camelCase, never Rust's `Adapter`.
        for k in ["role", "delivery", "result"] {
            if let Some(v) = l.get(k) {
                let ok = v.as_str().is_some_and(|s| {
                    s.starts_with(|c: char| c.is_ascii_lowercase())
                        && s.chars().all(|c| c.is_ascii_alphanumeric())
                });
                assert!(ok, "{k} is not a protocol value: {l}");
            }
        }
    }
    let with = |m: &str| -> Vec<&Value> { lines.iter().filter(|l| l["message"] == m).collect() };
    let find = |m: &str| -> &Value {
        lines
            .iter()
            .find(|l| l["message"] == m)
            .unwrap_or_else(|| panic!("no {m:?} line:\n{log}"))
    };

    let spawned = with("session spawned");
    assert!(
        spawned.iter().any(|l| l["argv"] == json!(["cat"])),
        "argv is not an array:\n{log}"
    );
    let other = find("ensure found the session running another argv");
    assert_eq!(other["running"], json!(["cat"]), "{other}");
    assert_eq!(other["asked"], json!(["cat", "-u"]), "{other}");
    let hello = find("hello");
    assert_eq!(hello["client"], "json-logs-test/1", "{hello}");
    assert_eq!(hello["protocol"], 1, "{hello}");
    let request = lines
        .iter()
        .find(|l| l["message"] == "request" && l["request"]["op"] == "close")
        .unwrap_or_else(|| panic!("no close request line as an object:\n{log}"));
    assert_eq!(request["request"]["session"], "s", "{request}");
    assert!(find("serving metrics over HTTP")["addr"]
        .as_str()
        .is_some_and(|a| a.starts_with("127.0.0.1:")));
    assert!(find("startup reap done")["summary"].is_object());

    let signalled = with("signalled");
    assert!(
        signalled
            .iter()
            .any(|l| l["role"] == "adapter" && l["delivery"] == "delivered"),
        "no signal to the adapter:\n{log}"
    );
    assert_eq!(find("close finished")["result"], "closed");

    let ended = with("session ended");
    assert_eq!(ended.len(), 4, "{log}");
    let all = [
        ("s", &started),
        ("own", &own),
        ("killed", &killed),
        ("last", &last),
    ];
    for (session, lease) in all {
        let l = ended
            .iter()
            .find(|l| l["session"] == session)
            .unwrap_or_else(|| panic!("no session ended line for {session}:\n{log}"));
        assert_eq!(l["lease_id"], lease["leaseId"], "{l}");
    }
    let status = |k: &str| ended.iter().find(|l| l["session"] == k).unwrap()["status"].clone();
    assert_eq!(status("s"), 143);
    assert_eq!(status("own"), 3);
    let settled = find("lease settled after the wrapper exited");
    assert_eq!(settled["lease_id"], killed["leaseId"], "{settled}");
    assert!(settled["result"].is_string(), "{settled}");
    // The session still running at shutdown. (The SIGKILLed wrapper's session may still be in
    // the daemon's table when shutdown begins, right after its settle was logged: it then gets an
    // "already settled when shutdown reached it" line, never a "closed at shutdown" one.)
    for l in with("closed at shutdown") {
        assert_ne!(
            l["result"], "conflict",
            "a settled lease logged as closed: {l}"
        );
    }
    let at_shutdown = with("closed at shutdown")
        .into_iter()
        .find(|l| l["session"] == "last")
        .unwrap_or_else(|| panic!("no \"closed at shutdown\" line for last:\n{log}"));
    assert_eq!(at_shutdown["lease_id"], last["leaseId"], "{at_shutdown}");
    assert_eq!(at_shutdown["result"], "closed", "{at_shutdown}");
}
