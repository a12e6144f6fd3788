//! Backpressure on the adapter's stdout: an attached client that keeps reading, at its
//! own pace, gets every item of an adapter that writes as fast as it can (the daemon stops
//! reading the adapter while the slowest live attach is a buffer behind); a client that stops
//! reading is dropped at the stall deadline and then holds nothing back; a close while the
//! adapter is held back answers and leaves nothing alive.
mod common;
mod daemon_support;
use common::*;
use daemon_support::*;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;

/// A small buffer, so that the adapter outruns it many times over.
const BUFFER: &[&str] = &["--replay-lines", "2000"];

/// An adapter that waits for one line on its stdin, then writes `lines` copies of `text`
/// as fast as `yes` can.
fn flood(text: &str, lines: usize) -> Vec<String> {
    vec![
        "sh".into(),
        "-c".into(),
        format!("read go; yes {text} | head -n {lines}"),
    ]
}

/// Attaches on its own connection from seq 0 and returns the reader and the attach's id.
fn attach_raw(daemon: &Daemon, session: &str) -> (BufReader<UnixStream>, UnixStream) {
    let mut s = UnixStream::connect(&daemon.socket).unwrap();
    s.set_read_timeout(Some(PATIENCE)).unwrap();
    let req = json!({"id": 1, "op": "attach", "session": session, "since": 0});
    s.write_all(format!("{req}\n").as_bytes()).unwrap();
    let mut r = BufReader::new(s.try_clone().unwrap());
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    let reply: Value = serde_json::from_str(&line).unwrap();
    assert_eq!(reply["ok"], true, "{reply}");
    (r, s)
}

/// Reads the attach to its end item: every output line's text, checking that seqs only go up.
/// `pause_every` makes a slow reader (a short pause every so many lines; it keeps reading).
fn read_to_end(mut r: BufReader<UnixStream>, pause_every: Option<usize>) -> (usize, Value) {
    let mut last = 0i64;
    let mut outputs = 0usize;
    let mut line = String::new();
    loop {
        line.clear();
        let n = r.read_line(&mut line).expect("read the attach");
        assert!(n > 0, "the daemon closed the attach after {outputs} lines");
        let v: Value = serde_json::from_str(&line).unwrap();
        if v["type"] == "end" {
            return (outputs, v);
        }
        let seq = v["seq"].as_i64().unwrap_or_else(|| panic!("no seq: {v}"));
        assert!(seq > last, "seq {seq} after {last}");
        last = seq;
        if v["type"] == "output" {
            outputs += 1;
            if let Some(k) = pause_every {
                if outputs % k == 0 {
                    // A reader that is slow, not one that stopped.
                    std::thread::sleep(std::time::Duration::from_millis(2));
                }
            }
        }
    }
}

fn assert_complete(what: &str, got: (usize, Value), want: usize) {
    let (outputs, end) = got;
    assert_eq!(end["reason"], "ended", "{what}: {end}");
    assert!(end.get("error").is_none_or(Value::is_null), "{what}: {end}");
    assert_eq!(outputs, want, "{what}: lines lost ({end})");
}

fn run_flood(session: &str, text: &str, lines: usize) {
    let tmp = TempDir::new("d-bp");
    let daemon = Daemon::start(&tmp.join("state"), BUFFER);
    let mut c = daemon.connect();
    c.call(
        "ensure",
        json!({"session": session, "argv": flood(text, lines), "graceMs": 500}),
    );
    let (r, _keep) = attach_raw(&daemon, session);
    assert!(wait_daemon(&mut c, |c| session_status(c, session)
        .is_some_and(|s| s["attached"] == 1)));
    c.call("send", json!({"session": session, "line": "go"}));
    assert_complete(session, read_to_end(r, None), lines);
}

#[test]
fn a_reader_that_keeps_reading_gets_every_short_line() {
    run_flood("short", "y", 200_000);
}

#[test]
fn a_reader_that_keeps_reading_gets_every_kib_line() {
    run_flood("kib", &"k".repeat(1023), 30_000);
}

#[test]
fn a_slow_reader_and_a_fast_one_both_get_every_line() {
    const LINES: usize = 60_000;
    let tmp = TempDir::new("d-bp2");
    let daemon = Daemon::start(&tmp.join("state"), BUFFER);
    let mut c = daemon.connect();
    c.call(
        "ensure",
        json!({"session": "two", "argv": flood("y", LINES), "graceMs": 500}),
    );
    let (fast, _k1) = attach_raw(&daemon, "two");
    let (slow, _k2) = attach_raw(&daemon, "two");
    assert!(wait_daemon(&mut c, |c| session_status(c, "two")
        .is_some_and(|s| s["attached"] == 2)));
    let slow = std::thread::spawn(move || read_to_end(slow, Some(500)));
    let fast = std::thread::spawn(move || read_to_end(fast, None));
    c.call("send", json!({"session": "two", "line": "go"}));
    assert_complete("fast", fast.join().unwrap(), LINES);
    assert_complete("slow", slow.join().unwrap(), LINES);
}

#[test]
fn a_client_that_stops_reading_is_dropped_and_then_holds_nothing_back() {
    const LINES: u64 = 300_000;
    let tmp = TempDir::new("d-bp3");
    let daemon = Daemon::start_with_env(
        &tmp.join("state"),
        BUFFER,
        "info",
        &[("LEASH_CLIENT_STALL_MS", "1000")],
    );
    let mut c = daemon.connect();
    c.call(
        "ensure",
        json!({"session": "lazy", "argv": flood("y", LINES as usize), "graceMs": 500}),
    );
    // Attached, and never reads a byte after the reply.
    let (_r, _keep) = attach_raw(&daemon, "lazy");
    assert!(wait_daemon(&mut c, |c| session_status(c, "lazy")
        .is_some_and(|s| s["attached"] == 1)));
    c.call("send", json!({"session": "lazy", "line": "go"}));
    // Dropped at the deadline; the adapter then runs to its end.
    assert!(wait_daemon(&mut c, |c| session_status(c, "lazy")
        .is_some_and(|s| s["attached"] == 0)));
    assert!(daemon.log_text().contains("stopped reading"));
    assert!(wait_daemon(&mut c, |c| session_status(c, "lazy")
        .is_some_and(
            |s| s["phase"] == "ended" && s["outputLines"] == LINES
        )));
    // Nobody needed the early items once the client was gone: they left the buffer as before.
    let (_, reply) = c.attach("lazy", 0);
    assert_eq!(reply["error"]["code"], "seq_evicted", "{reply}");
}

#[test]
fn a_close_while_the_adapter_is_held_back_answers_and_leaves_nothing_alive() {
    let tmp = TempDir::new("d-bp4");
    // The stalled client would hold the adapter back for a minute: the close must not wait.
    let daemon = Daemon::start_with_env(
        &tmp.join("state"),
        BUFFER,
        "info",
        &[("LEASH_CLIENT_STALL_MS", "60000")],
    );
    let mut c = daemon.connect();
    let ensured = c.call(
        "ensure",
        json!({"session": "held", "argv": ["sh", "-c", "read go; exec yes"], "graceMs": 500}),
    );
    let lease_id = ensured["leaseId"].as_str().unwrap().to_string();
    let (_r, _keep) = attach_raw(&daemon, "held");
    assert!(wait_daemon(&mut c, |c| session_status(c, "held")
        .is_some_and(|s| s["attached"] == 1)));
    c.call("send", json!({"session": "held", "line": "go"}));
    // Held back: output stops growing while the client does not read (it never reaches what
    // an unbounded `yes` writes in the time the old daemon took to read it).
    let mut last = 0;
    let mut same = 0;
    assert!(wait_daemon(&mut c, |c| {
        let n = session_status(c, "held").map_or(0, |s| s["outputLines"].as_u64().unwrap_or(0));
        same = if n == last && n > 0 { same + 1 } else { 0 };
        last = n;
        same >= 20
    }));
    let row = lease_row(&mut c, &lease_id);
    let adapter = Pid::of(row["adapterPid"].as_i64().unwrap() as i32).expect("adapter alive");
    let closed = c.call("close", json!({"session": "held"}));
    assert_eq!(closed[0]["result"], "closed", "{closed}");
    assert!(
        wait_for(|| !adapter.exists()),
        "the adapter outlived the close"
    );
    assert!(wait_daemon(&mut c, |c| session_status(c, "held")
        .is_none_or(|s| s["phase"] == "ended")));
}
