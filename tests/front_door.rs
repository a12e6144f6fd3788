//! The front door (`leash`, src/front/main.rs): a small program without a C library
//! that takes `leash exec` to a daemon of its state root with `execArgv` (the daemon reads and
//! parses the process's own command line) and hands everything else to `leash-main`. Whatever
//! way a command line goes, its effect is the one `leash-main` gives it: the adapter gets the
//! same argv and environment byte for byte, every refusal and every usage error reads the same,
//! and a request the daemon took but did not answer ends with the wrapper of the lease committed
//! for this process, or with that lease recorded lost. Live: real daemons, real SQLite, real
//! wrappers, real cgroups where the host has them.
mod common;
mod daemon_support;
use common::*;
use daemon_support::Daemon;
use serde_json::{json, Value};
use std::ffi::OsString;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::Path;
use std::process::{Command, Stdio};

const FRONT_COMMITTED: &str = "execArgv: lease committed for the peer";
const FRONT_DIRECT: &str = "execArgv: leash-main runs this command line";

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
fn the_adapter_gets_the_same_argv_and_environment_through_every_door() {
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
    let mut through_front = 0;
    for (i, extra) in variants.iter().enumerate() {
        let mut seen = Vec::new();
        for door in ["front", "leash-main", "no daemon"] {
            let mut cmd = match door {
                "leash-main" => leash_main(&state),
                _ => leash(&state),
            };
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
        through_front += 1;
        let (_, (argv, env)) = &seen[0];
        assert_eq!(
            argv[..],
            args.iter()
                .map(|a| a.as_bytes().to_vec())
                .collect::<Vec<_>>()[..]
        );
        for (door, view) in &seen[1..] {
            assert_eq!(&view.0, argv, "variant {i}: argv, front door vs {door}");
            assert_eq!(
                &view.1, env,
                "variant {i}: environment, front door vs {door}"
            );
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
    assert_eq!(count(&log, FRONT_COMMITTED), through_front, "{log}");
    assert_eq!(
        count(&log, "exec: lease committed for the peer"),
        variants.len(),
        "leash-main's own requests: {log}"
    );
}

/// Command lines the daemon does not take (usage errors, help, a refusal, `--no-daemon`) give
/// what `leash-main` gives: the same exit code, stdout and stderr, with a daemon running; and
/// nothing of them is committed through `execArgv`.
#[test]
fn every_other_command_line_ends_as_leash_main_ends_it() {
    let tmp = TempDir::new("front-other");
    let state = tmp.join("state");
    let daemon = Daemon::start_logging(&state, &[], "debug");
    let gone = {
        let mut c = Command::new("true").spawn().unwrap();
        let pid = c.id();
        c.wait().unwrap();
        pid.to_string()
    };
    let lines: Vec<Vec<&str>> = vec![
        vec!["exec"],
        vec!["exec", "/bin/true"],
        vec!["exec", "--grace-ms", "soon", "--", "/bin/true"],
        vec!["exec", "--bogus", "--", "/bin/true"],
        vec!["exec", "--owner-pid", &gone, "--", "/bin/true"],
        vec![
            "--error-format",
            "json",
            "exec",
            "--owner-pid",
            &gone,
            "--",
            "/bin/true",
        ],
        vec!["exec", "--unset-env", "A=B", "--", "/bin/true"],
        vec!["exec", "--lease-id", "not-a-uuid", "--", "/bin/true"],
        vec!["exec", "--help"],
        vec!["--version"],
        vec!["status", "--json"],
        vec!["exec", "--no-daemon", "--session", "nd", "--", "/bin/true"],
    ];
    for line in &lines {
        let run = |mut c: Command| {
            let out = c.args(line).stdin(Stdio::null()).output().unwrap();
            (
                out.status.code(),
                String::from_utf8_lossy(&out.stdout).into_owned(),
                String::from_utf8_lossy(&out.stderr).into_owned(),
            )
        };
        let front = run(leash(&state));
        // As the front door runs it: under the name `leash` (clap's usage lines show it).
        let mut main = leash_main(&state);
        std::os::unix::process::CommandExt::arg0(&mut main, "leash");
        let main = run(main);
        if line[0] == "status" {
            // Counts change between the two runs; the shape and the code do not.
            assert_eq!(front.0, main.0, "{line:?}");
            continue;
        }
        assert_eq!(front, main, "{line:?}");
    }
    let log = daemon.log_text();
    assert_eq!(count(&log, FRONT_COMMITTED), 0, "{log}");
    assert!(
        count(&log, FRONT_DIRECT) >= 2,
        "the daemon said direct: {log}"
    );
}

/// `execArgv` commits only for a process whose own command line is `leash exec`: the test
/// process asking for itself gets `direct` and nothing is made; a request with anything but a
/// canonical lease id is refused at the edge.
#[test]
fn a_process_that_is_not_leash_exec_gets_nothing() {
    let tmp = TempDir::new("front-not-exec");
    let state = tmp.join("state");
    let daemon = Daemon::start_logging(&state, &[], "debug");
    let mut c = daemon.connect();
    let id = "0190b1f2-7c3a-7d4e-8f00-0000000000a1";
    let r = c.call("execArgv", json!({ "leaseId": id }));
    assert_eq!(r["outcome"], "direct", "{r}");
    for bad in [
        json!({ "leaseId": "0190B1F2-7C3A-7D4E-8F00-0000000000A1" }),
        json!({ "leaseId": id, "rootPid": 1 }),
        json!({ "leaseId": id, "argv": ["/bin/true"] }),
        json!({}),
    ] {
        assert_eq!(
            c.error_code("execArgv", bad.clone()),
            "bad_request",
            "{bad}"
        );
    }
    let rows = run_json(&state, &["--no-daemon", "leases", "--json"]);
    assert_eq!(rows.as_array().map(Vec::len), Some(0), "{rows}");
    drop(daemon);
}

/// The daemon committed the lease and named a wrapper that is gone when the front door execs it:
/// the front door hands over with the lease id it asked for, and `leash-main` finds that lease,
/// rooted at this very process, tries the wrapper, and records the lease lost (its cgroup
/// removed) with the reason, exit 125. Nothing runs, nothing is left.
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
    assert!(daemon.log_text().contains(FRONT_COMMITTED));
}

/// `leash` without `leash-main` beside it says how to install the pair, for `exec` with leash
/// exec's failure status.
#[test]
fn the_front_door_alone_says_what_is_missing() {
    let tmp = TempDir::new("front-alone");
    let bin = tmp.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let copied = Command::new("cp")
        .arg(leash_bin())
        .arg(&bin)
        .status()
        .unwrap();
    assert!(copied.success());
    for (args, code) in [
        (&["status"][..], 1),
        (&["exec", "--", "/bin/true"][..], 125),
    ] {
        let out = Command::new(bin.join("leash"))
            .env("LEASH_STATE_DIR", tmp.join("state"))
            .args(args)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "{args:?}: {err}");
        assert!(err.contains("leash-main"), "{err}");
        assert!(err.contains("cargo install --path ."), "{err}");
    }
}
