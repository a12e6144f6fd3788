//! Every signal and every `cgroup.kill` of the leash library goes through `src/signal/` (the
//! raw syscalls live in `src/sys.rs`): that is what lets the recording signaller see everything
//! leash would send, and what keeps the guards (pin, start-time re-check, hard refusals) in front
//! of each one. This test fails if any other file of the library's `src/` names a signalling
//! call in code: `killpg`, `pidfd_send_signal`, `libc::kill(`, nix's `signal::kill(`, the
//! `"cgroup.kill"` file name, or defines a `fn kill(` of its own.
//!
//! Comments are not code (a doc may say what `cgroup.kill` does), so `//` comments are stripped
//! before the scan; a message that merely mentions cgroup.kill inside a longer string is not a
//! write of the file either, so only the bare literal `"cgroup.kill"` counts. The scope is this
//! crate's `src/`: the wrapper (`wrapper/`) is its own crate, with its own `sys.rs` and its own
//! signals to its own child. `/work/shared/hooks/before-stop` greps for a subset of the same names.
use std::path::{Path, PathBuf};

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The line without its `//` comment (a `//` inside a string literal is kept: the scan only
/// needs to be right for this crate's code, which the assertion below would show otherwise).
fn code_of(line: &str) -> &str {
    let mut in_str = false;
    let mut prev = '\0';
    for (i, c) in line.char_indices() {
        match c {
            '"' if prev != '\\' => in_str = !in_str,
            '/' if !in_str && prev == '/' => return &line[..i - 1],
            _ => {}
        }
        prev = if prev == '\\' && c == '\\' { '\0' } else { c };
    }
    line
}

const FORBIDDEN: [&str; 6] = [
    "killpg",
    "pidfd_send_signal",
    "libc::kill(",
    "signal::kill(",
    "\"cgroup.kill\"",
    "fn kill(",
];

#[test]
fn every_signal_and_cgroup_kill_goes_through_signal() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    assert!(files.len() > 10, "found the library's sources");
    let mut found = Vec::new();
    for f in &files {
        let rel = f.strip_prefix(&src).unwrap();
        if rel.starts_with("signal") || rel == Path::new("sys.rs") {
            continue;
        }
        let text = std::fs::read_to_string(f).unwrap();
        for (n, line) in text.lines().enumerate() {
            let code = code_of(line);
            for name in FORBIDDEN {
                if code.contains(name) {
                    found.push(format!("src/{}:{}: {}", rel.display(), n + 1, line.trim()));
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "signals outside src/signal/ (send them through a Signaller):\n{}",
        found.join("\n")
    );
}

#[test]
fn comments_are_not_code() {
    assert_eq!(code_of("a(); // killpg"), "a(); ");
    assert_eq!(code_of("/// cgroup.kill"), "");
    assert_eq!(code_of("f(\"http://x\")"), "f(\"http://x\")");
    assert_eq!(code_of("f(\"\\\\\") // x"), "f(\"\\\\\") ");
}
