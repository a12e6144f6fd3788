//! `leash legacy import --acpx DIR` reads the acpx extension's own state as it is on disk, and
//! `leash reap` then ends exactly the incumbent's orphans. A fake incumbent: a Node wrapper
//! written the way the extension generates `codex-acp-wrapper.mjs` (the adapter spawned detached,
//! in its own group; INT/TERM/HUP forwarded to the group; `process.ppid` polled once a second,
//! cleanup only once it reads 1), launched by a fake gateway with the extension's own command
//! (`env OPENCLAW_ACPX_LEASE_ID=… OPENCLAW_GATEWAY_INSTANCE_ID=… "node" "wrapper" --openclaw-…`)
//! under a user manager (a subreaper, as systemd --user is); the gateway is SIGKILLed, its
//! wrappers are re-parented to the manager, not to pid 1, so their polling misses it (the
//! incumbent's #96032) and they stay as orphans. Its state: the older layout (a JSON lease file
//! and a `gateway-instance-id` file) for one gateway, the newer one (the SQLite keyed store,
//! written here with the table the extension's plugin-state store creates) for another.
//! Decoys: a process forced onto the pid of a lease whose wrapper exited, a process with the
//! wrapper's very command line but no markers, and a pending lease's live wrapper; all survive,
//! unsignalled. A root with another gateway id is refused, and malformed input writes no row.
mod common;
use common::*;
use serde_json::json;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The node binary as the extension names it (`process.execPath`: an absolute, resolved path).
fn node() -> Option<PathBuf> {
    let out = Command::new("node")
        .args(["-e", "process.stdout.write(process.execPath)"])
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| PathBuf::from(String::from_utf8_lossy(&out.stdout).into_owned()))
}

/// `codex-acp-wrapper.mjs`, the way the extension generates it, with the test's adapter (the
/// trap script: logs every catchable signal, runs until SIGKILLed) as its installed bin. Writes
/// `<logs>/<tag>.wrapper.pid` (tag: the lease id from its argv, else `pid-<pid>`) and logs the
/// signals it gets to `<tag>.wrapper.log`, for the test.
fn wrapper_script(dir: &Path, logs: &Path, adapter: &Path) -> PathBuf {
    let body = format!(
        r#"#!/usr/bin/env node
import {{ spawn }} from "node:child_process";
import fs from "node:fs";

const logDir = {logs};
const installedBinPath = {adapter};
const env = {{ ...process.env }};
const configuredArgs = process.argv.slice(2);
const at = configuredArgs.indexOf("--openclaw-acpx-lease-id");
const tag = at >= 0 ? configuredArgs[at + 1] : `pid-${{process.pid}}`;
const log = `${{logDir}}/${{tag}}`;
fs.writeFileSync(`${{log}}.wrapper.pid`, String(process.pid));

const child = spawn(installedBinPath, [`${{log}}.adapter.log`, ...configuredArgs], {{
  env,
  stdio: "inherit",
  detached: true,
}});

for (const signal of ["SIGINT", "SIGTERM", "SIGHUP"]) {{
  process.on(signal, () => {{
    fs.appendFileSync(`${{log}}.wrapper.log`, `${{signal}}\n`);
    try {{ process.kill(-child.pid, signal); }} catch {{}}
  }});
}}

// Parent death: process.ppid polled once a second; only a re-parenting to init counts.
const watch = setInterval(() => {{
  if (process.ppid === 1) {{
    clearInterval(watch);
    try {{ process.kill(-child.pid, "SIGTERM"); }} catch {{}}
    setTimeout(() => {{
      try {{ process.kill(-child.pid, "SIGKILL"); }} catch {{}}
      process.exit(1);
    }}, 1500);
  }}
}}, 1000);

child.on("exit", (code, signal) => process.exit(code ?? (signal ? 1 : 0)));
"#,
        logs = json!(logs.display().to_string()),
        adapter = json!(adapter.display().to_string()),
    );
    std::fs::create_dir_all(dir).unwrap();
    let p = dir.join("codex-acp-wrapper.mjs");
    // Written through a draft and renamed: no descriptor of ours stays open on it (see `script`).
    let draft = dir.join(".codex-acp-wrapper.mjs.draft");
    std::fs::write(&draft, body).unwrap();
    std::fs::rename(&draft, &p).unwrap();
    p
}

/// The command the extension launches for a lease (`withAcpxLeaseEnvironment` of
/// `buildWrapperCommand`'s JSON-quoted parts).
fn leased_command(node: &Path, wrapper: &Path, lease: &str, gateway: &str) -> String {
    let command = format!(
        "{} {}",
        json!(node.display().to_string()),
        json!(wrapper.display().to_string())
    );
    format!(
        "env OPENCLAW_ACPX_LEASE_ID={lease} OPENCLAW_GATEWAY_INSTANCE_ID={gateway} {command} \
         --openclaw-acpx-lease-id {lease} --openclaw-gateway-instance-id {gateway}"
    )
}

/// `hashAcpxProcessCommand`, computed by node itself.
fn node_sha256(node: &Path, text: &str) -> String {
    let out = Command::new(node)
        .args([
            "-e",
            "process.stdout.write(require('node:crypto').createHash('sha256').update(process.argv[1]).digest('hex'))",
            text,
        ])
        .output()
        .unwrap();
    assert!(out.status.success());
    String::from_utf8(out.stdout).unwrap()
}

/// One `AcpxProcessLease` as the extension stores it (plus a field it does not know, which the
/// import must tolerate).
#[allow(clippy::too_many_arguments)]
fn lease_json(
    lease: &str,
    gateway: &str,
    session: &str,
    root: &Path,
    wrapper: &Path,
    pid: i32,
    hash: &str,
    state: &str,
) -> serde_json::Value {
    json!({
        "leaseId": lease,
        "gatewayInstanceId": gateway,
        "sessionKey": session,
        "wrapperRoot": root.display().to_string(),
        "wrapperPath": wrapper.display().to_string(),
        "rootPid": pid,
        "commandHash": hash,
        "startedAt": 1_764_000_000_000_i64,
        "state": state,
        "someFutureField": {"x": 1}
    })
}

/// The keyed store the way the extension's plugin-state store creates it
/// (`plugin-state-store.sqlite.ts`), at the newer path `<state>/state/openclaw.sqlite`.
fn write_keyed_store(state: &Path, rows: &[(&str, &str, String)]) -> PathBuf {
    let dir = state.join("state");
    std::fs::create_dir_all(&dir).unwrap();
    let db = dir.join("openclaw.sqlite");
    let conn = rusqlite::Connection::open(&db).unwrap();
    conn.execute_batch(
        "PRAGMA journal_mode=WAL;
         CREATE TABLE IF NOT EXISTS plugin_state_entries (
           plugin_id  TEXT    NOT NULL,
           namespace  TEXT    NOT NULL,
           entry_key  TEXT    NOT NULL,
           value_json TEXT    NOT NULL,
           created_at INTEGER NOT NULL,
           expires_at INTEGER,
           PRIMARY KEY (plugin_id, namespace, entry_key)
         );
         CREATE INDEX IF NOT EXISTS idx_plugin_state_expiry
           ON plugin_state_entries(expires_at) WHERE expires_at IS NOT NULL;
         CREATE INDEX IF NOT EXISTS idx_plugin_state_listing
           ON plugin_state_entries(plugin_id, namespace, created_at, entry_key);
         PRAGMA user_version = 1;",
    )
    .unwrap();
    for (namespace, key, value) in rows {
        conn.execute(
            "INSERT INTO plugin_state_entries VALUES ('acpx', ?1, ?2, ?3, 1764000000000, NULL)",
            rusqlite::params![namespace, key, value],
        )
        .unwrap();
    }
    db
}

/// What leash's own database holds: (legacy records, session rows, gateway instance id).
fn rows(state: &Path) -> (i64, i64, String) {
    let conn = rusqlite::Connection::open(state.join("leash.db")).unwrap();
    let n = |sql: &str| conn.query_row(sql, [], |r| r.get::<_, i64>(0)).unwrap();
    (
        n("SELECT COUNT(*) FROM legacy_records"),
        n("SELECT COUNT(*) FROM sessions"),
        conn.query_row(
            "SELECT value FROM meta WHERE key = 'gateway_instance_id'",
            [],
            |r| r.get(0),
        )
        .unwrap(),
    )
}

fn pid_of(logs: &Path, tag: &str, what: &str) -> Pid {
    read_pid_file(&logs.join(format!("{tag}.{what}")))
}

fn import(state: &Path, dir: &Path, extra: &[&str]) -> Output {
    let mut args = vec!["legacy", "import", "--acpx", dir.to_str().unwrap()];
    args.extend_from_slice(extra);
    run(state, &args)
}

fn by_session<'a>(list: &'a serde_json::Value, key: &str) -> &'a serde_json::Value {
    list.as_array()
        .unwrap()
        .iter()
        .find(|o| o["sessionKey"] == key)
        .unwrap_or_else(|| panic!("no entry for {key}: {list}"))
}

#[test]
fn the_incumbents_orphans_are_reaped_from_its_own_state_and_nothing_else() {
    let Some(node) = node() else {
        eprintln!("skipping: node is not on PATH (the fake incumbent is a Node wrapper)");
        return;
    };
    // The pid-reuse decoy forces a pid: serialised with the other tests that do.
    let _forcing = FORCING_PIDS.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = TempDir::new("acpx-import");
    let logs = tmp.join("logs");
    std::fs::create_dir_all(&logs).unwrap();
    let adapter = trap_script(tmp.path());
    // Gateway A: the older layout. Gateway B: the newer one.
    let (oc_a, oc_b) = (tmp.join("openclaw-a"), tmp.join("openclaw-b"));
    let (acpx_a, acpx_b) = (oc_a.join("acpx"), oc_b.join("acpx"));
    let wrapper_a = wrapper_script(&acpx_a, &logs, &adapter);
    let wrapper_b = wrapper_script(&acpx_b, &logs, &adapter);
    let gw_a = uuid::Uuid::new_v4().to_string();
    let gw_b = uuid::Uuid::new_v4().to_string();
    let id = || uuid::Uuid::new_v4().to_string();
    let (orphan_a, pending_a, reused_a) = (id(), id(), id());
    let (orphan_b, gone_b) = (id(), id());

    // The gateway: each wrapper launched with the extension's own command line, and a process
    // with a wrapper's command line but no markers; then it waits (it is SIGKILLed below).
    let mut gateway_lines = Vec::new();
    for (lease, gw, wrapper) in [
        (&orphan_a, &gw_a, &wrapper_a),
        (&pending_a, &gw_a, &wrapper_a),
        (&reused_a, &gw_a, &wrapper_a),
        (&orphan_b, &gw_b, &wrapper_b),
        (&gone_b, &gw_b, &wrapper_b),
    ] {
        gateway_lines.push(format!("{} &", leased_command(&node, wrapper, lease, gw)));
    }
    gateway_lines.push(format!(
        "{} {} & echo $! > '{}'",
        json!(node.display().to_string()),
        json!(wrapper_a.display().to_string()),
        logs.join("nomarker.pid").display()
    ));
    gateway_lines.push("wait".into());
    let gateway = script(tmp.path(), "gateway.sh", &gateway_lines.join("\n"));
    // The user manager: a subreaper that outlives the gateway.
    let manager_script = script(
        tmp.path(),
        "manager.sh",
        &format!(
            "'{}' & echo $! > '{}'\nwhile :; do sleep 1 & wait $!; done",
            gateway.display(),
            logs.join("gateway.pid").display()
        ),
    );
    let mut guard = Guard::new();
    let mut manager_cmd = Command::new(&manager_script);
    manager_cmd.stdin(Stdio::null()).stdout(Stdio::null());
    // SAFETY: prctl between fork and exec, async-signal-safe; the flag survives the exec.
    unsafe {
        manager_cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let manager = Pid::of(guard.child(manager_cmd.spawn().unwrap()).id() as i32).unwrap();
    let gateway_pid = read_pid_file(&logs.join("gateway.pid"));
    guard.add(gateway_pid);
    let mut wrappers = std::collections::HashMap::new();
    let mut adapters = std::collections::HashMap::new();
    for lease in [&orphan_a, &pending_a, &reused_a, &orphan_b, &gone_b] {
        let w = pid_of(&logs, lease, "wrapper.pid");
        let a = pid_of(&logs, lease, "adapter.log.pid");
        guard.add(w);
        guard.add(a);
        assert_ne!(
            pgid(a.pid),
            pgid(w.pid),
            "the adapter runs in its own group"
        );
        wrappers.insert(lease.clone(), w);
        adapters.insert(lease.clone(), a);
    }
    let nomarker = read_pid_file(&logs.join("nomarker.pid"));
    guard.add(nomarker);
    let nomarker_adapter = pid_of(&logs, &format!("pid-{}", nomarker.pid), "adapter.log.pid");
    guard.add(nomarker_adapter);

    // `reused_a`: its adapter dies, so its wrapper exits, and its pid goes to a decoy (as root),
    // with the wrapper's command line and no markers. `gone_b`: its wrapper is SIGKILLed, and
    // its detached adapter stays behind (the incumbent's own leak), carrying the env markers.
    signal(adapters[&reused_a], libc::SIGKILL);
    signal(wrappers[&gone_b], libc::SIGKILL);
    for lease in [&reused_a, &gone_b] {
        assert!(
            wait_for(|| !wrappers[lease].exists()),
            "wrapper of {lease} exited"
        );
    }
    assert!(
        adapters[&gone_b].alive(),
        "the escaped adapter survives its wrapper"
    );
    let reused_pid = wrappers[&reused_a].pid;
    let mut reuse_decoy = None;
    if is_root() {
        // A shell that execs the decoy once told to: a child that got the wrong pid is killed
        // before it starts anything.
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "read go; exec \"$0\" \"$1\""])
            .arg(&node)
            .arg(&wrapper_a)
            .stdin(Stdio::piped());
        if let Some(mut c) = spawn_with_pid(reused_pid, &mut cmd) {
            use std::io::Write;
            let d = Pid::of(c.id() as i32).unwrap();
            c.stdin.take().unwrap().write_all(b"go\n").unwrap();
            guard.child(c);
            let exec_d = pid_of(&logs, &format!("pid-{reused_pid}"), "wrapper.pid");
            assert_eq!(exec_d.pid, d.pid);
            let da = pid_of(&logs, &format!("pid-{reused_pid}"), "adapter.log.pid");
            guard.add(exec_d);
            guard.add(da);
            reuse_decoy = Some((exec_d, da));
        }
    }
    if reuse_decoy.is_none() {
        eprintln!(
            "note: pid {reused_pid} could not be forced (needs root and a free pid): the \
             pid-reuse decoy is not checked this run"
        );
    }

    // The gateway dies; its wrappers go to the manager, not to pid 1, and stay.
    signal(gateway_pid, libc::SIGKILL);
    for lease in [&orphan_a, &pending_a, &orphan_b] {
        let w = wrappers[lease];
        assert!(
            wait_for(|| ppid(w.pid) == Some(manager.pid)),
            "wrapper of {lease} re-parented to the user manager"
        );
    }
    assert!(wait_for(|| ppid(nomarker.pid) == Some(manager.pid)));

    // Gateway A's state, older layout: the lease file and the gateway id file, session records.
    let hash = |wrapper: &Path, lease: &str, gw: &str| {
        node_sha256(&node, &leased_command(&node, wrapper, lease, gw))
    };
    let file = json!({
        "version": 1,
        "leases": [
            lease_json(&orphan_a, &gw_a, "agent:codex:acp:orphan", &acpx_a, &wrapper_a,
                       wrappers[&orphan_a].pid, &hash(&wrapper_a, &orphan_a, &gw_a), "open"),
            lease_json(&pending_a, &gw_a, "agent:codex:acp:pending", &acpx_a, &wrapper_a,
                       0, &hash(&wrapper_a, &pending_a, &gw_a), "open"),
            lease_json(&reused_a, &gw_a, "agent:codex:acp:reused", &acpx_a, &wrapper_a,
                       reused_pid, &hash(&wrapper_a, &reused_a, &gw_a), "closing"),
            lease_json(&id(), &gw_a, "agent:codex:acp:done", &acpx_a, &wrapper_a,
                       4242, &hash(&wrapper_a, "x", &gw_a), "closed"),
        ]
    });
    std::fs::write(acpx_a.join("process-leases.json"), file.to_string()).unwrap();
    std::fs::write(oc_a.join("gateway-instance-id"), format!("{gw_a}\n")).unwrap();
    let sessions = acpx_a.join("sessions");
    std::fs::create_dir_all(&sessions).unwrap();
    std::fs::write(
        sessions.join("agent%3Acodex%3Aacp%3Aorphan.json"),
        json!({"schema": "openclaw.acpx.session.v1", "name": "agent:codex:acp:orphan",
               "acpxRecordId": "r1", "pid": wrappers[&orphan_a].pid, "messages": []})
        .to_string(),
    )
    .unwrap();
    std::fs::write(
        sessions.join("agent%3Aclaude%3Aacp%3Aother.json"),
        json!({"schema": "acpx.session.v1", "acpxRecordId": "r2", "unknown": true}).to_string(),
    )
    .unwrap();
    std::fs::write(
        sessions.join("index.json"),
        r#"{"kind": "not a session record"}"#,
    )
    .unwrap();

    // Gateway B's state, newer layout: the SQLite keyed store.
    let gone_pid = wrappers[&gone_b].pid;
    write_keyed_store(
        &oc_b,
        &[
            (
                "gateway-instance",
                "current",
                json!({"instanceId": gw_b, "createdAt": 1_764_000_000_000_i64}).to_string(),
            ),
            (
                "process-leases",
                &orphan_b,
                lease_json(
                    &orphan_b,
                    &gw_b,
                    "agent:codex:acp:b",
                    &acpx_b,
                    &wrapper_b,
                    wrappers[&orphan_b].pid,
                    &hash(&wrapper_b, &orphan_b, &gw_b),
                    "open",
                )
                .to_string(),
            ),
            (
                "process-leases",
                &gone_b,
                lease_json(
                    &gone_b,
                    &gw_b,
                    "agent:codex:acp:gone",
                    &acpx_b,
                    &wrapper_b,
                    gone_pid,
                    &hash(&wrapper_b, &gone_b, &gw_b),
                    "open",
                )
                .to_string(),
            ),
        ],
    );

    // Import A into a fresh root: it adopts A's gateway id.
    let (state_a, state_b) = (tmp.join("leash-a"), tmp.join("leash-b"));
    let out = import(&state_a, &acpx_a, &[]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert!(
        out.stdout.contains("adopted by this fresh root"),
        "{}",
        out.stdout
    );
    assert_eq!(
        rows(&state_a),
        (3, 2, gw_a.clone()),
        "3 open leases, 2 sessions, A's id"
    );
    let conn = rusqlite::Connection::open(state_a.join("leash.db")).unwrap();
    let agents: Vec<(String, Option<String>)> = conn
        .prepare("SELECT session_key, agent_id FROM sessions ORDER BY session_key")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    drop(conn);
    assert_eq!(
        agents,
        vec![
            (
                "agent:claude:acp:other".to_string(),
                Some("claude".to_string())
            ),
            (
                "agent:codex:acp:orphan".to_string(),
                Some("codex".to_string())
            ),
        ]
    );
    // Importing again changes nothing.
    let out = import(&state_a, &acpx_a, &[]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert!(out.stdout.contains("3 already present"), "{}", out.stdout);
    assert_eq!(rows(&state_a).0, 3);

    // B into A's root: another gateway id, refused and said why; with --adopt-gateway-id still
    // refused, A's imported records being open. Nothing written either time.
    let out = import(&state_a, &acpx_b, &[]);
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    assert!(
        out.stderr.contains(&gw_b) && out.stderr.contains("--adopt-gateway-id"),
        "{}",
        out.stderr
    );
    let out = import(&state_a, &acpx_b, &["--adopt-gateway-id"]);
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    assert!(out.stderr.contains("refusing to adopt"), "{}", out.stderr);
    assert_eq!(rows(&state_a), (3, 2, gw_a.clone()));
    // B into its own fresh root.
    let out = import(&state_b, &acpx_b, &[]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert_eq!(rows(&state_b), (2, 0, gw_b.clone()));

    // The dry run explains each lease and signals nothing.
    let plan = run_json(&state_a, &["reap", "--dry-run", "--json"]);
    let legacy = &plan["legacy"];
    let orphan = by_session(legacy, "agent:codex:acp:orphan");
    assert_eq!(orphan["verdict"], "owned", "{orphan}");
    let why = orphan["reason"].as_str().unwrap();
    for evidence in [
        wrapper_a.to_str().unwrap(),
        "--openclaw-acpx-lease-id",
        orphan_a.as_str(),
        gw_a.as_str(),
        "commandHash",
    ] {
        assert!(why.contains(evidence), "{evidence} missing from {why}");
    }
    let planned: Vec<i64> = orphan["signals"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["pid"].as_i64().unwrap())
        .collect();
    for p in [wrappers[&orphan_a], adapters[&orphan_a]] {
        assert!(
            planned.contains(&(p.pid as i64)),
            "the wrapper and its detached adapter are planned: {orphan}"
        );
    }
    let pending = by_session(legacy, "agent:codex:acp:pending");
    assert_eq!(pending["decision"]["action"], "leave", "{pending}");
    let why = pending["reason"].as_str().unwrap();
    assert!(
        why.contains("pending") && why.contains(&wrappers[&pending_a].pid.to_string()),
        "{why}"
    );
    if reuse_decoy.is_some() {
        let reused = by_session(legacy, "agent:codex:acp:reused");
        assert_eq!(reused["decision"]["action"], "leave", "{reused}");
        assert!(
            reused["reason"]
                .as_str()
                .unwrap()
                .contains("does not carry"),
            "{reused}"
        );
    }
    for lease in [&orphan_a, &pending_a, &orphan_b] {
        assert!(
            !logs.join(format!("{lease}.wrapper.log")).exists(),
            "no signal yet"
        );
    }
    assert!(wrappers[&orphan_a].alive(), "a dry run signals nothing");

    // The reap: exactly the two orphan trees go.
    let out = run(&state_a, &["reap", "--json", "--grace-ms", "300"]);
    let report: serde_json::Value = serde_json::from_str(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {} {}", out.stdout, out.stderr));
    let orphan = by_session(&report["legacy"], "agent:codex:acp:orphan");
    assert_eq!(orphan["result"], "closed", "{report}");
    assert_eq!(
        by_session(&report["legacy"], "agent:codex:acp:pending")["result"],
        "leftOpen"
    );
    let out = run(&state_b, &["reap", "--json", "--grace-ms", "300"]);
    let report_b: serde_json::Value = serde_json::from_str(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {} {}", out.stdout, out.stderr));
    assert_eq!(
        by_session(&report_b["legacy"], "agent:codex:acp:b")["result"],
        "closed",
        "{report_b}"
    );
    let gone = by_session(&report_b["legacy"], "agent:codex:acp:gone");
    // (Unless a stranger took the dead wrapper's pid meanwhile: then it is left alone.)
    let escaped = Pid::of(gone_pid).is_none();
    if escaped {
        assert_eq!(
            gone["result"], "closed",
            "the escaped adapter was reaped: {gone}"
        );
    }
    for lease in [&orphan_a, &orphan_b] {
        let (w, a) = (wrappers[lease], adapters[lease]);
        assert!(
            wait_for(|| !w.alive() && !a.alive()),
            "orphan tree of {lease} ended"
        );
        let adapter_log =
            std::fs::read_to_string(logs.join(format!("{lease}.adapter.log"))).unwrap_or_default();
        assert!(
            adapter_log.contains("TERM"),
            "SIGTERM came first: {adapter_log:?}"
        );
    }
    if escaped {
        let a = adapters[&gone_b];
        assert!(
            wait_for(|| !a.alive()),
            "the escaped adapter of {gone_b} ended"
        );
        let log =
            std::fs::read_to_string(logs.join(format!("{gone_b}.adapter.log"))).unwrap_or_default();
        assert!(log.contains("TERM"), "SIGTERM came first: {log:?}");
    }
    // The decoys: untouched.
    let untouched = |p: Pid, log: PathBuf, what: &str| {
        assert!(p.alive(), "{what} survives");
        assert_eq!(
            std::fs::read_to_string(&log).unwrap_or_default(),
            "",
            "{what} got no signal"
        );
    };
    for (what, p, tag) in [
        (
            "the pending lease's wrapper",
            wrappers[&pending_a],
            pending_a.clone(),
        ),
        (
            "the no-marker process",
            nomarker,
            format!("pid-{}", nomarker.pid),
        ),
    ] {
        untouched(p, logs.join(format!("{tag}.wrapper.log")), what);
    }
    untouched(
        adapters[&pending_a],
        logs.join(format!("{pending_a}.adapter.log")),
        "the pending lease's adapter",
    );
    untouched(
        nomarker_adapter,
        logs.join(format!("pid-{}.adapter.log", nomarker.pid)),
        "the no-marker process's adapter",
    );
    if let Some((d, da)) = reuse_decoy {
        untouched(
            d,
            logs.join(format!("pid-{reused_pid}.wrapper.log")),
            "the pid-reuse decoy",
        );
        untouched(
            da,
            logs.join(format!("pid-{reused_pid}.adapter.log")),
            "the pid-reuse decoy's adapter",
        );
    }
    assert!(manager.alive());
}

/// Malformed input: a clear error naming what is wrong, and not one row written (all or
/// nothing: a bad session record stops valid leases too).
#[test]
fn malformed_incumbent_state_writes_nothing() {
    let tmp = TempDir::new("acpx-malformed");
    let gw = uuid::Uuid::new_v4().to_string();
    let oc = tmp.join("openclaw");
    let acpx = oc.join("acpx");
    std::fs::create_dir_all(&acpx).unwrap();
    let good = json!({
        "leaseId": "lease-1", "gatewayInstanceId": gw, "sessionKey": "agent:codex:acp:x",
        "wrapperRoot": acpx.display().to_string(),
        "wrapperPath": acpx.join("codex-acp-wrapper.mjs").display().to_string(),
        "rootPid": 4321, "commandHash": "ab".repeat(32), "startedAt": 1, "state": "open"
    });
    let mut no_hash = good.clone();
    no_hash.as_object_mut().unwrap().remove("commandHash");
    let mut bad_state = good.clone();
    bad_state["state"] = json!("running");
    let mut other_gateway = good.clone();
    other_gateway["gatewayInstanceId"] = json!(uuid::Uuid::new_v4().to_string());
    other_gateway["leaseId"] = json!("lease-2");
    let cases: Vec<(&str, String, &str)> = vec![
        ("not JSON", "{not json".into(), "not JSON"),
        (
            "wrong version",
            json!({"version": 2, "leases": []}).to_string(),
            "version",
        ),
        (
            "no commandHash",
            json!({"version": 1, "leases": [no_hash]}).to_string(),
            "commandHash is missing",
        ),
        (
            "unknown state",
            json!({"version": 1, "leases": [bad_state]}).to_string(),
            "running",
        ),
        (
            "another gateway",
            json!({"version": 1, "leases": [good.clone(), other_gateway]}).to_string(),
            "another gateway",
        ),
    ];
    std::fs::write(oc.join("gateway-instance-id"), &gw).unwrap();
    for (what, text, says) in cases {
        std::fs::write(acpx.join("process-leases.json"), text).unwrap();
        let state = tmp.join(&format!("leash-{}", what.replace(' ', "-")));
        let out = import(&state, &acpx, &[]);
        assert_eq!(out.code, Some(1), "{what}: {}", out.stderr);
        assert!(out.stderr.contains(says), "{what}: {}", out.stderr);
        assert!(
            out.stderr.contains("nothing imported"),
            "{what}: {}",
            out.stderr
        );
        let (legacy, sessions, id) = rows(&state);
        assert_eq!((legacy, sessions), (0, 0), "{what}");
        assert_ne!(id, gw, "{what}: the gateway id was not adopted");
    }

    // Valid leases, but one session record is not JSON: nothing at all.
    std::fs::write(
        acpx.join("process-leases.json"),
        json!({"version": 1, "leases": [good]}).to_string(),
    )
    .unwrap();
    std::fs::create_dir_all(acpx.join("sessions")).unwrap();
    std::fs::write(acpx.join("sessions").join("broken.json"), "{\"schema\":").unwrap();
    let state = tmp.join("leash-session");
    let out = import(&state, &acpx, &[]);
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    assert!(out.stderr.contains("broken.json"), "{}", out.stderr);
    let (legacy, sessions, id) = rows(&state);
    assert_eq!((legacy, sessions), (0, 0));
    assert_ne!(id, gw);
    std::fs::remove_dir_all(acpx.join("sessions")).unwrap();

    // The keyed store: a value that is not JSON, and a non-UUID gateway id.
    std::fs::remove_file(acpx.join("process-leases.json")).unwrap();
    std::fs::remove_file(oc.join("gateway-instance-id")).unwrap();
    let db = write_keyed_store(&oc, &[("process-leases", "lease-1", "{oops".into())]);
    let state = tmp.join("leash-sqlite");
    let out = import(&state, &acpx, &[]);
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    assert!(
        out.stderr.contains("process-leases/lease-1") && out.stderr.contains("not JSON"),
        "{}",
        out.stderr
    );
    assert_eq!(rows(&state).0, 0);
    std::fs::remove_file(&db).unwrap();
    write_keyed_store(
        &oc,
        &[(
            "gateway-instance",
            "current",
            json!({"instanceId": "gw-test"}).to_string(),
        )],
    );
    let state = tmp.join("leash-not-uuid");
    let out = import(&state, &acpx, &[]);
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    assert!(out.stderr.contains("not a UUID"), "{}", out.stderr);

    // Nothing of the incumbent's at all.
    let empty = tmp.join("empty/acpx");
    std::fs::create_dir_all(&empty).unwrap();
    let out = import(&tmp.join("leash-empty"), &empty, &[]);
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    assert!(out.stderr.contains("no acpx state"), "{}", out.stderr);
}

/// Adopting another gateway id while this root's own leases are open is refused: their wrappers
/// carry the old id, and leash would take them for another gateway's.
#[test]
fn adoption_is_refused_while_own_leases_are_open() {
    let tmp = TempDir::new("acpx-adopt");
    let state = tmp.join("state");
    let mut guard = Guard::new();
    let (wrapper, adapter) = exec_trap(&mut guard, &state, tmp.path(), "live", &[]);
    guard.add(adapter.pid);
    let oc = tmp.join("openclaw");
    std::fs::create_dir_all(oc.join("acpx")).unwrap();
    let gw = uuid::Uuid::new_v4().to_string();
    std::fs::write(oc.join("gateway-instance-id"), &gw).unwrap();
    let before = rows(&state);
    let out = import(&state, &oc.join("acpx"), &[]);
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    assert!(out.stderr.contains("--adopt-gateway-id"), "{}", out.stderr);
    let out = import(&state, &oc.join("acpx"), &["--adopt-gateway-id"]);
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    assert!(
        out.stderr.contains("refusing to adopt") && out.stderr.contains("carry"),
        "{}",
        out.stderr
    );
    assert_eq!(rows(&state), before, "nothing written");
    // Once the session is over, adoption is allowed.
    signal(adapter.pid, libc::SIGKILL);
    assert!(wait_for(|| !wrapper.alive()));
    assert!(wait_for(|| {
        lease_of(&state, "live")["state"]
            .as_str()
            .is_some_and(|s| s == "closed" || s == "lost" || s == "ended")
    }));
    let out = import(&state, &oc.join("acpx"), &["--adopt-gateway-id"]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert!(
        out.stdout.contains("adopted (--adopt-gateway-id)"),
        "{}",
        out.stdout
    );
    assert_eq!(rows(&state).2, gw);
}
