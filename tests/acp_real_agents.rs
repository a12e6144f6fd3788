//! leash with the real npm packages. acpx drives `@zed-industries/codex-acp` through `leash exec`
//! (the recipe of docs/guide/gateway.md) and gets codex-acp's "Authentication required" answer to
//! `session/new` (no credentials here), the lease recorded and settled, nothing left running; and
//! `examples/gateway.mjs --agent codex` reports that error cleanly through `leash serve`. The
//! packages are installed on first use under `target/node-deps-acpx` (pinned versions).
mod common;
mod node_support;
use common::*;
use node_support::*;
use std::path::PathBuf;
use std::process::{Command, Stdio};

const PACKAGES: &[&str] = &["acpx@0.19.1", "@zed-industries/codex-acp@0.16.0"];

/// The installed packages' bin directory, or why the test is skipped.
fn bins() -> Option<PathBuf> {
    if let Err(why) = node() {
        common::skip(why);
        return None;
    }
    if !(cfg!(target_os = "linux")
        && (cfg!(target_arch = "x86_64") || cfg!(target_arch = "aarch64")))
    {
        common::skip("codex-acp ships binaries for linux x64/arm64 only here");
        return None;
    }
    Some(npm_install("node-deps-acpx", PACKAGES).join("node_modules/.bin"))
}

/// PATH with the npm bins and the leash binary first; a scratch HOME so no credentials or
/// config of the machine's user are found, and none written there.
fn agent_env(cmd: &mut Command, bins: &std::path::Path, home: &std::path::Path) {
    let path = format!(
        "{}:{}:{}",
        bins.display(),
        leash_bin().parent().unwrap().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    cmd.env("PATH", path)
        .env("HOME", home)
        .env_remove("OPENAI_API_KEY")
        .env_remove("CODEX_API_KEY")
        .env_remove("CODEX_HOME")
        .env_remove("LEASH_LOG");
}

#[test]
fn acpx_drives_codex_acp_through_leash_exec() {
    let Some(bins) = bins() else { return };
    let _ = wrap_bin();
    let tmp = TempDir::new("acpx-codex");
    let (home, state, work) = (tmp.join("home"), tmp.join("state"), tmp.join("work"));
    for d in [&home, &work] {
        std::fs::create_dir_all(d).unwrap();
    }
    let mut cmd = Command::new(bins.join("acpx"));
    agent_env(&mut cmd, &bins, &home);
    let out = cmd
        .args(["--agent", "leash exec --session acpx:e2e -- codex-acp"])
        .args(["--format", "json", "--timeout", "60", "--cwd"])
        .arg(&work)
        .args(["exec", "say hi"])
        .env("LEASH_STATE_DIR", &state)
        .stdin(Stdio::null())
        .output()
        .expect("run acpx");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<serde_json::Value> = stdout
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let init = lines
        .iter()
        .find(|m| m["result"]["agentInfo"]["name"] == "codex-acp")
        .unwrap_or_else(|| panic!("no initialize answer from codex-acp:\n{stdout}\n{stderr}"));
    assert_eq!(init["result"]["protocolVersion"], 1, "{init}");
    let new_id = lines
        .iter()
        .find(|m| m["method"] == "session/new")
        .map(|m| m["id"].clone())
        .unwrap_or_else(|| panic!("acpx sent no session/new:\n{stdout}"));
    let answer = lines
        .iter()
        .find(|m| m["id"] == new_id && m.get("method").is_none())
        .unwrap_or_else(|| panic!("no answer to session/new:\n{stdout}\n{stderr}"));
    let msg = answer["error"]["message"].as_str().unwrap_or_default();
    assert!(
        msg.to_lowercase().contains("authentication required"),
        "{answer}"
    );

    // The adapter ran under a lease of that session, which is settled: nothing left running.
    let leases = run_json(&state, &["leases", "--json"]);
    let lease = leases
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["sessionKey"] == "acpx:e2e")
        .cloned()
        .unwrap_or_else(|| panic!("no lease for acpx:e2e: {leases}"));
    assert_eq!(
        lease["command"],
        serde_json::json!(["codex-acp"]),
        "{lease}"
    );
    let adapter = lease["adapterPid"].as_i64().unwrap() as i32;
    assert!(
        wait_for(|| Pid::of(adapter).is_none_or(|p| !p.alive())
            && run_json(&state, &["leases", "--json"])
                .as_array()
                .unwrap()
                .iter()
                .all(|l| l["state"] != "open")),
        "the adapter or its lease is still open: {}",
        run_json(&state, &["leases", "--json"])
    );
}

#[test]
fn the_gateway_example_reports_codex_acps_authentication_error_cleanly() {
    let Some(bins) = bins() else { return };
    let _ = wrap_bin();
    let tmp = TempDir::new("gateway-codex");
    let home = tmp.join("home");
    std::fs::create_dir_all(&home).unwrap();
    let mut cmd = Command::new("node");
    agent_env(&mut cmd, &bins, &home);
    let out = run_ok(
        "node examples/gateway.mjs --agent codex",
        cmd.arg(repo().join("examples/gateway.mjs"))
            .args(["--agent", "codex", "--leash"])
            .arg(leash_bin())
            .arg("--state-dir")
            .arg(tmp.join("state"))
            .env_remove("LEASH_STATE_DIR"),
    );
    let text = String::from_utf8_lossy(&out.stdout);
    for want in [
        "[initialize] agent codex-acp",
        "Authentication required (JSON-RPC -32000)",
        "[close] agent:main:acp:demo: closed",
        "[done] ok",
    ] {
        assert!(text.contains(want), "missing {want:?} in:\n{text}");
    }
}
