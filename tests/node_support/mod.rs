//! Helpers for the tests that run Node: find a usable `node` (>= 20), install npm packages on
//! first use into a directory under `target/` (serialised by a file lock, so two test threads or
//! two cargo runs never install at once; re-installed only when the wanted packages change), and
//! run a command showing its output when it fails.
#![allow(dead_code)]

use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .map(|p| if p.is_absolute() { p } else { repo().join(p) })
        .unwrap_or_else(|| repo().join("target"))
}

/// `node` if it is installed, at least version 20, and npm is there too; else why not.
pub fn node() -> Result<PathBuf, String> {
    let out = Command::new("node")
        .arg("--version")
        .output()
        .map_err(|e| {
            format!("node is not installed ({e}); install Node.js >= 20 to run the client's tests")
        })?;
    let v = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let major: u32 = v
        .trim_start_matches('v')
        .split('.')
        .next()
        .and_then(|m| m.parse().ok())
        .unwrap_or(0);
    if major < 20 {
        return Err(format!(
            "node {v} is older than 20; the client needs Node.js >= 20"
        ));
    }
    let npm = Command::new("npm").arg("--version").output();
    if !npm.is_ok_and(|o| o.status.success()) {
        return Err(format!(
            "npm is not installed (node {v} is); install npm to run the client's tests"
        ));
    }
    Ok(PathBuf::from("node"))
}

/// Installs `packages` (exact `name@version` specs) into `target/<dir>` unless that exact set
/// is there already; returns the directory (its `node_modules/` holds them).
pub fn npm_install(dir: &str, packages: &[&str]) -> PathBuf {
    let root = target_dir().join(dir);
    std::fs::create_dir_all(&root).unwrap();
    let lock = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(root.join(".install.lock"))
        .unwrap();
    let _held = nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockExclusive)
        .map_err(|(_, e)| e)
        .expect("lock the npm install directory");
    let wanted = packages.join("\n");
    let marker = root.join(".installed");
    if std::fs::read_to_string(&marker).ok().as_deref() == Some(wanted.as_str()) {
        return root;
    }
    if !root.join("package.json").exists() {
        std::fs::write(root.join("package.json"), "{\"private\": true}\n").unwrap();
    }
    let out = Command::new("npm")
        .arg("install")
        .arg("--prefix")
        .arg(&root)
        .args(["--no-audit", "--no-fund", "--no-save", "--loglevel=error"])
        .args(packages)
        .output()
        .expect("run npm (install Node.js with npm)");
    assert!(
        out.status.success(),
        "npm install {packages:?} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::write(&marker, &wanted).unwrap();
    root
}

/// Runs a command; on failure panics with what it printed.
pub fn run_ok(what: &str, cmd: &mut Command) -> Output {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot run: {e}"));
    if !out.status.success() {
        panic!(
            "{what} failed ({}):\n--- stdout ---\n{}\n--- stderr ---\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    out
}

/// The client's test files (`clients/node/test/*.test.mjs`), sorted.
pub fn node_test_files(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.to_string_lossy().ends_with(".test.mjs"))
        .collect();
    v.sort();
    v
}
