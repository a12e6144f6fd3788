//! `leash serve --metrics ADDR` and the `metrics` op. A scripted workload (three sessions ensured,
//! two closed — one with a child under another uid, whose signal is refused —, an orphan outside
//! the daemon reaped through the `reap` op, a known number of requests per op) is scraped over HTTP; `promtool check metrics` (Debian's prometheus package,
//! unpacked under the target directory on first use) accepts the exposition, and every counter
//! equals what the workload did, as the ops' own replies report it.
mod common;
mod daemon_support;
use common::*;
use daemon_support::*;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::io::{Read, Write};

/// A scrape as Prometheus makes it (asking for OpenMetrics), or as curl does (`accept: None`).
fn scrape(addr: &str, accept: Option<&str>) -> String {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(PATIENCE)).unwrap();
    let accept = accept.map_or(String::new(), |a| format!("Accept: {a}\r\n"));
    write!(s, "GET /metrics HTTP/1.1\r\nHost: {addr}\r\n{accept}\r\n").unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").expect("an HTTP response");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    body.to_string()
}

/// `name{labels} value` lines → value, keyed by `name{labels}`.
fn samples(text: &str) -> HashMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| {
            let (k, v) = l.rsplit_once(' ')?;
            Some((k.to_string(), v.parse().ok()?))
        })
        .collect()
}

fn get(m: &HashMap<String, f64>, key: &str) -> f64 {
    m.get(key).copied().unwrap_or(0.0)
}

#[test]
fn the_scrape_matches_the_workload_and_passes_promtool() {
    let tmp = TempDir::new("metrics");
    let state = tmp.join("state");
    let d = Daemon::start(
        &state,
        &["--metrics", "127.0.0.1:0", "--reconcile-interval", "0"],
    );
    let mut c = d.connect();
    let status = c.call("status", json!({}));
    let addr = status["daemon"]["metrics"].as_str().unwrap().to_string();

    // Workload.
    ensure(&mut c, "a", &["sleep", "1000"]);
    ensure(&mut c, "b", &["sh", "-c", "echo hello; exec sleep 1000"]);
    assert!(wait_daemon(&mut c, |c| session_status(c, "b")
        .is_some_and(|s| s["lastSeq"].as_i64() > Some(0))));
    let closed = c.call("close", json!({"session": "a", "graceMs": 200}));
    let term_sent = closed[0]["signals"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["signal"] == "SIGTERM" && s["delivery"] == "delivered")
        .count();
    let mut guard = Guard::new();
    // A session whose adapter starts a child under another uid: leash refuses to signal it
    // (its uid is not the lease root's), and the refusal is counted by reason.
    let foreign_pid = tmp.join("foreign.pid");
    ensure(
        &mut c,
        "f",
        &[
            "sh",
            "-c",
            &format!(
                "setpriv --reuid 65534 --regid 65534 --clear-groups sleep 1000 & echo $! > '{}'; \
                 exec sleep 1000",
                foreign_pid.display()
            ),
        ],
    );
    let foreign = read_pid_file(&foreign_pid);
    guard.add(foreign);
    let closed_f = c.call("close", json!({"session": "f", "graceMs": 200}));
    let refused_permission = closed_f[0]["refused"].as_array().unwrap().len();
    let term_sent_f = closed_f[0]["signals"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["signal"] == "SIGTERM" && s["delivery"] == "delivered")
        .count();
    let (owner, wrapper, escapee) =
        outside_session(&mut guard, &state, tmp.path(), "orphan", "true");
    signal(wrapper, libc::SIGKILL);
    assert!(wait_for(|| !owner.alive()));
    let reaped = c.call("reap", json!({"graceMs": 200}));
    let reaped = reaped["leases"].as_array().unwrap();
    assert_eq!(reaped.len(), 1, "{reaped:?}");
    assert_eq!(reaped[0]["result"], "closed");
    assert!(!escapee.pid.alive());
    c.call("verify", json!({"session": "b"}));
    // A prompt the adapter never answers (it does not read stdin): `b` is busy from here on.
    c.call(
        "send",
        json!({"session": "b", "line": r#"{"jsonrpc":"2.0","id":1,"method":"session/prompt","params":{"sessionId":"x","prompt":[]}}"#}),
    );
    assert!(wait_daemon(&mut c, |c| session_status(c, "b")
        .is_some_and(|s| s["busy"] == true)));
    let leases = c.call("leases", json!({}));
    let b = session_status(&mut c, "b").unwrap();

    let text = scrape(
        &addr,
        Some("application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"),
    );
    assert!(
        text.ends_with("# EOF\n"),
        "OpenMetrics when asked for: {text}"
    );
    let m = samples(&text);
    // Requests so far: status 1 + 2 (session_status) + the waits' statuses, so count the ones
    // the workload made with a fixed number: ensure 2, close 1, reap 1, verify 1, leases 1.
    for (op, n) in [
        ("ensure", 3),
        ("close", 2),
        ("reap", 1),
        ("verify", 1),
        ("leases", 1),
        ("send", 1),
    ] {
        assert_eq!(
            get(
                &m,
                &format!("leash_request_duration_seconds_count{{op=\"{op}\"}}")
            ),
            n as f64,
            "{op}:\n{text}"
        );
    }
    assert_eq!(get(&m, "leash_wrapper_starts_total"), 3.0, "{text}");
    assert_eq!(
        get(&m, "leash_closes_total{result=\"closed\"}"),
        2.0,
        "{text}"
    );
    // Refused signals, by reason: exactly the close replies' refusals (the foreign-uid child).
    if is_root() {
        assert_eq!(refused_permission, 1, "{closed_f}");
    }
    assert_eq!(
        get(&m, "leash_signals_refused_total{reason=\"permission\"}"),
        refused_permission as f64,
        "{text}"
    );
    // Every refusal of the workload's replies is counted once, under its reason (the reap may
    // also meet a zombie: `already_dead`).
    let refused_total: f64 = m
        .iter()
        .filter(|(k, _)| k.starts_with("leash_signals_refused_total{"))
        .map(|(_, v)| v)
        .sum();
    let refused_in_replies = [&closed[0], &closed_f[0], &reaped[0]]
        .iter()
        .map(|o| o["refused"].as_array().unwrap().len())
        .sum::<usize>();
    assert_eq!(
        refused_total, refused_in_replies as f64,
        "{closed}\n{closed_f}\n{reaped:?}\n{text}"
    );
    assert_eq!(
        get(&m, "leash_signals_refused_total{reason=\"other\"}"),
        0.0,
        "every refusal has a reason label: {text}"
    );
    assert_eq!(
        get(&m, "leash_reaps_total{result=\"closed\"}"),
        1.0,
        "{text}"
    );
    // The reap's escapees: every process the orphan's reap signalled (its wrapper was gone, so
    // all of them are outside its tree), the trap script among them.
    let reap_pids: std::collections::BTreeSet<i64> = reaped[0]["signals"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["delivery"] == "delivered")
        .map(|s| s["pid"].as_i64().unwrap())
        .collect();
    assert!(reap_pids.contains(&(escapee.pid.pid as i64)), "{reaped:?}");
    assert_eq!(
        get(&m, "leash_escapees_killed_total"),
        reap_pids.len() as f64,
        "{reaped:?}\n{text}"
    );
    let term_metric: f64 = m
        .iter()
        .filter(|(k, _)| k.starts_with("leash_signals_sent_total{signal=\"SIGTERM\""))
        .map(|(_, v)| v)
        .sum();
    let reap_terms = reaped[0]["signals"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["signal"] == "SIGTERM" && s["delivery"] == "delivered")
        .count();
    assert!(reap_terms >= 1, "the escapee traps SIGTERM: {reaped:?}");
    assert_eq!(
        term_metric,
        (term_sent + term_sent_f + reap_terms) as f64,
        "{text}"
    );
    let open = leases
        .as_array()
        .unwrap()
        .iter()
        .filter(|l| l["state"] == "open")
        .count();
    assert_eq!(
        get(&m, "leash_leases{state=\"open\"}"),
        open as f64,
        "{text}"
    );
    assert_eq!(get(&m, "leash_leases{state=\"closed\"}"), 3.0, "{text}");
    assert_eq!(
        get(&m, "leash_sessions{phase=\"running\",busy=\"true\"}"),
        1.0,
        "{text}"
    );
    assert_eq!(
        get(&m, "leash_sessions{phase=\"running\",busy=\"false\"}"),
        0.0,
        "{text}"
    );
    assert_eq!(
        get(&m, "leash_replay_buffer_bytes{session=\"b\"}"),
        b["bufferedBytes"].as_f64().unwrap(),
        "{text}"
    );
    assert!(
        get(&m, "leash_session_rss_bytes{session=\"b\"}") > 0.0,
        "{text}"
    );
    assert!(
        m.contains_key("leash_session_cpu_seconds{session=\"b\"}"),
        "{text}"
    );
    assert!(
        !m.contains_key("leash_session_rss_bytes{session=\"a\"}"),
        "a closed session's gauges are dropped: {text}"
    );
    assert!(
        m.contains_key("leash_startup_reap_duration_seconds"),
        "{text}"
    );

    // The same numbers over the socket.
    let op = c.call("metrics", json!({}));
    let op_text = op["text"].as_str().unwrap();
    assert!(
        op_text.contains("leash_wrapper_starts_total 3"),
        "{op_text}"
    );
    assert_eq!(c.error_code("metrics", json!({"x": 1})), "bad_request");

    // promtool reads the classic text format, which a scrape that does not ask for OpenMetrics
    // gets: the same samples.
    let classic = scrape(&addr, None);
    assert!(
        classic.contains("# TYPE leash_wrapper_starts_total counter"),
        "{classic}"
    );
    assert_eq!(
        get(&samples(&classic), "leash_wrapper_starts_total"),
        3.0,
        "{classic}"
    );
    let text = classic;
    match apt::unpacked("promtool", "prometheus") {
        Ok(promtool) => {
            let mut p = std::process::Command::new(promtool)
                .args(["check", "metrics"])
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap();
            p.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
            let out = p.wait_with_output().unwrap();
            assert!(
                out.status.success(),
                "promtool check metrics: {}{}\n{text}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Err(why) => eprintln!("promtool not checked: {why}"),
    }
    let _: Value = status;
}

#[test]
fn metrics_are_off_by_default() {
    let tmp = TempDir::new("metrics-off");
    let state = tmp.join("state");
    let d = Daemon::start(&state, &[]);
    let mut c = d.connect();
    let status = c.call("status", json!({}));
    assert_eq!(status["daemon"]["metrics"], Value::Null);
    // The op still answers: it needs no TCP.
    let op = c.call("metrics", json!({}));
    assert!(op["text"].as_str().unwrap().ends_with("# EOF\n"));
}

#[test]
fn a_taken_metrics_address_refuses_the_start() {
    let tmp = TempDir::new("metrics-taken");
    let state = tmp.join("state");
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let out = serve_once(&state, &["--metrics", &addr]);
    assert_eq!(out.code, Some(3), "{}", out.stderr);
    assert!(
        out.stderr.contains("cannot serve metrics"),
        "{}",
        out.stderr
    );
    let bad = serve_once(&state, &["--metrics", "localhost"]);
    assert_eq!(bad.code, Some(2), "{}", bad.stderr);
}
