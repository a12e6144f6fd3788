//! The pure core (`core/`, the `leash-core` crate) stays pure by construction: it depends on
//! serde alone (its SHA-256, shell splitter and UUID reader are its own code; sha2, shlex and uuid
//! are only the dev-dependencies its tests compare them with), it forbids `unsafe`, and its
//! clippy configuration forbids the file system, processes, the environment and the clock.
//! Widening any of these fails here, not in review.

use std::path::PathBuf;

fn core_file(rel: &str) -> String {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("core")
        .join(rel);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

#[test]
fn the_core_depends_on_serde_only() {
    const ALLOWED: &[&str] = &["serde"];
    let manifest = core_file("Cargo.toml");
    let mut section = "";
    let mut deps = Vec::new();
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            section = line;
            assert!(
                !line.starts_with("[dependencies.") && !line.starts_with("[target"),
                "the core's manifest declares {line}: keep its dependencies in [dependencies]"
            );
            continue;
        }
        if section == "[dependencies]" && !line.is_empty() && !line.starts_with('#') {
            let name = line.split('=').next().unwrap().trim();
            assert!(
                ALLOWED.contains(&name),
                "leash-core depends on {name}: the pure core may depend on {ALLOWED:?} only"
            );
            deps.push(name);
        }
    }
    assert_eq!(
        deps, ALLOWED,
        "the core's [dependencies] section moved or emptied"
    );
}

#[test]
fn the_core_forbids_unsafe_and_io() {
    assert!(core_file("src/lib.rs").contains("#![forbid(unsafe_code)]"));
    let clippy = core_file("clippy.toml");
    for banned in ["std::fs::read", "std::process::Command", "std::env::var"] {
        assert!(
            clippy.contains(banned),
            "core/clippy.toml no longer bans {banned}"
        );
    }
}
