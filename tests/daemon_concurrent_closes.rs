//! Concurrent closes of one lease inside the daemon. Two `reap --include-live` and a `close` of the
//! same session, sent at once on three connections: exactly one of them claims the lease and
//! signals its tree; the others signal nothing and say why, and no answer that sent signals calls
//! itself a `conflict`. (The daemon's requests share its pid, so a claim by that pid must not count
//! as stale: else all three would go ahead.)
mod common;
mod daemon_support;
use common::*;
use daemon_support::*;
use serde_json::{json, Value};

#[test]
fn one_claim_per_lease_inside_one_daemon() {
    let tmp = TempDir::new("d-concclose");
    let state = tmp.join("state");
    let daemon = Daemon::start(&state, &[]);
    let mut c = daemon.connect();
    // Ignores SIGTERM: the winning close holds its claim for the whole grace.
    let (lease_id, adapter) = ensure_trap(&mut c, tmp.path(), "s1", 3000);

    let requests = [
        ("reap", json!({"includeLive": true})),
        ("reap", json!({"includeLive": true})),
        ("close", json!({"session": "s1"})),
    ];
    let barrier = std::sync::Arc::new(std::sync::Barrier::new(requests.len()));
    let handles: Vec<_> = requests
        .into_iter()
        .map(|(op, fields)| {
            let mut conn = daemon.connect();
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                barrier.wait();
                (op, conn.request(op, fields))
            })
        })
        .collect();
    let replies: Vec<(&str, Value)> = handles.into_iter().map(|h| h.join().unwrap()).collect();

    // Every outcome about our lease, from the close reply and from the reaps' reports.
    let mut outcomes: Vec<Value> = Vec::new();
    let mut skipped = 0;
    for (op, r) in &replies {
        assert_eq!(r["ok"], true, "{op}: {r}");
        let list = if *op == "close" {
            r["result"].as_array().unwrap().clone()
        } else {
            skipped += r["result"]["skipped"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|s| s[0] == lease_id.as_str())
                .count();
            r["result"]["leases"].as_array().unwrap().clone()
        };
        outcomes.extend(
            list.into_iter()
                .filter(|o| o["leaseId"] == lease_id.as_str()),
        );
    }
    let delivered = |o: &Value| {
        o["signals"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["delivery"] == "delivered")
    };
    let signalling: Vec<&Value> = outcomes.iter().filter(|o| delivered(o)).collect();
    assert_eq!(
        signalling.len(),
        1,
        "exactly one request may signal the lease's tree: {replies:#?}"
    );
    assert_eq!(signalling[0]["result"], "closed", "{replies:#?}");
    for o in &outcomes {
        if o["result"] == "conflict" {
            assert!(!delivered(o), "a conflict that sent signals: {o}");
        }
    }
    // The other two answered too: as a conflict (close) or as skipped (reap).
    assert_eq!(outcomes.len() - 1 + skipped, 2, "{replies:#?}");
    // (The adapter's own log is no measure: the wrapper, SIGTERMed after its children, forwards
    // the signal to the group, so one close can make the adapter see SIGTERM twice.)
    assert!(wait_for(|| !adapter.pid.alive()));
    assert_eq!(lease_row(&mut c, &lease_id)["state"], "closed");
}
