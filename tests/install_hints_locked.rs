//! Every `cargo install` command the project prints or documents installs what CI tested: it
//! passes `--locked`, so cargo builds with the versions in Cargo.lock instead of resolving the
//! dependencies afresh. The check reads every text file of the checkout (sources, docs, units,
//! scripts), the hint `leash` prints when its wrapper is missing among them (printed and checked
//! in tests/install_layout.rs).
use std::path::{Path, PathBuf};

const COMMAND: &str = concat!("cargo", " install");

/// Directories that hold no file of the project's own: build output, dependencies, fuzz runs.
const SKIPPED_DIRS: &[&str] = &["target", ".git", "node_modules", "corpus", "artifacts"];

fn text_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let Ok(t) = e.file_type() else { continue };
        let name = e.file_name().to_string_lossy().into_owned();
        if t.is_dir() && !SKIPPED_DIRS.contains(&name.as_str()) {
            text_files(&e.path(), out);
        } else if t.is_file() && e.metadata().is_ok_and(|m| m.len() < 1 << 20) {
            out.push(e.path());
        }
    }
}

/// The `cargo install` commands in `text` that lack `--locked`. A command runs from the words
/// to the end of its line (a shell line continued with `\` included), `&&`, `;`, `|`, a backtick
/// or a quote; a mention with no arguments (`` `cargo install`s ``) is prose, not a command.
fn unlocked(text: &str) -> Vec<String> {
    let joined = text.replace("\\\n", " ");
    let mut found = Vec::new();
    for (at, _) in joined.match_indices(COMMAND) {
        let rest = &joined[at + COMMAND.len()..];
        let end = rest
            .find(['\n', ';', '|', '`', '"', '\'', ')'])
            .unwrap_or(rest.len());
        let end = rest[..end].find("&&").unwrap_or(end);
        let args = &rest[..end];
        if !args.starts_with(' ') || args.trim().is_empty() {
            continue;
        }
        let args: Vec<&str> = args.split_whitespace().collect();
        if !args.contains(&"--locked") {
            found.push(format!("{COMMAND} {}", args.join(" ")));
        }
    }
    found
}

#[test]
fn every_cargo_install_in_the_tree_is_locked() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    text_files(repo, &mut files);
    let mut offenders = Vec::new();
    let mut commands = 0;
    // This file spells unlocked commands on purpose, as the scan's own examples.
    files.retain(|f| f != &repo.join(file!()));
    for f in files {
        let Ok(text) = std::fs::read_to_string(&f) else {
            continue;
        };
        commands += text.matches(COMMAND).count();
        for c in unlocked(&text) {
            offenders.push(format!("{}: {c}", f.strip_prefix(repo).unwrap().display()));
        }
    }
    // The scan saw the README's set-up, the units' notes and the operating guide.
    assert!(
        commands >= 5,
        "only {commands} mentions of `{COMMAND}` found"
    );
    assert!(
        offenders.is_empty(),
        "`{COMMAND}` without --locked resolves the dependencies afresh instead of using \
         Cargo.lock:\n{}",
        offenders.join("\n")
    );
}

#[test]
fn the_scan_tells_commands_from_prose() {
    assert_eq!(
        unlocked("run `cargo install --path wrapper` then"),
        ["cargo install --path wrapper"]
    );
    assert_eq!(
        unlocked("cargo install --path . && cargo install --locked --path wrapper"),
        ["cargo install --path ."]
    );
    assert_eq!(
        unlocked("cargo install \\\n  --path . --root /usr\n"),
        ["cargo install --path . --root /usr"]
    );
    assert!(unlocked("cargo install --locked --path . --root /usr").is_empty());
    assert!(unlocked("cargo install \\\n  --locked --path .").is_empty());
    assert!(unlocked("so the install is two `cargo install`s.").is_empty());
    assert!(unlocked("#[error(\"… with `cargo install --locked --path wrapper` …\")]").is_empty());
}
