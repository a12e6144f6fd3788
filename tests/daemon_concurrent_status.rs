//! 50 clients asking for `status` at once while 5 sessions stream output are all answered, and no
//! session is disturbed: each stream stays gap-free and in order, and every adapter keeps running.
mod common;
mod daemon_support;
use common::*;
use daemon_support::*;
use serde_json::json;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};

const SESSIONS: usize = 5;
const CLIENTS: usize = 50;
const ROUNDS: usize = 3;

#[test]
fn fifty_clients_ask_for_status_while_five_sessions_stream() {
    let tmp = TempDir::new("d-concurrent");
    let state = tmp.join("state");
    // Counts forever, pausing every 50 lines.
    let streamer = script(
        tmp.path(),
        "streamer.sh",
        r#"echo $$ > "$1"; i=0
while :; do i=$((i+1)); echo "$i"; case "$i" in *00|*50) sleep 0.01;; esac; done"#,
    );
    let daemon = Daemon::start(&state, &[]);
    let mut guard = Guard::new();
    let mut c = daemon.connect();
    let mut adapters = Vec::new();
    for i in 0..SESSIONS {
        let pid_file = tmp.join(&format!("s{i}.pid"));
        ensure(
            &mut c,
            &format!("s{i}"),
            &[streamer.to_str().unwrap(), pid_file.to_str().unwrap()],
        );
        let a = read_pid_file(&pid_file);
        guard.add(a);
        adapters.push(a);
    }

    // One reader per session checks its stream while the status storm runs.
    let stop = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = (0..SESSIONS)
        .map(|i| {
            let socket = daemon.socket.clone();
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut conn = Conn::open(&socket);
                let (id, reply) = conn.attach(&format!("s{i}"), 0);
                assert_eq!(reply["ok"], true, "{reply}");
                let (mut last_seq, mut last_n, mut lines) = (0i64, 0u64, 0u64);
                while !stop.load(Ordering::Relaxed) || lines < 200 {
                    let item = conn.next_item(&id);
                    assert_eq!(item.get("error"), None, "stream s{i} broke: {item}");
                    let seq = item["seq"].as_i64().unwrap();
                    assert!(seq > last_seq, "s{i}: seq {last_seq} then {seq}");
                    last_seq = seq;
                    if item["type"] == "output" {
                        let n: u64 = item["line"].as_str().unwrap().parse().unwrap();
                        assert_eq!(n, last_n + 1, "s{i}: line {last_n} then {n}");
                        last_n = n;
                        lines += 1;
                    }
                }
                lines
            })
        })
        .collect();

    let barrier = Arc::new(Barrier::new(CLIENTS));
    let clients: Vec<_> = (0..CLIENTS)
        .map(|_| {
            let socket = daemon.socket.clone();
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                let mut conn = Conn::open(&socket);
                barrier.wait();
                let mut answered = 0;
                for _ in 0..ROUNDS {
                    let st = conn.call("status", json!({}));
                    assert_eq!(st["daemon"]["sessions"].as_array().unwrap().len(), SESSIONS);
                    answered += 1;
                }
                answered
            })
        })
        .collect();
    let answered: usize = clients.into_iter().map(|t| t.join().unwrap()).sum();
    assert_eq!(answered, CLIENTS * ROUNDS, "every status request answered");
    stop.store(true, Ordering::Relaxed);
    for (i, r) in readers.into_iter().enumerate() {
        let lines = r.join().unwrap_or_else(|_| panic!("reader of s{i} failed"));
        eprintln!("s{i}: {lines} lines checked in order");
    }

    for (i, a) in adapters.iter().enumerate() {
        assert!(a.alive(), "adapter of s{i} died");
        let st = session_status(&mut c, &format!("s{i}")).unwrap();
        assert_eq!(st["phase"], "running", "{st}");
    }
}
