//! The pure core (`core/`, the `leash-core` crate) stays pure by construction, and purity is
//! about effects: it forbids `unsafe`, its clippy configuration forbids the file system,
//! processes, the network, the environment, sleeping and the clock, and its whole normal
//! dependency tree (what `cargo tree` resolves for this host) holds only the crates of an
//! allow-list, none of which has an effect of its own: serde (and its derive macros), sha2 (and
//! the RustCrypto crates it is built from), uuid without its default features, shlex, humantime.
//! Widening any of these fails here, not in review.

use std::collections::BTreeSet;
use std::path::PathBuf;

fn core_file(rel: &str) -> String {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("core")
        .join(rel);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// The crates the core may be built from, by name.
const ALLOWED: &[&str] = &[
    "leash-core",
    // serde and its derive macros (compile-time code only).
    "serde",
    "serde_core",
    "serde_derive",
    "proc-macro2",
    "quote",
    "syn",
    "unicode-ident",
    // sha2 and the digest crates it is built from; cpufeatures picks the SHA instructions.
    "sha2",
    "digest",
    "block-buffer",
    "crypto-common",
    "generic-array",
    "typenum",
    "cpufeatures",
    "cfg-if",
    "uuid",
    "shlex",
    // Durations as text (`3s`, `7d`): parsing and formatting, nothing else.
    "humantime",
];

/// The names of the packages in the core's normal dependency tree, for this host.
fn core_tree() -> BTreeSet<String> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let out = std::process::Command::new(cargo)
        .args(["tree", "-p", "leash-core", "--edges", "normal"])
        .args(["--prefix", "none", "--format", "{p}", "--offline"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "cargo tree: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_owned)
        .collect()
}

#[test]
fn the_core_depends_only_on_the_allow_list() {
    let tree = core_tree();
    let outside: Vec<&String> = tree
        .iter()
        .filter(|n| !ALLOWED.contains(&n.as_str()))
        .collect();
    assert!(
        outside.is_empty(),
        "leash-core's dependency tree holds {outside:?}: the pure core may be built from \
         {ALLOWED:?} only"
    );
    // The check reads a real tree: the core and its direct dependencies are in it.
    for direct in ["leash-core", "serde", "sha2", "uuid", "shlex", "humantime"] {
        assert!(tree.contains(direct), "{direct} missing from {tree:?}");
    }
}

/// uuid comes without its default features (std) and without random numbers (`v4`, `rng`):
/// reading a lease id needs neither.
#[test]
fn the_core_takes_uuid_without_its_default_features() {
    let manifest = core_file("Cargo.toml");
    let uuid = manifest
        .lines()
        .find(|l| l.starts_with("uuid"))
        .expect("uuid in the core's manifest");
    assert!(uuid.contains("default-features = false"), "{uuid}");
    assert!(!uuid.contains("features = ["), "{uuid}");
}

#[test]
fn the_core_forbids_unsafe_and_effects() {
    assert!(core_file("src/lib.rs").contains("#![forbid(unsafe_code)]"));
    let clippy = core_file("clippy.toml");
    for banned in [
        "std::fs::read",
        "std::fs::File",
        "std::process::Command",
        "std::net::TcpStream",
        "std::thread::sleep",
        "std::env::var",
        "std::time::SystemTime::now",
        "std::time::Instant::now",
    ] {
        assert!(
            clippy.contains(&format!("\"{banned}\"")),
            "core/clippy.toml no longer bans {banned}"
        );
    }
}
