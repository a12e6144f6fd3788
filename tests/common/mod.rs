//! Shared helpers for the live tests: temporary state roots, process guards that kill only what
//! the test itself started (by pid *and* start time), polling with deadlines instead of sleeps,
//! the cgroup roots tests contain their leases in (as root, or as a user in a delegated subtree),
//! and `skip`, which records every skipped test for CI's summary.
#![allow(dead_code)]

pub mod apt;
pub mod counting;
pub mod docs;
pub mod lifecycle;
pub mod tmpfs;

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Generous: the machine is a noisy 2-core box.
pub const PATIENCE: Duration = Duration::from_secs(30);

/// The host's target triple (`host:` of `rustc -vV`, asked once): what a build without
/// `--target` is for.
pub fn host_triple() -> &'static str {
    static HOST: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    HOST.get_or_init(|| {
        let out = Command::new(std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into()))
            .arg("-vV")
            .output()
            .expect("run rustc -vV");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .find_map(|l| l.strip_prefix("host: ").map(String::from))
            .expect("rustc -vV names the host")
    })
}

/// The `leash` binary cargo built for this run, or `$LEASH_TEST_BIN_DIR/leash` where a pass that
/// runs the tests as another user copied the binaries somewhere that user can reach
/// (`.ci/rootless.sh`): the path cargo bakes in may sit under a directory only root can enter.
pub fn leash_bin() -> PathBuf {
    init_containment();
    match std::env::var_os("LEASH_TEST_BIN_DIR") {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir).join("leash"),
        _ => PathBuf::from(env!("CARGO_BIN_EXE_leash")),
    }
}

// ---------------------------------------------------------------------------------------------
// Skips. A test that cannot run here says why through `skip`, which also appends a line
// `<test binary>::<test>\t<reason>` to `<target>/test-skips/<binary>-<pid>.txt` (or under
// `$LEASH_TEST_SKIPS_DIR`), so that CI can print how many tests skipped and why after each pass
// (`.ci/skips.sh`): a green run cannot hide a suite that skipped itself.

/// Where skip records go: `$LEASH_TEST_SKIPS_DIR`, else `test-skips/` in the target directory.
pub fn skips_dir() -> PathBuf {
    match std::env::var_os("LEASH_TEST_SKIPS_DIR") {
        Some(d) if !d.is_empty() => PathBuf::from(d),
        _ => {
            let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
            tmp.parent().unwrap_or(tmp).join("test-skips")
        }
    }
}

/// Says that (part of) the current test is skipped and why, and records it for CI's summary.
/// The caller then returns. A record that cannot be written is printed, never a failure.
pub fn skip(reason: impl std::fmt::Display) {
    let test = std::thread::current()
        .name()
        .filter(|n| *n != "main")
        .unwrap_or("?")
        .to_string();
    record_skip(&test, &reason.to_string());
}

fn record_skip(test: &str, reason: &str) {
    use std::io::Write;
    eprintln!("skipped: {reason}");
    let dir = skips_dir();
    let file = dir.join(format!(
        "{}-{}.txt",
        env!("CARGO_CRATE_NAME"),
        std::process::id()
    ));
    // One line, one write(2) with O_APPEND: threads of this binary never interleave within it.
    let line = format!(
        "{}::{test}\t{}\n",
        env!("CARGO_CRATE_NAME"),
        reason.replace(['\n', '\t'], " ")
    );
    let written = std::fs::create_dir_all(&dir).and_then(|()| {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&file)?
            .write_all(line.as_bytes())
    });
    if let Err(e) = written {
        eprintln!("cannot record the skip in {}: {e}", file.display());
    }
}

// ---------------------------------------------------------------------------------------------
// Containment in tests. leash contains each lease in a cgroup by default when it can (as root,
// or as a user in a delegated subtree), under the caller's own cgroup. Tests must create cgroups
// only under a root they made, so before the first leash command of a test binary this points
// LEASH_CGROUP_ROOT at `<parent>/leash-test-<pid>-bin`, where the parent is the cgroup2 mount
// (root) or the process's own delegated cgroup (`.ci/rootless.sh`), made here and removed at exit
// (cgroup.kill, wait, rmdir, bottom-up), and left-overs of test binaries that died are removed
// first. Where neither is writable, the binary runs uncontained and records that as a skip.
// `LEASH_TEST_CONTAINMENT=off` runs the same tests with containment off (CI runs the lifecycle
// tests both ways).

/// The cgroup2 mount point, from /proc/self/mountinfo.
pub fn cgroup2_mount() -> Option<PathBuf> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    text.lines().find_map(|l| {
        let (left, right) = l.split_once(" - ")?;
        if right.split_whitespace().next() != Some("cgroup2") {
            return None;
        }
        left.split_whitespace().nth(4).map(PathBuf::from)
    })
}

/// Where this process may create the cgroups of its tests: the cgroup2 mount itself when it can
/// write there (root), else its own cgroup when that was delegated to it (an ordinary user in a
/// subtree whose directory and `cgroup.procs` it owns, as systemd's `Delegate=yes` leaves them;
/// `.ci/rootless.sh` runs the lifecycle tests so). `Err` says why neither.
pub fn cgroup_parent() -> Result<PathBuf, String> {
    static PARENT: std::sync::OnceLock<Result<PathBuf, String>> = std::sync::OnceLock::new();
    PARENT
        .get_or_init(|| {
            let mount = cgroup2_mount()
                .ok_or("no cgroup2 hierarchy mounted (see /proc/self/mountinfo)".to_string())?;
            let writable = |p: &Path| nix::unistd::access(p, nix::unistd::AccessFlags::W_OK);
            if writable(&mount).is_ok() {
                return Ok(mount);
            }
            let own = std::fs::read_to_string("/proc/self/cgroup")
                .ok()
                .and_then(|t| {
                    t.lines()
                        .find_map(|l| l.strip_prefix("0::").map(str::to_owned))
                })
                .ok_or("this process has no cgroup v2 membership".to_string())?;
            let own = mount.join(own.trim_start_matches('/'));
            match writable(&own).and_then(|()| writable(&own.join("cgroup.procs"))) {
                Ok(()) if own != mount => Ok(own),
                _ => Err(format!(
                    "creating cgroups needs root or a delegated subtree: neither {} nor this \
                     process's cgroup {} is writable by uid {}",
                    mount.display(),
                    own.display(),
                    nix::unistd::geteuid()
                )),
            }
        })
        .clone()
}

/// Whether this process can contain leases in cgroups it makes (see [`cgroup_parent`]).
pub fn containment_available() -> bool {
    cgroup_parent().is_ok()
}

fn init_containment() {
    init_runtime_dir();
    static INIT: std::sync::Once = std::sync::Once::new();
    INIT.call_once(|| {
        // Set before any leash command runs; std serialises environment access with spawns.
        if std::env::var("LEASH_TEST_CONTAINMENT").as_deref() == Ok("off") {
            std::env::set_var("LEASH_CONTAINMENT", "off");
            return;
        }
        let parent = match cgroup_parent() {
            Ok(p) => p,
            Err(why) => {
                // Every test of this binary then runs uncontained: recorded as a skip of the
                // containment, so a pass that meant to contain cannot go green without it.
                record_skip("(containment)", &format!("containment off: {why}"));
                std::env::set_var("LEASH_CONTAINMENT", "off");
                return;
            }
        };
        sweep_dead_test_roots(&parent);
        let root = parent.join(format!("leash-test-{}-bin", std::process::id()));
        if let Err(e) = std::fs::create_dir(&root) {
            record_skip(
                "(containment)",
                &format!("containment off: cannot create {} ({e})", root.display()),
            );
            std::env::set_var("LEASH_CONTAINMENT", "off");
            return;
        }
        std::env::set_var("LEASH_CGROUP_ROOT", &root);
        extern "C" fn cleanup() {
            if let Ok(parent) = cgroup_parent() {
                remove_cgroup_tree(&parent.join(format!("leash-test-{}-bin", std::process::id())));
            }
        }
        // SAFETY: registers a plain extern "C" fn; the test harness exits through exit(3).
        unsafe { libc::atexit(cleanup) };
    });
}

// ---------------------------------------------------------------------------------------------
// The wrappers' reports. leash puts them in a runtime directory on tmpfs shared by every state
// root of the user (`/run/leash`, `/dev/shm/leash-<uid>`: `state::resolve_reports_dir`), where a
// test that removes its state root with a lease still open would leave its report behind. So
// before the first leash command of a test binary this points LEASH_RUNTIME_DIR at
// `/dev/shm/leash-test-<pid>-rt` (tmpfs, as the default is), removed with everything in it at
// exit; left-overs of test binaries that died are removed first. A caller that set
// LEASH_RUNTIME_DIR keeps its own.

/// Where this process's tests' reports go by default (see above).
pub fn test_runtime_dir() -> PathBuf {
    runtime_base().join(format!("leash-test-{}-rt", std::process::id()))
}

fn runtime_base() -> PathBuf {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    }
}

fn init_runtime_dir() {
    static INIT: std::sync::Once = std::sync::Once::new();
    INIT.call_once(|| {
        if std::env::var_os("LEASH_RUNTIME_DIR").is_some() {
            return;
        }
        let base = runtime_base();
        if let Ok(rd) = std::fs::read_dir(&base) {
            for e in rd.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                let dead = name.ends_with("-rt") && of_a_dead_test(&name);
                let ours = e.metadata().is_ok_and(|m| {
                    std::os::unix::fs::MetadataExt::uid(&m) == nix::unistd::geteuid().as_raw()
                });
                if dead && ours {
                    let _ = std::fs::remove_dir_all(e.path());
                }
            }
        }
        let dir = test_runtime_dir();
        use std::os::unix::fs::DirBuilderExt;
        if let Err(e) = std::fs::DirBuilder::new().mode(0o700).create(&dir) {
            eprintln!(
                "cannot create {} ({e}): the default reports directory applies",
                dir.display()
            );
            return;
        }
        std::env::set_var("LEASH_RUNTIME_DIR", &dir);
        extern "C" fn cleanup() {
            let _ = std::fs::remove_dir_all(test_runtime_dir());
        }
        // SAFETY: registers a plain extern "C" fn; the test harness exits through exit(3).
        unsafe { libc::atexit(cleanup) };
    });
}

/// The wrapper's report file of a lease as `leash leases --json` shows it: in its `reportDir`,
/// else in the state root's `run/`.
pub fn report_file_of(state: &Path, lease: &serde_json::Value) -> PathBuf {
    let id = lease["leaseId"].as_str().expect("a lease id");
    let dir = match lease["reportDir"].as_str() {
        Some(d) => PathBuf::from(d),
        None => state.join("run"),
    };
    dir.join(format!("{id}.json"))
}

/// [`sweep_dead_test_roots`] where this process makes its cgroups (nothing where it cannot):
/// what a run of other test processes (Node's, SIGKILLed when they hung) calls once they are gone.
pub fn sweep_dead_test_roots_here() {
    if let Ok(parent) = cgroup_parent() {
        sweep_dead_test_roots(&parent);
    }
}

/// Removes `leash-test-<pid>-*` roots whose test process is gone (killed before its clean-up).
fn sweep_dead_test_roots(parent: &Path) {
    let Ok(rd) = std::fs::read_dir(parent) else {
        return;
    };
    for e in rd.flatten() {
        if of_a_dead_test(&e.file_name().to_string_lossy()) {
            remove_cgroup_tree(&e.path());
        }
    }
}

/// Whether `name` is `leash-test-<pid>-…` of a test process that is gone.
fn of_a_dead_test(name: &str) -> bool {
    name.strip_prefix("leash-test-")
        .and_then(|r| r.split('-').next())
        .and_then(|p| p.parse::<i32>().ok())
        .is_some_and(|pid| !Path::new(&format!("/proc/{pid}")).exists())
}

/// Kills every member of every cgroup under (and including) `root`, waits until each is empty,
/// and removes them deepest first. For test-made roots only.
pub fn remove_cgroup_tree(root: &Path) {
    fn dirs(p: &Path, out: &mut Vec<PathBuf>) {
        if let Ok(rd) = std::fs::read_dir(p) {
            for e in rd.flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    dirs(&e.path(), out);
                }
            }
        }
        out.push(p.to_path_buf());
    }
    let mut all = Vec::new();
    dirs(root, &mut all);
    for d in &all {
        let _ = std::fs::write(d.join("cgroup.kill"), "1");
    }
    for d in &all {
        wait_for_within(Duration::from_secs(10), || !cgroup_populated(d));
        let _ = std::fs::remove_dir(d);
    }
}

pub fn cgroup_populated(dir: &Path) -> bool {
    std::fs::read_to_string(dir.join("cgroup.events"))
        .is_ok_and(|t| t.lines().any(|l| l.trim() == "populated 1"))
}

pub fn cgroup_procs(dir: &Path) -> Vec<i32> {
    std::fs::read_to_string(dir.join("cgroup.procs"))
        .map(|t| {
            t.split_whitespace()
                .filter_map(|s| s.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// A cgroup root made by one test, `<parent>/leash-test-<pid>-<tag>-<n>` (the parent from
/// [`cgroup_parent`]), removed on drop with
/// everything in it (also when the test fails).
pub struct CgroupRoot(pub PathBuf);

impl CgroupRoot {
    /// `None`, with the skip recorded, where this process cannot create cgroups (no cgroup2,
    /// or neither root nor a delegated subtree: see [`cgroup_parent`]).
    pub fn new(tag: &str) -> Option<CgroupRoot> {
        init_containment();
        let parent = match cgroup_parent() {
            Ok(p) => p,
            Err(why) => {
                skip(format!("containment test: {why}"));
                return None;
            }
        };
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let p = parent.join(format!("leash-test-{}-{tag}-{n}", std::process::id()));
        std::fs::create_dir(&p).unwrap_or_else(|e| panic!("mkdir {}: {e}", p.display()));
        Some(CgroupRoot(p))
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    /// `leash --state-dir STATE` with containment on under this root.
    pub fn leash(&self, state: &Path) -> Command {
        let mut c = leash(state);
        c.env("LEASH_CGROUP_ROOT", &self.0)
            .env("LEASH_CONTAINMENT", "on");
        c
    }
}

impl Drop for CgroupRoot {
    fn drop(&mut self) {
        remove_cgroup_tree(&self.0);
    }
}

/// The wrapper binary the `leash` binary will install (built next to it by `cargo test
/// --workspace`, because the wrapper crate has integration tests of its own).
pub fn wrap_bin() -> PathBuf {
    let p = leash_bin().with_file_name("leash-wrap");
    assert!(
        p.is_file(),
        "{} is missing: run the tests with `cargo test --workspace`",
        p.display()
    );
    p
}

/// A scratch directory removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        init_containment();
        let p = std::env::temp_dir().join(format!(
            "leash-test-{tag}-{}-{}",
            std::process::id(),
            uuid::Uuid::new_v4().simple()
        ));
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    pub fn join(&self, s: &str) -> PathBuf {
        self.0.join(s)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        record_gateway_ids(&self.0);
        // A process the test ended can still be writing its last file here (a wrapper's final
        // report, a recorder's signal log): a removal that meets a file made meanwhile fails
        // (`ENOTEMPTY`) and leaves the rest, so it is tried again, for up to two seconds. After
        // the directory is gone such a write fails: nothing makes it again.
        let deadline = Instant::now() + Duration::from_secs(2);
        while std::fs::remove_dir_all(&self.0).is_err()
            && self.0.exists()
            && Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Where CI collects the gateway ids of the tests' state roots (one per line): its check of the
/// default cgroup root (`.ci/default-cgroup-root.sh`) counts only cgroups of these gateways, so
/// another leash on the host does not fail the run. Unset: nothing is recorded.
pub const ENV_TEST_GATEWAYS: &str = "LEASH_TEST_GATEWAYS";

/// Appends to [`ENV_TEST_GATEWAYS`] the gateway id of every state root (a `leash.db`) in `dir`,
/// up to three levels down, as the scratch directory is removed. Best effort: a database that
/// cannot be read (still locked, or not leash's) is passed over.
pub fn record_gateway_ids(dir: &Path) {
    if let Some(log) = std::env::var_os(ENV_TEST_GATEWAYS).filter(|v| !v.is_empty()) {
        record_gateway_ids_into(dir, Path::new(&log));
    }
}

/// The gateway id a state database holds (read only; `None` when it has none yet).
pub fn gateway_id(db: &Path) -> Option<String> {
    let c = rusqlite::Connection::open_with_flags(
        db,
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .ok()?;
    c.busy_timeout(Duration::from_millis(200)).ok()?;
    c.query_row(
        "SELECT value FROM meta WHERE key = 'gateway_instance_id'",
        [],
        |r| r.get(0),
    )
    .ok()
}

/// [`record_gateway_ids`] into the file `log`.
pub fn record_gateway_ids_into(dir: &Path, log: &Path) {
    fn dbs(d: &Path, depth: usize, out: &mut Vec<PathBuf>) {
        let Ok(rd) = std::fs::read_dir(d) else { return };
        for e in rd.flatten() {
            let Ok(t) = e.file_type() else { continue };
            if t.is_file() && e.file_name() == "leash.db" {
                out.push(e.path());
            } else if t.is_dir() && depth > 0 {
                dbs(&e.path(), depth - 1, out);
            }
        }
    }
    let mut found = Vec::new();
    dbs(dir, 3, &mut found);
    let mut ids = String::new();
    for db in found {
        if let Some(id) = gateway_id(&db) {
            ids.push_str(&id);
            ids.push('\n');
        }
    }
    if !ids.is_empty() {
        use std::io::Write;
        // One write of whole lines with O_APPEND: lines of concurrent tests do not interleave.
        let _ = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(log)
            .and_then(|mut f| f.write_all(ids.as_bytes()));
    }
}

/// `leash --state-dir <root> ARGS…` as a Command.
pub fn leash(state: &Path) -> Command {
    let mut c = Command::new(leash_bin());
    c.arg("--state-dir").arg(state);
    c.env_remove("LEASH_STATE_DIR").env_remove("LEASH_LOG");
    c
}

/// Creates a state root the way a user does, with `leash exec` (read-only commands never create
/// one): a lease of `/bin/true`, without containment, that ends at once.
#[allow(dead_code)]
pub fn init_state_root(state: &Path) {
    let out = run(
        state,
        &[
            "exec",
            "--containment",
            "off",
            "--session",
            "init",
            "--",
            "true",
        ],
    );
    assert_eq!(
        out.code,
        Some(0),
        "leash exec to create {state:?}: {}",
        out.stderr
    );
}

pub struct Output {
    pub code: Option<i32>,
    pub signal: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

/// Runs leash to completion and captures its output.
pub fn run(state: &Path, args: &[&str]) -> Output {
    let out = leash(state)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run leash");
    Output {
        code: out.status.code(),
        signal: out.status.signal(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

pub fn run_json(state: &Path, args: &[&str]) -> serde_json::Value {
    let out = run(state, args);
    assert_eq!(out.code, Some(0), "leash {args:?} failed: {}", out.stderr);
    serde_json::from_str(&out.stdout)
        .unwrap_or_else(|e| panic!("leash {args:?}: bad JSON ({e}): {}", out.stdout))
}

/// (pid, start time): a process instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pid {
    pub pid: i32,
    pub start: u64,
}

pub fn stat_fields(pid: i32) -> Option<Vec<String>> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &text[text.rfind(')')? + 1..];
    Some(rest.split_whitespace().map(str::to_owned).collect())
}

pub fn start_time(pid: i32) -> Option<u64> {
    stat_fields(pid)?.get(19)?.parse().ok()
}

pub fn ppid(pid: i32) -> Option<i32> {
    stat_fields(pid)?.get(1)?.parse().ok()
}

pub fn pgid(pid: i32) -> Option<i32> {
    stat_fields(pid)?.get(2)?.parse().ok()
}

fn state(pid: i32) -> Option<String> {
    stat_fields(pid)?.first().cloned()
}

impl Pid {
    pub fn of(pid: i32) -> Option<Pid> {
        Some(Pid {
            pid,
            start: start_time(pid)?,
        })
    }

    /// Alive: same instance and not a zombie.
    pub fn alive(&self) -> bool {
        start_time(self.pid) == Some(self.start) && state(self.pid).as_deref() != Some("Z")
    }

    /// Exists at all (a zombie counts): for "did it get reaped" questions.
    pub fn exists(&self) -> bool {
        start_time(self.pid) == Some(self.start)
    }
}

/// Polls `cond` until it holds or `PATIENCE` passes. Returns whether it held.
pub fn wait_for(mut cond: impl FnMut() -> bool) -> bool {
    wait_for_within(PATIENCE, &mut cond)
}

pub fn wait_for_within(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The resident set of a process in KiB (`VmRSS` of `/proc/PID/status`), `None` once it is gone.
pub fn vm_rss_kib(pid: i32) -> Option<u64> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
}

/// Reads a pid the test's processes wrote to a file, once it is there.
pub fn read_pid_file(path: &Path) -> Pid {
    let mut found = None;
    let ok = wait_for(|| {
        found = std::fs::read_to_string(path)
            .ok()
            .and_then(|s| s.trim().parse::<i32>().ok())
            .and_then(Pid::of);
        found.is_some()
    });
    assert!(ok, "{} never appeared", path.display());
    found.unwrap()
}

/// Children of a pid (from /proc/<pid>/task/*/children).
pub fn children(pid: i32) -> Vec<i32> {
    let mut out = Vec::new();
    if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        for t in tasks.flatten() {
            if let Ok(s) = std::fs::read_to_string(t.path().join("children")) {
                out.extend(s.split_whitespace().filter_map(|x| x.parse::<i32>().ok()));
            }
        }
    }
    out
}

/// Kills, on drop, every process the test registered, but only if it is still the same instance:
/// cleanup also when the test fails, never a stranger.
#[derive(Default)]
pub struct Guard {
    procs: Vec<Pid>,
    children: Vec<std::process::Child>,
}

impl Guard {
    pub fn new() -> Guard {
        Guard::default()
    }

    pub fn add(&mut self, p: Pid) {
        self.procs.push(p);
    }

    pub fn child(&mut self, c: std::process::Child) -> &mut std::process::Child {
        if let Some(p) = Pid::of(c.id() as i32) {
            self.procs.push(p);
        }
        self.children.push(c);
        self.children.last_mut().unwrap()
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        for p in &self.procs {
            if p.alive() {
                // SAFETY: kill(2) on a positive pid we started and re-identified by start time.
                unsafe {
                    libc::kill(p.pid, libc::SIGKILL);
                }
            }
        }
        for c in &mut self.children {
            let _ = c.wait();
        }
    }
}

/// Sends a signal to a process the test started, after checking it is still that instance.
pub fn signal(p: Pid, sig: i32) {
    assert!(p.pid > 1, "refusing to signal pid {}", p.pid);
    if p.alive() {
        // SAFETY: kill(2) on a positive pid re-identified by start time just above.
        unsafe {
            libc::kill(p.pid, sig);
        }
    }
}

/// Writes an executable shell script.
///
/// The script is put in place by `cp`, not written from this process: tests run as threads of one
/// process, and a child another thread forks at the wrong moment inherits our write descriptor
/// until it execs; exec'ing the script meanwhile fails with ETXTBSY ("Text file busy"). Only the
/// short-lived `cp` ever holds the final file open for writing.
pub fn script(dir: &Path, name: &str, body: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let p = dir.join(name);
    let draft = dir.join(format!(".{name}.draft"));
    std::fs::write(&draft, format!("#!/bin/sh\n{body}\n")).unwrap();
    let copied = Command::new("cp")
        .arg(&draft)
        .arg(&p)
        .status()
        .expect("run cp");
    assert!(copied.success(), "cp {} failed", draft.display());
    std::fs::remove_file(&draft).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    p
}

/// A shell script that traps and logs every catchable termination signal to the file named by
/// its first argument, writes its pid to `<log>.pid`, and runs until SIGKILLed. Used both as a
/// decoy (a process that is not ours to signal) and as a stubborn adapter.
pub fn trap_script(dir: &Path) -> PathBuf {
    script(
        dir,
        "trap.sh",
        r#"log="$1"
for s in TERM INT HUP QUIT USR1 USR2 ALRM; do trap "echo $s >> '$log'" $s; done
echo $$ > "$log.pid"
while :; do sleep 1 & wait $!; done"#,
    )
}

/// Starts `leash exec --session SESSION EXTRA… -- trap.sh <dir>/<session>.log` (an adapter that
/// logs every catchable signal) under `guard`; returns the wrapper and the adapter, once the
/// adapter runs. The adapter is not added to `guard`: the caller decides who ends it.
#[allow(dead_code)]
pub fn exec_trap(
    guard: &mut Guard,
    state: &Path,
    dir: &Path,
    session: &str,
    extra: &[&str],
) -> (Pid, Logged) {
    let trap = trap_script(dir);
    let log = dir.join(format!("{session}.log"));
    let child = guard.child(
        leash(state)
            .args(["exec", "--session", session])
            .args(extra)
            .arg("--")
            .arg(&trap)
            .arg(&log)
            .stdin(Stdio::null())
            .spawn()
            .expect("spawn leash exec"),
    );
    let wrapper = Pid::of(child.id() as i32).expect("leash exec started");
    (wrapper, Logged::wait_started(log))
}

/// A process that logs any signal it gets.
pub struct Logged {
    pub pid: Pid,
    pub log: PathBuf,
}

impl Logged {
    /// What the process logged (empty: it got no catchable signal).
    pub fn signals(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits for the pid file the trap script writes.
    pub fn wait_started(log: PathBuf) -> Logged {
        let pid = read_pid_file(&PathBuf::from(format!("{}.pid", log.display())));
        Logged { pid, log }
    }
}

/// Starts a decoy: the trap script run directly, not under leash.
pub fn start_decoy(guard: &mut Guard, dir: &Path, name: &str) -> Logged {
    let log = dir.join(format!("{name}.log"));
    guard.child(
        Command::new(trap_script(dir))
            .arg(&log)
            .stdin(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let d = Logged::wait_started(log);
    guard.add(d.pid);
    d
}

/// The leases of a state root, as JSON.
pub fn leases(state: &Path) -> Vec<serde_json::Value> {
    run_json(state, &["leases", "--json"])
        .as_array()
        .unwrap()
        .clone()
}

/// The leases of a state root read from its database (`--no-daemon`: never through a daemon;
/// the reports are folded in), none while the state root has no database yet.
pub fn db_leases(state: &Path) -> Vec<serde_json::Value> {
    if !state.join("leash.db").exists() {
        return Vec::new();
    }
    run_json(state, &["--no-daemon", "leases", "--json"])
        .as_array()
        .unwrap()
        .clone()
}

/// Starts `cmd`, a `leash … exec [OPTIONS]`, with `--session SESSION -- sleep 1000` under
/// `guard`, and waits until its lease has the adapter's pid (the wrapper's first report record
/// was read). Returns the wrapper and the lease's row ([`db_lease_of`]).
pub fn sleeping_lease(
    guard: &mut Guard,
    mut cmd: Command,
    state: &Path,
    session: &str,
) -> (Pid, serde_json::Value) {
    let child = guard.child(
        cmd.args(["--session", session, "--", "sleep", "1000"])
            .stdin(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let wrapper = Pid::of(child.id() as i32).unwrap();
    assert!(
        wait_for(|| db_lease_of(state, session).is_some_and(|l| l["adapterPid"].is_number())),
        "no wrapper report was read"
    );
    (wrapper, db_lease_of(state, session).unwrap())
}

/// The first lease of `session` in [`db_leases`].
pub fn db_lease_of(state: &Path, session: &str) -> Option<serde_json::Value> {
    db_leases(state)
        .into_iter()
        .find(|l| l["sessionKey"] == session)
}

pub fn lease_of(state: &Path, session: &str) -> serde_json::Value {
    leases(state)
        .into_iter()
        .rev()
        .find(|l| l["sessionKey"] == session)
        .unwrap_or_else(|| panic!("no lease for session {session}"))
}

/// Waits until the wrapper has a child (the adapter) and returns it.
pub fn adapter_of(wrapper: Pid) -> Pid {
    let mut adapter = None;
    assert!(
        wait_for(|| {
            adapter = children(wrapper.pid).first().and_then(|&p| Pid::of(p));
            adapter.is_some()
        }),
        "wrapper {} never started its adapter",
        wrapper.pid
    );
    adapter.unwrap()
}

/// True when running as root (needed to force pids and to mount over /proc).
pub fn is_root() -> bool {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// Starts a session, SIGKILLs its wrapper (the adapter dies with it) and reaps it: the lease stays
/// open while its root pid is free. Returns (lease id, the dead root pid).
pub fn dead_session(state: &Path, session: &str) -> (String, i32) {
    let mut child = leash(state)
        .args(["exec", "--session", session, "--", "sleep", "1000"])
        .spawn()
        .unwrap();
    let wrapper = Pid::of(child.id() as i32).unwrap();
    let adapter = adapter_of(wrapper);
    let id = lease_of(state, session)["leaseId"]
        .as_str()
        .unwrap()
        .to_string();
    signal(wrapper, libc::SIGKILL);
    child.wait().unwrap();
    assert!(wait_for(|| !adapter.alive()));
    (id, wrapper.pid)
}

/// Rewrites a lease row behind leash's back: `set` is an SQL assignment list whose parameters
/// start at ?2 (?1 is the lease id).
pub fn tamper(state: &Path, lease_id: &str, set: &str, params: &[i64]) {
    let params: Vec<&dyn rusqlite::ToSql> =
        params.iter().map(|p| p as &dyn rusqlite::ToSql).collect();
    tamper_with(state, lease_id, set, &params);
}

/// [`tamper`] with parameters of any SQL type (text, say).
pub fn tamper_with(state: &Path, lease_id: &str, set: &str, params: &[&dyn rusqlite::ToSql]) {
    let conn = rusqlite::Connection::open(state.join("leash.db")).unwrap();
    let mut all: Vec<&dyn rusqlite::ToSql> = vec![&lease_id];
    all.extend_from_slice(params);
    let n = conn
        .execute(
            &format!("UPDATE leases SET {set} WHERE lease_id = ?1"),
            all.as_slice(),
        )
        .unwrap();
    assert_eq!(n, 1);
}

/// Held by every test that forces pids (they share ns_last_pid).
pub static FORCING_PIDS: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Spawns `cmd` so that it gets pid `target`, retrying when another process takes the pid first.
/// `None` when the pid stays taken by someone else.
pub fn spawn_with_pid(target: i32, cmd: &mut Command) -> Option<std::process::Child> {
    for _ in 0..200 {
        if Pid::of(target).is_some() {
            return None; // a stranger holds it now
        }
        std::fs::write("/proc/sys/kernel/ns_last_pid", (target - 1).to_string()).unwrap();
        let mut child = cmd.spawn().unwrap();
        if child.id() as i32 == target {
            return Some(child);
        }
        child.kill().unwrap();
        child.wait().unwrap();
    }
    None
}

/// `sh -c 'leash exec … -- sh -c "trap.sh LOG & wait" & wait; THEN'`: the sh is the owner, the
/// adapter starts the trap script in the background, so the trap script outlives a SIGKILLed
/// wrapper (the adapter itself dies with it, by its parent-death signal). Returns (owner,
/// wrapper, the trap script).
pub fn outside_session(
    guard: &mut Guard,
    state: &Path,
    dir: &Path,
    session: &str,
    then: &str,
) -> (Pid, Pid, Logged) {
    let trap = trap_script(dir);
    let log = dir.join(format!("{session}.log"));
    let inner = format!("'{}' '{}' & wait", trap.display(), log.display());
    let owner_script = format!(
        "'{}' --state-dir '{}' exec --session {session} --grace-ms 200 -- sh -c \"{inner}\" & wait; {then}",
        leash_bin().display(),
        state.display(),
    );
    let child = guard.child(
        Command::new("sh")
            .arg("-c")
            .arg(owner_script)
            .env_remove("LEASH_STATE_DIR")
            .spawn()
            .unwrap(),
    );
    let owner = Pid::of(child.id() as i32).unwrap();
    let escapee = Logged::wait_started(log);
    guard.add(escapee.pid);
    let mut wrapper = None;
    assert!(wait_for(|| {
        wrapper = children(owner.pid).first().and_then(|&p| Pid::of(p));
        wrapper.is_some()
    }));
    let wrapper = wrapper.unwrap();
    guard.add(wrapper);
    (owner, wrapper, escapee)
}
