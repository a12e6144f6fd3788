//! The process lifecycle simulator. Each fixture in `fixtures/lifecycle/` stages one case (PID
//! reuse, another gateway's wrapper, quoted commands, descendants left in the group, parent death,
//! an unreadable process table, stale leases, startup orphans, ...) as a process-table snapshot
//! plus leases, and writes out the plan it expects: the decision per lease, the pids signalled in
//! order (children first), and pids that must never be signalled. The planner runs against the
//! fixture table exactly as it runs against /proc.
mod common;
use common::lifecycle::{
    case_caller, case_leases, case_reap_options, lifecycle_fixtures, read_case,
};
use leash::proc::{FixtureTable, ProcessTable};
use leash_core::guard::Sig;
use leash_core::model::Lease;
use leash_core::model::LegacyRecord;
use leash_core::plan::{plan_reap, Decision};
use leash_core::verify::Expect;
use serde_json::Value;
use std::path::PathBuf;

fn decision_name(d: &Decision) -> &'static str {
    match d {
        Decision::Terminate => "terminate",
        Decision::MarkLost { .. } => "markLost",
        Decision::Leave { .. } => "leave",
        Decision::Skip { .. } => "skip",
    }
}

fn decision_reason(d: &Decision) -> String {
    match d {
        Decision::Terminate => String::new(),
        Decision::MarkLost { reason } | Decision::Leave { reason } | Decision::Skip { reason } => {
            reason.clone()
        }
    }
}

fn pids(v: &Value) -> Vec<i32> {
    v.as_array()
        .map(|a| a.iter().map(|x| x.as_i64().unwrap() as i32).collect())
        .unwrap_or_default()
}

fn check_expectation(
    case: &str,
    what: &str,
    exp: &Value,
    decision: &Decision,
    signalled: &[i32],
    kinds: &[Vec<Sig>],
) {
    let want = exp["decision"].as_str().unwrap();
    assert_eq!(
        decision_name(decision),
        want,
        "{case}: {what}: decision {decision:?}"
    );
    assert_eq!(
        signalled,
        pids(&exp["signals"]).as_slice(),
        "{case}: {what}: signal order"
    );
    for never in pids(&exp["notSignalled"]) {
        assert!(
            !signalled.contains(&never),
            "{case}: {what}: pid {never} must not be signalled"
        );
    }
    if let Some(sub) = exp["reasonContains"].as_str() {
        let reason = decision_reason(decision);
        assert!(
            reason.contains(sub),
            "{case}: {what}: reason {reason:?} lacks {sub:?}"
        );
    }
    if let Some(k) = exp["signalKinds"].as_array() {
        let want: Vec<&str> = k.iter().map(|s| s.as_str().unwrap()).collect();
        for got in kinds {
            let got: Vec<&str> = got.iter().map(|s| s.name()).collect();
            assert_eq!(got, want, "{case}: {what}: signal kinds");
        }
    }
}

#[test]
fn every_fixture_case_plans_as_expected() {
    let files = lifecycle_fixtures();
    assert!(files.len() >= 8, "the seed's cases are all staged");
    for f in files {
        let case = f.file_stem().unwrap().to_string_lossy().into_owned();
        let doc = read_case(&f);
        let gateway = doc["gateway"]["gatewayInstanceId"].as_str().unwrap();
        let wrapper_root = PathBuf::from(doc["gateway"]["wrapperRoot"].as_str().unwrap());
        let expect = Expect {
            gateway_instance_id: gateway,
            wrapper_root: &wrapper_root,
            cgroup_root: None,
        };
        let caller = case_caller(&doc);
        let leases: Vec<Result<Lease, String>> = case_leases(&doc).into_iter().map(Ok).collect();
        let legacy: Vec<LegacyRecord> = serde_json::from_value(doc["legacy"].clone()).unwrap();
        let table: FixtureTable = serde_json::from_value(doc["table"].clone()).unwrap();
        let snap = table.snapshot();
        let plan = plan_reap(
            &leases,
            &legacy,
            &expect,
            snap.as_ref(),
            &caller,
            &case_reap_options(),
        );
        let exp_leases = doc["expect"]["leases"].as_array().unwrap();
        assert_eq!(plan.leases.len(), exp_leases.len(), "{case}: lease plans");
        for exp in exp_leases {
            let id = exp["leaseId"].as_str().unwrap();
            let lp = plan.leases.iter().find(|p| p.lease_id == id).unwrap();
            let signalled: Vec<i32> = lp.signals.iter().map(|s| s.pid).collect();
            let kinds: Vec<Vec<Sig>> = lp.signals.iter().map(|s| s.signals.clone()).collect();
            check_expectation(&case, id, exp, &lp.decision, &signalled, &kinds);
            if lp.decision != Decision::Terminate {
                assert!(
                    lp.signals.is_empty(),
                    "{case}: no signals unless terminating"
                );
            }
        }
        let exp_legacy = doc["expect"]["legacy"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        assert_eq!(plan.legacy.len(), exp_legacy.len(), "{case}: legacy plans");
        for exp in &exp_legacy {
            let id = exp["id"].as_i64().unwrap();
            let lp = plan.legacy.iter().find(|p| p.id == id).unwrap();
            let signalled: Vec<i32> = lp.signals.iter().map(|s| s.pid).collect();
            check_expectation(
                &case,
                &format!("legacy #{id}"),
                exp,
                &lp.decision,
                &signalled,
                &[],
            );
        }
        // The caller itself and pid 1 are never in any plan's signals, whatever the fixture says.
        for lp in &plan.leases {
            assert!(
                lp.signals.iter().all(|s| s.pid > 1 && s.pid != caller.pid),
                "{case}"
            );
        }
    }
}
