//! The `rust-version` the workspace's crates declare is one that builds them from Cargo.lock:
//! no locked dependency they build with (normal and build dependencies, transitively; the dev
//! dependencies too, for the crates' tests) declares a newer `rust-version`. README.md's set-up
//! runs `cargo install --locked`, and cargo refuses the whole install on an older rustc when one
//! locked package asks for more ("rustc 1.85.0 is not supported by the following package: uuid@…
//! requires rustc 1.89.0"): the declared minimum must be at least the locked maximum. README.md
//! states the same number. Reads `cargo metadata --locked --offline` for the host; nothing is
//! built.
mod common;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;

/// `1.89` or `1.89.0` as comparable numbers.
fn version(v: &str) -> Vec<u64> {
    let mut parts: Vec<u64> = v
        .split('.')
        .map(|p| {
            p.parse()
                .unwrap_or_else(|_| panic!("rust-version {v:?} is not numeric"))
        })
        .collect();
    parts.resize(3, 0);
    parts
}

/// The resolve for the host (`--filter-platform`: the packages of other platforms are neither
/// built nor downloaded, and `--offline` needs nothing a build has not fetched).
fn metadata() -> Value {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = Command::new(env!("CARGO"))
        .args(["metadata", "--format-version", "1", "--locked", "--offline"])
        .args(["--filter-platform", common::host_triple()])
        .current_dir(repo)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "cargo metadata: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Every package reachable from the workspace members in the resolve graph, with the
/// `rust-version` it declares (if any).
fn reachable(meta: &Value) -> BTreeMap<String, Option<String>> {
    let packages: BTreeMap<&str, &Value> = meta["packages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p["id"].as_str().unwrap(), p))
        .collect();
    let nodes: BTreeMap<&str, &Value> = meta["resolve"]["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| (n["id"].as_str().unwrap(), n))
        .collect();
    let mut todo: Vec<&str> = meta["workspace_members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m.as_str().unwrap())
        .collect();
    let mut seen = BTreeSet::new();
    while let Some(id) = todo.pop() {
        if !seen.insert(id) {
            continue;
        }
        for dep in nodes[id]["deps"].as_array().unwrap() {
            todo.push(dep["pkg"].as_str().unwrap());
        }
    }
    seen.into_iter()
        .map(|id| {
            let p = packages[id];
            (
                format!(
                    "{}@{}",
                    p["name"].as_str().unwrap(),
                    p["version"].as_str().unwrap()
                ),
                p["rust_version"].as_str().map(String::from),
            )
        })
        .collect()
}

#[test]
fn declared_rust_version_builds_every_locked_dependency() {
    let meta = metadata();
    let members: BTreeSet<&str> = meta["workspace_members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m.as_str().unwrap())
        .collect();
    // The members' own declarations (a member without one is not held to a number).
    let declared: BTreeMap<String, String> = meta["packages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| members.contains(p["id"].as_str().unwrap()))
        .filter_map(|p| {
            Some((
                p["name"].as_str().unwrap().to_string(),
                p["rust_version"].as_str()?.to_string(),
            ))
        })
        .collect();
    assert!(
        declared.contains_key("leash"),
        "the leash crate declares no rust-version: {declared:?}"
    );
    let ours = declared.values().map(|v| version(v)).min().unwrap();
    let (needs, who) = reachable(&meta)
        .into_iter()
        .filter_map(|(pkg, rv)| Some((version(&rv?), pkg)))
        .max()
        .unwrap();
    let dotted = |v: &[u64]| v.iter().map(u64::to_string).collect::<Vec<_>>().join(".");
    let needs_text = dotted(&needs);
    assert!(
        ours >= needs,
        "the workspace declares rust-version {declared:?}, but the locked {who} requires rustc \
         {needs_text}: `cargo install --locked` fails on the declared minimum; raise rust-version \
         (and README.md's set-up line) or lock an older version of it"
    );

    // README's set-up names the same minimum.
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap();
    let leash = &declared["leash"];
    assert!(
        readme.contains(&format!("Rust toolchain (≥ {leash})")),
        "README.md's set-up does not name rust-version {leash}"
    );
}
