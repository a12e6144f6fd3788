//! `reap --dry-run` prints the plan — per lease its verdict, each pid with the signals it would get
//! and the evidence — and changes no row and sends no signal: the session's own processes and a
//! decoy with the same argv all trap and log every signal, and log none.
mod common;
use common::*;

/// Every row of every table, as text: what "changes no row" compares.
fn dump(state: &std::path::Path) -> String {
    let conn = rusqlite::Connection::open(state.join("leash.db")).unwrap();
    let mut out = String::new();
    for table in ["meta", "leases", "sessions", "events", "legacy_records"] {
        let mut stmt = conn
            .prepare(&format!("SELECT * FROM {table} ORDER BY 1"))
            .unwrap();
        let n = stmt.column_count();
        let rows = stmt
            .query_map([], |r| {
                let mut line = Vec::new();
                for i in 0..n {
                    line.push(format!("{:?}", r.get::<_, rusqlite::types::Value>(i)?));
                }
                Ok(line.join("|"))
            })
            .unwrap();
        for r in rows {
            out.push_str(&format!("{table}: {}\n", r.unwrap()));
        }
    }
    out
}

#[test]
fn dry_run_plans_signals_but_changes_and_signals_nothing() {
    let tmp = TempDir::new("dryrun");
    let state = tmp.join("state");
    let trap = trap_script(tmp.path());
    let mut guard = Guard::new();
    let decoy = start_decoy(&mut guard, tmp.path(), "decoy");
    let log = tmp.join("adapter.log");
    let child = guard.child(
        leash(&state)
            .args(["exec", "--session", "d", "--"])
            .arg(&trap)
            .arg(&log)
            .spawn()
            .unwrap(),
    );
    let wrapper = Pid::of(child.id() as i32).unwrap();
    let adapter = Logged::wait_started(log);
    // Let the wrapper's report land in the row first, so the comparison is of a settled store.
    assert!(wait_for(
        || lease_of(&state, "d")["adapterPid"] == adapter.pid.pid
    ));
    let before = dump(&state);

    // --include-live so that the plan does include signals for this live session.
    let out = run(&state, &["reap", "--dry-run", "--include-live", "--json"]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let plan: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    let lp = &plan["leases"][0];
    assert_eq!(lp["decision"]["action"], "terminate", "{plan}");
    assert_eq!(lp["verdict"], "owned");
    let planned: Vec<i64> = lp["signals"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["pid"].as_i64().unwrap())
        .collect();
    // Children first: the adapter's own children (its `sleep`), then the adapter, then the wrapper.
    assert_eq!(
        planned[planned.len() - 2..],
        [adapter.pid.pid as i64, wrapper.pid as i64],
        "{planned:?}"
    );
    for s in &lp["signals"].as_array().unwrap()[..planned.len() - 2] {
        assert_eq!(s["role"], "descendant", "{s}");
    }
    assert_eq!(
        lp["signals"][0]["signals"],
        serde_json::json!(["SIGTERM", "SIGKILL"])
    );
    assert!(!lp["evidence"].as_array().unwrap().is_empty());
    assert!(!planned.contains(&(decoy.pid.pid as i64)));

    // The human form says the same, and says it is a dry run.
    let out = run(&state, &["reap", "--dry-run", "--include-live"]);
    assert!(out.stdout.contains("dry run"), "{}", out.stdout);
    assert!(
        out.stdout.contains(&format!("pid {}", adapter.pid.pid)),
        "{}",
        out.stdout
    );

    assert_eq!(dump(&state), before, "dry run changed the store");
    assert!(adapter.pid.alive() && wrapper.alive() && decoy.pid.alive());
    assert_eq!(adapter.signals(), "", "dry run signalled the adapter");
    assert_eq!(decoy.signals(), "", "dry run signalled the decoy");
}
