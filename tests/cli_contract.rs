//! The command-line contract: every failure of `leash exec` itself is 125 with a machine-readable
//! cause; session keys follow one rule everywhere; read-only commands never create a state root and
//! relative paths are made absolute; `--json` errors are JSON; `cancel --session` answers the same
//! with or without a daemon, in the CLI's words; durations are accepted for the grace; `--help` is
//! readable.
mod common;
mod daemon_support;
use common::*;
use daemon_support::*;
use serde_json::{json, Value};

/// The one JSON error line on stderr.
fn json_error(out: &Output) -> Value {
    let line = out.stderr.lines().last().unwrap_or_default();
    serde_json::from_str(line)
        .unwrap_or_else(|e| panic!("not a JSON error line ({e}): {}", out.stderr))
}

#[test]
fn every_failure_of_exec_is_125_with_a_machine_readable_cause() {
    let tmp = TempDir::new("exec125");
    let state = tmp.join("state");
    let mut guard = Guard::new();
    guard.child(
        leash(&state)
            .args(["exec", "--session", "live", "--", "sleep", "1000"])
            .stdin(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    assert!(wait_for(|| run(&state, &["leases", "--json"])
        .stdout
        .contains("\"live\"")));

    let cases: &[(&[&str], &str)] = &[
        (&["exec", "--session", "live", "--", "true"], "conflict"),
        (&["exec", "--no-such-flag", "--", "true"], "bad_request"),
        (&["exec", "--session", "a\nb", "--", "true"], "bad_request"),
        (&["exec", "--session", "", "--", "true"], "bad_request"),
        (&["exec", "--grace", "soon", "--", "true"], "bad_request"),
        (&["exec", "--owner-pid", "0", "--", "true"], "bad_request"),
        (&["exec", "--session", "x"], "bad_request"),
    ];
    for (args, cause) in cases {
        let out = run(&state, args);
        assert_eq!(out.code, Some(125), "{args:?}: {}", out.stderr);
        let mut with_json = vec!["--error-format", "json"];
        with_json.extend(args.iter().copied());
        let out = run(&state, &with_json);
        assert_eq!(out.code, Some(125), "{args:?}: {}", out.stderr);
        let e = json_error(&out);
        assert_eq!(e["error"]["code"], *cause, "{args:?}: {e}");
        assert_eq!(e["error"]["exitCode"], 125, "{e}");
        assert!(e["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()));
    }
    // Nothing of the refused keys was stored.
    let keys: Vec<String> = leases(&state)
        .iter()
        .map(|l| l["sessionKey"].as_str().unwrap_or("").to_string())
        .collect();
    assert!(
        keys.iter().all(|k| !k.contains('\n') && !k.is_empty()),
        "{keys:?}"
    );
}

#[test]
fn the_daemon_and_exec_refuse_the_same_keys() {
    let tmp = TempDir::new("keys");
    let state = tmp.join("state");
    let daemon = Daemon::start(&state, &[]);
    let mut c = daemon.connect();
    for key in ["a\nb", "tab\there", "esc\u{1b}[31m", ""] {
        let code = c.error_code("ensure", json!({"session": key, "argv": ["true"]}));
        assert_eq!(code, "bad_request", "{key:?}");
        let out = run(&state, &["exec", "--session", key, "--", "true"]);
        assert_eq!(out.code, Some(125), "exec accepted {key:?}");
    }
}

#[test]
fn read_only_commands_never_create_a_state_root() {
    let tmp = TempDir::new("readonly");
    let missing = tmp.join("typo");
    for args in [
        vec!["status"],
        vec!["leases"],
        vec!["reap", "--dry-run"],
        vec!["reap"],
        vec!["close", "--session", "s"],
        vec!["cancel", "--session", "s"],
        vec!["sessions", "list", "--as", "me"],
        vec!["legacy", "list"],
    ] {
        let out = run(&missing, &args);
        assert_eq!(out.code, Some(4), "{args:?}: {}", out.stderr);
        assert!(
            out.stderr.contains("does not exist"),
            "{args:?}: {}",
            out.stderr
        );
        assert!(!missing.exists(), "{args:?} created the state root");
    }
    // With --json the error is JSON too.
    let out = run(&missing, &["leases", "--json"]);
    assert_eq!(out.code, Some(4));
    assert_eq!(json_error(&out)["error"]["code"], "not_found");
    assert!(out.stdout.is_empty());
}

#[test]
fn a_relative_state_dir_is_made_absolute() {
    let tmp = TempDir::new("relative");
    let ok = std::process::Command::new(leash_bin())
        .current_dir(tmp.path())
        .env_remove("LEASH_STATE_DIR")
        .args([
            "--state-dir",
            "rel/state",
            "exec",
            "--session",
            "r",
            "--",
            "true",
        ])
        .status()
        .unwrap();
    assert!(ok.success());
    let out = std::process::Command::new(leash_bin())
        .current_dir(tmp.path())
        .env("LEASH_STATE_DIR", "rel/state")
        .args(["status", "--json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let dir = v["stateDir"].as_str().unwrap();
    assert!(dir.starts_with('/'), "{dir}");
    assert_eq!(
        std::path::PathBuf::from(dir),
        std::fs::canonicalize(tmp.join("rel/state")).unwrap()
    );
}

#[test]
fn cancel_by_session_answers_the_same_with_or_without_a_daemon() {
    let tmp = TempDir::new("cancel-same");
    let state = tmp.join("state");
    let daemon = Daemon::start(&state, &[]);
    let mut c = daemon.connect();
    // A daemon session that never spoke ACP: there is no ACP session to infer.
    ensure(&mut c, "k", &["cat"]);
    let with = run(&state, &["cancel", "--session", "k"]);
    assert_eq!(with.code, Some(0), "{}", with.stderr);
    assert!(!with.stderr.contains("acpSessionId"), "{}", with.stderr);
    assert!(with.stdout.contains("--acp-session"), "{}", with.stdout);
    let without = run(&state, &["--no-daemon", "cancel", "--session", "k"]);
    assert_eq!(without.code, Some(0), "{}", without.stderr);
    let kinds = event_kinds(&mut c, "k");
    assert_eq!(
        kinds.iter().filter(|k| *k == "cancel").count(),
        2,
        "both recorded the intent: {kinds:?}"
    );
    // Errors through the daemon name CLI flags, not wire fields.
    let out = run(
        &state,
        &["cancel", "--session", "k", "--acp-session", "x\ny"],
    );
    assert_eq!(out.code, Some(2));
    assert!(!out.stderr.contains("acpSessionId"), "{}", out.stderr);
}

#[test]
fn grace_takes_durations_and_milliseconds() {
    let tmp = TempDir::new("durations");
    let state = tmp.join("state");
    for (args, ms) in [
        (vec!["--grace", "1500ms"], 1500),
        (vec!["--grace", "2s"], 2000),
        (vec!["--grace-ms", "700"], 700),
        (vec![], 3000),
    ] {
        let key = format!("d{ms}");
        let mut full = vec!["exec", "--session", key.as_str()];
        full.extend(args.iter().copied());
        full.extend(["--", "true"]);
        assert_eq!(run(&state, &full).code, Some(0), "{args:?}");
        assert_eq!(lease_of(&state, &key)["graceMs"], ms, "{args:?}");
    }
    let out = run(
        &state,
        &["exec", "--grace", "1s", "--grace-ms", "5", "--", "true"],
    );
    assert_eq!(out.code, Some(125), "both given: {}", out.stderr);
}

#[test]
fn help_is_readable() {
    let tmp = TempDir::new("help");
    let state = tmp.join("state");
    let help = |args: &[&str]| {
        let out = run(&state, args);
        assert_eq!(out.code, Some(0), "{args:?}: {}", out.stderr);
        out.stdout
    };
    let top = help(&["--help"]);
    assert!(top.contains("Global options:"), "{top}");
    let close = help(&["close", "--help"]);
    assert!(
        close.contains("Global options:") && close.contains("--grace <DURATION>"),
        "{close}"
    );
    let cancel = help(&["cancel", "--help"]);
    assert!(cancel.contains("--session"), "{cancel}");
    assert!(help(&["cancel", "-h"]).contains("--session KEY"));
    let hist = help(&["sessions", "history", "--help"]);
    assert!(!hist.contains("<KEY> <KEY>"), "{hist}");
    assert!(hist.contains("<SESSION>"), "{hist}");
    let import = help(&["legacy", "import", "--help"]);
    assert!(
        import.contains("JSON") && import.contains("[FILE]") && import.contains("--acpx <DIR>"),
        "{import}"
    );
    let leases = help(&["leases", "--help"]);
    assert!(leases.contains("open, closing, closed, lost"), "{leases}");
    assert!(!state.exists(), "help created the state root");
}

#[test]
fn human_output_uses_the_words_of_the_json() {
    let tmp = TempDir::new("words");
    let state = tmp.join("state");
    let mut guard = Guard::new();
    guard.child(
        leash(&state)
            .args(["exec", "--session", "w", "--", "sleep", "1000"])
            .stdin(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    assert!(wait_for(|| lease_of_opt(&state, "w")));
    // The adapter is named as such once the wrapper reported it: wait for that, or a close that
    // comes first calls it a descendant (a race of the test, not of leash).
    assert!(wait_for(|| lease_of(&state, "w")["adapterPid"].is_i64()));
    let out = run(&state, &["close", "--session", "w", "--grace", "1s"]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    for debug in ["Closed", "Adapter", "Root", "Delivered", "start "] {
        assert!(!out.stdout.contains(debug), "{debug:?} in {}", out.stdout);
    }
    assert!(out.stdout.contains(": closed"), "{}", out.stdout);
    assert!(out.stdout.contains("(adapter, started "), "{}", out.stdout);
    let list = run(&state, &["leases"]);
    assert!(list.stdout.contains("AGE"), "{}", list.stdout);
}

fn lease_of_opt(state: &std::path::Path, key: &str) -> bool {
    run(state, &["leases", "--json"])
        .stdout
        .contains(&format!("\"{key}\""))
}

#[test]
fn exec_without_any_state_directory_is_125_too() {
    let out = std::process::Command::new(leash_bin())
        .env_remove("LEASH_STATE_DIR")
        .env_remove("XDG_STATE_HOME")
        .env_remove("HOME")
        .args(["--error-format", "json", "exec", "--", "true"])
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(125));
    let line = String::from_utf8_lossy(&out.stderr);
    let v: Value = serde_json::from_str(line.trim()).unwrap();
    assert_eq!(v["error"]["exitCode"], 125, "{v}");
}

#[test]
fn a_relative_socket_is_recorded_absolute() {
    // A relative --socket is made absolute before it is recorded in daemon.lock, so clients in
    // any other directory find the daemon (a guard: the daemon already did this).
    let tmp = TempDir::new("relsock");
    let state = tmp.join("state");
    let mut guard = Guard::new();
    let daemon = guard.child(
        std::process::Command::new(leash_bin())
            .current_dir(tmp.path())
            .env_remove("LEASH_STATE_DIR")
            .arg("--state-dir")
            .arg(&state)
            .args(["serve", "--socket", "rel.sock"])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    let pid = daemon.id();
    let lock = state.join("daemon.lock");
    let mut recorded = Value::Null;
    assert!(wait_for(|| {
        recorded = std::fs::read_to_string(&lock)
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok())
            .unwrap_or(Value::Null);
        recorded["pid"] == pid && tmp.join("rel.sock").exists()
    }));
    let socket = recorded["socket"].as_str().unwrap();
    assert!(socket.starts_with('/'), "{recorded}");
    // From this test's own working directory, the CLI finds the daemon.
    let v = run_json(&state, &["status", "--json"]);
    assert_eq!(v["daemon"]["pid"], pid, "{v}");
}
