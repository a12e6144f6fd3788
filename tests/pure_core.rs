//! The pure core (`core/`, the `leash-core` crate) stays pure by construction: it depends on
//! nothing that reaches the database, the process table or a signal (only serde, and the pure
//! computation crates sha2 for hashing, shlex for splitting a stored command, uuid without its
//! default features for reading a lease id's time), it forbids `unsafe`, and its clippy configuration forbids the file system,
//! processes, the environment and the clock. Widening any of these fails here, not in review.

use std::path::PathBuf;

fn core_file(rel: &str) -> String {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("core")
        .join(rel);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

#[test]
fn the_core_depends_on_serde_and_pure_computation_crates_only() {
    const ALLOWED: &[&str] = &["serde", "sha2", "shlex", "uuid"];
    let manifest = core_file("Cargo.toml");
    let mut section = "";
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
            // uuid's default features bring std; its clock (v7) and random (v4) features would
            // let the core make ids: the caller passes them in.
            if name == "uuid" {
                assert!(
                    line.contains("default-features = false") && !line.contains("features = ["),
                    "leash-core's uuid must have no features: {line}"
                );
            }
        }
    }
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
