//! One process may hold only so many connections to the daemon (`LEASH_MAX_PEER_CONNECTIONS`,
//! lowered here to 4): the next ones are answered with one `conflict` line and closed, another
//! process's requests are served meanwhile, a closed connection frees its place, and the
//! refusals are logged once a period, not once each.
mod common;
mod daemon_support;
use common::*;
use daemon_support::*;
use serde_json::json;
use std::io::{BufRead, BufReader};
use std::os::unix::net::UnixStream;
use std::time::Duration;

const CAP: usize = 4;

/// Connects and reads what the daemon says first, without asking: a refusal line, or nothing
/// (`None`) within a short wait for a connection that is served.
fn unasked(daemon: &Daemon) -> (UnixStream, Option<serde_json::Value>) {
    let s = UnixStream::connect(&daemon.socket).expect("connect");
    s.set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    let mut line = String::new();
    let said = match BufReader::new(s.try_clone().unwrap()).read_line(&mut line) {
        Ok(n) if n > 0 => Some(serde_json::from_str(&line).expect("a JSON line")),
        _ => None,
    };
    (s, said)
}

#[test]
fn a_process_past_its_connection_cap_is_refused_and_others_are_served() {
    let tmp = TempDir::new("d-peer-cap");
    let state = tmp.join("state");
    let cap = CAP.to_string();
    let daemon =
        Daemon::start_with_env(&state, &[], "info", &[("LEASH_MAX_PEER_CONNECTIONS", &cap)]);
    // This process takes its whole allowance, each connection answering.
    let mut held: Vec<Conn> = (0..CAP).map(|_| daemon.connect()).collect();
    for c in &mut held {
        assert_eq!(c.call("ping", json!({}))["pong"], true);
    }
    // Past it: every further connection is refused at once, with a reason, and closed.
    for i in 0..40 {
        let (s, said) = unasked(&daemon);
        let said = said.unwrap_or_else(|| panic!("connection {i} past the cap was served"));
        assert_eq!(said["ok"], false, "{said}");
        assert_eq!(said["error"]["code"], "conflict", "{said}");
        let msg = said["error"]["message"].as_str().unwrap();
        assert!(
            msg.contains(&format!(
                "process {} already holds {CAP}",
                std::process::id()
            )) && msg.contains("LEASH_MAX_PEER_CONNECTIONS"),
            "{msg}"
        );
        let mut rest = String::new();
        s.set_read_timeout(Some(PATIENCE)).unwrap();
        let n = BufReader::new(s).read_line(&mut rest).unwrap_or(0);
        assert_eq!(n, 0, "the refused connection stays open: {rest}");
    }
    // Another process is served while this one is at its cap.
    let out = run(&state, &["status", "--json"]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let status: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    assert!(status["daemon"]["pid"].is_number(), "{status}");
    // A connection closed frees its place: the next one is served.
    drop(held.pop());
    let mut freed = None;
    assert!(wait_for(|| {
        let (s, said) = unasked(&daemon);
        let served = said.is_none();
        if served {
            freed = Some(s);
        }
        served
    }));
    drop(freed);
    // The refusals were logged once, not 40 times.
    let log = daemon.log_text();
    let lines = log
        .lines()
        .filter(|l| l.contains("connection refused"))
        .count();
    assert_eq!(lines, 1, "{log}");
    assert!(log.contains("refusals are logged once a minute"), "{log}");
}
