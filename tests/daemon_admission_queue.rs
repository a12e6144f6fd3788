//! Same-key admission, live: a second `ensure` of a key whose first ensure is in
//! flight queues behind it instead of answering `conflict`, and gets the outcome it would have had
//! alone: the session its predecessor started (`running`, `created: false`, the same lease); a
//! fresh start when the predecessor failed; a fresh start when a close arrived in between (the
//! close closed the predecessor's session, and the queued ensure never receives its outcome).
//! Beyond the queue's bound, or past its `queueTimeoutMs`, a queued ensure answers `conflict` and
//! started nothing.
//!
//! The predecessor is held in flight by its own adapter: it blocks reading a FIFO before its first
//! output line, and the ensure waits for that line (`waitMs`). The tests synchronise on the
//! daemon's log line for each queued ensure and release the predecessor by writing the FIFO.
mod common;
mod daemon_support;
use common::*;
use daemon_support::*;
use serde_json::{json, Value};
use std::io::Write;
use std::path::{Path, PathBuf};

fn mkfifo(path: &Path) {
    let ok = std::process::Command::new("mkfifo")
        .arg(path)
        .status()
        .expect("mkfifo runs");
    assert!(ok.success(), "mkfifo {}", path.display());
}

/// Opens the FIFO for writing (the adapter holds its read end) and writes a line.
fn release(fifo: &Path) {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .open(fifo)
        .expect("the adapter reads the fifo");
    f.write_all(b"go\n").unwrap();
}

/// Sends an ensure without waiting for its reply; returns its id.
fn send_ensure(c: &mut Conn, id: &str, fields: Value) -> Value {
    let mut req = fields;
    req["id"] = json!(id);
    req["op"] = json!("ensure");
    let mut line = serde_json::to_vec(&req).unwrap();
    line.push(b'\n');
    c.send_raw(&line);
    json!(id)
}

/// Waits until the daemon logged `n` queued ensures.
fn wait_queued(d: &Daemon, n: usize) {
    let ok = wait_for(|| {
        d.log_text()
            .matches("ensure queued behind an ensure of the same key in flight")
            .count()
            >= n
    });
    assert!(ok, "{n} ensures never queued:\n{}", d.log_text());
}

/// The lease ids of the key's lease rows.
fn lease_ids(c: &mut Conn, key: &str) -> Vec<String> {
    c.call("leases", json!({}))
        .as_array()
        .unwrap()
        .iter()
        .filter(|l| l["sessionKey"] == key)
        .map(|l| l["leaseId"].as_str().unwrap().to_string())
        .collect()
}

/// The script of an adapter that writes its pid, blocks on the FIFO, then runs as `then`.
fn held(tmp: &TempDir, name: &str, then: &str) -> (PathBuf, PathBuf, String) {
    let fifo = tmp.join(&format!("{name}.fifo"));
    mkfifo(&fifo);
    let pid = tmp.join(&format!("{name}.pid"));
    let script = format!(
        "echo $$ > '{}'; read x < '{}'; {then}",
        pid.display(),
        fifo.display()
    );
    (fifo, pid, script)
}

#[test]
fn a_queued_ensure_finds_the_session_its_predecessor_started() {
    let tmp = TempDir::new("d-queue-running");
    let daemon = Daemon::start(&tmp.join("state"), &[]);
    let (mut a, mut b, mut c) = (daemon.connect(), daemon.connect(), daemon.connect());
    let (fifo, _pid, script) = held(&tmp, "a", "echo ready; exec sleep 1000");
    let argv = json!(["sh", "-c", script]);
    let ida = send_ensure(
        &mut a,
        "a",
        json!({"session": "k", "argv": argv, "waitMs": 30000, "graceMs": 200}),
    );
    // A is in flight (its session exists) before B arrives.
    assert!(wait_for(|| session_status(&mut c, "k").is_some()));
    let idb = send_ensure(&mut b, "b", json!({"session": "k", "argv": argv}));
    wait_queued(&daemon, 1);
    release(&fifo);
    let ra = a.reply_to(&ida);
    let rb = b.reply_to(&idb);
    assert_eq!(ra["ok"], true, "{ra}");
    assert_eq!(ra["result"]["created"], true, "{ra}");
    assert_eq!(rb["ok"], true, "the queued ensure: {rb}");
    assert_eq!(rb["result"]["created"], false, "{rb}");
    assert_eq!(rb["result"]["phase"], "running", "{rb}");
    assert_eq!(rb["result"]["argvMatches"], true, "{rb}");
    assert_eq!(
        rb["result"]["leaseId"], ra["result"]["leaseId"],
        "{ra} {rb}"
    );
    assert_eq!(lease_ids(&mut c, "k").len(), 1, "one session, one lease");
    let out = c.call("close", json!({"session": "k"}));
    assert_eq!(out[0]["result"], "closed", "{out}");
}

#[test]
fn a_failed_predecessor_does_not_fail_the_queued_ensure() {
    let tmp = TempDir::new("d-queue-failed");
    let daemon = Daemon::start(&tmp.join("state"), &[]);
    let (mut a, mut b, mut c) = (daemon.connect(), daemon.connect(), daemon.connect());
    let (fifo, _pid, script) = held(&tmp, "a", "echo 'bad config' >&2; exit 3");
    let ida = send_ensure(
        &mut a,
        "a",
        json!({"session": "k", "argv": ["sh", "-c", script], "waitMs": 30000}),
    );
    assert!(wait_for(|| session_status(&mut c, "k").is_some()));
    let idb = send_ensure(
        &mut b,
        "b",
        json!({"session": "k", "argv": ["sh", "-c", "echo up; exec sleep 1000"], "graceMs": 200}),
    );
    wait_queued(&daemon, 1);
    release(&fifo);
    let ra = a.reply_to(&ida);
    let rb = b.reply_to(&idb);
    assert_eq!(ra["error"]["code"], "start_failed", "{ra}");
    assert_eq!(rb["ok"], true, "the queued ensure started afresh: {rb}");
    assert_eq!(rb["result"]["created"], true, "{rb}");
    let ids = lease_ids(&mut c, "k");
    assert_eq!(ids.len(), 2, "{ids:?}");
    let lb = rb["result"]["leaseId"].as_str().unwrap();
    assert!(
        ids.iter().any(|i| i != lb),
        "A's lease is another one: {ids:?}"
    );
    let out = c.call("close", json!({"session": "k"}));
    assert_eq!(out[0]["result"], "closed", "{out}");
    assert_eq!(out[0]["leaseId"], lb, "{out}");
}

#[test]
fn a_close_between_two_ensures_closes_the_first_and_the_second_starts_anew() {
    let tmp = TempDir::new("d-queue-close");
    let daemon = Daemon::start(&tmp.join("state"), &[]);
    let (mut a, mut b, mut c, mut w) = (
        daemon.connect(),
        daemon.connect(),
        daemon.connect(),
        daemon.connect(),
    );
    // A ignores SIGTERM, so the close needs its grace: B arrives while it runs.
    let (_fifo, pid_a, script) = held(&tmp, "a", "echo never");
    let script = format!("trap '' TERM; {script}");
    let ida = send_ensure(
        &mut a,
        "a",
        json!({"session": "k", "argv": ["sh", "-c", script], "waitMs": 30000, "graceMs": 1500}),
    );
    assert!(wait_for(|| session_status(&mut w, "k").is_some()));
    let mut adapter_a = None;
    assert!(wait_for(|| {
        adapter_a = std::fs::read_to_string(&pid_a)
            .ok()
            .and_then(|t| t.trim().parse().ok())
            .and_then(Pid::of);
        adapter_a.is_some()
    }));
    let adapter_a = adapter_a.unwrap();
    let idc = json!("close");
    let mut line = serde_json::to_vec(&json!({"id": idc, "op": "close", "session": "k"})).unwrap();
    line.push(b'\n');
    c.send_raw(&line);
    assert!(wait_for(
        || session_status(&mut w, "k").is_some_and(|s| s["phase"] == "closing")
    ));
    let idb = send_ensure(
        &mut b,
        "b",
        json!({"session": "k", "argv": ["sh", "-c", "echo up; exec sleep 1000"], "graceMs": 200}),
    );
    wait_queued(&daemon, 1);
    let ra = a.reply_to(&ida);
    let rc = c.reply_to(&idc);
    let rb = b.reply_to(&idb);
    assert_eq!(rc["ok"], true, "{rc}");
    let la = rc["result"][0]["leaseId"].clone();
    assert_eq!(rc["result"][0]["result"], "closed", "{rc}");
    assert_eq!(
        ra["error"]["code"], "closed",
        "A was closed in flight: {ra}"
    );
    assert_eq!(ra["error"]["leaseId"], la, "{ra}");
    // B never receives A's outcome: it started its own session under another lease.
    assert_eq!(rb["ok"], true, "{rb}");
    assert_eq!(rb["result"]["created"], true, "{rb}");
    assert_ne!(rb["result"]["leaseId"], la, "B got A's lease: {rb}");
    assert!(
        !adapter_a.alive(),
        "A's adapter outlived the close ({adapter_a:?})"
    );
    let out = w.call("close", json!({"session": "k"}));
    assert_eq!(out[0]["result"], "closed", "{out}");
    assert_eq!(out[0]["leaseId"], rb["result"]["leaseId"], "{out}");
}

#[test]
fn the_queue_is_bounded_and_a_queued_ensure_gives_up_at_its_deadline() {
    let tmp = TempDir::new("d-queue-bound");
    let daemon = Daemon::start(&tmp.join("state"), &[]);
    let mut a = daemon.connect();
    let mut w = daemon.connect();
    let (fifo, _pid, script) = held(&tmp, "a", "echo ready; exec sleep 1000");
    let ida = send_ensure(
        &mut a,
        "a",
        json!({"session": "k", "argv": ["sh", "-c", script], "waitMs": 30000, "graceMs": 200}),
    );
    assert!(wait_for(|| session_status(&mut w, "k").is_some()));
    // A short deadline in the queue: conflict, and nothing started.
    let r = w.request(
        "ensure",
        json!({"session": "k", "argv": ["sh", "-c", "exec sleep 1000"], "queueTimeoutMs": 50}),
    );
    assert_eq!(r["error"]["code"], "conflict", "{r}");
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap()
            .contains("queueTimeoutMs"),
        "{r}"
    );
    // Sixteen wait; the seventeenth is refused at once.
    let mut queued = Vec::new();
    for i in 0..16 {
        let mut c = daemon.connect();
        let id = send_ensure(
            &mut c,
            &format!("q{i}"),
            json!({"session": "k", "argv": ["sh", "-c", "exec sleep 1000"]}),
        );
        queued.push((c, id));
        wait_queued(&daemon, i + 2);
    }
    let r = w.request(
        "ensure",
        json!({"session": "k", "argv": ["sh", "-c", "exec sleep 1000"]}),
    );
    assert_eq!(r["error"]["code"], "conflict", "{r}");
    assert!(
        r["error"]["message"].as_str().unwrap().contains("16 more"),
        "{r}"
    );
    // A bad deadline is refused at the edge.
    let r = w.request(
        "ensure",
        json!({"session": "k", "argv": ["true"], "queueTimeoutMs": 600001}),
    );
    assert_eq!(r["error"]["code"], "bad_request", "{r}");
    release(&fifo);
    let ra = a.reply_to(&ida);
    assert_eq!(ra["ok"], true, "{ra}");
    for (mut c, id) in queued {
        let r = c.reply_to(&id);
        assert_eq!(r["result"]["created"], false, "{r}");
        assert_eq!(r["result"]["leaseId"], ra["result"]["leaseId"], "{r}");
    }
    assert_eq!(lease_ids(&mut w, "k").len(), 1);
    let out = w.call("close", json!({"session": "k"}));
    assert_eq!(out[0]["result"], "closed", "{out}");
}
