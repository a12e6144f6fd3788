//! A failed upgrade ends no session. Each fault is staged for real: the upgrade program is
//! missing; it is not executable; it does not read this daemon's handoff format (a program that
//! answers the pre-flight check with other formats); or it panics during the takeover, after
//! the exec (a copy of leash whose build marker is named by LEASH_TEST_TAKEOVER_PANIC, see
//! tests/upgrade_support). In each case the upgrade is answered with the reason, the daemon
//! keeps its pid and its version, every session keeps its wrapper and its lease, the stream of
//! an attached session goes on without a hole or a repeat, and no adapter gets a signal.
mod common;
mod daemon_support;
mod upgrade_support;
use common::*;
use daemon_support::*;
use serde_json::json;
use std::path::{Path, PathBuf};
use upgrade_support::*;

/// Asks for an upgrade to the program `stage` makes and checks that it is refused with `why`
/// and that everything goes on under the program that ran before. `execs`: the fault comes after
/// the exec (the connections of before are dropped by it).
fn refused(
    tag: &str,
    stage: impl FnOnce(&Path) -> PathBuf,
    env: &[(&str, &str)],
    why: &[&str],
    execs: bool,
) {
    let tmp = TempDir::new(tag);
    let state = tmp.join("state");
    let signals = tmp.join("signals");
    let program = stage(tmp.path());
    let daemon = Daemon::start_with_env(
        &state,
        &["--upgrade-program", program.to_str().unwrap()],
        "info",
        env,
    );
    let mut c = daemon.connect();
    let mut leases = Vec::new();
    for key in ["a", "b"] {
        leases.push(ensure_counter(&mut c, key, &signals)["leaseId"].clone());
    }
    let before = sessions(&mut c);
    let mut w = daemon.connect();
    let (id, _) = w.attach("a", 0);
    let (last, seq) = follow(&mut w, &id, 0, 0, 50);

    let mut u = daemon.connect();
    let r = u.request("upgrade", json!({}));
    assert_eq!(r["ok"], false, "{r}");
    let message = r["error"]["message"].as_str().unwrap();
    for w in why {
        assert!(message.contains(w), "{message:?} should say {w:?}");
    }

    if !execs {
        // `leash serve --upgrade` says the same and exits non-zero.
        let out = leash(&state).args(["serve", "--upgrade"]).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{err}");
        assert!(err.contains(why[0]), "{err:?} should say {:?}", why[0]);
    }
    let mut c = daemon.connect();
    let d = daemon_status(&mut c);
    assert_eq!(d["pid"], daemon.pid.pid, "the same daemon");
    assert_eq!(d["version"], version(None), "the program of before serves");
    assert_eq!(d["handoffs"], 0);
    assert_eq!(d["lastHandoff"]["ok"], false, "{d}");
    assert!(d["servingSince"].as_i64() > Some(0), "{d}");
    assert!(d["lastHandoff"]["error"].is_string(), "{d}");
    assert_kept(&mut c, &before, &leases);
    // The stream goes on where it was: on the same attach when nothing was exec'd, on a new one
    // from the last seq seen when the exec dropped the connection.
    if execs {
        let mut w2 = daemon.connect();
        let (id2, _) = w2.attach("a", seq);
        follow(&mut w2, &id2, last, seq, 300);
    } else {
        follow(&mut w, &id, last, seq, 300);
    }
    assert_unsignalled(&signals);
    c.call("close", json!({"sessions": ["a", "b"], "graceMs": 500}));
}

#[test]
fn a_missing_program_is_refused_and_every_session_serves_on() {
    refused(
        "upgrade-missing",
        |dir| dir.join("not-installed").join("leash"),
        &[],
        &["not-installed/leash", "cannot be used", "serves on"],
        false,
    );
}

#[test]
fn a_program_that_is_not_executable_is_refused_and_every_session_serves_on() {
    refused(
        "upgrade-not-executable",
        |dir| {
            let p = build_copy(&dir.join("build"), "noexec");
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
            p
        },
        &[],
        &["not an executable file"],
        false,
    );
}

#[test]
fn a_program_that_does_not_read_the_handoff_format_is_refused_and_every_session_serves_on() {
    refused(
        "upgrade-format",
        |dir| {
            script(
                dir,
                "leash-of-another-format",
                "echo '{\"handoffFormats\":[99],\"version\":\"9.9.9\"}'",
            )
        },
        &[],
        &["reads handoff formats [99]", "not this daemon's 1"],
        false,
    );
}

#[test]
fn a_program_that_panics_while_taking_over_hands_back_and_every_session_serves_on() {
    refused(
        "upgrade-panic",
        |dir| build_copy(&dir.join("build"), "panics"),
        &[("LEASH_TEST_TAKEOVER_PANIC", "panics")],
        &[
            "the new program could not take over",
            "panicked",
            "LEASH_TEST_TAKEOVER_PANIC",
            "every session with it",
        ],
        true,
    );
}
