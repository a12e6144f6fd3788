//! `leash exec` with a daemon serving the state root: the client sends what it resolved (the
//! `exec` op) and the daemon commits the lease on its warm connection, rooted at the peer of the
//! socket as the kernel says; without one, or with a daemon that cannot honour the request,
//! `leash exec` commits it itself; a refusal reads the same either way; and a daemon that dies
//! while a client waits leaves the client to decide by the lease id it chose. Live: real daemons,
//! real SQLite, real cgroups under the test binary's own root where it can make them.
mod common;
mod daemon_support;
use common::*;
use daemon_support::{Conn, Daemon};
use serde_json::{json, Value};
use std::path::Path;
use std::process::Stdio;

const DIRECT: &str = "exec: the client commits directly";

/// The daemon's log line for a lease it committed for a `leash exec`.
const COMMITTED: &str = "exec: lease committed for the peer";

/// An adapter that records its parent (the wrapper) and its cgroup, then exits.
fn recorder(dir: &Path) -> std::path::PathBuf {
    script(
        dir,
        "record.sh",
        &format!(
            "echo $PPID > '{0}/ppid'\ncat /proc/self/cgroup > '{0}/cgroup'\necho ran > '{0}/ran'",
            dir.display()
        ),
    )
}

/// The cgroup a process of the recorder was in, as a path under the cgroup2 mount.
fn recorded_cgroup(dir: &Path) -> Option<std::path::PathBuf> {
    let text = std::fs::read_to_string(dir.join("cgroup")).ok()?;
    let rel = text.lines().find_map(|l| l.strip_prefix("0::"))?;
    Some(cgroup2_mount()?.join(rel.trim_start_matches('/')))
}

#[test]
fn the_daemon_roots_the_lease_at_the_exec_process_and_its_cgroup() {
    let tmp = TempDir::new("exec-daemon-root");
    let state = tmp.join("state");
    let mut daemon = Daemon::start_logging(&state, &[], "debug");
    let adapter = recorder(tmp.path());
    let mut child = leash(&state)
        .args(["exec", "--session", "rooted", "--"])
        .arg(&adapter)
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id() as i32;
    let start = start_time(pid).expect("leash exec alive or a zombie");
    assert!(child.wait().unwrap().success());
    assert!(
        daemon.log_text().contains(COMMITTED),
        "{}",
        daemon.log_text()
    );
    let l = db_lease_of(&state, "rooted").expect("the lease row");
    assert_eq!(l["rootPid"], pid, "{l}");
    assert_eq!(l["rootStartTime"], start, "{l}");
    assert_eq!(l["ownerPid"], std::process::id(), "{l}");
    let wrapper: i32 = std::fs::read_to_string(tmp.join("ppid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert_eq!(wrapper, pid, "the wrapper kept leash exec's pid");
    match l["cgroupPath"].as_str() {
        Some(cg) => assert_eq!(
            recorded_cgroup(tmp.path()).as_deref(),
            Some(Path::new(cg)),
            "the adapter ran in the cgroup the daemon made: {l}"
        ),
        None => skip("exec_through_daemon: containment off, no cgroup to compare"),
    }
    assert!(daemon.terminate().success());
}

/// A client can name no pid: the root is the socket's peer. A request with a root pid is refused
/// at the edge; one whose owner is not the peer's parent is refused with `leash exec`'s own
/// words; a valid one is rooted at the peer (here the test process), never elsewhere.
#[test]
fn a_client_lying_about_pids_gets_nothing_rooted_at_another_process() {
    let tmp = TempDir::new("exec-daemon-lie");
    let state = tmp.join("state");
    // Containment off on both sides, so the hand-written request matches the daemon's.
    let daemon = Daemon::start_with_env(&state, &[], "debug", &[("LEASH_CONTAINMENT", "off")]);
    let out = leash(&state)
        .env("LEASH_CONTAINMENT", "off")
        .args(["exec", "--session", "first", "--", "/bin/true"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let wrapper = std::fs::read_dir(state.join("wrappers"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("leash-wrap-")
        })
        .expect("an installed wrapper");
    let mut guard = Guard::new();
    let stranger = guard.child(
        std::process::Command::new("sleep")
            .arg("600")
            .spawn()
            .unwrap(),
    );
    let stranger_pid = stranger.id() as i32;
    let ask = |lease: &str| {
        json!({
            "stateDir": state,
            "leaseId": lease,
            "session": format!("lie-{lease}"),
            "graceMs": 1000,
            "argv": ["/bin/true"],
            "wrapper": wrapper,
            "containment": "off",
        })
    };
    let mut c: Conn = daemon.connect();
    let mut forged = ask("0190b1f2-7c3a-7d4e-8f00-000000000001");
    forged["rootPid"] = json!(stranger_pid);
    assert_eq!(c.error_code("exec", forged), "bad_request");
    let mut other_owner = ask("0190b1f2-7c3a-7d4e-8f00-000000000002");
    other_owner["ownerPid"] = json!(stranger_pid);
    let r = c.request("exec", other_owner);
    assert_eq!(r["error"]["code"], "spawn_failed", "{r}");
    let msg = r["error"]["message"].as_str().unwrap();
    assert!(
        msg.starts_with(&format!("--owner-pid {stranger_pid} is not our parent")),
        "{msg}"
    );
    assert!(msg.ends_with("nothing started, nothing recorded"), "{msg}");
    let ok = c.call("exec", ask("0190b1f2-7c3a-7d4e-8f00-000000000003"));
    assert_eq!(ok["outcome"], "committed", "{ok}");
    assert_eq!(ok["rootPid"], std::process::id(), "{ok}");
    let all = db_leases(&state);
    for l in &all {
        assert_ne!(
            l["rootPid"], stranger_pid,
            "a lease rooted at a stranger: {l}"
        );
        assert_ne!(
            l["ownerPid"], stranger_pid,
            "a lease owned by a stranger: {l}"
        );
    }
    let lied: Vec<_> = all
        .iter()
        .filter(|l| l["sessionKey"].as_str().unwrap().starts_with("lie-"))
        .collect();
    assert_eq!(lied.len(), 1, "only the honest request committed: {all:?}");
    assert_eq!(lied[0]["rootPid"], std::process::id());
    assert_eq!(
        lied[0]["ownerStartTime"],
        start_time(ppid(std::process::id() as i32).unwrap()).unwrap()
    );
}

/// No daemon: committed directly. A daemon of another state root answering on this root's
/// socket path: not asked (this root's lock is not held), committed directly. A daemon of this
/// root whose containment differs from the client's: answers "direct", the client commits.
#[test]
fn exec_commits_directly_without_a_daemon_of_its_state_root() {
    let tmp = TempDir::new("exec-daemon-fallback");
    let a = tmp.join("a");
    let b = tmp.join("b");
    let run_true = |state: &Path, session: &str, containment: Option<&str>| {
        let mut c = leash(state);
        if let Some(m) = containment {
            c.env("LEASH_CONTAINMENT", m);
        }
        let out = c
            .args(["exec", "--session", session, "--", "/bin/true"])
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
    };
    run_true(&a, "alone", None);
    assert!(db_lease_of(&a, "alone").is_some());

    let a_socket = a.join("leash.sock");
    let other = Daemon::start_logging(&b, &["--socket", a_socket.to_str().unwrap()], "debug");
    run_true(&a, "beside-another", None);
    assert!(db_lease_of(&a, "beside-another").is_some());
    assert!(db_lease_of(&b, "beside-another").is_none());
    let log = other.log_text();
    assert!(
        !log.contains("lease committed") && !log.contains(DIRECT),
        "{log}"
    );
    drop(other);

    // Containment: the daemon off, the client on where this host can contain.
    let c = tmp.join("c");
    let d = Daemon::start_with_env(&c, &[], "debug", &[("LEASH_CONTAINMENT", "off")]);
    if containment_available() {
        run_true(&c, "other-containment", Some("on"));
        let l = db_lease_of(&c, "other-containment").unwrap();
        assert!(l["cgroupPath"].is_string(), "the client's containment: {l}");
        let log = d.log_text();
        assert!(
            log.contains(DIRECT) && !log.contains("lease committed"),
            "{log}"
        );
    } else {
        skip("exec_through_daemon: no containment here, the containment mismatch is not tried");
    }
    run_true(&c, "same-containment", Some("off"));
    assert!(d.log_text().contains(COMMITTED), "{}", d.log_text());
}

/// A second exec of a live session: the same exit code and the same words, text and JSON,
/// whether the daemon decided or `leash exec` itself.
#[test]
fn a_busy_session_is_refused_in_the_same_words_through_both_paths() {
    let tmp = TempDir::new("exec-daemon-busy");
    let direct = tmp.join("direct");
    let served = tmp.join("served");
    init_state_root(&served);
    let daemon = Daemon::start_logging(&served, &[], "debug");
    let mut guard = Guard::new();
    let lease = "0190b1f2-7c3a-7d4e-8f00-00000000b051";
    let refused = |state: &Path| -> Vec<(Option<i32>, String)> {
        [&[][..], &["--error-format", "json"][..]]
            .iter()
            .map(|extra| {
                let out = leash(state)
                    .args(*extra)
                    .args(["exec", "--session", "busy", "--", "/bin/true"])
                    .output()
                    .unwrap();
                (
                    out.status.code(),
                    String::from_utf8_lossy(&out.stderr).into_owned(),
                )
            })
            .collect()
    };
    let mut refusals = Vec::new();
    for state in [&direct, &served] {
        guard.child(
            leash(state)
                .args(["exec", "--session", "busy", "--lease-id", lease, "--"])
                .args(["sleep", "600"])
                .stdin(Stdio::null())
                .spawn()
                .unwrap(),
        );
        assert!(
            wait_for(|| db_lease_of(state, "busy").is_some_and(|l| l["state"] == "open")),
            "the first lease"
        );
        refusals.push((state == &served, refused(state)));
    }
    let first = &refusals[0].1;
    assert_eq!(first[0].0, Some(125), "{refusals:?}");
    assert!(
        first[0]
            .1
            .contains(&format!("session busy already has a live lease {lease}")),
        "{refusals:?}"
    );
    for (served, seen) in &refusals {
        assert_eq!(seen, first, "served {served}: {refusals:?}");
    }
    assert!(
        daemon.log_text().contains(COMMITTED),
        "{}",
        daemon.log_text()
    );
}

/// The daemon killed while a client waits for its answer: after the commit, the client finds
/// its row (its own pid and start time) and execs the wrapper under it; before the commit, it
/// finds none and commits directly. Either way the adapter runs under a lease rooted at it.
#[test]
fn a_client_outlives_a_daemon_killed_mid_request() {
    for at in ["after", "before"] {
        let tmp = TempDir::new(&format!("exec-daemon-killed-{at}"));
        let state = tmp.join("state");
        let pause = format!("{at}:60000");
        let mut daemon = Daemon::start_with_env(
            &state,
            &[],
            "info",
            &[("LEASH_TEST_EXEC_PAUSE", pause.as_str())],
        );
        let adapter = recorder(tmp.path());
        let mut guard = Guard::new();
        let child = guard.child(
            leash(&state)
                .args(["exec", "--session", "waits", "--"])
                .arg(&adapter)
                .stdin(Stdio::null())
                .spawn()
                .unwrap(),
        );
        let pid = child.id() as i32;
        let start = start_time(pid).unwrap();
        // The daemon holds the request where it was told to (its log says so), and for "after"
        // the row is committed.
        assert!(
            wait_for(|| daemon.log_text().contains("exec: pausing")),
            "{at}: the daemon never paused:\n{}",
            daemon.log_text()
        );
        if at.ends_with("after") {
            assert!(wait_for(|| db_lease_of(&state, "waits").is_some()), "{at}");
        } else {
            assert!(
                db_lease_of(&state, "waits").is_none(),
                "{at}: nothing committed yet"
            );
        }
        assert!(
            !tmp.join("ran").exists(),
            "{at}: the adapter waits for the lease"
        );
        daemon.kill9();
        let status = child.wait().unwrap();
        assert!(status.success(), "{at}: {status:?}");
        assert!(tmp.join("ran").exists(), "{at}: the adapter ran");
        let all: Vec<Value> = db_leases(&state)
            .into_iter()
            .filter(|l| l["sessionKey"] == "waits")
            .collect();
        assert_eq!(all.len(), 1, "{at}: one lease: {all:?}");
        assert_eq!(all[0]["rootPid"], pid, "{at}");
        assert_eq!(all[0]["rootStartTime"], start, "{at}");
        let wrapper: i32 = std::fs::read_to_string(tmp.join("ppid"))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert_eq!(wrapper, pid, "{at}");
        if let Some(cg) = all[0]["cgroupPath"].as_str() {
            assert_eq!(
                recorded_cgroup(tmp.path()).as_deref(),
                Some(Path::new(cg)),
                "{at}"
            );
        }
    }
}
