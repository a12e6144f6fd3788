//! `leash ps` shows, per open lease, the session, its members (pid, command, RSS, CPU time) and
//! totals: from the lease's cgroup where there is one (so a detached, env-less escapee is counted),
//! from the verified process tree otherwise.
mod common;
use common::*;
use serde_json::Value;
use std::process::Stdio;

#[test]
fn ps_lists_members_and_totals_from_the_cgroup_and_from_the_tree() {
    let Some(cg) = CgroupRoot::new("ps") else {
        return;
    };
    let tmp = TempDir::new("ps");
    let state = tmp.join("state");
    let d = tmp.path().display().to_string();
    let mut guard = Guard::new();
    let contained = script(
        tmp.path(),
        "contained.sh",
        &format!(
            "( setsid env -i /bin/sh -c 'echo $$ > \"{d}/escapee.pid\"; exec sleep 100000' & )\n\
             exec sleep 100000"
        ),
    );
    let mut children = Vec::new();
    for (key, containment, cmd) in [
        ("contained", "on", contained.display().to_string()),
        ("plain", "off", "sleep".to_string()),
    ] {
        let mut c = cg.leash(&state);
        c.env("LEASH_CONTAINMENT", containment)
            .args(["exec", "--session", key, "--", &cmd]);
        if key == "plain" {
            c.arg("100000");
        }
        let child = c.stdin(Stdio::null()).spawn().unwrap();
        let wrapper = Pid::of(child.id() as i32).unwrap();
        guard.add(wrapper);
        guard.add(adapter_of(wrapper));
        children.push(child);
    }
    let escapee = read_pid_file(&tmp.join("escapee.pid"));
    guard.add(escapee);

    let out = cg.leash(&state).args(["ps", "--json"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let session = |k: &str| {
        v["sessions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["sessionKey"] == k)
            .unwrap_or_else(|| panic!("{v}"))
            .clone()
    };
    let c = session("contained");
    assert_eq!(c["source"], "cgroup", "{c}");
    let pids: Vec<i64> = c["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["pid"].as_i64().unwrap())
        .collect();
    assert!(pids.contains(&(escapee.pid as i64)), "escapee counted: {c}");
    assert_eq!(
        c["totals"]["processes"], 3,
        "wrapper, adapter, escapee: {c}"
    );
    assert!(c["totals"]["rssBytes"].as_u64().unwrap() > 0, "{c}");
    assert!(
        c["members"][1]["command"]
            .as_str()
            .unwrap()
            .contains("sleep"),
        "{c}"
    );
    let p = session("plain");
    assert_eq!(p["source"], "tree", "{p}");
    assert_eq!(p["totals"]["processes"], 2, "wrapper and adapter: {p}");

    // `leash sessions status` carries the same entry.
    let out = cg
        .leash(&state)
        .args([
            "sessions",
            "status",
            "contained",
            "--as",
            "contained",
            "--json",
        ])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let st: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(st["usage"]["source"], "cgroup", "{st}");
    assert_eq!(st["usage"]["totals"]["processes"], 3, "{st}");

    let text = cg.leash(&state).arg("ps").output().unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("session contained") && text.contains("from cgroup"),
        "{text}"
    );

    for key in ["contained", "plain"] {
        let out = cg
            .leash(&state)
            .args(["close", "--session", key, "--grace-ms", "200"])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0));
    }
    for mut c in children {
        c.wait().unwrap();
    }
    assert!(!escapee.alive());
}
