//! Running the documentation as written: a page's fenced blocks, and the bash a page's shell
//! blocks run in (the binaries under test first on PATH, from the root of the source tree,
//! never the caller's state root). README.md's tour and the guides' pages both run through here.

use super::{leash_bin, wrap_bin};
use std::path::Path;
use std::process::Command;

/// A file of the source tree, by its path from the root.
pub fn read_doc(rel: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(rel))
        .unwrap_or_else(|e| panic!("read {rel}: {e}"))
}

/// The fenced blocks of a Markdown text, in order: (info string, trimmed; body).
pub fn fenced_blocks(doc: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut lines = doc.lines();
    while let Some(l) = lines.next() {
        let Some(info) = l.strip_prefix("```") else {
            continue;
        };
        let mut body = String::new();
        for b in lines.by_ref() {
            if b.starts_with("```") {
                break;
            }
            body.push_str(b);
            body.push('\n');
        }
        out.push((info.trim().to_string(), body));
    }
    out
}

/// `bash -c script` as a reader of the docs runs it: `leash` and `leash-wrap` under test first
/// on PATH (then `extra_path`'s directories, then the caller's PATH), from the root of the
/// source tree, `LEASH_STATE_DIR` unset so that the page's own state roots apply. The caller
/// sets its stdio and starts it (under a guard).
pub fn doc_shell(script: &str, extra_path: &[&Path]) -> Command {
    let _ = wrap_bin(); // leash-wrap next to leash, as the install puts it
    let mut dirs = vec![leash_bin().parent().unwrap().to_path_buf()];
    dirs.extend(extra_path.iter().map(|d| d.to_path_buf()));
    let mut path = std::env::join_paths(dirs).unwrap();
    if let Some(inherited) = std::env::var_os("PATH") {
        path.push(":");
        path.push(inherited);
    }
    let mut c = Command::new("bash");
    c.arg("-c")
        .arg(script)
        .env("PATH", path)
        .env_remove("LEASH_STATE_DIR")
        .current_dir(env!("CARGO_MANIFEST_DIR"));
    c
}
