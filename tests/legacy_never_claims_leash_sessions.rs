//! An imported legacy record is a claim; a lease leash committed itself, whose owner lives,
//! outweighs it. leash's wrappers and adapters carry the incumbent's environment contract
//! (`OPENCLAW_ACPX_LEASE_ID`, `OPENCLAW_GATEWAY_INSTANCE_ID`), so an acpx record that names a live
//! leash session's lease id and gateway id (both readable from `ps`) must never end it.
//!
//! A live session (`leash exec`, or `ensure` through `leash serve`), contained in a cgroup of
//! the test's own or not. Then, against the very ids it carries:
//! - an acpx record stored in its own root, and in a second root that holds its gateway id (as
//!   an import without these checks stored them): `leash reap` (through the daemon when one
//!   serves) leaves the session alone, signals nothing, and says why;
//! - `legacy import --acpx` into its own root is refused (the lease is this root's), and into a
//!   fresh second root too (another live root uses the gateway id), each saying why.
//!
//! And `legacy import --acpx` while `leash serve` serves the root refuses to adopt another
//! gateway id ("stop leash serve first"); the daemon's id and the database's stay one.
mod common;
mod daemon_support;
use common::*;
use daemon_support::{ensure_trap, Daemon};
use serde_json::json;
use std::path::Path;
use std::process::{Command, Stdio};

/// Where the sessions run: in a cgroup root the test made (`Some`), or without containment.
struct Place {
    cgroups: Option<CgroupRoot>,
}

impl Place {
    /// `None` (the skip recorded) when containment is asked for and this host cannot give it.
    fn new(contained: bool, tag: &str) -> Option<Place> {
        if !contained {
            return Some(Place { cgroups: None });
        }
        Some(Place {
            cgroups: Some(CgroupRoot::new(tag)?),
        })
    }

    fn env(&self) -> Vec<(&'static str, String)> {
        match &self.cgroups {
            Some(c) => vec![
                ("LEASH_CGROUP_ROOT", c.path().display().to_string()),
                ("LEASH_CONTAINMENT", "on".into()),
            ],
            None => vec![("LEASH_CONTAINMENT", "off".into())],
        }
    }

    fn leash(&self, state: &Path) -> Command {
        let mut c = leash(state);
        for (k, v) in self.env() {
            c.env(k, v);
        }
        c
    }

    fn run(&self, state: &Path, args: &[&str]) -> Output {
        let out = self
            .leash(state)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("run leash");
        Output {
            code: out.status.code(),
            signal: None,
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }
}

/// The incumbent's lease file naming `lease` of `gateway`, its root pid long gone (the issue's
/// reproduction: `rootPid` 999993).
fn incumbent_state(dir: &Path, lease: &str, gateway: &str) -> std::path::PathBuf {
    let acpx = dir.join(format!("openclaw-{lease}")).join("acpx");
    std::fs::create_dir_all(&acpx).unwrap();
    let record = json!({
        "leaseId": lease, "gatewayInstanceId": gateway, "sessionKey": "agent:codex:acp:x",
        "wrapperRoot": acpx.display().to_string(),
        "wrapperPath": acpx.join("codex-acp-wrapper.mjs").display().to_string(),
        "rootPid": 999_993, "commandHash": "ab".repeat(32), "startedAt": 1, "state": "open"
    });
    std::fs::write(
        acpx.join("process-leases.json"),
        json!({"version": 1, "leases": [record]}).to_string(),
    )
    .unwrap();
    acpx
}

/// Stores, in `state`'s database, the acpx record an import without these checks wrote: it
/// names `lease` of `gateway`, imported after every live process started.
fn store_record(state: &Path, lease: &str, gateway: &str, acpx: &Path) {
    let conn = rusqlite::Connection::open(state.join("leash.db")).unwrap();
    conn.busy_timeout(std::time::Duration::from_secs(10))
        .unwrap();
    let wrapper = acpx.join("codex-acp-wrapper.mjs").display().to_string();
    conn.execute(
        "INSERT INTO legacy_records (session_key, pid, command, wrapper_path, wrapper_root, \
         state, imported_at, imported_ticks, source, acpx_lease_id, acpx_gateway_id, \
         command_hash) VALUES ('agent:codex:acp:x', 999993, ?1, ?1, ?2, 'open', 1, ?3, 'acpx', \
         ?4, ?5, ?6)",
        rusqlite::params![
            wrapper,
            acpx.display().to_string(),
            i64::MAX,
            lease,
            gateway,
            "ab".repeat(32)
        ],
    )
    .unwrap();
}

fn set_gateway(state: &Path, gateway: &str) {
    let conn = rusqlite::Connection::open(state.join("leash.db")).unwrap();
    conn.execute(
        "UPDATE meta SET value = ?1 WHERE key = 'gateway_instance_id'",
        [gateway],
    )
    .unwrap();
}

fn legacy_count(state: &Path) -> i64 {
    let conn = rusqlite::Connection::open(state.join("leash.db")).unwrap();
    conn.query_row("SELECT COUNT(*) FROM legacy_records", [], |r| r.get(0))
        .unwrap()
}

/// `leash reap --json` on `state`: the record is left open, its reason names leash's own
/// lease; nothing was terminated.
fn reap_leaves_it(place: &Place, state: &Path, what: &str) {
    let out = place.run(state, &["reap", "--json"]);
    assert!(
        out.code == Some(0) || out.code == Some(6),
        "{what}: {}",
        out.stderr
    );
    let report: serde_json::Value =
        serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("{what}: {e}: {}", out.stdout));
    let legacy = report["legacy"].as_array().expect("legacy outcomes");
    assert_eq!(legacy.len(), 1, "{what}: {report}");
    assert_eq!(legacy[0]["result"], "leftOpen", "{what}: {report}");
    let reason = legacy[0]["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("leash's own leases") || reason.contains("belongs to a leash lease"),
        "{what}: {reason}"
    );
    assert!(
        legacy[0]["signals"].as_array().is_none_or(|s| s.is_empty()),
        "{what}: {report}"
    );
}

fn scenario(contained: bool, daemon: bool) {
    let tag = format!(
        "legacy-leash-{}-{}",
        if contained { "cg" } else { "nocg" },
        if daemon { "d" } else { "x" }
    );
    let Some(place) = Place::new(contained, &tag) else {
        return;
    };
    let tmp = TempDir::new(&tag);
    let mut guard = Guard::new();
    let a = tmp.join("root-a");
    // The live session: its owner (this test, or the daemon) is alive.
    let mut served = None;
    let adapter = if daemon {
        let env = place.env();
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let d = Daemon::start_with_env(&a, &[], "info", &env);
        let mut c = d.connect();
        let (_, adapter) = ensure_trap(&mut c, tmp.path(), "live1", 500);
        served = Some(d);
        adapter
    } else {
        let trap = trap_script(tmp.path());
        let log = tmp.join("live1.log");
        guard.child(
            place
                .leash(&a)
                .args(["exec", "--session", "live1", "--"])
                .arg(&trap)
                .arg(&log)
                .stdin(Stdio::null())
                .spawn()
                .unwrap(),
        );
        Logged::wait_started(log)
    };
    guard.add(adapter.pid);
    let row = db_lease_of(&a, "live1").expect("the live session's lease");
    let lease = row["leaseId"].as_str().unwrap().to_string();
    let gw = row["gatewayInstanceId"].as_str().unwrap().to_string();
    assert_eq!(row["cgroupPath"].is_string(), contained, "{row}");
    let acpx = incumbent_state(tmp.path(), &lease, &gw);

    // Reproduction 1: the record stored in the session's own root. Reap leaves it.
    store_record(&a, &lease, &gw, &acpx);
    reap_leaves_it(&place, &a, "own root");
    assert!(
        adapter.pid.alive(),
        "the session survives its own root's reap"
    );

    // Reproduction 2: a second root that holds the gateway id, with the record.
    let b = tmp.join("root-b");
    init_state_root(&b);
    set_gateway(&b, &gw);
    store_record(&b, &lease, &gw, &acpx);
    reap_leaves_it(&place, &b, "second root");
    assert!(
        adapter.pid.alive(),
        "the session survives the second root's reap"
    );

    // The imports themselves are refused, saying why, and write nothing.
    let before = legacy_count(&a);
    let out = place.run(&a, &["legacy", "import", "--acpx", acpx.to_str().unwrap()]);
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    assert!(
        out.stderr
            .contains(&format!("acpx lease {lease} is a lease of this state root")),
        "{}",
        out.stderr
    );
    assert_eq!(legacy_count(&a), before, "nothing imported");
    // A fresh root taking the gateway id, for a lease that is not leash's.
    let c = tmp.join("root-c");
    let other = incumbent_state(tmp.path(), "incumbent-lease-1", &gw);
    let out = place.run(&c, &["legacy", "import", "--acpx", other.to_str().unwrap()]);
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    assert!(
        out.stderr
            .contains(&format!("refusing to adopt gateway instance id {gw}"))
            && out.stderr.contains("another live leash state root uses it"),
        "{}",
        out.stderr
    );
    if contained {
        assert!(
            out.stderr.contains("its cgroup directory"),
            "{}",
            out.stderr
        );
    } else {
        assert!(out.stderr.contains("leash-wrap pid"), "{}", out.stderr);
    }
    assert_ne!(
        gateway_id(&c.join("leash.db")).unwrap(),
        gw,
        "the fresh root did not adopt it"
    );

    // Nothing signalled: the adapter logs every catchable signal it gets.
    assert!(adapter.pid.alive());
    assert_eq!(adapter.signals(), "", "the session was signalled");
    if let Some(mut d) = served {
        let mut conn = d.connect();
        conn.call("close", json!({"session": "live1", "graceMs": 100}));
        assert!(wait_for(|| !adapter.pid.alive()));
        assert!(d.terminate().success());
    }
}

#[test]
fn a_record_never_ends_an_uncontained_session() {
    scenario(false, false);
}

#[test]
fn a_record_never_ends_a_contained_session() {
    scenario(true, false);
}

#[test]
fn a_record_never_ends_an_uncontained_daemon_session() {
    scenario(false, true);
}

#[test]
fn a_record_never_ends_a_contained_daemon_session() {
    scenario(true, true);
}

/// `legacy import --acpx` on a root `leash serve` serves refuses to adopt another gateway id
/// (the daemon would keep its own): it says to stop leash serve first, and writes nothing; once
/// the daemon is stopped, the same import adopts the id.
#[test]
fn adoption_under_leash_serve_is_refused() {
    let tmp = TempDir::new("legacy-adopt-serve");
    let state = tmp.join("state");
    let mut d = Daemon::start_with_env(&state, &[], "info", &[("LEASH_CONTAINMENT", "off")]);
    let theirs = uuid::Uuid::new_v4().to_string();
    let oc = tmp.join("openclaw");
    std::fs::create_dir_all(oc.join("acpx")).unwrap();
    std::fs::write(oc.join("gateway-instance-id"), &theirs).unwrap();
    let ours = gateway_id(&state.join("leash.db")).unwrap();
    let acpx = oc.join("acpx");
    let out = run(
        &state,
        &["legacy", "import", "--acpx", acpx.to_str().unwrap()],
    );
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    assert!(
        out.stderr.contains("stop leash serve first"),
        "{}",
        out.stderr
    );
    assert_eq!(
        gateway_id(&state.join("leash.db")).unwrap(),
        ours,
        "one gateway id for the root"
    );
    assert!(d.terminate().success());
    let out = run(
        &state,
        &["legacy", "import", "--acpx", acpx.to_str().unwrap()],
    );
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert_eq!(gateway_id(&state.join("leash.db")).unwrap(), theirs);
}
