//! `ensure` starts an adapter under a lease with the given argv, cwd, environment and ownership
//! fields, is idempotent for a running session, refuses a session whose live lease another process
//! holds, and reports an adapter that cannot start. An adapter that exits by itself ends its stream
//! with its output, the lease's settlement and its exit status, in seq order.
mod common;
mod daemon_support;
use common::*;
use daemon_support::*;
use serde_json::{json, Value};
use std::process::Stdio;

#[test]
fn ensure_spawns_under_a_lease_with_argv_cwd_env_and_ownership() {
    let tmp = TempDir::new("d-ensure");
    let state = tmp.join("state");
    let work = tmp.join("work");
    std::fs::create_dir(&work).unwrap();
    let daemon = Daemon::start(&state, &[]);
    let mut guard = Guard::new();
    let mut c = daemon.connect();
    let r = c.call(
        "ensure",
        json!({
            "session": "agent:main:acp:1",
            "argv": ["sh", "-c", "echo \"$PWD|$GREETING|$OPENCLAW_ACPX_LEASE_ID\"; echo $$ > pid; exec cat"],
            "cwd": work,
            "env": {"GREETING": "hello there"},
            "agent": "codex",
            "owner": "agent:main:main",
            "spawnedBy": "agent:main:main",
            "graceMs": 400,
        }),
    );
    assert_eq!(r["created"], true, "{r}");
    assert_eq!(r["phase"], "running", "{r}");
    let lease_id = r["leaseId"].as_str().unwrap().to_string();
    guard.add(read_pid_file(&work.join("pid")));
    let wrapper = Pid::of(r["rootPid"].as_i64().unwrap() as i32).unwrap();
    assert_eq!(
        common::ppid(wrapper.pid),
        Some(daemon.pid.pid),
        "the daemon is the wrapper's parent"
    );

    let (id, _) = c.attach("agent:main:acp:1", 0);
    let mut first_output = None;
    while first_output.is_none() {
        let item = c.next_item(&id);
        if item["type"] == "output" {
            first_output = Some(item["line"].as_str().unwrap().to_string());
        } else {
            assert_eq!(item["kind"], "spawned", "{item}");
        }
    }
    let work_canon = std::fs::canonicalize(&work).unwrap();
    assert_eq!(
        first_output.unwrap(),
        format!("{}|hello there|{lease_id}", work_canon.display())
    );

    let lease = lease_row(&mut c, &lease_id);
    assert_eq!(
        lease["ownerPid"], daemon.pid.pid,
        "the daemon owns the lease: {lease}"
    );
    assert_eq!(lease["graceMs"], 400);
    assert_eq!(lease["agentId"], "codex");
    let rows = c.call("sessions", json!({}));
    let row = rows
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["sessionKey"] == "agent:main:acp:1")
        .unwrap()
        .clone();
    assert_eq!(row["ownerSessionKey"], "agent:main:main", "{row}");
    assert_eq!(row["spawnedBy"], "agent:main:main", "{row}");
    assert_eq!(row["live"]["phase"], "running", "{row}");
    // The requester sees its own spawned child; an unrelated requester under `self` does not.
    let mine = c.call(
        "sessions",
        json!({"requesterSessionKey": "agent:main:main", "visibility": "tree"}),
    );
    assert_eq!(mine.as_array().unwrap().len(), 1, "{mine}");
    let theirs = c.call(
        "sessions",
        json!({"requesterSessionKey": "agent:other:main", "visibility": "self"}),
    );
    assert_eq!(theirs, json!([]));

    // Idempotent while running.
    let again = c.call(
        "ensure",
        json!({"session": "agent:main:acp:1", "argv": ["false"]}),
    );
    assert_eq!(again["created"], false);
    assert_eq!(again["leaseId"], lease_id.as_str());

    // Bad cwd: refused before anything starts.
    let code = c.error_code(
        "ensure",
        json!({"session": "x", "argv": ["true"], "cwd": "/nonexistent/dir"}),
    );
    assert_eq!(code, "bad_request");
}

#[test]
fn ensure_reports_what_could_not_start_and_whose_lease_is_in_the_way() {
    let tmp = TempDir::new("d-ensure-fail");
    let state = tmp.join("state");
    let daemon = Daemon::start(&state, &[]);
    let mut guard = Guard::new();
    let mut c = daemon.connect();

    let r = c.request(
        "ensure",
        json!({"session": "missing", "argv": ["/nonexistent/adapter"]}),
    );
    assert_eq!(r["error"]["code"], "spawn_failed", "{r}");
    let msg = r["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("127")
            && msg.contains("the adapter could not be started: /nonexistent/adapter: not found"),
        "{msg}"
    );
    // The fields `leash exec --error-format json` gives: its cause word and status; stderr is
    // the adapter's lines (an array, without leash's JSON line); the lease it recorded.
    let e = &r["error"];
    assert_eq!(e["cause"], "adapter_not_found", "{r}");
    assert_eq!(e["exitStatus"], 127, "{r}");
    let stderr = e["stderr"].as_array().expect("stderr is an array");
    assert!(
        stderr
            .iter()
            .all(|l| !l.as_str().unwrap().contains("{\"error\"")),
        "{r}"
    );
    let lease = e["leaseId"]
        .as_str()
        .expect("the lease leash exec recorded");
    let rows = c.call("leases", json!({}));
    let row = rows
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["leaseId"] == lease)
        .unwrap_or_else(|| panic!("{lease} in {rows}"));
    assert_ne!(row["state"], "open", "{row}");

    // A session whose live lease another process holds (a gateway's own leash exec).
    let mut other = leash(&state)
        .args(["exec", "--session", "taken", "--", "sleep", "1000"])
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let wrapper = Pid::of(other.id() as i32).unwrap();
    guard.add(wrapper);
    assert!(wait_for(|| !children(wrapper.pid).is_empty()));
    guard.add(adapter_of(wrapper));
    let r = c.request("ensure", json!({"session": "taken", "argv": ["true"]}));
    assert_eq!(r["error"]["code"], "conflict", "{r}");
    assert!(
        r["error"]["message"].as_str().unwrap().contains("taken"),
        "{r}"
    );
    signal(wrapper, libc::SIGTERM);
    let _ = other.wait();
}

#[test]
fn an_adapter_that_exits_ends_its_stream_in_order() {
    let tmp = TempDir::new("d-ensure-exit");
    let state = tmp.join("state");
    let gate = tmp.join("gate");
    let daemon = Daemon::start(&state, &[]);
    let mut c = daemon.connect();
    // Waits for the test to attach (the gate file), then says goodbye and exits 3.
    let script = format!(
        "while [ ! -e '{}' ]; do sleep 0.01; done; echo bye; exit 3",
        gate.display()
    );
    let r = c.call(
        "ensure",
        json!({"session": "short", "argv": ["sh", "-c", script]}),
    );
    let lease_id = r["leaseId"].as_str().unwrap().to_string();
    let (id, _) = c.attach("short", 0);
    std::fs::write(&gate, b"").unwrap();
    let mut items: Vec<Value> = Vec::new();
    loop {
        let item = c.next_item(&id);
        if item["type"] == "end" {
            assert_eq!(item["reason"], "ended", "{item}");
            assert_eq!(item["lastSeq"], items.last().unwrap()["seq"], "{item}");
            break;
        }
        items.push(item);
    }
    let kinds: Vec<String> = items
        .iter()
        .map(|i| {
            if i["type"] == "output" {
                format!("out:{}", i["line"].as_str().unwrap())
            } else {
                i["kind"].as_str().unwrap().to_string()
            }
        })
        .collect();
    assert_eq!(
        kinds,
        vec!["spawned", "out:bye", "ended", "exit"],
        "{items:?}"
    );
    let exit = items.last().unwrap();
    assert_eq!(exit["detail"]["status"], 3, "{exit}");
    let seqs: Vec<i64> = items.iter().map(|i| i["seq"].as_i64().unwrap()).collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");
    // The persisted events carry the same seqs as the stream.
    let stored = c.call("events", json!({"session": "short"}));
    let stored: Vec<(i64, String)> = stored
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["seq"].as_i64().unwrap(),
                e["kind"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let streamed: Vec<(i64, String)> = items
        .iter()
        .filter(|i| i["type"] == "event")
        .map(|i| {
            (
                i["seq"].as_i64().unwrap(),
                i["kind"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(stored, streamed);
    let lease = lease_row(&mut c, &lease_id);
    // The adapter exited on its own and leash saw it: ended, not lost.
    assert_eq!(lease["state"], "ended", "{lease}");
    assert_eq!(lease["exitStatus"], 3, "{lease}");
}
