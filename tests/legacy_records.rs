//! Legacy records (no lease id) are cleaned up fail-safe. Records pointing at pid 1, at the reaper
//! itself, or at a process whose argv differs from the stored command are refused with the reason;
//! a process whose live argv matches the stored (shell-quoted) command token for token is
//! terminated; a record whose pid is gone is marked lost. A stored pid alone never leads to a
//! signal.
mod common;
use common::*;
use serde_json::json;

#[test]
fn legacy_records_are_verified_or_left_alone() {
    let tmp = TempDir::new("legacy");
    let state = tmp.join("state");
    let trap = trap_script(tmp.path());
    let mut guard = Guard::new();
    // A process the old gateway "started": argv with a space in a token.
    let match_log = tmp.join("old session.log");
    guard.child(
        std::process::Command::new(&trap)
            .arg(&match_log)
            .spawn()
            .unwrap(),
    );
    let matching = Logged::wait_started(match_log.clone());
    // A live process whose argv differs from what its record says.
    let decoy = start_decoy(&mut guard, tmp.path(), "decoy");
    let mut g2 = Guard::new();
    g2.add(matching.pid);

    let records = json!([
        {"sessionKey": "old-init", "pid": 1, "command": "/sbin/init"},
        {"sessionKey": "old-differs", "pid": decoy.pid.pid, "command": "codex-acp --stdio"},
        {"sessionKey": "old-match", "pid": matching.pid.pid,
         // A script started through its #! line runs as `/bin/sh <script> <args>`.
         "command": format!("/bin/sh {} '{}'", trap.display(), match_log.display())},
        {"sessionKey": "old-gone", "pid": 999_999, "command": "codex-acp"}
    ]);
    let file = tmp.join("legacy.json");
    std::fs::write(&file, records.to_string()).unwrap();
    let out = run(&state, &["legacy", "import", file.to_str().unwrap()]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);

    // The reaper itself: a shell that imports a record naming its own pid, then execs the reaper
    // (exec keeps the pid).
    let selfrec = tmp.join("self.json");
    let reaper = script(
        tmp.path(),
        "reaper.sh",
        &format!(
            "printf '[{{\"sessionKey\":\"old-self\",\"pid\":%d,\"command\":\"leash reap\"}}]' $$ > '{f}'\n'{l}' --state-dir '{s}' legacy import '{f}' >/dev/null 2>&1\nexec '{l}' --state-dir '{s}' reap --json --grace-ms 300",
            f = selfrec.display(),
            l = leash_bin().display(),
            s = state.display()
        ),
    );
    let out = std::process::Command::new(&reaper).output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let by_session = |k: &str| {
        report["legacy"]
            .as_array()
            .unwrap()
            .iter()
            .find(|o| o["sessionKey"] == k)
            .unwrap_or_else(|| panic!("no outcome for {k}: {report}"))
            .clone()
    };
    let reason = |k: &str| by_session(k)["reason"].as_str().unwrap().to_string();
    assert_eq!(by_session("old-init")["result"], "leftOpen");
    assert!(
        reason("old-init").contains("1 or lower"),
        "{}",
        reason("old-init")
    );
    assert_eq!(by_session("old-self")["result"], "leftOpen");
    assert!(
        reason("old-self").contains("reaper itself"),
        "{}",
        reason("old-self")
    );
    assert_eq!(by_session("old-differs")["result"], "leftOpen");
    assert!(
        reason("old-differs").contains("differs from the stored command"),
        "{}",
        reason("old-differs")
    );
    assert_eq!(by_session("old-gone")["result"], "lost");
    assert_eq!(by_session("old-match")["result"], "closed", "{report}");

    assert!(
        wait_for(|| !matching.pid.alive()),
        "the verified legacy process was terminated"
    );
    assert!(matching.signals().contains("TERM"), "SIGTERM came first");
    assert!(decoy.pid.alive(), "argv differs: left alone");
    assert_eq!(decoy.signals(), "");

    // The refused records stay open with their reason; a bad import changes nothing.
    let list = run_json(&state, &["legacy", "list", "--json"]);
    let open: Vec<_> = list
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["state"] == "open")
        .collect();
    assert_eq!(open.len(), 3, "{list}");
    std::fs::write(&file, r#"[{"sessionKey": "x", "pid": 0, "command": "y"}]"#).unwrap();
    let out = run(&state, &["legacy", "import", file.to_str().unwrap()]);
    assert_eq!(out.code, Some(1));
    assert!(out.stderr.contains("not a valid pid"), "{}", out.stderr);
    std::fs::write(&file, "{not json").unwrap();
    assert_eq!(
        run(&state, &["legacy", "import", file.to_str().unwrap()]).code,
        Some(1)
    );
    assert_eq!(
        run_json(&state, &["legacy", "list", "--json"])
            .as_array()
            .unwrap()
            .len(),
        5
    );
}
