//! The CLI's shape as a new user meets it: a lease is named the same way by
//! every command (`LEASE`, `--lease ID` or `--session KEY`) and a command given none names all
//! three; `leash leases` prints session keys whole (they are pasted back into `--session`) and
//! keeps REASON short; `reap --dry-run` speaks words, each said once; `leash exec` without `--`
//! says to add it; `ps` quotes argv as a shell would; `leash man SUB` has leash's version in `.TH`.
mod common;
use common::*;
use std::process::Stdio;

/// A live session (`sleep 1000` under `sh -c`), its wrapper and the lease id.
fn live_session(
    state: &std::path::Path,
    guard: &mut Guard,
    key: &str,
    script: &str,
) -> (Pid, String) {
    let child = guard.child(
        leash(state)
            .args(["exec", "--session", key, "--", "sh", "-c", script])
            .stdin(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let wrapper = Pid::of(child.id() as i32).unwrap();
    let adapter = adapter_of(wrapper);
    guard.add(adapter);
    // The shell's children (so `ps` has the whole tree to show).
    assert!(wait_for(
        || children(adapter.pid).len() == 2 || !script.contains('&')
    ));
    for c in children(adapter.pid) {
        if let Some(p) = Pid::of(c) {
            guard.add(p);
        }
    }
    let id = lease_of(state, key)["leaseId"]
        .as_str()
        .unwrap()
        .to_string();
    (wrapper, id)
}

#[test]
fn every_command_names_a_lease_by_positional_or_flag_or_session() {
    let tmp = TempDir::new("shape-names");
    let state = tmp.join("state");
    let mut guard = Guard::new();
    let (_, id) = live_session(&state, &mut guard, "named", "sleep 1000");

    // verify: positional and flag give the same answer.
    let pos = run(&state, &["verify", "--json", &id]);
    let flag = run(&state, &["verify", "--json", "--lease", &id]);
    assert_eq!(pos.code, Some(0), "{}", pos.stderr);
    assert_eq!(flag.code, Some(0), "{}", flag.stderr);
    let answer = |o: &Output| -> serde_json::Value {
        serde_json::from_str::<serde_json::Value>(&o.stdout).unwrap()["leaseId"].clone()
    };
    assert_eq!(answer(&pos), answer(&flag));
    // cancel: both forms.
    for args in [
        vec!["cancel", "--json", id.as_str()],
        vec!["cancel", "--json", "--lease", id.as_str()],
    ] {
        let out = run(&state, &args);
        assert_eq!(out.code, Some(0), "{args:?}: {}", out.stderr);
    }
    // close: the flag form, which was refused.
    let out = run(
        &state,
        &["close", "--json", "--lease", &id, "--grace", "200ms"],
    );
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let v: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(v[0]["result"], "closed", "{v}");

    // Naming nothing: the error names every way to name a lease, --session included.
    for cmd in ["close", "verify", "cancel"] {
        let out = run(&state, &[cmd]);
        assert_eq!(out.code, Some(2), "{cmd}: {}", out.stderr);
        for form in ["LEASE", "--lease", "--session"] {
            assert!(out.stderr.contains(form), "{cmd}: {form}: {}", out.stderr);
        }
    }
    // Both a positional and --lease for one-lease commands: refused, nothing done.
    let out = run(&state, &["verify", &id, "--lease", &id]);
    assert_eq!(out.code, Some(2), "{}", out.stderr);
}

#[test]
fn leases_prints_session_keys_whole_and_keeps_the_reason_short() {
    let tmp = TempDir::new("shape-leases");
    let state = tmp.join("state");
    let mut guard = Guard::new();
    let key = "agent:main:acp:3f1c2a9e-5d7b-4c1a-9e2f-0123456789ab";
    let (_, id) = live_session(&state, &mut guard, key, "sleep 1000");
    let out = run(&state, &["leases"]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let row = out
        .stdout
        .lines()
        .find(|l| l.starts_with(&id))
        .unwrap_or_else(|| panic!("no row for {id}: {}", out.stdout));
    // Whole, and followed by the next column: it can be pasted back.
    let words: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(words[2], key, "{row}");
    assert!(!row.contains('…'), "{row}");
    // The header's SESSION column is as wide as the key.
    let header = out.stdout.lines().next().unwrap();
    assert_eq!(
        header
            .find("ROOT")
            .map(|i| i > header.find("SESSION").unwrap() + key.len()),
        Some(true),
        "{header}"
    );
    let pasted = run(&state, &["verify", "--session", words[2]]);
    assert_eq!(pasted.code, Some(0), "{}", pasted.stderr);

    // A closed lease whose reason names its cgroup (containment on): the table shows the
    // cgroup's last component, the JSON the whole path.
    if let Some(cg) = CgroupRoot::new("shape-reason") {
        let st = tmp.join("contained");
        let mut child = cg
            .leash(&st)
            .args(["exec", "--session", "c", "--", "sleep", "1000"])
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        let wrapper = Pid::of(child.id() as i32).unwrap();
        guard.add(wrapper);
        guard.add(adapter_of(wrapper));
        let mut close = cg.leash(&st);
        let out = close.args(["close", "--session", "c"]).output().unwrap();
        assert!(out.status.success(), "{out:?}");
        child.wait().unwrap();
        let json = cg.leash(&st).args(["leases", "--json"]).output().unwrap();
        let rows: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
        let path = rows[0]["cgroupPath"].as_str().unwrap().to_string();
        let reason = rows[0]["stateReason"].as_str().unwrap().to_string();
        assert!(
            reason.contains(&path),
            "the JSON keeps the whole path: {reason}"
        );
        let text = cg.leash(&st).arg("leases").output().unwrap();
        let text = String::from_utf8_lossy(&text.stdout);
        let last = path.rsplit('/').next().unwrap();
        assert!(!text.contains(&path), "{text}");
        assert!(text.contains(&format!("…/{last}")), "{text}");
    }
}

#[test]
fn reap_dry_run_speaks_words_and_says_each_thing_once() {
    let Some(cg) = CgroupRoot::new("shape-reap") else {
        return;
    };
    let tmp = TempDir::new("shape-reap");
    let state = tmp.join("state");
    let mut guard = Guard::new();
    let child = guard.child(
        cg.leash(&state)
            .args(["exec", "--session", "r", "--", "sleep", "1000"])
            .stdin(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let wrapper = Pid::of(child.id() as i32).unwrap();
    guard.add(adapter_of(wrapper));
    let out = cg
        .leash(&state)
        .args(["reap", "--dry-run", "--include-live"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    for internal in ["KillAndRemove", "Remove,", "Leave,", "None,"] {
        assert!(!text.contains(internal), "{internal}: {text}");
    }
    assert!(
        text.contains("cgroup.kill its 1 member(s) once the grace is over"),
        "{text}"
    );
    // No line is said twice (the cgroup's evidence is not printed both as evidence and again on
    // the cgroup's line).
    let verified: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("verified (path under this gateway's root"))
        .collect();
    assert_eq!(verified.len(), 1, "{text}");
}

#[test]
fn exec_without_dashdash_says_to_add_it() {
    let tmp = TempDir::new("shape-dashdash");
    let state = tmp.join("state");
    for args in [
        vec!["exec", "sleep", "1"],
        vec!["exec", "--session", "x", "sleep", "1"],
    ] {
        let out = run(&state, &args);
        assert_eq!(out.code, Some(125), "{args:?}: {}", out.stderr);
        assert!(
            out.stderr
                .contains("the adapter command goes after `--`: leash exec [OPTIONS] -- CMD"),
            "{args:?}: {}",
            out.stderr
        );
    }
    // In JSON too.
    let out = run(&state, &["--error-format", "json", "exec", "sleep", "1"]);
    assert_eq!(out.code, Some(125));
    let v: serde_json::Value = serde_json::from_str(out.stderr.lines().last().unwrap()).unwrap();
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("goes after `--`"),
        "{v}"
    );
    // A bad flag is not told to add `--`.
    let out = run(&state, &["exec", "--no-such-flag", "--", "true"]);
    assert_eq!(out.code, Some(125));
    assert!(!out.stderr.contains("goes after"), "{}", out.stderr);
    assert!(!state.exists(), "nothing was started, no state root made");
}

#[test]
fn ps_quotes_argv_as_a_shell_would() {
    let tmp = TempDir::new("shape-ps");
    let state = tmp.join("state");
    let mut guard = Guard::new();
    live_session(&state, &mut guard, "q", "sleep 1000 & sleep 1001; wait");
    let out = run(&state, &["ps"]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert!(
        out.stdout.contains("sh -c 'sleep 1000 & sleep 1001; wait'"),
        "{}",
        out.stdout
    );
    assert!(out.stdout.contains("sleep 1000"), "{}", out.stdout);
}

#[test]
fn man_pages_of_subcommands_carry_leashs_version() {
    let version = env!("CARGO_PKG_VERSION");
    let out = std::process::Command::new(leash_bin())
        .args(["man", "serve"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let page = String::from_utf8_lossy(&out.stdout);
    let th = page.lines().find(|l| l.starts_with(".TH")).unwrap();
    assert_eq!(
        th,
        format!(".TH leash-serve 1  \"leash {version}\" "),
        "{th}"
    );
    // The same in the pages --out-dir writes.
    let tmp = TempDir::new("shape-man");
    let out = std::process::Command::new(leash_bin())
        .args(["man", "--out-dir"])
        .arg(tmp.path())
        .output()
        .unwrap();
    assert!(out.status.success());
    for page in ["leash.1", "leash-serve.1", "leash-close.1"] {
        let text = std::fs::read_to_string(tmp.join(page)).unwrap();
        let th = text
            .lines()
            .find(|l| l.starts_with(".TH"))
            .unwrap()
            .to_string();
        assert!(th.contains(&format!("\"leash {version}\"")), "{page}: {th}");
    }
}
