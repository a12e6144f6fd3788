//! What the CLI says when something is off: a reader that went away ends a command quietly
//! (no panic, no backtrace), a size or CPU count names what is wrong with it, a refusal says
//! "nothing started" once, and a `leash serve` that cannot start leaves no half-made state root.
mod common;
mod daemon_support;
use common::*;
use daemon_support::Daemon;
use std::os::unix::process::ExitStatusExt;
use std::process::Stdio;

/// Runs leash with stdout a pipe whose reader is already gone: every write meets EPIPE.
fn run_into_closed_pipe(
    state: &std::path::Path,
    args: &[&str],
) -> (std::process::ExitStatus, String) {
    let (read, write) = nix::unistd::pipe().unwrap();
    drop(read);
    let out = leash(state)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::from(write))
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    (
        out.status,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `leash close … | head -2` panicked with "Broken pipe" and a backtrace. Every command that
/// writes to stdout now ends as SIGPIPE ends other tools: killed by SIGPIPE, nothing on stderr.
#[test]
fn a_reader_that_went_away_ends_every_command_quietly() {
    let tmp = TempDir::new("epipe");
    let state = tmp.join("state");
    init_state_root(&state);
    let mut guard = Guard::new();
    let (c1, _) = exec_trap(&mut guard, &state, tmp.path(), "c1", &["--grace-ms", "100"]);
    let (c2, _) = exec_trap(&mut guard, &state, tmp.path(), "c2", &["--grace-ms", "100"]);
    for args in [
        &["leases"][..],
        &["leases", "--json"],
        &["close", "--session", "c1"],
        &["close", "--session", "c2", "--json"],
        &["reap", "--dry-run"],
        &["status"],
        &["sessions", "list", "--as", "init"],
        &["completions", "bash"],
        &["man"],
    ] {
        let (status, stderr) = run_into_closed_pipe(&state, args);
        assert_eq!(
            status.signal(),
            Some(libc::SIGPIPE),
            "{args:?}: {status:?}, stderr: {stderr}"
        );
        assert!(stderr.is_empty(), "{args:?} said: {stderr}");
    }
    // `leash mcp` whose client closed stdout: the client is gone, exit 0, nothing said.
    let (read, write) = nix::unistd::pipe().unwrap();
    drop(read);
    let mut mcp = leash(&state)
        .args(["mcp", "--as", "init"])
        .stdin(Stdio::piped())
        .stdout(Stdio::from(write))
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(
        mcp.stdin.as_mut().unwrap(),
        b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}\n",
    )
    .unwrap();
    let out = mcp.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{:?}", out.status);
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The closes finished their work before they wrote (and died of the pipe).
    assert!(wait_for(|| !c1.alive() && !c2.alive()));
    assert_eq!(lease_of(&state, "c1")["state"], "closed");
    assert_eq!(lease_of(&state, "c2")["state"], "closed");
}

#[test]
fn sizes_and_cpus_are_refused_for_what_is_wrong_with_them() {
    let tmp = TempDir::new("limits-msg");
    let state = tmp.join("state");
    // A decimal size with a unit is a size: what refuses this exec is containment being off,
    // said once.
    let out = run(
        &state,
        &[
            "exec",
            "--containment",
            "off",
            "--memory-max",
            "1.5G",
            "--",
            "true",
        ],
    );
    assert_eq!(out.code, Some(125), "{}", out.stderr);
    assert!(!out.stderr.contains("unknown unit"), "{}", out.stderr);
    assert!(out.stderr.contains("containment is off"), "{}", out.stderr);
    assert_eq!(
        out.stderr.matches("nothing started").count(),
        1,
        "{}",
        out.stderr
    );
    let out = run(
        &state,
        &["exec", "--cpu-max", "1000000000000", "--", "true"],
    );
    assert_eq!(out.code, Some(125), "{}", out.stderr);
    assert!(out.stderr.contains("at most 4096 CPUs"), "{}", out.stderr);
    assert!(!out.stderr.contains("more than 0"), "{}", out.stderr);
    let out = run(&state, &["exec", "--memory-max", "1.5", "--", "true"]);
    assert_eq!(out.code, Some(125), "{}", out.stderr);
    assert!(out.stderr.contains("fraction of a byte"), "{}", out.stderr);
}

/// A busy `--metrics` port fails the start, and the state root the start made is gone again
/// (lock file, `wrappers/`, `run/`, the directories); a root that existed before is kept.
#[test]
fn a_serve_that_cannot_start_leaves_no_half_made_state_root() {
    let tmp = TempDir::new("serve-busy-port");
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = busy.local_addr().unwrap().to_string();
    let state = tmp.join("new/state");
    let out = run(&state, &["serve", "--metrics", &addr]);
    assert_ne!(out.code, Some(0), "{}", out.stderr);
    assert!(out.stderr.contains("metrics"), "{}", out.stderr);
    assert!(
        !tmp.join("new").exists(),
        "a failed serve left {:?}",
        std::fs::read_dir(tmp.path())
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .collect::<Vec<_>>()
    );
    // An existing root is the operator's: kept as it was.
    let kept = tmp.join("kept");
    init_state_root(&kept);
    let out = run(&kept, &["serve", "--metrics", &addr]);
    assert_ne!(out.code, Some(0), "{}", out.stderr);
    assert!(kept.join("leash.db").exists());
    assert!(kept.join("wrappers").is_dir());
    drop(busy);
}

/// What a message names, said in the protocol's words and without Rust's `Some(…)`/`None`.
fn assert_plain_words(what: &str, text: &str) {
    for rust in ["Some(", "None", "Ok(", "Err("] {
        assert!(!text.contains(rust), "{what} shows Rust's {rust}: {text}");
    }
}

/// A refused `LEASH_RUNTIME_DIR` is called what it is (the reports directory LEASH_RUNTIME_DIR
/// names), never a "state directory", and the reason is said of it.
#[test]
fn a_refused_runtime_dir_is_named_as_the_reports_directory() {
    let tmp = TempDir::new("runtime-dir-words");
    let state = tmp.join("state");
    // A file where the directory should be, and a link to a directory.
    let file = tmp.join("a-file");
    std::fs::write(&file, "").unwrap();
    let link = tmp.join("a-link");
    std::os::unix::fs::symlink(tmp.path(), &link).unwrap();
    for (dir, why) in [
        (&file, "it exists but is not a directory"),
        (&link, "it is a symbolic link"),
    ] {
        let out = leash(&state)
            .env("LEASH_RUNTIME_DIR", dir)
            .args(["--no-daemon", "exec", "--session", "r", "--", "true"])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(125), "{err}");
        assert!(err.contains("LEASH_RUNTIME_DIR"), "{err}");
        assert!(err.contains(why), "{err}");
        assert!(!err.contains("state directory"), "{err}");
        assert_plain_words("the refusal", &err);
    }
}

/// A daemon that commits with other containment than the client's says which, in the protocol's
/// words (`containment on (cgroup root …)`), not with Rust's `Some("…")`: the reason the client
/// then commits directly, which `-vv` shows.
#[test]
fn a_containment_mismatch_is_said_in_the_protocols_words() {
    if !containment_available() {
        skip("containment is not available: the client cannot ask for it");
        return;
    }
    let tmp = TempDir::new("containment-words");
    let state = tmp.join("state");
    init_state_root(&state);
    let mut daemon = Daemon::start_with_env(&state, &[], "info", &[("LEASH_CONTAINMENT", "off")]);
    let out = leash(&state)
        .env("LEASH_CONTAINMENT", "on")
        .args(["-vv", "exec", "--session", "m", "--", "true"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    let line = err
        .lines()
        .find(|l| l.contains("the daemon resolved"))
        .unwrap_or_else(|| panic!("no reason for committing directly: {err}"));
    assert!(
        line.contains("the client asked for containment on (cgroup root /")
            && line.contains("the daemon resolved containment off (no cgroup root)"),
        "{line}"
    );
    assert_plain_words("the reason", line);
    assert!(daemon.terminate().success());
}
