//! leash's benchmark suite: whole processes, measured side by side with the peers a user would
//! pick instead (tini, dumb-init, catatonit, a Node wrapper like the incumbent's), in the same run.
//!
//! Run it with `cargo bench` (after `bench/setup.sh`, which installs the peers; a missing peer is
//! skipped with a note). It builds `leash` and `leash-wrap` with the release profile first, as
//! `cargo build --release` does, so the programs measured are the ones in this tree as they ship. Every figure is a median with min and max over several
//! rounds, and every ratio is taken against a baseline measured in the same round, so a noisy
//! neighbour shifts both sides together. Results go to stdout and to
//! `target/leash-bench/latest.md`; `docs/benchmarks.md` quotes a quiet run.
//!
//! Sections (`--only a,b`): `spawn` (start-up overhead), `footprint` (resident memory, binary
//! size), `pdeath` (parent death → the adapter's SIGTERM), `proctable` (process-table work with
//! 2,000 extra processes), `scale` (closing 500 trees, reaping 10,000 stale leases, lease commits
//! per second), `containment` (a cgroup per session: exec with and without, close of 500 trees
//! with cgroup.kill against signals per pid, `leash ps` over 200 sessions; as root with cgroup2), `mcp` (`leash mcp` exec → `initialize` answered), `hostscale` (exec with a reused key, close of
//! one session and reap, quiet and with 500 / 2,000 / 10,000 unrelated processes), `hostreap` (reap of 100 contained leases, quiet and with 10,000 unrelated processes, against the host-wide pass; as root with cgroup2), `daemon` (`status` p99 under load against `ping`, memory per idle session; quiet and with 2,000 extra processes), `relay` (one session's output through the daemon against a pipe, every round and its ratio; quiet and with 2,000 extra processes), `execfloor` (`leash exec -- /bin/true`, lease committed and cgroup made, against the bare `leash-wrap -- /bin/true` and beside a floor server of the bench's own, quiet and with 2,000 unrelated processes), `upgrade` (a live upgrade of `leash serve` with 100 idle sessions, request to the new program's answer). `--quick` shrinks every loop for a smoke run; its numbers are not for quoting.
//! `--rounds N` sets the number of rounds of the sections that repeat; `--extra-wrapper NAME=PATH`
//! measures another wrapper build next to leash-wrap (see `bench/wrapper-variant.sh`);
//! `LEASH_BENCH_TRACE=FILE` writes the library's tracing events with timestamps to FILE.
//!
//! The binary also plays roles in its own stagings (`--role pdeath-parent|pdeath-adapter|relay-floor`):
//! a parent that can be SIGKILLed, an adapter that reports when SIGTERM reaches it, and a plain
//! relay (the relay section's floor).
//!
//! Everything a benchmark starts it cleans up, also on failure, and it signals only processes it
//! started, by pid and start time.

mod containment;
mod daemon;
mod execfloor;
mod floorserve;
mod footprint;
mod hostreap;
mod hostscale;
mod mcp;
mod pdeath;
mod procs;
mod proctable;
mod scale;
mod spawn;
mod stats;
mod upgrade;

use std::ffi::OsString;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

/// One section of the report: runs its benchmarks and returns its markdown.
type Section = fn(&Env, &Config) -> Result<String, String>;

/// How much of everything to do.
#[derive(Debug, Clone)]
pub struct Config {
    pub quick: bool,
    pub only: Option<Vec<String>>,
    /// Spawn: rounds, and runs per command per round.
    pub spawn_rounds: usize,
    pub spawn_batch: usize,
    pub spawn_batch_slow: usize,
    /// Footprint: measurements per wrapper.
    pub footprint_runs: usize,
    /// Parent death: trials per wrapper (the Node wrapper polls once a second: fewer trials).
    pub pdeath_trials: usize,
    pub pdeath_trials_node: usize,
    /// Process table: extra live processes, rounds, and repetitions per round.
    pub extra_procs: usize,
    pub table_rounds: usize,
    /// Scale: leases closed at once and their grace; stale leases reaped; commits timed.
    pub close_leases: usize,
    pub close_grace_ms: u64,
    pub reap_leases: usize,
    pub commits: usize,
    pub scale_rounds: usize,
    /// Wrapper builds to measure next to `leash-wrap` (`--extra-wrapper NAME=PATH`).
    pub extra_wrappers: Vec<(String, PathBuf)>,
    /// MCP start-up: runs per command per round (rounds: `spawn_rounds`).
    pub mcp_batch: usize,
}

impl Config {
    fn full() -> Config {
        Config {
            quick: false,
            only: None,
            spawn_rounds: 10,
            spawn_batch: 200,
            spawn_batch_slow: 10,
            footprint_runs: 7,
            pdeath_trials: 200,
            pdeath_trials_node: 60,
            extra_procs: 2_000,
            table_rounds: 7,
            close_leases: 500,
            close_grace_ms: 2_000,
            reap_leases: 10_000,
            commits: 2_000,
            scale_rounds: 3,
            extra_wrappers: Vec::new(),
            mcp_batch: 50,
        }
    }

    fn quick() -> Config {
        Config {
            quick: true,
            spawn_rounds: 3,
            spawn_batch: 30,
            spawn_batch_slow: 3,
            footprint_runs: 2,
            pdeath_trials: 20,
            pdeath_trials_node: 4,
            extra_procs: 200,
            table_rounds: 2,
            close_leases: 20,
            close_grace_ms: 500,
            reap_leases: 500,
            commits: 200,
            scale_rounds: 1,
            mcp_batch: 10,
            ..Config::full()
        }
    }

    pub fn wants(&self, section: &str) -> bool {
        self.only
            .as_ref()
            .is_none_or(|o| o.iter().any(|s| s == section))
    }
}

/// The programs under test, located once.
pub struct Env {
    pub leash: PathBuf,
    pub wrap: PathBuf,
    pub this: PathBuf,
    pub tini: Option<PathBuf>,
    pub tini_static: Option<PathBuf>,
    pub dumb_init: Option<PathBuf>,
    pub catatonit: Option<PathBuf>,
    pub node: Option<PathBuf>,
    pub sleep: PathBuf,
    pub true_bin: PathBuf,
}

impl Env {
    /// `(name, argv prefix)` of every wrapper to compare: leash-wrap, the extra builds, the peers
    /// that are installed. The command follows the prefix.
    pub fn wrappers(&self, cfg: &Config) -> Vec<(String, Vec<OsString>)> {
        let mut out = vec![(
            "leash-wrap".to_string(),
            vec![self.wrap.clone().into(), "--".into()],
        )];
        for (name, path) in &cfg.extra_wrappers {
            out.push((name.clone(), vec![path.clone().into(), "--".into()]));
        }
        out.extend(self.peers());
        out
    }

    /// The installed peers as `(name, argv prefix)`: the options a user would pass them to get
    /// leash-wrap's behaviour (own group, subreaper).
    pub fn peers(&self) -> Vec<(String, Vec<OsString>)> {
        let mut out = Vec::new();
        if let Some(p) = &self.catatonit {
            out.push(("catatonit".into(), vec![p.into(), "--".into()]));
        }
        if let Some(p) = &self.tini {
            out.push((
                "tini -s -g".into(),
                vec![p.into(), "-s".into(), "-g".into(), "--".into()],
            ));
        }
        if let Some(p) = &self.tini_static {
            out.push((
                "tini-static -s -g".into(),
                vec![p.into(), "-s".into(), "-g".into(), "--".into()],
            ));
        }
        if let Some(p) = &self.dumb_init {
            out.push(("dumb-init".into(), vec![p.into()]));
        }
        out
    }
}

fn main() {
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    if args.first().is_some_and(|a| a == "--role") {
        std::process::exit(match args.get(1).and_then(|a| a.to_str()) {
            Some("relay-floor") => daemon::relay_floor(),
            _ => pdeath::role(&args[1..]),
        });
    }
    trace_to_file();
    let cfg = match parse_args(&args) {
        Ok(c) => c,
        Err(msg) => {
            eprintln!("leash-bench: {msg}");
            eprintln!(
                "usage: cargo bench -- [--quick] [--rounds N] \
                 [--only spawn,footprint,pdeath,proctable,scale,containment,mcp,hostscale,hostreap,daemon,relay,execfloor,upgrade] [--extra-wrapper NAME=PATH]..."
            );
            std::process::exit(2);
        }
    };
    let env = match locate(&cfg) {
        Ok(e) => e,
        Err(msg) => {
            eprintln!("leash-bench: {msg}");
            std::process::exit(1);
        }
    };

    let mut report = String::new();
    let header = header(&env, &cfg);
    print!("{header}");
    report.push_str(&header);
    // The sections measure leash without containment unless they say otherwise (the
    // containment section points leash at a cgroup root it makes for itself): never under the
    // caller's own cgroup.
    std::env::set_var("LEASH_CONTAINMENT", "off");
    std::env::remove_var("LEASH_CGROUP_ROOT");
    let reports = BenchReports::start();
    let sections: [(&str, Section); 13] = [
        ("spawn", spawn::run),
        ("footprint", footprint::run),
        ("pdeath", pdeath::run),
        ("proctable", proctable::run),
        ("scale", scale::run),
        ("containment", containment::run),
        ("mcp", mcp::run),
        ("hostscale", hostscale::run),
        ("hostreap", hostreap::run),
        ("daemon", daemon::run),
        ("relay", daemon::relay),
        ("execfloor", execfloor::run),
        ("upgrade", upgrade::run),
    ];
    let mut failed = false;
    for (name, run) in sections {
        if !cfg.wants(name) {
            continue;
        }
        eprintln!("leash-bench: running {name} (load {})", loadavg());
        let text = match run(&env, &cfg) {
            Ok(t) => t,
            Err(e) => {
                failed = true;
                format!("\n### {name}: FAILED\n\n{e}\n")
            }
        };
        print!("{text}");
        report.push_str(&text);
    }
    let _ = writeln!(report, "\nLoad average at the end: {}", loadavg());
    let dir = env
        .leash
        .parent()
        .and_then(Path::parent)
        .map(|t| t.join("leash-bench"))
        .unwrap_or_else(|| PathBuf::from("leash-bench"));
    let _ = std::fs::create_dir_all(&dir);
    let path = dir.join("latest.md");
    match std::fs::write(&path, &report) {
        Ok(()) => eprintln!("leash-bench: results written to {}", path.display()),
        Err(e) => eprintln!("leash-bench: cannot write {}: {e}", path.display()),
    }
    drop(reports);
    if failed {
        std::process::exit(1);
    }
}

/// The wrappers' reports go where leash puts them by default, a private directory on tmpfs, but
/// in one of the bench's own (`/dev/shm/leash-bench-<pid>`, `LEASH_RUNTIME_DIR`), removed with
/// what is in it at the end: the bench removes state roots whose last leases nobody settled, and
/// their reports would be left in the user's shared one. A `LEASH_RUNTIME_DIR` the caller set
/// is kept (and not removed).
struct BenchReports(Option<PathBuf>);

impl BenchReports {
    fn start() -> BenchReports {
        if std::env::var_os("LEASH_RUNTIME_DIR").is_some_and(|v| !v.is_empty()) {
            return BenchReports(None);
        }
        let on_tmpfs = nix::sys::statfs::statfs("/dev/shm")
            .is_ok_and(|f| f.filesystem_type() == nix::sys::statfs::TMPFS_MAGIC);
        if !on_tmpfs {
            return BenchReports(None);
        }
        let dir = PathBuf::from(format!("/dev/shm/leash-bench-{}", std::process::id()));
        use std::os::unix::fs::DirBuilderExt;
        match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
            Ok(()) => {
                std::env::set_var("LEASH_RUNTIME_DIR", &dir);
                BenchReports(Some(dir))
            }
            Err(e) => {
                eprintln!(
                    "leash-bench: cannot make {} ({e}); leash's default applies",
                    dir.display()
                );
                BenchReports(None)
            }
        }
    }
}

impl Drop for BenchReports {
    fn drop(&mut self) {
        if let Some(dir) = &self.0 {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

fn parse_args(args: &[OsString]) -> Result<Config, String> {
    let mut cfg = Config::full();
    let mut extra = Vec::new();
    let mut only = None;
    let mut rounds = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.to_str() {
            // `cargo bench` passes --bench to harness-less benchmarks.
            Some("--bench") => {}
            Some("--quick") => cfg = Config::quick(),
            Some("--rounds") => {
                let n: usize = it
                    .next()
                    .and_then(|v| v.to_str())
                    .and_then(|v| v.parse().ok())
                    .filter(|&n| n > 0)
                    .ok_or("--rounds needs a positive number")?;
                rounds = Some(n);
            }
            Some("--only") => {
                let v = it
                    .next()
                    .and_then(|v| v.to_str())
                    .ok_or("--only needs a list")?;
                only = Some(v.split(',').map(str::to_string).collect::<Vec<_>>());
            }
            Some("--extra-wrapper") => {
                let v = it
                    .next()
                    .and_then(|v| v.to_str())
                    .ok_or("--extra-wrapper needs NAME=PATH")?;
                let (name, path) = v.split_once('=').ok_or("--extra-wrapper needs NAME=PATH")?;
                let path = std::fs::canonicalize(path)
                    .map_err(|e| format!("--extra-wrapper {path}: {e}"))?;
                extra.push((name.to_string(), path));
            }
            _ => return Err(format!("unknown argument {}", a.to_string_lossy())),
        }
    }
    if let Some(o) = &only {
        for s in o {
            if ![
                "spawn",
                "footprint",
                "pdeath",
                "proctable",
                "scale",
                "containment",
                "mcp",
                "hostscale",
                "hostreap",
                "daemon",
                "relay",
                "execfloor",
                "upgrade",
            ]
            .contains(&s.as_str())
            {
                return Err(format!("unknown section '{s}'"));
            }
        }
    }
    if let Some(n) = rounds {
        cfg.spawn_rounds = n;
        cfg.table_rounds = n;
        cfg.scale_rounds = n;
    }
    cfg.only = only;
    cfg.extra_wrappers = extra;
    Ok(cfg)
}

/// Builds `leash` and `leash-wrap` from this tree as they ship (release profile) and finds
/// everything else.
fn locate(_cfg: &Config) -> Result<Env, String> {
    let leash = PathBuf::from(env!("CARGO_BIN_EXE_leash"));
    // `cargo bench` builds this package's binaries, not the wrapper crate's; and the `leash` it
    // builds for the bench has the dev-dependencies' features too (proptest turns on
    // regex-syntax's Unicode tables: +0.45 MB, 5,600 more relocations at every start). Both are
    // built here as `cargo build --release` builds them, into the same places, so the programs
    // measured are the ones that ship.
    if let Some(cargo) = std::env::var_os("CARGO") {
        let status = Command::new(cargo)
            .args(["build", "--release", "-p", "leash-wrap", "-p", "leash"])
            .args(["--bin", "leash-wrap", "--bin", "leash"])
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .status()
            .map_err(|e| format!("cannot run cargo to build leash and leash-wrap: {e}"))?;
        if !status.success() {
            return Err(format!("building leash and leash-wrap failed ({status})"));
        }
    }
    let wrap = leash.with_file_name("leash-wrap");
    if !wrap.is_file() {
        return Err(format!(
            "{} is missing: build it with `cargo build --release --workspace`",
            wrap.display()
        ));
    }
    let this = std::env::current_exe().map_err(|e| format!("cannot find myself: {e}"))?;
    let note_missing = |name: &str| {
        let p = procs::which(name);
        if p.is_none() {
            eprintln!(
                "leash-bench: note: {name} is not installed; its rows are skipped (bench/setup.sh \
                 installs it)"
            );
        }
        p
    };
    Ok(Env {
        leash,
        wrap,
        this,
        tini: note_missing("tini"),
        tini_static: note_missing("tini-static"),
        dumb_init: note_missing("dumb-init"),
        catatonit: note_missing("catatonit"),
        node: note_missing("node"),
        sleep: procs::which("sleep").ok_or("sleep is not on PATH")?,
        true_bin: PathBuf::from("/bin/true"),
    })
}

fn first_line(cmd: &Path, args: &[&str]) -> String {
    Command::new(cmd)
        .args(args)
        .output()
        .ok()
        .map(|o| {
            let text = if o.stdout.is_empty() {
                o.stderr
            } else {
                o.stdout
            };
            String::from_utf8_lossy(&text)
                .lines()
                .next()
                .unwrap_or("")
                .trim()
                .to_string()
        })
        .unwrap_or_default()
}

pub fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|| "?".into())
}

fn header(env: &Env, cfg: &Config) -> String {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let cpu = read("/proc/cpuinfo")
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.trim().to_string())
        .unwrap_or_else(|| "?".into());
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let mem_kib: f64 = read("/proc/meminfo")
        .lines()
        .find(|l| l.starts_with("MemTotal:"))
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or(0.0);
    let date = first_line(Path::new("date"), &["-u", "+%Y-%m-%d %H:%M UTC"]);
    let commit = first_line(
        Path::new("git"),
        &[
            "-C",
            env!("CARGO_MANIFEST_DIR"),
            "describe",
            "--always",
            "--dirty",
        ],
    );
    let link = |p: &Path| match procs::elf_is_dynamic(p) {
        Some(true) => "dynamically linked",
        Some(false) => "statically linked",
        None => "not an ELF executable",
    };
    let mut h = String::new();
    let _ = writeln!(
        h,
        "## Run of {date}{}\n",
        if cfg.quick {
            " (--quick: smoke run, not for quoting)"
        } else {
            ""
        }
    );
    let _ = writeln!(
        h,
        "- machine: {cpu}, {cpus} CPUs, {:.1} GB RAM",
        mem_kib / 1024.0 / 1024.0
    );
    let _ = writeln!(
        h,
        "- kernel: Linux {}",
        read("/proc/sys/kernel/osrelease").trim()
    );
    let _ = writeln!(h, "- load average at the start: {}", loadavg());
    let _ = writeln!(
        h,
        "- leash: {commit}, {}",
        first_line(Path::new("rustc"), &["-V"])
    );
    let _ = writeln!(
        h,
        "- leash-wrap: {} ({} bytes, {})",
        env.wrap.display(),
        file_size(&env.wrap),
        link(&env.wrap)
    );
    for (name, path) in &cfg.extra_wrappers {
        let _ = writeln!(
            h,
            "- {name}: {} ({} bytes, {})",
            path.display(),
            file_size(path),
            link(path)
        );
    }
    let peers: [(&str, &Option<PathBuf>, &[&str]); 5] = [
        ("tini", &env.tini, &["--version"]),
        ("tini-static", &env.tini_static, &["--version"]),
        ("dumb-init", &env.dumb_init, &["--version"]),
        ("catatonit", &env.catatonit, &["--version"]),
        ("node", &env.node, &["--version"]),
    ];
    for (name, path, args) in peers {
        match path {
            Some(p) => {
                let _ = writeln!(h, "- {name}: {} ({})", first_line(p, args), p.display());
            }
            None => {
                let _ = writeln!(h, "- {name}: not installed, skipped");
            }
        }
    }
    h
}

pub fn file_size(p: &Path) -> u64 {
    std::fs::metadata(p).map_or(0, |m| m.len())
}

/// With `LEASH_BENCH_TRACE=FILE`, the library's tracing events (signals sent, closes finished)
/// go to FILE with their time since start: the timeline that splits a slow close into phases.
fn trace_to_file() {
    let Some(path) = std::env::var_os("LEASH_BENCH_TRACE") else {
        return;
    };
    let file = match std::fs::File::create(&path) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("leash-bench: cannot write the trace: {e}");
            return;
        }
    };
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new("leash=debug"))
        .with_timer(tracing_subscriber::fmt::time::Uptime::default())
        .with_ansi(false)
        .with_writer(std::sync::Mutex::new(file))
        .try_init();
}
