//! Every dependency a crate of this repository declares is used: each entry of `[dependencies]`,
//! `[dev-dependencies]` and `[build-dependencies]` of every workspace member (and of the fuzz
//! crate, its own workspace) must be named in that crate's Rust sources. A dependency nobody
//! uses (an error crate once sat in Cargo.toml, never named) costs build time and audit surface
//! on every machine; this keeps it from creeping back, inside `cargo test --workspace`, with
//! nothing to install.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The crates to check: the workspace members of the root manifest, and the fuzz crate.
fn crates() -> Vec<PathBuf> {
    let root = std::fs::read_to_string(repo().join("Cargo.toml")).unwrap();
    let start = root.find("members").expect("a [workspace] members list");
    let list = &root[start..root[start..].find(']').unwrap() + start];
    let mut out: Vec<PathBuf> = list
        .split('"')
        .skip(1)
        .step_by(2)
        .map(|m| repo().join(m))
        .collect();
    out.push(repo().join("fuzz"));
    out
}

/// The dependency names a manifest declares, as Rust names them (`-` → `_`), with the section.
fn declared(manifest: &str) -> Vec<(String, String)> {
    let mut section = String::new();
    let mut out = Vec::new();
    for line in manifest.lines() {
        let line = line.trim();
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        if let Some(h) = line.strip_prefix('[') {
            let h = h.trim_end_matches(']').trim();
            // `[dependencies.NAME]` declares NAME.
            for kind in ["dependencies", "dev-dependencies", "build-dependencies"] {
                if let Some(name) = h.strip_prefix(&format!("{kind}.")) {
                    out.push((kind.to_string(), name.replace('-', "_")));
                }
            }
            section = h.to_string();
            continue;
        }
        if matches!(
            section.as_str(),
            "dependencies" | "dev-dependencies" | "build-dependencies"
        ) {
            if let Some((name, _)) = line.split_once('=') {
                let name = name.trim();
                if !name.is_empty() && !name.contains('.') {
                    out.push((section.clone(), name.replace('-', "_")));
                }
            }
        }
    }
    out
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        let name = e.file_name();
        // Build output and other crates of the workspace are not this crate's sources.
        if name == "target" || name == "node_modules" || name == ".git" {
            continue;
        }
        if p.is_dir() {
            if p.join("Cargo.toml").exists() && p != dir {
                continue;
            }
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The words of a crate's Rust sources (identifiers, as a set).
fn words(dir: &Path) -> BTreeSet<String> {
    let mut files = Vec::new();
    rust_files(dir, &mut files);
    let mut out = BTreeSet::new();
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap_or_default();
        for w in text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
            if !w.is_empty() {
                out.insert(w.to_string());
            }
        }
    }
    out
}

#[test]
fn every_declared_dependency_is_used() {
    let mut unused = Vec::new();
    let mut checked = 0;
    for dir in crates() {
        let manifest = std::fs::read_to_string(dir.join("Cargo.toml"))
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        let used = words(&dir);
        for (section, name) in declared(&manifest) {
            checked += 1;
            if !used.contains(&name) {
                unused.push(format!("{}: [{section}] {name}", dir.display()));
            }
        }
    }
    assert!(
        checked > 10,
        "found only {checked} dependencies: is the parser broken?"
    );
    assert!(
        unused.is_empty(),
        "declared but never named in the crate's sources (remove them from Cargo.toml):\n{}",
        unused.join("\n")
    );
}

#[test]
fn the_check_finds_an_unused_dependency() {
    // Spelt in two halves, so that this file does not itself name it.
    let gone = format!("{}{}", "any", "how");
    let manifest = format!(
        "[package]\nname = \"x\"\n\n[dependencies]\n{gone} = \"1\"\nserde-json = \"1\"\n\n\
         [dependencies.leash]\npath = \"..\"\n"
    );
    let names: Vec<String> = declared(&manifest).into_iter().map(|(_, n)| n).collect();
    assert_eq!(names, [gone.as_str(), "serde_json", "leash"]);
    // No source of the repository's main crate names it: declared, it would be reported.
    assert!(!words(&repo()).contains(&gone));
}
