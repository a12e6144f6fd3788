//! The credential scrub, live: an adapter that prints its environment shows
//! exactly what each mode lets through, through `leash exec` (`--unset-env`, `--clear-env`,
//! `--keep-env`) and through the daemon's `ensure` (`unsetEnv`, `clearEnv`, `keepEnv`, and the
//! default scrub of the provider credentials from the daemon's own environment). The lease
//! markers always survive; a bad name is refused at the edge and nothing starts.
mod common;
mod daemon_support;
use common::*;
use daemon_support::*;
use serde_json::json;
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Stdio;

const MARKERS: [&str; 2] = ["OPENCLAW_ACPX_LEASE_ID", "OPENCLAW_GATEWAY_INSTANCE_ID"];

/// `NAME=value` lines (as `env` prints them, or `/proc/self/environ` split on NUL) as a map.
fn parse_env(text: &str) -> BTreeMap<String, String> {
    text.split(['\n', '\0'])
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// `leash exec FLAGS -- /bin/cat /proc/self/environ` with `env` added to a clean copy of ours;
/// returns the adapter's environment (its stdout) and the exit status.
fn exec_env(
    state: &Path,
    flags: &[&str],
    env: &[(&str, &str)],
) -> (BTreeMap<String, String>, Output) {
    let out = leash(state)
        .arg("exec")
        .args(flags)
        .args(["--", "/bin/cat", "/proc/self/environ"])
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let out = captured(out);
    (parse_env(&out.stdout), out)
}

fn captured(out: std::process::Output) -> Output {
    use std::os::unix::process::ExitStatusExt;
    Output {
        code: out.status.code(),
        signal: out.status.signal(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

fn keys(m: &BTreeMap<String, String>) -> Vec<&str> {
    m.keys().map(String::as_str).collect()
}

#[test]
fn leash_exec_removes_what_it_is_told_and_keeps_the_markers() {
    let tmp = TempDir::new("scrub-exec");
    let state = tmp.join("state");
    let secrets = [("SCRUB_A", "a-secret"), ("SCRUB_B", "b-value")];

    // No flags: the caller's environment as given (it composed it), markers added.
    let (env, out) = exec_env(&state, &[], &secrets);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert_eq!(env["SCRUB_A"], "a-secret");
    assert_eq!(env["SCRUB_B"], "b-value");
    for m in MARKERS {
        assert!(env.contains_key(m), "{m} missing: {env:?}");
    }

    // --unset-env: exactly those names go, everything else stays.
    let (all, _) = exec_env(&state, &[], &secrets);
    let (env, out) = exec_env(
        &state,
        &["--unset-env", "SCRUB_A", "--unset-env", "HOME"],
        &secrets,
    );
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let mut want: Vec<&str> = keys(&all)
        .into_iter()
        .filter(|k| !["SCRUB_A", "HOME"].contains(k))
        .collect();
    want.sort();
    assert_eq!(keys(&env), want);
    // A marker named in --unset-env still reaches the adapter (set after the scrub).
    let (env, _) = exec_env(&state, &["--unset-env", MARKERS[0]], &secrets);
    assert!(env.contains_key(MARKERS[0]), "{env:?}");

    // --clear-env --keep-env: nothing but the kept names and the markers.
    let (env, out) = exec_env(
        &state,
        &[
            "--clear-env",
            "--keep-env",
            "SCRUB_B",
            "--keep-env",
            "NOT_SET_ANYWHERE",
        ],
        &secrets,
    );
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let mut want = vec!["SCRUB_B", MARKERS[0], MARKERS[1]];
    want.sort();
    assert_eq!(keys(&env), want, "{env:?}");
    assert_eq!(env["SCRUB_B"], "b-value");
    // The markers are this lease's.
    let leases = leases(&state);
    let newest = leases.last().unwrap();
    assert_eq!(env[MARKERS[0]], newest["leaseId"].as_str().unwrap());
    let (env, _) = exec_env(&state, &["--clear-env"], &secrets);
    let mut want = vec![MARKERS[0], MARKERS[1]];
    want.sort();
    assert_eq!(keys(&env), want, "{env:?}");
}

#[test]
fn leash_exec_refuses_bad_names_and_starts_nothing() {
    let tmp = TempDir::new("scrub-bad");
    let state = tmp.join("state");
    init_state_root(&state); // one lease, of the session "init"
    let marker = tmp.join("ran");
    for flags in [
        vec!["--unset-env", "A=B"],
        vec!["--unset-env", ""],
        vec!["--clear-env", "--keep-env", "A=B"],
        vec!["--clear-env", "--keep-env", ""],
        vec!["--keep-env", "PATH"],
        vec!["--clear-env", "--unset-env", "PATH"],
    ] {
        let out = leash(&state)
            .arg("exec")
            .args(&flags)
            .args(["--", "/bin/sh", "-c"])
            .arg(format!("touch {}", marker.display()))
            .output()
            .unwrap();
        let out = captured(out);
        assert_ne!(out.code, Some(0), "{flags:?} was accepted");
        assert!(!out.stderr.trim().is_empty(), "{flags:?}: no message");
        assert!(
            !out.stderr.contains("panicked"),
            "{flags:?}: {}",
            out.stderr
        );
        assert!(!marker.exists(), "{flags:?} ran the command");
        assert_eq!(leases(&state).len(), 1, "{flags:?} recorded a lease");
    }
    // The message names the problem, and a bad name touches nothing: not even a state root.
    let fresh = tmp.join("fresh");
    let out = captured(
        leash(&fresh)
            .args(["exec", "--unset-env", "A=B", "--", "/bin/true"])
            .output()
            .unwrap(),
    );
    assert_eq!(out.code, Some(125), "{}", out.stderr);
    assert!(
        out.stderr.contains("'A=B'")
            && out.stderr.contains("--unset-env")
            && out.stderr.contains("'=' or NUL"),
        "{}",
        out.stderr
    );
    assert!(!fresh.exists(), "a refused exec created a state root");
}

/// The environment an adapter of the daemon printed into `<session>.env`, then it waits on stdin.
fn ensure_env(
    c: &mut Conn,
    dir: &Path,
    session: &str,
    extra: serde_json::Value,
) -> BTreeMap<String, String> {
    let file = dir.join(format!("{session}.env"));
    // The shell's own initial environment (`/proc/$$/environ`): what the wrapper handed it,
    // before the shell exports anything (PWD) to the programs it runs.
    let script = format!(
        "/bin/cat /proc/$$/environ > {f}.tmp; /bin/mv {f}.tmp {f}; exec /bin/cat",
        f = file.display()
    );
    let mut req = json!({"session": session, "argv": ["/bin/sh", "-c", script], "graceMs": 300});
    req.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    c.call("ensure", req);
    assert!(wait_for(|| file.exists()), "{session} printed nothing");
    parse_env(&std::fs::read_to_string(&file).unwrap())
}

#[test]
fn the_daemon_scrubs_provider_credentials_unless_the_ensure_keeps_them() {
    let tmp = TempDir::new("scrub-daemon");
    let state = tmp.join("state");
    let daemon = Daemon::start_with_env(
        &state,
        &[],
        "info",
        &[
            ("ANTHROPIC_API_KEY", "sk-ant-daemon"),
            ("OPENAI_API_KEY", "sk-oai-daemon"),
            ("DAEMON_SETTING", "plain"),
        ],
    );
    let mut c = daemon.connect();
    let dir = tmp.path();

    // The default: the daemon's environment minus the provider credentials.
    let env = ensure_env(&mut c, dir, "default", json!({}));
    assert!(!env.contains_key("ANTHROPIC_API_KEY"), "{env:?}");
    assert!(!env.contains_key("OPENAI_API_KEY"), "{env:?}");
    assert_eq!(env["DAEMON_SETTING"], "plain");
    for m in MARKERS {
        assert!(env.contains_key(m), "{m} missing: {env:?}");
    }
    // keepEnv spares one; env sets one (which passes whatever the scrub says).
    let env = ensure_env(
        &mut c,
        dir,
        "kept",
        json!({"keepEnv": ["ANTHROPIC_API_KEY"], "env": {"OPENAI_API_KEY": "sk-oai-session"}}),
    );
    assert_eq!(env["ANTHROPIC_API_KEY"], "sk-ant-daemon");
    assert_eq!(env["OPENAI_API_KEY"], "sk-oai-session");
    // unsetEnv removes more.
    let env = ensure_env(
        &mut c,
        dir,
        "unset",
        json!({"unsetEnv": ["DAEMON_SETTING"]}),
    );
    assert!(!env.contains_key("DAEMON_SETTING"), "{env:?}");
    assert!(env.contains_key("PATH"), "{env:?}");
    // clearEnv: exactly keepEnv, env and the markers.
    let env = ensure_env(
        &mut c,
        dir,
        "clear",
        json!({"clearEnv": true, "keepEnv": ["DAEMON_SETTING"], "env": {"SESSION_ONLY": "1"}}),
    );
    let mut want = vec!["DAEMON_SETTING", "SESSION_ONLY", MARKERS[0], MARKERS[1]];
    want.sort();
    assert_eq!(keys(&env), want, "{env:?}");
    let lease = session_status(&mut c, "clear").unwrap()["leaseId"].clone();
    assert_eq!(env[MARKERS[0]], lease.as_str().unwrap());

    // Bad names: bad_request at the edge, no lease, no process.
    for (i, bad) in [
        json!({"unsetEnv": ["A=B"]}),
        json!({"unsetEnv": [""]}),
        json!({"keepEnv": ["A\u{0}B"]}),
        json!({"clearEnv": true, "unsetEnv": ["PATH"]}),
        json!({"unsetEnv": ["X"], "keepEnv": ["X"]}),
        json!({"unsetEnv": ["X"], "env": {"X": "1"}}),
        json!({"unsetEnv": "PATH"}),
    ]
    .into_iter()
    .enumerate()
    {
        let key = format!("bad-{i}");
        let mut req = json!({"session": key, "argv": ["/bin/cat"]});
        req.as_object_mut()
            .unwrap()
            .extend(bad.as_object().unwrap().clone());
        let r = c.request("ensure", req);
        assert_eq!(r["error"]["code"], "bad_request", "{bad}: {r}");
        assert!(session_status(&mut c, &key).is_none(), "{bad} started");
    }
    let rows = c.call("leases", json!({}));
    assert!(
        rows.as_array()
            .unwrap()
            .iter()
            .all(|l| !l["sessionKey"].as_str().unwrap().starts_with("bad-")),
        "{rows}"
    );
}
