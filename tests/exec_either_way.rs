//! `leash exec` through a daemon of its state root (the `exec` op) and on its own
//! (`--no-daemon`) give the adapter the same argv and environment byte for byte; a daemon that
//! committed the lease for a wrapper that is then gone leaves the lease recorded lost; and the
//! daemon has no other way in for `leash exec` (`execArgv` is an unknown op). Live: real daemons,
//! real SQLite, real wrappers, real cgroups where the host has them.
mod common;
mod daemon_support;
use common::*;
use daemon_support::Daemon;
use serde_json::{json, Value};
use std::ffi::OsString;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::Path;
use std::process::{Command, Stdio};

const COMMITTED: &str = "exec: lease committed for the peer";

/// An adapter that records its own argv and environment, as the kernel gave them, to
/// `$1.argv` and `$1.env`.
fn recorder(dir: &Path) -> std::path::PathBuf {
    script(
        dir,
        "record.sh",
        "cat /proc/$$/cmdline > \"$1.argv\"\ncat /proc/$$/environ > \"$1.env\"",
    )
}

/// `NAME=value` entries of a NUL-separated environ, but the lease id (another per lease).
fn env_entries(raw: &[u8]) -> Vec<Vec<u8>> {
    raw.split(|&c| c == 0)
        .filter(|e| !e.is_empty() && !e.starts_with(b"OPENCLAW_ACPX_LEASE_ID="))
        .map(<[u8]>::to_vec)
        .collect()
}

fn count(log: &str, what: &str) -> usize {
    log.matches(what).count()
}

/// One adapter start through `cmd`; the adapter's argv (its own path aside) and environment.
fn adapter_view(
    cmd: &mut Command,
    dir: &Path,
    name: &str,
    args: &[OsString],
) -> (Vec<Vec<u8>>, Vec<Vec<u8>>) {
    let out_base = dir.join(name);
    let status = cmd
        .arg("--")
        .arg(recorder(dir))
        .arg(&out_base)
        .args(args)
        .stdin(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success(), "{name}: {status:?}");
    let argv = std::fs::read(out_base.with_extension("argv")).unwrap();
    let env = std::fs::read(out_base.with_extension("env")).unwrap();
    let argv = argv.strip_suffix(b"\0").unwrap_or(&argv);
    let argv: Vec<Vec<u8>> = argv.split(|&c| c == 0).map(<[u8]>::to_vec).collect();
    // sh's argv: "/bin/sh", the script, then ours (the base path differs by name).
    (argv[3..].to_vec(), env_entries(&env))
}

#[test]
fn the_adapter_gets_the_same_argv_and_environment_either_way() {
    let tmp = TempDir::new("front-same");
    let state = tmp.join("state");
    let daemon = Daemon::start_logging(&state, &[], "debug");
    let odd = OsString::from_vec(b"f\xffo".to_vec());
    let args: Vec<OsString> = vec![
        odd.clone(),
        "".into(),
        "--".into(),
        "two words".into(),
        "--state-dir".into(),
    ];
    let variants: [&[&str]; 3] = [
        &["--session", "plain"],
        &["--unset-env", "FRONT_SECRET", "--grace", "2s"],
        &[
            "--clear-env",
            "--keep-env",
            "PATH",
            "--keep-env",
            "FRONT_ODD",
            "--keep-env",
            "FRONT_ABSENT",
        ],
    ];
    for (i, extra) in variants.iter().enumerate() {
        let mut seen = Vec::new();
        for door in ["daemon", "no daemon"] {
            let mut cmd = leash(&state);
            cmd.env("FRONT_SECRET", "s3cret")
                .env("FRONT_ODD", &odd)
                .env("FRONT_EMPTY", "")
                .arg("exec");
            if door == "no daemon" {
                cmd.arg("--no-daemon");
            }
            // The sessions differ by door, so each lease is its own.
            let extra: Vec<String> = extra
                .iter()
                .map(|a| {
                    if *a == "plain" {
                        format!("plain-{door}")
                    } else {
                        a.to_string()
                    }
                })
                .collect();
            cmd.args(&extra);
            seen.push((
                door,
                adapter_view(&mut cmd, tmp.path(), &format!("v{i}-{door}"), &args),
            ));
        }
        let (_, (argv, env)) = &seen[0];
        assert_eq!(
            argv[..],
            args.iter()
                .map(|a| a.as_bytes().to_vec())
                .collect::<Vec<_>>()[..]
        );
        for (door, view) in &seen[1..] {
            assert_eq!(&view.0, argv, "variant {i}: argv, daemon vs {door}");
            assert_eq!(&view.1, env, "variant {i}: environment, daemon vs {door}");
        }
        let has = |name: &str| {
            env.iter()
                .any(|e| e.starts_with(format!("{name}=").as_bytes()))
        };
        match i {
            0 => assert!(has("FRONT_SECRET") && has("FRONT_EMPTY") && has("LEASH_CONTAINMENT")),
            1 => assert!(!has("FRONT_SECRET") && has("FRONT_ODD")),
            _ => {
                assert!(
                    has("PATH") && has("FRONT_ODD") && !has("FRONT_SECRET"),
                    "{env:?}"
                );
                assert!(
                    has("OPENCLAW_GATEWAY_INSTANCE_ID"),
                    "the markers always pass"
                );
            }
        }
        assert!(
            env.contains(&[b"FRONT_ODD=".as_slice(), odd.as_bytes()].concat()),
            "variant {i}: a value that is not UTF-8 passes as it is"
        );
    }
    let log = daemon.log_text();
    assert_eq!(count(&log, COMMITTED), variants.len(), "{log}");
}

/// `execArgv` (a lease for the caller's own command line, read from `/proc`) is no op of the
/// daemon: a client that sends it is told `unknown_op`, and nothing is made.
#[test]
fn exec_argv_is_an_unknown_op() {
    let tmp = TempDir::new("exec-argv-gone");
    let state = tmp.join("state");
    let daemon = Daemon::start_logging(&state, &[], "debug");
    let mut c = daemon.connect();
    let id = "0190b1f2-7c3a-7d4e-8f00-0000000000a1";
    assert_eq!(
        c.error_code("execArgv", json!({ "leaseId": id })),
        "unknown_op"
    );
    // The connection still serves known ops.
    c.call("ping", json!({}));
    let rows = run_json(&state, &["--no-daemon", "leases", "--json"]);
    assert_eq!(rows.as_array().map(Vec::len), Some(0), "{rows}");
    drop(daemon);
}

/// The daemon committed the lease and named a wrapper that is gone when `leash exec` execs it:
/// `leash exec` records the lease lost (its cgroup removed) with the reason, exit 125. Nothing
/// runs, nothing is left.
#[test]
fn a_wrapper_gone_after_the_commit_leaves_the_lease_lost_and_says_so() {
    let tmp = TempDir::new("front-gone");
    let state = tmp.join("state");
    let daemon = Daemon::start_with_env(
        &state,
        &[],
        "debug",
        &[("LEASH_TEST_EXEC_PAUSE", "before:5000")],
    );
    let mut guard = Guard::new();
    let child = guard.child(
        leash(&state)
            .args(["exec", "--session", "gone", "--", "sh", "-c", "echo ran"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let pid = child.id() as i32;
    assert!(
        wait_for(|| daemon.log_text().contains("exec: pausing")),
        "{}",
        daemon.log_text()
    );
    // Installed before the pause, removed during it: the daemon names it all the same.
    for e in std::fs::read_dir(state.join("wrappers")).unwrap().flatten() {
        std::fs::remove_file(e.path()).unwrap();
    }
    let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
    use std::io::Read;
    child
        .stdout
        .take()
        .unwrap()
        .read_to_end(&mut stdout)
        .unwrap();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_end(&mut stderr)
        .unwrap();
    let status = child.wait().unwrap();
    let err = String::from_utf8_lossy(&stderr);
    assert_eq!(status.code(), Some(125), "{err}");
    assert!(err.contains("cannot exec the wrapper"), "{err}");
    assert!(err.contains("recorded lost"), "{err}");
    assert!(stdout.is_empty(), "the adapter never ran");
    let rows = run_json(&state, &["--no-daemon", "leases", "--json"]);
    let rows = rows.as_array().unwrap();
    assert_eq!(rows.len(), 1, "one lease: {rows:?}");
    let l: &Value = &rows[0];
    assert_eq!(l["rootPid"], pid, "{l}");
    assert_eq!(l["state"], "lost", "{l}");
    if let Some(cg) = l["cgroupPath"].as_str() {
        assert!(!Path::new(cg).exists(), "its cgroup is gone: {l}");
    }
    assert!(daemon.log_text().contains(COMMITTED));
}
