//! Each state root has its own stable gateway instance id and wrapper root.
mod common;
use common::*;
use std::os::unix::fs::PermissionsExt;

#[test]
fn two_roots_two_identities_and_stable_ids() {
    let tmp = TempDir::new("roots");
    let a = tmp.join("a");
    let b = tmp.join("b");
    // The first exec creates a root (read-only commands never do).
    for d in [&a, &b] {
        assert_eq!(run(d, &["exec", "--", "true"]).code, Some(0));
    }
    let sa = run_json(&a, &["status", "--json"]);
    let sb = run_json(&b, &["status", "--json"]);
    assert_ne!(sa["gatewayInstanceId"], sb["gatewayInstanceId"]);
    assert_ne!(sa["wrapperRoot"], sb["wrapperRoot"]);
    assert!(sa["gatewayInstanceId"]
        .as_str()
        .unwrap()
        .parse::<uuid::Uuid>()
        .is_ok());
    // Stable for the life of the root.
    assert_eq!(
        run_json(&a, &["status", "--json"])["gatewayInstanceId"],
        sa["gatewayInstanceId"]
    );
    for d in [&a, &b] {
        let mode = std::fs::metadata(d).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700, "{}", d.display());
    }
}

#[test]
fn env_and_flag_pick_the_root() {
    let tmp = TempDir::new("rootenv");
    let create = |env: (&str, std::path::PathBuf)| {
        let ok = std::process::Command::new(leash_bin())
            .args(["exec", "--", "true"])
            .env_remove("LEASH_STATE_DIR")
            .env(env.0, env.1)
            .status()
            .unwrap();
        assert!(ok.success());
    };
    create(("LEASH_STATE_DIR", tmp.join("fromenv")));
    create(("XDG_STATE_HOME", tmp.join("xdg")));
    let out = std::process::Command::new(leash_bin())
        .args(["status", "--json"])
        .env("LEASH_STATE_DIR", tmp.join("fromenv"))
        .output()
        .unwrap();
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v["stateDir"].as_str().unwrap().ends_with("fromenv"));
    let out = std::process::Command::new(leash_bin())
        .args(["status", "--json"])
        .env_remove("LEASH_STATE_DIR")
        .env("XDG_STATE_HOME", tmp.join("xdg"))
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        v["stateDir"].as_str().unwrap().ends_with("xdg/leash"),
        "{v}"
    );
}
