//! The controller simulator: `close` and `reap` run through the real controller, store and
//! TERM → grace → KILL engine, over the recording signaller: a fixture host
//! (`fixtures/lifecycle`) whose processes exit as the fixture's script says, on a scripted clock.
//! Each fixture's `simulate` section writes down, per verb, the exact timeline (who got SIGTERM,
//! when SIGKILL followed, children first, what a pin refused and why), each lease's outcome (the
//! members signalled with their role, what the guards refused and why, the result) and the
//! final rows (lease state and reason, legacy records). Every case the live tests stage on real
//! processes (grandchild, decoys, a foreign uid, pid reuse, a group member, a marker carrier, a
//! setsid escapee, a TERM-ignoring adapter, legacy records) has its twin here. The cgroup kill
//! goes through the signaller too (`Signaller::kill_cgroup`), and the recording one records it;
//! the engine's cgroup kill of a contained lease runs here over a stand-in cgroup
//! (`fixtures/lifecycle/contained/`), and so do contained leases through `close` and `reap`: the
//! controller reads a lease's cgroup (members, `populated`, id) through the process table, which
//! the recording signaller is, so the fixture host's cgroups are the ones observed. The
//! live tests stay.
mod common;
use common::lifecycle::{
    case_caller as caller, case_leases as leases, case_reap_options, lifecycle_fixture,
    lifecycle_fixtures, read_case,
};
use leash::controller::{CloseOutcome, CloseResult, Controller, LeaseRef, LegacyOutcome};
use leash::proc::FixtureTable;
use leash::signal::{Delivery, Exit, RecordingSignaller, SimEvent, SimWhat};
use leash::state::StateRoot;
use leash::store::NewLegacyRecord;
use leash_core::guard::Sig;
use leash_core::model::LeaseState;
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
    let text = std::fs::read_to_string(lifecycle_fixture(&format!("{case}.json"))).unwrap();
    let doc: Value = serde_json::from_str(&text).unwrap();
    let text = text
        .replace(doc["gateway"]["gatewayInstanceId"].as_str().unwrap(), &gw)
        .replace(
            doc["gateway"]["wrapperRoot"].as_str().unwrap(),
            root.wrapper_root().to_str().unwrap(),
        );
    (serde_json::from_str(&text).unwrap(), root)
}

/// When each process of the fixture host exited (scripted ms), in the table's order.
fn exits(sim: &RecordingSignaller, doc: &Value) -> Value {
    doc["table"]["processes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| {
            let pid = p["pid"].as_i64()? as i32;
            sim.exited_at(pid).map(|at| format!("{at} ms {pid}"))
        })
        .collect::<Vec<_>>()
        .into()
}

/// Whether `pid` got a signal, alone, as a member of a group or of a killed cgroup.
fn signalled(sim: &RecordingSignaller, pid: i32) -> bool {
    sim.timeline().iter().any(|e| match &e.what {
        SimWhat::Signal { members, .. } => e.pid == pid || members.contains(&pid),
        SimWhat::CgroupKill { members, .. } => members.contains(&pid),
        SimWhat::Refused { .. } => false,
    })
}

/// A controller over the fixture's state root that signals through the recording signaller on
/// its scripted clock, as the fixture's caller, without containment.
fn simulated<'a>(root: StateRoot, sim: &'a RecordingSignaller, doc: &Value) -> Controller<'a> {
    Controller::open(root, sim)
        .unwrap()
        .with_containment(&leash::cgroup::Settings::default_off())
        .with_signaller(sim, sim, caller(doc))
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
                ..
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
    let ctl = simulated(root, &sim, &doc);
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
        let ctl = simulated(root, &sim, &doc);
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

/// One line of a timeline as the fixtures spell it: `"3000 ms SIGKILL 1204"`, with
/// ` group [members reached]` for a signal to the group the process leads, ` (already gone)` when
/// it had exited, and
/// `"0 ms refused 4000: <why>"` for a pin or send the signaller refused.
fn timeline_line(e: &SimEvent) -> String {
    match &e.what {
        SimWhat::Signal {
            signal,
            group,
            delivery,
            members,
        } => format!(
            "{} ms {} {}{}{}",
            e.at,
            signal.name(),
            e.pid,
            if *group {
                format!(" group {members:?}")
            } else {
                String::new()
            },
            match delivery {
                Delivery::Delivered => "",
                Delivery::AlreadyGone => " (already gone)",
                Delivery::CgroupKill => " (cgroup.kill)",
            }
        ),
        SimWhat::Refused { reason } => format!("{} ms refused {}: {reason}", e.at, e.pid),
        SimWhat::CgroupKill { cgroup, members } => {
            format!("{} ms cgroup.kill {cgroup} {members:?}", e.at)
        }
    }
}

/// What an outcome signalled, as `"SIGTERM 1205 marked"` (delivery named unless delivered), and
/// what it refused, as `"4000: <why>"`.
fn signalled_and_refused(
    signals: &[leash::controller::terminate::SignalRecord],
    refused: &[leash_core::plan::RefusedSignal],
) -> (Value, Value) {
    let signals: Vec<String> = signals
        .iter()
        .map(|s| {
            let role = serde_json::to_value(s.role).unwrap();
            format!(
                "{} {} {}{}",
                s.signal.name(),
                s.pid,
                role.as_str().unwrap(),
                match s.delivery {
                    Delivery::Delivered => "",
                    Delivery::AlreadyGone => " (already gone)",
                    Delivery::CgroupKill => " (cgroup.kill)",
                }
            )
        })
        .collect();
    let refused: Vec<String> = refused
        .iter()
        .map(|r| format!("{}: {}", r.pid, r.reason))
        .collect();
    (serde_json::json!(signals), serde_json::json!(refused))
}

fn result_name(r: CloseResult) -> Value {
    serde_json::to_value(r).unwrap()
}

/// Each fixture lease: its outcome (if the verb produced one) and its row afterwards.
fn lease_results(
    ctl: &mut Controller<'_>,
    doc: &Value,
    outcomes: &[CloseOutcome],
    skipped: &[(String, String)],
) -> Vec<Value> {
    leases(doc)
        .iter()
        .map(|l| {
            let row = ctl.store().lease(&l.lease_id).unwrap().unwrap();
            let mut v = serde_json::json!({
                "leaseId": l.lease_id,
                "state": row.state.to_string(),
                "reason": row.state_reason,
            });
            if let Some(o) = outcomes.iter().find(|o| o.lease_id == l.lease_id) {
                let (signals, refused) = signalled_and_refused(&o.signals, &o.refused);
                v["result"] = result_name(o.result);
                v["signals"] = signals;
                v["refused"] = refused;
            }
            if let Some((_, why)) = skipped.iter().find(|(id, _)| *id == l.lease_id) {
                v["skipped"] = Value::String(why.clone());
            }
            v
        })
        .collect()
}

/// Each legacy record: its outcome and its row afterwards.
fn legacy_results(ctl: &mut Controller<'_>, outcomes: &[LegacyOutcome]) -> Vec<Value> {
    ctl.store()
        .legacy_records(false)
        .unwrap()
        .into_iter()
        .map(|r| {
            let mut v = serde_json::json!({
                "pid": r.pid,
                "state": r.state,
                "reason": r.state_reason,
            });
            if let Some(o) = outcomes.iter().find(|o| o.id == r.id) {
                let (signals, refused) = signalled_and_refused(&o.signals, &o.refused);
                v["result"] = result_name(o.result);
                v["signals"] = signals;
                v["refused"] = refused;
            }
            v
        })
        .collect()
}

/// Runs `verb` (`close` of every fixture lease, or `reap`) on a fresh store holding the
/// fixture's leases and legacy records, over the fixture host as its script says; returns what
/// happened in the fixtures' spelling.
fn simulate(case: &str, verb: &str) -> Value {
    let dir = tempdir(&format!("{case}-{verb}"));
    let (doc, root) = load(case, &dir);
    let table: FixtureTable = serde_json::from_value(doc["table"].clone()).unwrap();
    let script: HashMap<String, Exit> =
        serde_json::from_value(doc["simulate"]["script"].clone()).unwrap_or_default();
    let script = script
        .into_iter()
        .map(|(pid, exit)| (pid.parse::<i32>().unwrap(), exit))
        .collect();
    let sim = RecordingSignaller::new(table, script);
    let mut ctl = simulated(root, &sim, &doc);
    for l in leases(&doc) {
        ctl.store().insert_lease(&l, None, |_| None).unwrap();
    }
    let records: Vec<leash_core::model::LegacyRecord> =
        serde_json::from_value(doc["legacy"].clone()).unwrap_or_default();
    for r in &records {
        ctl.store()
            .import_legacy(
                &[NewLegacyRecord {
                    session_key: &r.session_key,
                    pid: r.pid as i64,
                    command: &r.command,
                    wrapper_path: r.wrapper_path.as_deref(),
                }],
                r.wrapper_root.as_deref(),
                r.imported_ticks,
                r.imported_at,
            )
            .unwrap();
    }
    let mut out = serde_json::json!({});
    match verb {
        "close" => {
            let refs: Vec<LeaseRef> = leases(&doc)
                .into_iter()
                .map(|l| LeaseRef::Id(l.lease_id))
                .collect();
            let outcomes = ctl.close(&refs, None).unwrap();
            out["leases"] = lease_results(&mut ctl, &doc, &outcomes, &[]).into();
        }
        "reap" => {
            let report = ctl.reap(&case_reap_options()).unwrap();
            out["leases"] = lease_results(&mut ctl, &doc, &report.leases, &report.skipped).into();
            if !records.is_empty() {
                out["legacy"] = legacy_results(&mut ctl, &report.legacy).into();
            }
            if !report.escapees.is_empty() {
                out["escapees"] = report
                    .escapees
                    .iter()
                    .map(|o| {
                        let (signals, refused) = signalled_and_refused(&o.signals, &o.refused);
                        serde_json::json!({
                            "leaseId": o.lease_id,
                            "reason": o.reason,
                            "signals": signals,
                            "refused": refused,
                        })
                    })
                    .collect::<Vec<_>>()
                    .into();
            }
        }
        _ => unreachable!("{verb}"),
    }
    out["timeline"] = sim
        .timeline()
        .iter()
        .map(timeline_line)
        .collect::<Vec<_>>()
        .into();
    out["exits"] = exits(&sim, &doc);
    // Nothing the fixture calls a decoy is ever signalled, whatever the verb.
    for exp in doc["expect"]["leases"].as_array().into_iter().flatten() {
        for never in exp["notSignalled"].as_array().into_iter().flatten() {
            let never = never.as_i64().unwrap() as i32;
            assert!(
                !signalled(&sim, never),
                "{case}: {verb}: decoy {never} was signalled: {:#?}",
                sim.timeline()
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    // Reasons that name the state root name it as `<root>`.
    let text = serde_json::to_string(&out)
        .unwrap()
        .replace(dir.to_str().unwrap(), "<root>");
    serde_json::from_str(&text).unwrap()
}

/// Every fixture with a `simulate` section: `close` and `reap` each end exactly as it says.
#[test]
fn every_fixture_case_closes_and_reaps_on_its_timeline() {
    let dir = lifecycle_fixture("");
    let cases: Vec<String> = lifecycle_fixtures()
        .iter()
        .map(|p| p.file_stem().unwrap().to_string_lossy().into_owned())
        .collect();
    let mut simulated = 0;
    let mut failures = Vec::new();
    for case in &cases {
        let text = std::fs::read_to_string(dir.join(format!("{case}.json"))).unwrap();
        let doc: Value = serde_json::from_str(&text).unwrap();
        let Some(want) = doc.get("simulate") else {
            continue;
        };
        simulated += 1;
        for verb in ["close", "reap"] {
            let got = simulate(case, verb);
            if want[verb] != got {
                failures.push(format!(
                    "{case}: {verb}: got\n{}\nwant\n{}",
                    serde_json::to_string_pretty(&got).unwrap(),
                    serde_json::to_string_pretty(&want[verb]).unwrap()
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    assert!(
        simulated >= 18,
        "every staged case has its simulated twin ({simulated} of {})",
        cases.len()
    );
}

/// The startup-orphans host lists a setsid escapee (1204) re-parented to init while its wrapper
/// still runs. Close and reap read a live wrapper's subtree only (a live wrapper is a subreaper,
/// so on Linux every orphan of its tree stays below it), so the first reap closes the lease
/// without it; the next reap finds it by its markers among the closed lease's escapees and
/// terminates it, and the decoys (same argv without markers, another lease's marker) survive both.
#[test]
fn escapee_outside_a_live_wrappers_tree_is_taken_by_the_next_reap() {
    let case = "startup_orphans_wrapper_adapter_descendants";
    let dir = tempdir("next-reap");
    let (doc, root) = load(case, &dir);
    let table: FixtureTable = serde_json::from_value(doc["table"].clone()).unwrap();
    let sim = RecordingSignaller::new(table, HashMap::new());
    let lease = leases(&doc).remove(0);
    let ctl = simulated(root, &sim, &doc);
    ctl.store().insert_lease(&lease, None, |_| None).unwrap();
    let opts = case_reap_options();
    let first = ctl.reap(&opts).unwrap();
    assert_eq!(first.leases[0].result, CloseResult::Closed, "{first:?}");
    assert!(first.escapees.is_empty(), "{first:?}");
    assert_eq!(sim.exited_at(1204), None, "the first reap leaves 1204");
    let second = ctl.reap(&opts).unwrap();
    assert!(second.leases.is_empty(), "{second:?}");
    assert_eq!(second.escapees.len(), 1, "{second:?}");
    let (signals, refused) =
        signalled_and_refused(&second.escapees[0].signals, &second.escapees[0].refused);
    assert_eq!(signals, serde_json::json!(["SIGTERM 1204 marked"]));
    assert_eq!(refused, serde_json::json!([]));
    assert_eq!(sim.exited_at(1204), Some(0));
    let lines: Vec<String> = sim.timeline().iter().map(timeline_line).collect();
    assert_eq!(lines.last().map(String::as_str), Some("0 ms SIGTERM 1204"));
    for decoy in [1, 1300, 1400] {
        assert!(sim.timeline().iter().all(|e| e.pid != decoy), "{lines:?}");
        assert_eq!(sim.exited_at(decoy), None);
    }
    let row = ctl.store().lease(&lease.lease_id).unwrap().unwrap();
    assert_eq!(row.state, LeaseState::Closed);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A job of the engine test below: it terminates nothing a log line names.
struct Contained;

impl leash::controller::terminate::Subject for Contained {
    fn lease_id(&self) -> Option<&str> {
        None
    }
}

/// A contained lease's cgroup kill goes through the signaller, so the recording one sees it
/// (`fixtures/lifecycle/contained/`): the TERM → grace → KILL engine over a fixture host whose
/// verified cgroup (a directory this test made, standing in for the cgroupfs one) holds the
/// lease's members. When every member passes the member check, one `cgroup.kill` at the end of
/// the grace takes them all, the escapee no pin reached included; when a stranger was moved in,
/// the check refuses, nobody is killed as a group and the pinned adapter gets its own SIGKILL.
#[test]
fn contained_lease_cgroup_kill_is_the_signallers() {
    use leash::controller::terminate::{Engine, Job};
    use leash::signal::Clock;
    let doc = read_case(&lifecycle_fixture(
        "contained/cgroup_kill_at_grace_end.json",
    ));
    let r = &doc["rule"];
    let rule = leash_core::verify::MemberRule {
        lease_id: r["leaseId"].as_str().unwrap().into(),
        gateway_instance_id: r["gatewayInstanceId"].as_str().unwrap().into(),
        root_start_time: r["rootStartTime"].as_u64().unwrap(),
        uid: r["uid"].as_u64().map(|u| u as u32),
    };
    let script: HashMap<i32, Exit> = doc["script"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(pid, e)| {
            (
                pid.parse().unwrap(),
                serde_json::from_value(e.clone()).unwrap(),
            )
        })
        .collect();
    let caller = caller(&doc);
    for case in doc["cases"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let cg = tempdir(&format!("cgroup-{}", name.replace(' ', "-")));
        let ino = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&cg).unwrap());
        let table: FixtureTable = serde_json::from_value(doc["table"].clone()).unwrap();
        let members: Vec<i32> = serde_json::from_value(case["cgroupMembers"].clone()).unwrap();
        let sim = RecordingSignaller::new(table, script.clone()).with_cgroup(cg.clone(), members);
        let engine = Engine {
            table: &sim,
            caller: &caller,
            signaller: &sim,
            clock: &sim,
        };
        let mut job = Job::new(
            Contained,
            "agent:main:1".into(),
            doc["graceMs"].as_u64().unwrap(),
            serde_json::from_value(doc["planned"].clone()).unwrap(),
            Vec::new(),
            sim.now(),
        );
        job.cgroup = Some((cg.clone(), ino, Some(rule.clone())));
        let mut jobs = [job];
        engine.run_jobs(&mut jobs);
        let cg_name = cg.display().to_string();
        let timeline: Vec<String> = sim
            .timeline()
            .iter()
            .map(|e| timeline_line(e).replace(&cg_name, "CGROUP"))
            .collect();
        assert_eq!(
            serde_json::json!(timeline),
            case["timeline"],
            "{name}: timeline"
        );
        let (signals, _) = signalled_and_refused(&jobs[0].signals, &jobs[0].refused);
        assert_eq!(signals, case["signals"], "{name}: signals");
        for pid in [1200, 1201, 1205, 1300] {
            assert_eq!(
                sim.exited_at(pid),
                case["exited"][pid.to_string()].as_u64(),
                "{name}: exit of {pid}"
            );
        }
        for never in case["notSignalled"].as_array().unwrap() {
            let never = never.as_i64().unwrap() as i32;
            assert!(
                !sim.timeline().iter().any(|e| match &e.what {
                    SimWhat::Signal { members, .. } => e.pid == never || members.contains(&never),
                    SimWhat::CgroupKill { members, .. } => members.contains(&never),
                    SimWhat::Refused { .. } => false,
                }),
                "{name}: {never} was signalled"
            );
        }
        let _ = std::fs::remove_dir_all(&cg);
    }
}

/// A contained lease through the controller's `close` and `reap` over the fixture host
/// (`fixtures/lifecycle/contained/close_and_reap_after_wrapper_sigkill.json`): the controller
/// reads the lease's cgroup through the process table, which the recording signaller is, so its
/// members are the fixture's; the verified cgroup's kill at the end of the grace is the
/// signaller's (`cgroup.kill` in the timeline) and the cgroup (a directory this test made,
/// standing in for the cgroupfs one) is removed once empty. With a stranger moved in, no cgroup
/// kill: the proven members are signalled one by one, the stranger never, the cgroup is left.
#[test]
fn contained_lease_through_close_and_reap() {
    let case_name = "contained/close_and_reap_after_wrapper_sigkill";
    // The fixture is read through a store of its own; the directory goes once it is read.
    let fixture_dir = tempdir("contained-fixture");
    let (fixture, _) = load(case_name, &fixture_dir);
    let _ = std::fs::remove_dir_all(&fixture_dir);
    let script: HashMap<String, Exit> = serde_json::from_value(fixture["script"].clone()).unwrap();
    let script: HashMap<i32, Exit> = script
        .into_iter()
        .map(|(pid, exit)| (pid.parse().unwrap(), exit))
        .collect();
    for case in fixture["cases"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        for verb in ["close", "reap"] {
            let tag = format!("contained-{}-{verb}", name.replace(' ', "-"));
            let dir = tempdir(&tag);
            let (doc, root) = load(case_name, &dir);
            let cg_root = tempdir(&format!("{tag}-cgroups"));
            let gw_root = cg_root.join("gw");
            let mut lease = leases(&doc).remove(0);
            let cg = gw_root.join(&lease.lease_id);
            std::fs::create_dir_all(&cg).unwrap();
            let ino = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&cg).unwrap());
            lease.cgroup_path = Some(cg.display().to_string());
            lease.cgroup_id = Some(ino);
            let table: FixtureTable = serde_json::from_value(doc["table"].clone()).unwrap();
            let members: Vec<i32> = serde_json::from_value(case["cgroupMembers"].clone()).unwrap();
            let sim =
                RecordingSignaller::new(table, script.clone()).with_cgroup(cg.clone(), members);
            let mut ctl = Controller::open(root, &sim)
                .unwrap()
                .with_resolved_containment(leash::cgroup::Containment {
                    mode: "on".into(),
                    root: Some(cg_root.clone()),
                    gateway_root: Some(gw_root.clone()),
                    mount: None,
                    controllers: Vec::new(),
                    reason: None,
                })
                .with_signaller(&sim, &sim, caller(&doc));
            ctl.store().insert_lease(&lease, None, |_| None).unwrap();
            let mut got = serde_json::json!({});
            let cg_name = cg.display().to_string();
            if verb == "close" {
                let out = ctl
                    .close(&[LeaseRef::Id(lease.lease_id.clone())], None)
                    .unwrap();
                got["leases"] = lease_results(&mut ctl, &doc, &out, &[]).into();
            } else {
                let report = ctl.reap(&case_reap_options()).unwrap();
                got["leases"] =
                    lease_results(&mut ctl, &doc, &report.leases, &report.skipped).into();
            }
            got["timeline"] = sim
                .timeline()
                .iter()
                .map(|e| timeline_line(e).replace(&cg_name, "CGROUP"))
                .collect::<Vec<_>>()
                .into();
            got["exits"] = exits(&sim, &doc);
            got["cgroupRemoved"] = (!cg.exists()).into();
            let got: Value =
                serde_json::from_str(&got.to_string().replace(&cg_name, "CGROUP").replace(
                    doc["gateway"]["gatewayInstanceId"].as_str().unwrap(),
                    "GATEWAY",
                ))
                .unwrap();
            for never in case["notSignalled"].as_array().unwrap() {
                let never = never.as_i64().unwrap() as i32;
                assert!(
                    !signalled(&sim, never),
                    "{name}: {verb}: {never} was signalled"
                );
            }
            assert_eq!(
                got,
                case[verb],
                "{name}: {verb}: got {}",
                serde_json::to_string_pretty(&got).unwrap()
            );
            drop(ctl);
            let _ = std::fs::remove_dir_all(&dir);
            let _ = std::fs::remove_dir_all(&cg_root);
        }
    }
}
