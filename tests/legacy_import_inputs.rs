//! What `leash legacy import` reads and what it answers. Its inputs are the incumbent's files
//! and SQLite stores: each must be a regular file (a symlink, a device is refused, never followed
//! nor skipped), no larger than the stated bound (64 MiB: a larger one is refused at once, not
//! read into memory), and the keyed store's `plugin_state_entries` a plain table (a recursive
//! view under that name is refused, not queried for ever). A refusal writes nothing and adopts
//! no gateway id. A success is reported on stdout (with `--json`, as one JSON object), never on
//! stderr.
mod common;
use common::*;
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

/// `<tmp>/<name>/openclaw/acpx`, with one valid lease of `gateway` in its lease file.
fn incumbent(tmp: &Path, name: &str, gateway: &str) -> PathBuf {
    let acpx = tmp.join(name).join("openclaw").join("acpx");
    std::fs::create_dir_all(&acpx).unwrap();
    let lease = json!({
        "leaseId": "lease-1", "gatewayInstanceId": gateway, "sessionKey": "agent:codex:acp:x",
        "wrapperRoot": acpx.display().to_string(),
        "wrapperPath": acpx.join("codex-acp-wrapper.mjs").display().to_string(),
        "rootPid": 4321, "commandHash": "ab".repeat(32), "startedAt": 1, "state": "open"
    });
    std::fs::write(
        acpx.join("process-leases.json"),
        json!({"version": 1, "leases": [lease]}).to_string(),
    )
    .unwrap();
    acpx
}

fn import(state: &Path, acpx: &Path, extra: &[&str]) -> Output {
    let mut args = vec!["legacy", "import", "--acpx", acpx.to_str().unwrap()];
    args.extend_from_slice(extra);
    run(state, &args)
}

/// A refusal: exit 1, the words, nothing imported, the id not adopted.
fn refused(state: &Path, out: &Output, gateway: &str, says: &str) {
    assert_eq!(out.code, Some(1), "{says}: {}", out.stderr);
    assert!(out.stderr.contains(says), "{says}: {}", out.stderr);
    assert!(out.stderr.contains("nothing imported"), "{}", out.stderr);
    assert_ne!(
        gateway_id(&state.join("leash.db")).as_deref(),
        Some(gateway),
        "{says}: adopted"
    );
}

/// Symlinked inputs and devices are refused, and what a link points at is never echoed.
#[test]
fn inputs_that_are_not_regular_files_are_refused() {
    let tmp = TempDir::new("legacy-inputs-links");
    let gw = uuid::Uuid::new_v4().to_string();

    // gateway-instance-id, a link to another file: its contents stay out of the message.
    let acpx = incumbent(tmp.path(), "link-id", &gw);
    let secret = tmp.join("secret.txt");
    std::fs::write(&secret, "hunter2-not-for-your-eyes").unwrap();
    std::os::unix::fs::symlink(&secret, acpx.parent().unwrap().join("gateway-instance-id"))
        .unwrap();
    let state = tmp.join("state-link-id");
    let out = import(&state, &acpx, &[]);
    refused(&state, &out, &gw, "a symbolic link");
    assert!(!out.stderr.contains("hunter2"), "{}", out.stderr);

    // The lease file, a link to /dev/zero, next to a valid gateway id file: refused, not
    // skipped (the id is not adopted without the leases).
    let acpx = incumbent(tmp.path(), "zero", &gw);
    std::fs::write(acpx.parent().unwrap().join("gateway-instance-id"), &gw).unwrap();
    let leases = acpx.join("process-leases.json");
    std::fs::remove_file(&leases).unwrap();
    std::os::unix::fs::symlink("/dev/zero", &leases).unwrap();
    let state = tmp.join("state-zero");
    let out = import(&state, &acpx, &[]);
    refused(&state, &out, &gw, "process-leases.json");
    assert!(out.stderr.contains("a symbolic link"), "{}", out.stderr);

    // A FIFO as the lease file: refused, never opened for a read that would block.
    let acpx = incumbent(tmp.path(), "fifo", &gw);
    let leases = acpx.join("process-leases.json");
    std::fs::remove_file(&leases).unwrap();
    nix::unistd::mkfifo(&leases, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let state = tmp.join("state-fifo");
    let out = import(&state, &acpx, &[]);
    refused(&state, &out, &gw, "not a regular file (a FIFO)");
}

/// A keyed store whose `plugin_state_entries` is a recursive view (it never ends) is refused at
/// once, not queried.
#[test]
fn a_keyed_store_that_is_a_recursive_view_is_refused() {
    let tmp = TempDir::new("legacy-inputs-view");
    let gw = uuid::Uuid::new_v4().to_string();
    let acpx = tmp.join("openclaw").join("acpx");
    std::fs::create_dir_all(&acpx).unwrap();
    let db = tmp.join("openclaw").join("state");
    std::fs::create_dir_all(&db).unwrap();
    let conn = rusqlite::Connection::open(db.join("openclaw.sqlite")).unwrap();
    conn.execute_batch(
        "CREATE VIEW plugin_state_entries AS WITH RECURSIVE c(n) AS \
         (SELECT 1 UNION ALL SELECT n + 1 FROM c) \
         SELECT 'acpx' AS plugin_id, 'process-leases' AS namespace, CAST(n AS TEXT) AS entry_key, \
         '{}' AS value_json, n AS created_at, NULL AS expires_at FROM c;",
    )
    .unwrap();
    drop(conn);
    std::fs::write(tmp.join("openclaw").join("gateway-instance-id"), &gw).unwrap();
    let state = tmp.join("state");
    let mut guard = Guard::new();
    let child = guard.child(
        leash(&state)
            .args(["legacy", "import", "--acpx", acpx.to_str().unwrap()])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let started = Instant::now();
    let done = wait_for_within(Duration::from_secs(60), || {
        child.try_wait().unwrap().is_some()
    });
    assert!(
        done,
        "legacy import still runs after {:?} on a recursive view",
        started.elapsed()
    );
    let mut stderr = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut stderr).unwrap();
    assert_eq!(child.wait().unwrap().code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("plugin_state_entries is a view here"),
        "{stderr}"
    );
    assert_ne!(
        gateway_id(&state.join("leash.db")).as_deref(),
        Some(gw.as_str())
    );
}

/// A file past the bound is refused with the bound in the message, at once (it is not read):
/// measured here with a sparse 400 MB lease file.
#[test]
fn a_file_past_the_bound_is_refused_unread() {
    let tmp = TempDir::new("legacy-inputs-big");
    let gw = uuid::Uuid::new_v4().to_string();
    let acpx = incumbent(tmp.path(), "big", &gw);
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(acpx.join("process-leases.json"))
        .unwrap();
    f.set_len(400 << 20).unwrap();
    drop(f);
    let state = tmp.join("state-big");
    let started = Instant::now();
    let out = import(&state, &acpx, &[]);
    let took = started.elapsed();
    refused(
        &state,
        &out,
        &gw,
        "more than the 64 MiB leash reads from one file",
    );
    eprintln!("a 400 MB lease file refused in {took:?}");
    assert!(took < Duration::from_secs(20), "{took:?}");

    // Just past the bound: refused too; the legacy record format has the same bound.
    let file = tmp.join("records.json");
    let f = std::fs::File::create(&file).unwrap();
    f.set_len((64 << 20) + 1).unwrap();
    drop(f);
    let state = tmp.join("state-records");
    let out = run(&state, &["legacy", "import", file.to_str().unwrap()]);
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    assert!(out.stderr.contains("64 MiB"), "{}", out.stderr);
}

/// Success goes to stdout (stderr stays empty), and `--json` gives the result as JSON.
#[test]
fn success_is_reported_on_stdout() {
    let tmp = TempDir::new("legacy-inputs-stdout");
    let gw = uuid::Uuid::new_v4().to_string();
    let acpx = incumbent(tmp.path(), "text", &gw);
    let state = tmp.join("state-text");
    let out = import(&state, &acpx, &[]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert_eq!(out.stderr, "", "nothing on stderr");
    assert!(
        out.stdout.contains(&format!(
            "gateway instance id {gw} adopted by this fresh root"
        )) && out.stdout.contains("imported 1 acpx lease(s)"),
        "{}",
        out.stdout
    );

    let acpx = incumbent(tmp.path(), "json", &gw);
    let state = tmp.join("state-json");
    let out = import(&state, &acpx, &["--json"]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert_eq!(out.stderr, "");
    let v: serde_json::Value =
        serde_json::from_str(out.stdout.trim()).unwrap_or_else(|e| panic!("{e}: {}", out.stdout));
    assert_eq!(v["gatewayInstanceId"], gw.as_str(), "{v}");
    assert_eq!(v["adoption"], "fresh", "{v}");
    assert_eq!(v["leases"], 1, "{v}");
    assert_eq!(v["sessions"], 0, "{v}");
    // Again: already there.
    let out = import(&state, &acpx, &["--json"]);
    let v: serde_json::Value = serde_json::from_str(out.stdout.trim()).unwrap();
    assert_eq!(
        (v["adoption"].as_str(), v["alreadyPresent"].as_u64()),
        (Some("same"), Some(1))
    );

    // leash's own legacy format too.
    let file = tmp.join("records.json");
    std::fs::write(
        &file,
        json!([{"sessionKey": "old:1", "pid": 4321, "command": "old-gateway --serve"}]).to_string(),
    )
    .unwrap();
    let state = tmp.join("state-records");
    let out = run(&state, &["legacy", "import", file.to_str().unwrap()]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert_eq!(out.stderr, "");
    assert!(
        out.stdout.contains("imported 1 legacy record(s)"),
        "{}",
        out.stdout
    );
    let state = tmp.join("state-records-json");
    let out = run(
        &state,
        &["legacy", "import", "--json", file.to_str().unwrap()],
    );
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let v: serde_json::Value = serde_json::from_str(out.stdout.trim()).unwrap();
    assert_eq!(v["imported"], 1, "{v}");
}
