//! The snapshot format as users meet it: the hand-written fixture of `docs/guide/simulate.md`
//! runs through `leash simulate --expect` and passes, and a changed expectation fails; every
//! fixture, the guide's example and a live `leash snapshot` validate against
//! `docs/snapshot.schema.json` (checked by Python's `jsonschema`, draft 2020-12), and the schema
//! refuses a newer version and an environment value beyond the markers; `snapshot --session`
//! and `--lease` hold only the leases they name and those leases' processes.
mod common;
use common::*;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

fn repo(p: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(p)
}

/// The first ```json block of the guide.
fn guide_example() -> String {
    let text = std::fs::read_to_string(repo("docs/guide/simulate.md")).unwrap();
    let start = text
        .find("```json\n")
        .expect("the guide has a JSON example")
        + 8;
    let end = start + text[start..].find("\n```").unwrap();
    text[start..end].to_string()
}

fn simulate(args: &[&Path], extra: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(leash_bin())
        .arg("simulate")
        .args(args)
        .args(extra)
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
    )
}

#[test]
fn the_guides_fixture_runs_and_its_expectation_is_checked() {
    let tmp = TempDir::new("guide");
    let f = tmp.join("fixture.json");
    std::fs::write(&f, guide_example()).unwrap();
    let (code, out) = simulate(&[&f], &["--expect", f.to_str().unwrap()]);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("expectation holds"), "{out}");
    assert!(out.contains("t+0 ms SIGTERM pid 1202"), "{out}");
    let (code, out) = simulate(&[&f], &[]);
    assert_eq!(code, Some(1), "signals would be sent: {out}");

    let mut doc: Value = serde_json::from_str(&guide_example()).unwrap();
    doc["expect"]["notSignalled"] = serde_json::json!([1300, 1202]);
    let g = tmp.join("wrong.json");
    std::fs::write(&g, doc.to_string()).unwrap();
    let (code, out) = simulate(&[&g], &["--expect", g.to_str().unwrap()]);
    assert_eq!(code, Some(2), "{out}");
    assert!(
        out.contains("- pid 1202 is signalled but must not be"),
        "{out}"
    );
}

/// Validates each document against the schema with Python's jsonschema; returns the errors
/// per document (empty: valid). `None` when python3 with jsonschema is not installed.
fn validate(docs: &[Value]) -> Option<Vec<Vec<String>>> {
    let probe = Command::new("python3")
        .args(["-c", "import jsonschema"])
        .stderr(Stdio::null())
        .status();
    if !probe.is_ok_and(|s| s.success()) {
        return None;
    }
    let script = r#"
import json, sys, jsonschema
schema = json.load(open(sys.argv[1]))
jsonschema.Draft202012Validator.check_schema(schema)
v = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker())
out = [[e.message for e in v.iter_errors(d)] for d in json.load(sys.stdin)]
print(json.dumps(out))
"#;
    let mut child = Command::new("python3")
        .arg("-c")
        .arg(script)
        .arg(repo("docs/snapshot.schema.json"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(serde_json::to_string(docs).unwrap().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "the schema itself is invalid");
    Some(serde_json::from_slice(&out.stdout).unwrap())
}

#[test]
fn fixtures_the_guide_and_a_live_snapshot_follow_the_schema() {
    let mut names = Vec::new();
    let mut docs = Vec::new();
    for f in common::lifecycle::lifecycle_fixtures() {
        names.push(f.display().to_string());
        docs.push(common::lifecycle::read_case(&f));
    }
    names.push("the guide's example".into());
    docs.push(serde_json::from_str(&guide_example()).unwrap());

    // Two live sessions; a snapshot of one holds that lease and its processes only.
    let tmp = TempDir::new("schema");
    let state = tmp.join("state");
    let mut guard = Guard::new();
    let exec = || {
        let mut c = leash(&state);
        c.args(["--containment", "off", "exec"]);
        c
    };
    let (wa, la) = sleeping_lease(&mut guard, exec(), &state, "a");
    let (wb, lb) = sleeping_lease(&mut guard, exec(), &state, "b");
    let snap = |args: &[&str]| -> Value {
        let out = run(&state, &[&["snapshot"], args].concat());
        assert_eq!(out.code, Some(0), "{}", out.stderr);
        serde_json::from_str(&out.stdout).unwrap()
    };
    let pids = |s: &Value| -> Vec<i64> {
        s["table"]["processes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["pid"].as_i64().unwrap())
            .collect()
    };
    let ids = |s: &Value| -> Vec<String> {
        s["leases"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| l["leaseId"].as_str().unwrap().to_string())
            .collect()
    };
    let all = snap(&[]);
    assert!(pids(&all).contains(&(wa.pid as i64)) && pids(&all).contains(&(wb.pid as i64)));
    let (a, b) = (
        la["adapterPid"].as_i64().unwrap(),
        lb["adapterPid"].as_i64().unwrap(),
    );
    for (s, keep, drop_) in [
        (snap(&["--session", "a"]), (&la, wa, a), (&lb, wb, b)),
        (
            snap(&["--lease", lb["leaseId"].as_str().unwrap()]),
            (&lb, wb, b),
            (&la, wa, a),
        ),
    ] {
        assert_eq!(ids(&s), vec![keep.0["leaseId"].as_str().unwrap()]);
        assert!(pids(&s).contains(&(keep.1.pid as i64)) && pids(&s).contains(&keep.2));
        assert!(!pids(&s).contains(&(drop_.1.pid as i64)) && !pids(&s).contains(&drop_.2));
    }
    names.push("a live snapshot".into());
    docs.push(all.clone());

    // What the schema must refuse: a newer version, an environment value beyond the markers.
    let mut newer = all.clone();
    newer["version"] = 2.into();
    let mut leaky = all.clone();
    leaky["table"]["processes"][0]["env"] = serde_json::json!({"HOME": "/root"});
    docs.push(newer);
    docs.push(leaky);

    let Some(errors) = validate(&docs) else {
        common::skip("python3 with jsonschema is not installed");
        return;
    };
    let n = names.len();
    for (name, errs) in names.iter().zip(&errors[..n]) {
        assert!(errs.is_empty(), "{name}: {errs:?}");
    }
    assert!(!errors[n].is_empty(), "a newer version passes the schema");
    assert!(
        !errors[n + 1].is_empty(),
        "an environment value passes the schema"
    );
}
