//! Issue 11: the controller simulator. `close` runs through the TERM → grace → KILL engine over
//! the recording signaller: a fixture host (`fixtures/lifecycle`) whose processes exit as a
//! script says, on a scripted clock, with a real store. The test asserts the exact timeline:
//! who got SIGTERM, when SIGKILL followed, children first, what was never signalled, and the
//! lease's final state. The live tests (`close_and_cancel.rs`, `wrapper_sigkill.rs`, ...) stay.
use leash::lease::{command_hash, Lease, LeaseState};
use leash::lifecycle::{CloseResult, Controller, LeaseRef};
use leash::proc::FixtureTable;
use leash::signal::{Caller, Delivery, Exit, RecordingSignaller, Sig, SimWhat};
use leash::state::StateRoot;
use serde_json::Value;
use std::collections::HashMap;
use std::path::Path;

/// A fixture case with its gateway id and wrapper root rewritten to the store's.
fn load(case: &str, dir: &Path) -> (Value, StateRoot) {
    let root = StateRoot::open(dir).unwrap();
    let gw = leash::store::Store::open(&root.db_path())
        .unwrap()
        .gateway_instance_id()
        .to_string();
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("fixtures/lifecycle/{case}.json"));
    let text = std::fs::read_to_string(path).unwrap();
    let doc: Value = serde_json::from_str(&text).unwrap();
    let text = text
        .replace(doc["gateway"]["gatewayInstanceId"].as_str().unwrap(), &gw)
        .replace(
            doc["gateway"]["wrapperRoot"].as_str().unwrap(),
            root.wrapper_root().to_str().unwrap(),
        );
    (serde_json::from_str(&text).unwrap(), root)
}

fn leases(doc: &Value) -> Vec<Lease> {
    doc["leases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| {
            let mut l = l.clone();
            let argv: Vec<String> = serde_json::from_value(l["command"].clone()).unwrap();
            l["commandHash"] = Value::String(command_hash(&argv));
            serde_json::from_value(l).unwrap()
        })
        .collect()
}

fn caller(doc: &Value) -> Caller {
    let c = &doc["caller"];
    Caller {
        pid: c["pid"].as_i64().unwrap() as i32,
        pgid: c["pgid"].as_i64().unwrap() as i32,
        uid: c["uid"].as_u64().unwrap() as u32,
    }
}

fn tempdir(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("leash-sim-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// (ms, pid, signal, group) of every delivered signal, in order.
fn signals(sim: &RecordingSignaller) -> Vec<(u64, i32, Sig, bool)> {
    sim.timeline()
        .into_iter()
        .filter_map(|e| match e.what {
            SimWhat::Signal {
                signal,
                group,
                delivery: Delivery::Delivered,
            } => Some((e.at, e.pid, signal, group)),
            _ => None,
        })
        .collect()
}

/// A setsid escapee carrying the lease's markers ignores SIGTERM: its child goes first on
/// SIGTERM, the escapee gets SIGKILL exactly when the lease's 3,000 ms grace ends, another
/// gateway's marked process is never signalled, and the lease ends closed.
#[test]
fn escapee_ignoring_term_is_killed_when_the_grace_ends() {
    let dir = tempdir("escapee");
    let (doc, root) = load("wrapper_killed_escapee_found_by_markers", &dir);
    let table: FixtureTable = serde_json::from_value(doc["table"].clone()).unwrap();
    let mut script = HashMap::new();
    script.insert(
        1204,
        Exit {
            on_term: None,
            ..Exit::default()
        },
    );
    let sim = RecordingSignaller::new(table, script);
    let lease = leases(&doc).remove(0);
    let mut ctl = Controller::open(root, &sim)
        .unwrap()
        .with_containment(&leash::cgroup::Settings::default_off())
        .with_signaller(&sim, &sim, caller(&doc));
    ctl.store().insert_lease(&lease, None, |_| None).unwrap();
    let out = ctl
        .close(&[LeaseRef::Id(lease.lease_id.clone())], None)
        .unwrap();
    assert_eq!(
        signals(&sim),
        vec![
            (0, 1205, Sig::Term, false),
            (0, 1204, Sig::Term, false),
            (3000, 1204, Sig::Kill, false),
        ],
        "timeline {:#?}",
        sim.timeline()
    );
    assert!(sim.timeline().iter().all(|e| e.pid != 1500));
    assert_eq!(sim.exited_at(1205), Some(0));
    assert_eq!(sim.exited_at(1204), Some(3000));
    assert_eq!(out[0].result, CloseResult::Closed, "{out:?}");
    let row = ctl.store().lease(&lease.lease_id).unwrap().unwrap();
    assert_eq!(row.state, LeaseState::Closed);
    assert!(row
        .state_reason
        .unwrap()
        .contains("1 needed SIGKILL after 3000 ms"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// Pid reuse (a stranger, another gateway's wrapper at the root pid) and an unreadable process
/// table: close signals nobody, refuses nothing it would have had to pin, and the lease ends
/// lost (the pid was reused) or open again (ownership could not be proven), with the reason.
#[test]
fn reused_root_pid_and_unverifiable_table_signal_nobody() {
    for (case, state, result, why) in [
        (
            "unrelated_process_reuses_root_pid",
            LeaseState::Lost,
            CloseResult::Lost,
            "pid was reused",
        ),
        (
            "other_gateway_wrapper_reuses_root_pid",
            LeaseState::Lost,
            CloseResult::Lost,
            "pid was reused",
        ),
        (
            "process_list_unavailable",
            LeaseState::Open,
            CloseResult::LeftOpen,
            "unavailable",
        ),
    ] {
        let dir = tempdir(case);
        let (doc, root) = load(case, &dir);
        let table: FixtureTable = serde_json::from_value(doc["table"].clone()).unwrap();
        let sim = RecordingSignaller::new(table, HashMap::new());
        let lease = leases(&doc).remove(0);
        let mut ctl = Controller::open(root, &sim)
            .unwrap()
            .with_containment(&leash::cgroup::Settings::default_off())
            .with_signaller(&sim, &sim, caller(&doc));
        ctl.store().insert_lease(&lease, None, |_| None).unwrap();
        let out = ctl
            .close(&[LeaseRef::Id(lease.lease_id.clone())], None)
            .unwrap();
        assert_eq!(sim.timeline(), vec![], "{case}: nothing signalled");
        assert_eq!(out[0].result, result, "{case}: {out:?}");
        let row = ctl.store().lease(&lease.lease_id).unwrap().unwrap();
        assert_eq!(row.state, state, "{case}");
        let reason = row.state_reason.unwrap_or_default();
        assert!(reason.contains(why), "{case}: {reason}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
