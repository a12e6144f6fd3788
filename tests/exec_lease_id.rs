//! `leash exec --lease-id UUID`: the spawner chooses the lease id, so it can record its launch
//! before and after the spawn. The id is used as given (the wrapper's environment, the lease
//! row); one that is not a canonical UUID, or that any lease row already has (open or settled),
//! is refused with exit 125 and nothing is started or stored.
mod common;
use common::*;

const ID: &str = "0190b1f2-7c3a-7d4e-8f00-1234567890ab";

#[test]
fn a_chosen_lease_id_is_used_and_never_reused() {
    let tmp = TempDir::new("lease-id");
    let state = tmp.join("state");
    let seen = tmp.join("seen");
    let out = run(
        &state,
        &[
            "exec",
            "--lease-id",
            ID,
            "--session",
            "l1",
            "--",
            "sh",
            "-c",
            &format!("echo \"$OPENCLAW_ACPX_LEASE_ID\" > {}", seen.display()),
        ],
    );
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert_eq!(std::fs::read_to_string(&seen).unwrap().trim(), ID);
    let rows = leases(&state);
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0]["leaseId"], ID);
    assert_eq!(rows[0]["sessionKey"], "l1");

    // The row is settled now (closed): its id is still taken, for another session too.
    let marker = tmp.join("second");
    let out = run(
        &state,
        &[
            "exec",
            "--lease-id",
            ID,
            "--session",
            "l2",
            "--",
            "touch",
            marker.to_str().unwrap(),
        ],
    );
    assert_eq!(out.code, Some(125), "{}", out.stderr);
    assert!(out.stderr.contains("already taken"), "{}", out.stderr);
    assert!(!marker.exists(), "nothing may start under a taken id");
    assert_eq!(leases(&state).len(), 1, "no row for the refused exec");
}

#[test]
fn a_lease_id_that_is_not_a_canonical_uuid_is_refused_before_anything_is_stored() {
    let tmp = TempDir::new("lease-id-bad");
    let state = tmp.join("state");
    init_state_root(&state);
    let marker = tmp.join("started");
    for bad in [
        "not-a-uuid",
        "0190B1F2-7C3A-7D4E-8F00-1234567890AB",
        "0190b1f27c3a7d4e8f001234567890ab",
        "00000000-0000-0000-0000-000000000000",
        "../0190b1f2-7c3a-7d4e-8f00-1234567890ab",
        "",
    ] {
        let out = run(
            &state,
            &[
                "exec",
                "--lease-id",
                bad,
                "--",
                "touch",
                marker.to_str().unwrap(),
            ],
        );
        assert_eq!(out.code, Some(125), "{bad:?}: {}", out.stderr);
        assert!(out.stderr.contains("not a UUID"), "{bad:?}: {}", out.stderr);
        assert!(!marker.exists(), "{bad:?}: the command must not have run");
    }
    assert_eq!(
        leases(&state).len(),
        1,
        "only the root's first lease: no row for a refused exec"
    );
}
