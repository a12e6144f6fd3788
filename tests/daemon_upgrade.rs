//! The live upgrade, asked by the `upgrade` op and by SIGHUP: the daemon hands over to another
//! build of leash (a copy with another build marker, installed at its --upgrade-program path as
//! a package upgrade would), as the same process. The new program answers the op on the
//! connection that asked; the daemon keeps its pid, reports the new version and the handoff;
//! every session keeps its wrapper and its open lease; a stream picked up again from its last
//! seq goes on with no hole and no repeat; nothing is signalled; the counters go on.
mod common;
mod daemon_support;
mod upgrade_support;
use common::*;
use daemon_support::*;
use serde_json::json;
use std::path::Path;
use upgrade_support::*;

/// Installs the build at `from` as `to` (leash and leash-wrap): a new file renamed over the old.
fn install(from: &Path, to: &Path) {
    std::fs::create_dir_all(to.parent().unwrap()).unwrap();
    for name in ["leash", "leash-wrap"] {
        let dst = to.with_file_name(name);
        let tmp = to.with_file_name(format!("{name}.new"));
        std::fs::copy(from.with_file_name(name), &tmp).unwrap();
        std::fs::rename(&tmp, &dst).unwrap();
    }
}

#[test]
fn upgrades_by_op_and_by_sighup_keep_the_pid_every_session_and_every_line() {
    let tmp = TempDir::new("upgrade");
    let state = tmp.join("state");
    let signals = tmp.join("signals");
    let installed = tmp.join("installed").join("leash");
    let v2 = build_copy(&tmp.join("build-v2"), "v2");
    let v3 = build_copy(&tmp.join("build-v3"), "v3");
    let daemon = Daemon::start(&state, &["--upgrade-program", installed.to_str().unwrap()]);
    let mut c = daemon.connect();
    let mut leases = Vec::new();
    for key in ["a", "b", "c"] {
        leases.push(ensure_counter(&mut c, key, &signals)["leaseId"].clone());
    }
    let before = sessions(&mut c);
    let started_at = daemon_status(&mut c)["startedAt"].clone();
    let mut w = daemon.connect();
    let (id, _) = w.attach("a", 0);
    let (last, seq) = follow(&mut w, &id, 0, 0, 100);

    // By the op: the reply comes from the new program.
    install(&v2, &installed);
    let mut u = daemon.connect();
    let r = u.call("upgrade", json!({}));
    assert_eq!(r["from"], version(None), "{r}");
    assert_eq!(r["to"], version(Some("v2")), "{r}");
    assert_eq!(r["sessions"], 3);
    assert_eq!(r["handoffs"], 1);
    let mut c = daemon.connect();
    let d = daemon_status(&mut c);
    assert_eq!(d["pid"], daemon.pid.pid, "the same process");
    assert_eq!(d["version"], version(Some("v2")));
    assert_eq!(d["handoffs"], 1);
    assert_eq!(d["startedAt"], started_at, "the daemon's start is kept");
    let started = started_at.as_i64().expect("status gives startedAt");
    assert!(
        d["servingSince"]
            .as_i64()
            .expect("status gives servingSince")
            >= started,
        "{d}"
    );
    assert_eq!(d["lastHandoff"]["ok"], true, "{d}");
    assert_kept(&mut c, &before, &leases);
    // The exec closed the attach's connection: picked up again from the last seq seen.
    let mut w = daemon.connect();
    let (id, _) = w.attach("a", seq);
    let (last, seq) = follow(&mut w, &id, last, seq, 300);

    // By SIGHUP: nobody waits for an answer; status tells.
    install(&v3, &installed);
    signal(daemon.pid, libc::SIGHUP);
    let ok = wait_for(|| {
        std::os::unix::net::UnixStream::connect(&daemon.socket).is_ok() && {
            let mut c = daemon.connect();
            daemon_status(&mut c)["version"] == version(Some("v3"))
        }
    });
    assert!(ok, "SIGHUP did not upgrade:\n{}", daemon.log_text());
    let mut c = daemon.connect();
    let d = daemon_status(&mut c);
    assert_eq!(d["pid"], daemon.pid.pid);
    assert_eq!(d["handoffs"], 2);
    assert_kept(&mut c, &before, &leases);
    let mut w = daemon.connect();
    let (id, _) = w.attach("a", seq);
    follow(&mut w, &id, last, seq, 300);
    let metrics = c.call("metrics", json!({}))["text"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(metrics.contains("leash_handoffs_total 2"), "{metrics}");
    assert!(
        metrics.contains("leash_wrapper_starts_total 3"),
        "counted on: {metrics}"
    );
    assert!(
        metrics.contains("leash_handoff_duration_seconds "),
        "{metrics}"
    );
    assert_unsignalled(&signals);
    c.call(
        "close",
        json!({"sessions": ["a", "b", "c"], "graceMs": 500}),
    );
}
