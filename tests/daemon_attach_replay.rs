//! A client that disconnects in the middle of an attach and reattaches with the last seq it saw
//! gets every line exactly once, in order, while the session runs on undisturbed; asking for a seq
//! that fell out of the bounded replay buffer gets `seq_evicted`, with the oldest seq still
//! available.
mod common;
mod daemon_support;
use common::*;
use daemon_support::*;
use serde_json::json;

const LINES: usize = 3000;

#[test]
fn reattaching_with_the_last_seq_sees_every_line_exactly_once() {
    let tmp = TempDir::new("d-replay");
    let state = tmp.join("state");
    let counter = counter_script(tmp.path());
    let pid_file = tmp.join("counter.pid");
    let daemon = Daemon::start(&state, &[]);
    let mut guard = Guard::new();
    let mut c = daemon.connect();
    ensure(
        &mut c,
        "replay",
        &[
            counter.to_str().unwrap(),
            &LINES.to_string(),
            pid_file.to_str().unwrap(),
        ],
    );
    let adapter = read_pid_file(&pid_file);
    guard.add(adapter);

    // Disconnect after these many output lines each time, mid-stream.
    let cuts = [1usize, 150, 700, 701, 1800];
    let mut seen: Vec<String> = Vec::new();
    let mut last_seq = 0i64;
    let mut reattaches = 0;
    while seen.len() < LINES {
        let mut conn = daemon.connect();
        let (id, reply) = conn.attach("replay", last_seq);
        assert_eq!(reply["ok"], true, "attach since {last_seq}: {reply}");
        let stop_at = cuts.get(reattaches).copied().unwrap_or(usize::MAX);
        loop {
            let item = conn.next_item(&id);
            assert_ne!(item["type"], "end", "the session ended early: {item}");
            let seq = item["seq"].as_i64().expect("stream items carry a seq");
            assert!(seq > last_seq, "seq went from {last_seq} to {seq}: {item}");
            last_seq = seq;
            if item["type"] == "output" {
                seen.push(item["line"].as_str().unwrap().to_string());
                if seen.len() == stop_at || seen.len() == LINES {
                    break;
                }
            }
        }
        // Hang up mid-stream: the daemon is still writing to this connection.
        drop(conn);
        reattaches += 1;
    }
    let expected: Vec<String> = (1..=LINES).map(|i| i.to_string()).collect();
    assert_eq!(seen.len(), LINES);
    assert!(seen == expected, "lines lost, repeated or reordered");
    assert!(reattaches > cuts.len(), "every cut happened");

    // The session was not disturbed by the clients coming and going.
    assert!(adapter.alive(), "the adapter died");
    let st = session_status(&mut c, "replay").unwrap();
    assert_eq!(st["phase"], "running", "{st}");
    assert_eq!(st["outputLines"], LINES, "{st}");
    // The attach threads of the vanished clients notice the hang-up and end, even though
    // the session has nothing more to stream.
    assert!(
        wait_daemon(&mut c, |c| session_status(c, "replay").unwrap()["attached"]
            == 0),
        "attach threads of vanished clients linger: {}",
        session_status(&mut c, "replay").unwrap()
    );
}

#[test]
fn a_seq_that_fell_out_of_the_buffer_is_reported() {
    let tmp = TempDir::new("d-evict");
    let state = tmp.join("state");
    let counter = counter_script(tmp.path());
    let pid_file = tmp.join("counter.pid");
    let daemon = Daemon::start(&state, &["--replay-lines", "50"]);
    let mut guard = Guard::new();
    let mut c = daemon.connect();
    ensure(
        &mut c,
        "evict",
        &[counter.to_str().unwrap(), "500", pid_file.to_str().unwrap()],
    );
    guard.add(read_pid_file(&pid_file));
    assert!(wait_daemon(&mut c, |c| session_status(c, "evict").unwrap()
        ["outputLines"]
        == 500));

    let r = c.request("attach", json!({"session": "evict", "since": 0}));
    assert_eq!(r["ok"], false, "{r}");
    assert_eq!(r["error"]["code"], "seq_evicted", "{r}");
    let oldest = r["error"]["oldestSeq"].as_i64().expect("oldestSeq");
    let last = r["error"]["lastSeq"].as_i64().expect("lastSeq");
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap()
            .contains("replay buffer"),
        "{r}"
    );

    // From just before the oldest buffered item: the newest 50 lines, nothing else.
    let (id, reply) = c.attach("evict", oldest - 1);
    assert_eq!(reply["ok"], true, "{reply}");
    let mut lines = Vec::new();
    loop {
        let item = c.next_item(&id);
        lines.push(item["line"].as_str().unwrap().to_string());
        if item["seq"] == last {
            break;
        }
    }
    let expected: Vec<String> = (451..=500).map(|i| i.to_string()).collect();
    assert_eq!(lines, expected);
}
