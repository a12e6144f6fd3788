//! Helpers for the tests that run Node: find a usable `node` (>= 20), install npm packages on
//! first use into a directory under `target/` (serialised by a file lock, so two test threads or
//! two cargo runs never install at once; re-installed only when the wanted packages change), and
//! run a command showing its output when it fails.
#![allow(dead_code)]

use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

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
    let out = run_within(what, cmd, RUN_LIMIT);
    if !out.status.success() {
        let stdout = String::from_utf8_lossy(&out.stdout);
        panic!(
            "{what} failed ({}):\n--- failing subtests ---\n{}\n--- stdout ---\n{stdout}\n--- stderr ---\n{}",
            out.status,
            failing_subtests(&stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    out
}

/// The blocks of a TAP report that say why a test failed (`not ok …` and its YAML block), first
/// in a failure's message: a log that keeps only a report's head and tail still shows them.
pub fn failing_subtests(tap: &str) -> String {
    let mut blocks = Vec::new();
    let mut lines = tap.lines();
    while let Some(line) = lines.next() {
        let trimmed = line.trim_start();
        if !trimmed.starts_with("not ok ") {
            continue;
        }
        let indent = line.len() - trimmed.len();
        let mut block = vec![line];
        // The YAML block ends with `...` at the result's indentation plus two.
        for next in lines.by_ref() {
            block.push(next);
            if next.trim_start() == "..." && next.len() - next.trim_start().len() <= indent + 2 {
                break;
            }
        }
        blocks.push(block.join("\n"));
    }
    if blocks.is_empty() {
        "(no `not ok` line: the run failed outside a test)".to_owned()
    } else {
        blocks.join("\n")
    }
}

/// How long a Node run may take before it counts as hung (the client suite takes ~1 min on a
/// loaded 2-core machine).
pub const RUN_LIMIT: Duration = Duration::from_secs(600);

/// Runs `cmd` in a process group of its own with its output collected; past `limit` the whole
/// group (the command, the test files it runs, the daemons they started) is SIGKILLed and the
/// run fails with what it printed. A hung test file (a cleanup hook that threw and left a
/// daemon referenced) once held CI until its hard limit.
pub fn run_within(what: &str, cmd: &mut Command, limit: Duration) -> Output {
    use std::io::Read;
    use std::os::unix::process::CommandExt;
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .unwrap_or_else(|e| panic!("{what}: cannot run: {e}"));
    let drain = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut v = Vec::new();
            let _ = r.read_to_end(&mut v);
            v
        })
    };
    let out_t = drain(Box::new(child.stdout.take().unwrap()));
    let err_t = drain(Box::new(child.stderr.take().unwrap()));
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() >= deadline {
            // The group is the one this call created for the command (its pgid is its pid), and
            // its leader is not reaped yet, so the id cannot have been reused.
            // SAFETY: kill takes plain integers.
            unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
            let _ = child.wait();
            let (o, e) = (out_t.join().unwrap(), err_t.join().unwrap());
            panic!(
                "{what} hung: killed after {limit:?}\n--- stdout ---\n{}\n--- stderr ---\n{}",
                String::from_utf8_lossy(&o),
                String::from_utf8_lossy(&e)
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    Output {
        status,
        stdout: out_t.join().unwrap(),
        stderr: err_t.join().unwrap(),
    }
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

/// The default cgroup root (the one leash takes without `LEASH_CGROUP_ROOT`, a real gateway's:
/// `<cgroup2 mount>/leash` as root) and the directories under it when the watch began. A Node
/// run must make its cgroups only under roots it made for itself (clients/node/test/
/// cgroup-root.mjs, or the test's [`common::CgroupRoot`]); [`DefaultRootWatch::assert_unchanged`]
/// fails naming every directory the default root gained meanwhile. Dropped (also when the run
/// failed or hung, its Node processes SIGKILLed before their own clean-up), it removes the roots
/// of Node test processes that are gone (`leash-test-<dead pid>-node`).
pub struct DefaultRootWatch {
    root: Option<PathBuf>,
    before: std::collections::BTreeSet<PathBuf>,
}

impl DefaultRootWatch {
    pub fn start() -> DefaultRootWatch {
        let root = crate::common::cgroup2_mount().and_then(|mount| {
            let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
            let rel = leash::cgroup::own_cgroup(&own)?;
            Some(leash::cgroup::default_root(&mount, &rel))
        });
        let before = root.as_deref().map(dirs_under).unwrap_or_default();
        DefaultRootWatch { root, before }
    }

    /// Fails when the default root gained a directory since [`DefaultRootWatch::start`].
    pub fn assert_unchanged(&self, what: &str) {
        let Some(root) = &self.root else { return };
        let gained: Vec<PathBuf> = dirs_under(root)
            .into_iter()
            .filter(|d| !self.before.contains(d))
            .collect();
        assert!(
            gained.is_empty(),
            "{what} made cgroups under the default cgroup root {} instead of a root of its own: \
             {gained:?}",
            root.display()
        );
    }
}

impl Drop for DefaultRootWatch {
    fn drop(&mut self) {
        crate::common::sweep_dead_test_roots_here();
    }
}

/// `dir` and every directory below it (none when it does not exist).
fn dirs_under(dir: &Path) -> std::collections::BTreeSet<PathBuf> {
    let mut out = std::collections::BTreeSet::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                todo.push(e.path());
            }
        }
        out.insert(d);
    }
    out
}
