//! What a lease says about how its session ended, with real `leash
//! exec` runs: an adapter that cannot be started exits 127 (not found) or 126 (not executable),
//! told as a plain line or leash's JSON error line, and its lease is `ended` with the reason; an
//! adapter that exits on its own (0 or 3) leaves its lease `ended` with that status; only a
//! wrapper that vanished without a report (SIGKILL) leaves a `lost` lease.
mod common;
use common::*;
use leash_core::kind::Kind;

fn only_lease(state: &std::path::Path, session: &str) -> serde_json::Value {
    let mut l = lease_of(state, session);
    // The wrapper's report is folded in by the next command that reads the leases; poll until
    // the row is settled (the wrapper writes its report just before it exits).
    assert!(
        wait_for(|| {
            l = lease_of(state, session);
            l["state"] != "open"
        }),
        "lease of {session} never settled: {l}"
    );
    l
}

#[test]
fn a_missing_adapter_exits_127_and_its_lease_says_why() {
    let tmp = TempDir::new("missing-adapter");
    let state = tmp.join("state");
    let out = run(
        &state,
        &["exec", "--session", "m", "--", "leash-test-no-such-adapter"],
    );
    assert_eq!(out.code, Some(127), "{}", out.stderr);
    assert!(
        out.stdout.is_empty(),
        "stdout is the adapter's: {}",
        out.stdout
    );
    assert!(
        out.stderr.contains(
            "the adapter could not be started: leash-test-no-such-adapter: not found on PATH"
        ),
        "{}",
        out.stderr
    );
    let l = only_lease(&state, "m");
    assert_eq!(l["state"], "ended", "{l}");
    assert_eq!(l["exitStatus"], 127, "{l}");
    let reason = l["stateReason"].as_str().unwrap();
    assert!(
        reason
            .starts_with("the adapter could not be started: leash-test-no-such-adapter: not found"),
        "{l}"
    );
    // The text view says the same.
    let text = run(&state, &["leases"]);
    assert!(text.stdout.contains("ended"), "{}", text.stdout);
    assert!(text.stdout.contains("not found on PATH"), "{}", text.stdout);
}

#[test]
fn json_errors_cover_an_adapter_that_cannot_be_started() {
    let tmp = TempDir::new("json-adapter");
    let state = tmp.join("state");
    // A file without execute permission (root too is refused: no x bit at all).
    let file = tmp.join("not-executable.sh");
    std::fs::write(&file, "#!/bin/sh\necho ran\n").unwrap();
    let cases = [
        (
            file.to_str().unwrap().to_string(),
            126,
            Kind::AdapterNotExecutable,
        ),
        (
            tmp.join("absent").to_str().unwrap().to_string(),
            127,
            Kind::AdapterNotFound,
        ),
    ];
    for (i, (cmd, code, kind)) in cases.iter().enumerate() {
        let session = format!("j{i}");
        let out = run(
            &state,
            &[
                "--error-format",
                "json",
                "exec",
                "--session",
                &session,
                "--",
                cmd,
            ],
        );
        assert_eq!(out.code, Some(*code), "{cmd}: {}", out.stderr);
        assert_eq!(kind.exit_code() as i32, *code);
        assert!(out.stdout.is_empty(), "{}", out.stdout);
        let last = out.stderr.trim_end().lines().last().unwrap_or_default();
        let v: serde_json::Value = serde_json::from_str(last)
            .unwrap_or_else(|e| panic!("{cmd}: not a JSON error line ({e}): {}", out.stderr));
        assert_eq!(v["error"]["code"], kind.cause(), "{v}");
        assert_eq!(v["error"]["exitCode"], *code, "{v}");
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(
            msg.starts_with(&format!("the adapter could not be started: {cmd}: ")),
            "{v}"
        );
        let l = only_lease(&state, &session);
        assert_eq!(l["state"], "ended", "{l}");
        assert_eq!(l["exitStatus"], *code, "{l}");
        assert!(l["stateReason"].as_str().unwrap().starts_with(msg), "{l}");
    }
}

#[test]
fn an_adapter_that_exits_on_its_own_ends_its_lease_not_loses_it() {
    let tmp = TempDir::new("ended");
    let state = tmp.join("state");
    for (session, status) in [("zero", 0), ("three", 3)] {
        let script = format!("exit {status}");
        let out = run(
            &state,
            &["exec", "--session", session, "--", "sh", "-c", &script],
        );
        assert_eq!(out.code, Some(status), "{}", out.stderr);
        let l = only_lease(&state, session);
        assert_eq!(l["state"], "ended", "{l}");
        assert_eq!(l["exitStatus"], status, "{l}");
        assert_eq!(
            l["stateReason"],
            format!("the adapter exited with status {status}"),
            "{l}"
        );
    }
    let st = run_json(&state, &["status", "--json"]);
    assert_eq!(st["leases"]["ended"], 2, "{st}");
    assert_eq!(st["leases"]["lost"], 0, "{st}");
    // The filter knows the state.
    let ended = run_json(&state, &["leases", "--state", "ended", "--json"]);
    assert_eq!(ended.as_array().unwrap().len(), 2, "{ended}");
}

#[test]
fn a_wrapper_killed_without_a_report_leaves_its_lease_lost() {
    let tmp = TempDir::new("lost");
    let state = tmp.join("state");
    let (id, _) = dead_session(&state, "k");
    let out = run(&state, &["close", "--json", &id]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let l = lease_of(&state, "k");
    assert_eq!(l["state"], "lost", "{l}");
}
