//! `leash simulate --expect` over every fixture of `fixtures/lifecycle/`: each is a snapshot
//! (format `leash-snapshot`, version 1) whose `expect` section names the pids `reap` signals, in
//! order, and those it must never signal; the command replays `reap` over it and exits 0 only
//! when the plan agrees. The signals are also held against the fixture's hand-written plan (the
//! order of `expect.leases[].signals`) and the command's timeline against the controller
//! simulator's (`simulate.reap.timeline`), so the command and the simulator tests are one thing.
//! Files that are not snapshots are refused with exit 2 and the reason, never a panic.
mod common;

use common::lifecycle::{lifecycle_fixture, lifecycle_fixtures, read_case};
use serde_json::Value;
use std::process::{Command, Output};

fn leash(args: &[&str]) -> Output {
    Command::new(common::leash_bin())
        .args(args)
        .output()
        .expect("run leash")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn pids(v: &Value) -> Vec<i64> {
    v.as_array()
        .map(|a| a.iter().filter_map(Value::as_i64).collect())
        .unwrap_or_default()
}

/// A command timeline line (`t+0 ms SIGTERM pid 1201 group [..]`) in the simulator fixtures'
/// spelling (`0 ms SIGTERM 1201 group [..]`).
fn fixture_spelling(line: &str) -> String {
    line.trim_start_matches("t+")
        .replacen(" pid ", " ", 1)
        .replacen("refused pid ", "refused ", 1)
}

#[test]
fn every_fixture_runs_through_simulate_expect() {
    let files = lifecycle_fixtures();
    assert!(files.len() >= 19, "{} fixtures", files.len());
    let mut checked = 0;
    for f in &files {
        let case = f.file_stem().unwrap().to_string_lossy().into_owned();
        let path = f.to_str().unwrap();
        let doc = read_case(f);
        let out = leash(&["simulate", path, "--expect", path]);
        let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
        assert!(!stderr.contains("panicked"), "{case}: {stderr}");
        if let Some(why) = doc["expect"]["simulateRefuses"].as_str() {
            assert_eq!(out.status.code(), Some(2), "{case}: {stdout}{stderr}");
            assert!(stderr.contains(why), "{case}: {stderr}");
            checked += 1;
            continue;
        }
        assert_eq!(
            out.status.code(),
            Some(0),
            "{case}: the plan disagrees with the fixture:\n{stdout}{stderr}"
        );
        assert!(stdout.contains("expectation holds"), "{case}: {stdout}");
        // The expectation is the hand-written plan's order, children first: the signalled
        // pids are, in order, among the plan's signals (a closed lease's escapees aside: they
        // are planned under `escapees`, which the fixtures do not spell).
        let want = pids(&doc["expect"]["signalled"]);
        let mut plan = Vec::new();
        for l in doc["expect"]["leases"]
            .as_array()
            .into_iter()
            .flatten()
            .chain(doc["expect"]["legacy"].as_array().into_iter().flatten())
        {
            plan.extend(pids(&l["signals"]));
        }
        if !plan.is_empty() {
            let mut it = plan.iter();
            assert!(
                want.iter().all(|p| it.any(|q| q == p)),
                "{case}: expect.signalled {want:?} is not in the plan's order {plan:?}"
            );
        }
        // The same run as JSON: its timeline is the controller simulator's.
        let out = leash(&["simulate", path, "--json"]);
        let sim: Value = serde_json::from_slice(&out.stdout).unwrap();
        let code = if want.is_empty() { 0 } else { 1 };
        assert_eq!(
            out.status.code(),
            Some(code),
            "{case}: exit without --expect"
        );
        assert_eq!(pids(&sim["signalled"]), want, "{case}");
        if let Some(tl) = doc["simulate"]["reap"]["timeline"].as_array() {
            let got: Vec<String> = text(&leash(&["simulate", path]).stdout)
                .lines()
                .skip_while(|l| !l.starts_with("timeline"))
                .skip(1)
                .take_while(|l| l.starts_with("  t+"))
                .map(|l| fixture_spelling(l.trim()))
                .collect();
            let want: Vec<&str> = tl.iter().filter_map(Value::as_str).collect();
            assert_eq!(got, want, "{case}: timeline");
        }
        checked += 1;
    }
    assert_eq!(checked, files.len());
}

/// An expectation the plan does not meet fails with exit 2 and a diff that names each pid: a
/// forbidden pid signalled, an expected one missing.
#[test]
fn a_disagreeing_expectation_fails_with_a_diff() {
    let f = lifecycle_fixture("startup_orphans_wrapper_adapter_descendants.json");
    let dir = std::env::temp_dir().join(format!("leash-simexp-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let exp = dir.join("expect.json");
    std::fs::write(
        &exp,
        r#"{"signalled": [1203, 1202, 1201, 1204, 1200], "notSignalled": [1202]}"#,
    )
    .unwrap();
    let out = leash(&[
        "simulate",
        f.to_str().unwrap(),
        "--expect",
        exp.to_str().unwrap(),
    ]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(2), "{stdout}");
    assert!(stdout.contains("expectation not met"), "{stdout}");
    assert!(
        stdout.contains("- pid 1202 is signalled but must not be"),
        "{stdout}"
    );
    assert!(
        stdout.contains("- pid 1204 must be signalled but is not"),
        "{stdout}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--close` and `--verify` replay those verbs: close of the escapee case signals its two
/// marked processes (SIGKILL for the one ignoring SIGTERM at the end of the grace), verify of a
/// reused root pid signals nobody and answers dead; an unknown lease is refused with exit 2.
#[test]
fn close_and_verify_are_replayed_too() {
    let dir = lifecycle_fixture("");
    let f = dir.join("parent_death_sigterm_then_sigkill.json");
    let doc = read_case(&f);
    let id = doc["leases"][0]["leaseId"].as_str().unwrap();
    let out = leash(&["simulate", f.to_str().unwrap(), "--close", id, "--json"]);
    let sim: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(out.status.code(), Some(1), "{sim}");
    assert_eq!(sim["verb"], "close");
    assert_eq!(sim["close"][0]["leaseId"], id);
    assert!(!pids(&sim["signalled"]).is_empty(), "{sim}");

    let f = dir.join("unrelated_process_reuses_root_pid.json");
    let doc = read_case(&f);
    let id = doc["leases"][0]["leaseId"].as_str().unwrap();
    let out = leash(&["simulate", f.to_str().unwrap(), "--verify", id]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    assert!(stdout.contains("simulated verify:"), "{stdout}");
    assert!(stdout.contains("dead"), "{stdout}");
    assert!(stdout.contains("no signal"), "{stdout}");

    let out = leash(&[
        "simulate",
        f.to_str().unwrap(),
        "--close",
        "01936b2a-0000-7000-8000-000000000000",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("no lease"),
        "{}",
        text(&out.stderr)
    );
}

/// Not JSON, not a snapshot, a newer version, a cycle in the parent links, a pid listed twice,
/// a lease that does not read: each refused with exit 2 and what is wrong, never a panic, and
/// nothing replayed (nothing on stdout).
#[test]
fn bad_files_are_refused_with_exit_2() {
    let base = read_case(&lifecycle_fixture("parent_death_sigterm_then_sigkill.json"));
    let with = |f: &dyn Fn(&mut Value)| {
        let mut v = base.clone();
        f(&mut v);
        v.to_string()
    };
    let cases: Vec<(&str, String, &str)> = vec![
        ("not json", "{ leases: [".into(), "not a leash snapshot"),
        ("empty", String::new(), "not a leash snapshot"),
        ("array", "[1, 2]".into(), "not a JSON object"),
        (
            "no format",
            with(&|v| {
                v.as_object_mut().unwrap().remove("format");
            }),
            "no \"format\"",
        ),
        (
            "other format",
            with(&|v| v["format"] = "acpx-sessions".into()),
            "not \"leash-snapshot\"",
        ),
        (
            "no version",
            with(&|v| {
                v.as_object_mut().unwrap().remove("version");
            }),
            "no \"version\"",
        ),
        (
            "newer version",
            with(&|v| v["version"] = 2.into()),
            "version 2, newer than this leash reads",
        ),
        (
            "cycle",
            with(&|v| {
                let procs = v["table"]["processes"].as_array_mut().unwrap();
                let n = procs.len();
                let (a, b) = (procs[n - 1]["pid"].clone(), procs[n - 2]["pid"].clone());
                procs[n - 2]["ppid"] = a;
                procs[n - 1]["ppid"] = b;
            }),
            "parent links form a cycle",
        ),
        (
            "duplicate pid",
            with(&|v| {
                let procs = v["table"]["processes"].as_array_mut().unwrap();
                let first = procs[0].clone();
                procs.push(first);
            }),
            "is listed twice",
        ),
        (
            "bad lease",
            with(&|v| v["leases"][0]["rootPid"] = "twelve".into()),
            "leases[0]",
        ),
        (
            "bad gateway id",
            with(&|v| v["gateway"]["gatewayInstanceId"] = "gw".into()),
            "not a UUID",
        ),
        (
            "time before the epoch",
            with(&|v| v["takenAt"] = i64::MIN.into()),
            "takenAt",
        ),
        (
            "table not an object",
            with(&|v| v["table"] = 7.into()),
            "table",
        ),
    ];
    let dir = std::env::temp_dir().join(format!("leash-simbad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for (name, body, why) in cases {
        let f = dir.join(format!("{}.json", name.replace(' ', "-")));
        std::fs::write(&f, body).unwrap();
        let out = leash(&["simulate", f.to_str().unwrap()]);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{name}: {stderr}");
        assert!(stderr.contains(why), "{name}: {stderr}");
        assert!(!stderr.contains("panicked"), "{name}: {stderr}");
        assert!(out.stdout.is_empty(), "{name}: {}", text(&out.stdout));
    }
    let out = leash(&["simulate", dir.join("absent.json").to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("cannot read"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// Extreme values a snapshot may hold (a script's delays at the top of their range, pids and a
/// caller the guards refuse) replay to an end, with exit 0 or 1, never a panic.
#[test]
fn extreme_values_replay_without_a_panic() {
    let base = read_case(&lifecycle_fixture(
        "wrapper_killed_escapee_found_by_markers.json",
    ));
    let id = base["leases"][0]["leaseId"].as_str().unwrap().to_string();
    let dir = std::env::temp_dir().join(format!("leash-simwild-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cases: Vec<(&str, Value)> = vec![
        (
            "onKill max",
            serde_json::json!({"script": {"1204": {"onTerm": null, "onKill": u64::MAX}}}),
        ),
        (
            "onTerm max",
            serde_json::json!({"script": {"1204": {"onTerm": u64::MAX}}}),
        ),
        (
            "at max",
            serde_json::json!({"script": {"1204": {"onTerm": null, "onKill": null, "at": u64::MAX}}}),
        ),
        (
            "after itself",
            serde_json::json!({"script": {"1204": {"onTerm": null, "after": [1204]}}}),
        ),
    ];
    for (name, script) in cases {
        let mut v = base.clone();
        v["simulate"] = script;
        let f = dir.join(format!("{}.json", name.replace(' ', "-")));
        std::fs::write(&f, v.to_string()).unwrap();
        for extra in [
            vec![],
            vec!["--close", id.as_str()],
            vec!["--verify", id.as_str()],
        ] {
            let out = leash(&[&["simulate", f.to_str().unwrap()], extra.as_slice()].concat());
            let stderr = text(&out.stderr);
            assert!(!stderr.contains("panicked"), "{name} {extra:?}: {stderr}");
            assert!(
                matches!(out.status.code(), Some(0 | 1)),
                "{name} {extra:?}: {stderr}"
            );
        }
    }
    let mut v = base.clone();
    v["caller"] = serde_json::json!({"pid": 1204, "pgid": 1204, "uid": 0});
    let f = dir.join("caller.json");
    std::fs::write(&f, v.to_string()).unwrap();
    let out = leash(&["simulate", f.to_str().unwrap(), "--json"]);
    let sim: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        !pids(&sim["signalled"]).contains(&1204),
        "the caller is never signalled: {sim}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
