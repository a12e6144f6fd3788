//! A state root written by an older build of leash reads the same: its stored `command_hash`
//! values, lease ids and gateway id come out as they were stored, and what leash computes from
//! them today agrees. `fixtures/state_roots/older_build/leash.db` is the database (WAL
//! checkpointed into the file) of a build whose SHA-256 and UUID code were written by hand; it
//! holds five ended leases made with `leash exec`, one of them with a `--lease-id` given. The
//! hashes pinned here were computed apart from leash, with coreutils:
//! `printf 'sh\0-c\0exit 3' | sha256sum`; the times of the lease ids are their first 48 bits.
mod common;
use common::*;
use leash_core::model::command_hash;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// One stored lease: (session key, lease id, command, its SHA-256 as `sha256sum` prints it).
const STORED: [(&str, &str, &[&str], &str); 5] = [
    (
        "fixture-true",
        "01a24754-a4c3-743b-9334-275a841bc3cc",
        &["/bin/true"],
        "b5e6f77be438be2102aff91bb048414f26e4ed0c05b6986e84f0c35806afc018",
    ),
    (
        "fixture-exit",
        "01a24754-a4ea-74d3-88e6-fba2dc210bb8",
        &["sh", "-c", "exit 3"],
        "c183c3bc2cac7a1a3a2044a564095c502406e6251d15f82a8327108c31034a95",
    ),
    (
        // A token with a blank, an empty token, and text beyond ASCII.
        "fixture-words",
        "01a24754-a50e-77bc-925c-1c14fa4428a5",
        &["/bin/echo", "two words", "", "héllo ✓"],
        "38fb24cb3e6b5e19ab496cc4f01ad46a3f6b69645d72b1d8fb97b20a59dd2fdb",
    ),
    (
        // 110 bytes: more than one SHA-256 block.
        "fixture-long",
        "01a24754-a53d-77a8-81ad-1d2484a279ea",
        &[
            "/bin/true",
            "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx",
        ],
        "e345ea6f791ade010fbafbea04a87567bd787ca0223f396d21c5e10478467c15",
    ),
    (
        // The lease id the caller gave (`leash exec --lease-id`).
        "fixture-given",
        "0190b1f2-7c3a-7d4e-8f00-1234567890ab",
        &["/usr/bin/env", "true"],
        "0e17e3239d0a35b84a12d16171b8b6c94c08ef081106d623a99d7b33756d5525",
    ),
];

/// The gateway id stored in the fixture's `meta` table.
const GATEWAY: &str = "9880cf2b-39b0-4b73-a71e-49bb3f7927cb";

/// A copy of the fixture's state root in `tmp` (the fixture itself is never opened for writing).
fn older_state_root(tmp: &TempDir) -> PathBuf {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/state_roots/older_build");
    let state = tmp.join("state");
    std::fs::create_dir_all(&state).unwrap();
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::fs::copy(fixture.join("leash.db"), state.join("leash.db")).unwrap();
    std::fs::set_permissions(
        state.join("leash.db"),
        std::fs::Permissions::from_mode(0o600),
    )
    .unwrap();
    state
}

#[test]
fn stored_hashes_lease_ids_and_gateway_id_read_the_same() {
    let tmp = TempDir::new("older-root");
    let state = older_state_root(&tmp);
    let leases = run_json(&state, &["--no-daemon", "leases", "--json"]);
    let leases = leases.as_array().expect("a list of leases");
    assert_eq!(leases.len(), STORED.len(), "{leases:?}");
    for (session, id, command, hash) in STORED {
        let row = leases
            .iter()
            .find(|l| l["sessionKey"] == session)
            .unwrap_or_else(|| panic!("no lease of {session}: {leases:?}"));
        assert_eq!(row["leaseId"], id, "{row}");
        assert_eq!(row["command"], serde_json::json!(command), "{row}");
        assert_eq!(
            row["commandHash"], hash,
            "the stored hash, as stored: {row}"
        );
        assert_eq!(row["gatewayInstanceId"], GATEWAY, "{row}");
        assert_eq!(row["state"], "ended", "{row}");
        // Today's hash of the same command is the stored one, so a live process of such a lease
        // would still match its row.
        assert_eq!(command_hash(command), hash, "{command:?}");
    }
    let status = run_json(&state, &["--no-daemon", "status", "--json"]);
    assert_eq!(status["gatewayInstanceId"], GATEWAY, "{status}");
}

/// The time in a lease id is what a stray cgroup named for it is aged by (a cgroup younger than
/// the sweep's minimum age may be a `leash exec` committing its lease): for each stored id, the
/// sweep leaves its cgroup alone until exactly the id's time plus the minimum age, then removes
/// it. The time is read here from the id's hex digits alone.
#[test]
fn the_time_in_each_stored_lease_id_reads_the_same() {
    const MIN_AGE_MS: i64 = 60_000;
    for (_, id, _, _) in STORED {
        let hex: String = id.chars().filter(|c| *c != '-').take(12).collect();
        let made_ms = i64::from_str_radix(&hex, 16).unwrap();
        let dirs = [(id.to_string(), 7u64)];
        let decide = |now_ms| {
            let strays = leash_core::plan::plan_strays(
                Path::new("/cg/leash/gw"),
                &dirs,
                &[],
                now_ms,
                MIN_AGE_MS,
            );
            assert_eq!(strays.len(), 1, "{strays:?}");
            strays[0].action
        };
        assert_eq!(
            decide(made_ms + MIN_AGE_MS - 1),
            leash_core::plan::CgroupAction::Leave,
            "{id}: younger than the minimum age"
        );
        assert_eq!(
            decide(made_ms + MIN_AGE_MS),
            leash_core::plan::CgroupAction::Remove,
            "{id}: as old as the minimum age"
        );
    }
}
