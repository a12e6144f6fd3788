//! The `leash` command line: flags are parsed here, then each subcommand calls the library.
//! Output is for operators by default and JSON with `--json`; exit codes are in
//! [`leash_core::kind::exitcode`].

/// `println!` for the CLI's stdout ([`write_stdout`]): a reader that went away ends the command
/// quietly instead of with a panic and a backtrace.
macro_rules! outln {
    () => {
        $crate::cli::write_stdout(format_args!("\n"))
    };
    ($($t:tt)*) => {
        $crate::cli::write_stdout(format_args!("{}\n", format_args!($($t)*)))
    };
}

mod backend;
mod docs;
pub mod logging;
mod mcp;
mod output;
mod serve;
pub mod sessions;
mod simulate;
mod verify;

use crate::controller::exec::ExecRequest;
use crate::controller::Controller;
use crate::controller::{CloseResult, LeaseRef};
use crate::limits::DEFAULT_GRACE_MS;
use crate::proc::LiveTable;
use crate::state::StateRoot;
use clap::{Args, Parser, Subcommand};
use leash_core::kind::exitcode;
use leash_core::kind::{HasKind, Kind};
use leash_core::model::LeaseState;
use leash_core::plan::ReapOptions;
use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

const EXIT_CODES: &str = "\
Exit codes:
  0    success
  1    error (I/O, corrupt or locked database, ...): the message says what failed
  2    bad usage
  3    conflict: the lease is not open, or another process is closing it
  4    no such lease, session or state directory
  5    the requester may not see that session
  6    ownership could not be verified: nothing was signalled (the reason is printed and recorded)
  7    the operation needs a running daemon (leash serve)
  8    leash verify: ownership disproven (dead)
  125  leash exec itself failed (bad usage, the session already has a live lease, the database,
       the wrapper): nothing was started
  126  leash exec: the adapter could not be executed (not executable); the lease is ended
  127  leash exec: the adapter was not found (not on PATH); the lease is ended
       Any other status of leash exec is the adapter's (its code, or 128+N for signal N).

Errors: one line on stderr, `leash: MESSAGE`. With --json or --error-format json, one JSON line
instead: {\"error\":{\"code\":\"conflict\",\"message\":\"...\",\"exitCode\":125}} (codes as in the
daemon protocol, docs/protocol.md).";

const GLOBAL: &str = "Global options";

#[derive(Debug, Parser)]
#[command(
    name = "leash",
    version,
    about = "Lease-based process supervisor and reaper for agent gateways",
    long_about = "leash makes process ownership a durable fact: every adapter a gateway starts runs \
under a lease committed before it is spawned, no signal is sent unless live evidence matches a \
lease, and no process leash started outlives its owner.",
    after_help = EXIT_CODES
)]
pub struct Cli {
    #[command(flatten)]
    pub global: GlobalArgs,

    #[command(subcommand)]
    pub command: Command,
}

/// The options every subcommand takes.
#[derive(Debug, Args)]
pub struct GlobalArgs {
    /// State directory (one per gateway installation; only `exec`, `serve` and `legacy import`
    /// create it) [default: $XDG_STATE_HOME/leash, else ~/.local/state/leash]
    #[arg(long, global = true, env = "LEASH_STATE_DIR", value_name = "DIR", help_heading = GLOBAL)]
    pub state_dir: Option<PathBuf>,

    /// More log output on stderr (-v: info, -vv: debug). LEASH_LOG overrides (tracing filter syntax).
    #[arg(short, long, global = true, action = clap::ArgAction::Count, help_heading = GLOBAL)]
    pub verbose: u8,

    /// The daemon's socket: where `leash serve` listens and where the other commands look for
    /// it [default: the one the running daemon recorded, else <state-dir>/leash.sock]
    #[arg(long, global = true, value_name = "PATH", help_heading = GLOBAL)]
    pub socket: Option<PathBuf>,

    /// Work on the state database directly even when a daemon serves the state root
    #[arg(long, global = true, help_heading = GLOBAL)]
    pub no_daemon: bool,

    /// How errors are printed on stderr: `text` (one line) or `json` (one JSON line with the
    /// protocol's error code; the default with --json)
    #[arg(long, global = true, value_enum, value_name = "FORMAT", help_heading = GLOBAL)]
    pub error_format: Option<ErrorFormat>,
    /// Containment: `on` puts each lease in its own cgroup wherever leash can create cgroups
    /// (root, or a delegated subtree), `off` never touches cgroups
    #[arg(long, global = true, env = "LEASH_CONTAINMENT", value_name = "on|off",
          value_parser = parse_containment, help_heading = GLOBAL)]
    pub containment: Option<crate::cgroup::Requested>,

    /// The leash cgroup root (under the cgroup2 mount) [default: the caller's own cgroup, or
    /// <cgroup2 mount>/leash for a caller in the root cgroup]
    #[arg(long, global = true, env = "LEASH_CGROUP_ROOT", value_name = "DIR", help_heading = GLOBAL)]
    pub cgroup_root: Option<PathBuf>,
}

/// Parses a command line, every subcommand `exec` included, with the one parser [`Cli`].
pub fn parse(args: &[OsString]) -> Result<Cli, clap::Error> {
    Cli::try_parse_from(args)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ErrorFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Commit a lease, then become the wrapper that runs CMD (stdio passes straight through).
    #[command(
        long_about = "Commit a lease for CMD, then exec the wrapper in place (same pid), which runs \
CMD in its own process group with OPENCLAW_ACPX_LEASE_ID and OPENCLAW_GATEWAY_INSTANCE_ID in its \
environment. stdin, stdout and stderr pass straight through; leash exec prints nothing on stdout. \
When the process that ran leash exec dies, the whole tree gets SIGTERM, then SIGKILL after the \
grace.\n\nAt most one lease per session is active. A second exec for a session whose lease is \
still active starts nothing and exits 125 with the reason, unless nothing of the old lease is \
alive any more (verified: wrapper, adapter, marked escapees): then the old lease is marked lost \
and the new one proceeds.\n\nThe wrapper writes a small report (the adapter's pid, then its exit \
status) in LEASH_RUNTIME_DIR when set (refused, nothing started, when it is not a directory of \
yours that can be made private), else in a private directory on tmpfs ($XDG_RUNTIME_DIR/leash, \
/run/leash for root, /dev/shm/leash-UID, the first that is safe), else in the state directory's \
run/; the lease records which.",
        after_help = "Exit status: the adapter's (its code, or 128+N if it died of signal N); 127 if \
CMD was not found, 126 if it could not be executed (the lease is then recorded ended, with the \
reason); 125 if leash exec itself failed (bad usage, a live lease for the session, the database, \
the wrapper), nothing started. With --error-format json the cause is one JSON line on stderr: \
{\"error\":{\"code\":\"conflict\",\"message\":\"...\",\"exitCode\":125}}; codes: bad_request, \
conflict, spawn_failed, internal, and adapter_not_found (127), adapter_not_executable (126)."
    )]
    Exec(ExecArgs),
    /// List leases.
    Leases(LeasesArgs),
    /// Show the gateway instance id, state directory, wrapper root and lease counts.
    Status(JsonArg),
    /// Verify a lease's live tree, then terminate it children first (SIGTERM, grace, SIGKILL).
    Close(CloseArgs),
    /// Record the intent to cancel the active turn of a session (--session KEY) or lease (LEASE or --lease ID).
    #[command(
        long_about = "Record the intent to cancel the active turn of a lease, named by its id \
(LEASE) or as the active lease of a session (--session KEY). Never signals; the lease stays open. \
When a daemon supervises the session it also writes an ACP session/cancel notification to the \
adapter (for --acp-session ID, or the one ACP session it knows); otherwise, or when it knows \
none, the intent is recorded just the same and the output says no notification was written."
    )]
    Cancel(TargetArgs),
    /// Reap orphaned leases (owner gone): what a gateway runs at startup.
    #[command(
        long_about = "Reap this gateway's open and closing leases whose owner is gone: verify \
each against the live process table, terminate verified trees (children first), mark lost those \
whose processes are all gone, and leave unverifiable ones open with the reason. Leases whose owner \
is alive are live sessions and are left alone. Legacy records are handled fail-safe. Closed and \
lost leases older than the retention are deleted. Never starts from a command-line search."
    )]
    Reap(ReapArgs),
    /// Records of the old gateway that predate leases (import, list).
    #[command(subcommand)]
    Legacy(LegacyCommand),
    /// Run the supervisor daemon: sessions outlive their clients (protocol: docs/protocol.md).
    #[command(long_about = serve::SERVE_ABOUT)]
    Serve(serve::ServeArgs),
    /// Each open session's processes and what they cost: pid, command, RSS, CPU time, totals.
    #[command(
        long_about = "For each open lease: the session, its members (pid, command, RSS, CPU time) \
and the session's totals, read from the lease's cgroup where containment put it in one (its CPU \
time then includes members that already exited; memory.current where the memory controller is \
enabled), else from the verified process tree. Sorted by RSS, largest first."
    )]
    Ps(JsonArg),
    /// Sessions as a requester sees them: list, history, send, status (one visibility check).
    #[command(subcommand)]
    Sessions(sessions::SessionsCommand),
    /// Is a lease's process alive and ours (owned), dead, or unknowable? Never signals.
    #[command(long_about = verify::VERIFY_ABOUT, after_help = verify::VERIFY_CODES)]
    Verify(verify::VerifyArgs),
    /// Print shell completions (bash, zsh, fish, …) generated from these definitions.
    Completions(docs::CompletionsArgs),
    /// Print the man page of leash or of one subcommand, or write them all with --out-dir.
    Man(docs::ManArgs),
    /// Serve the session tools to an agent over MCP (stdio), as one fixed requester.
    #[command(long_about = mcp::MCP_ABOUT)]
    Mcp(mcp::McpArgs),
    /// Write what a decision reads (leases, the processes that matter) as JSON, for `simulate`.
    #[command(long_about = simulate::SNAPSHOT_ABOUT)]
    Snapshot(simulate::SnapshotArgs),
    /// Replay reap, close or verify over a snapshot on a recording signaller; signals nothing.
    #[command(long_about = simulate::SIMULATE_ABOUT, after_help = simulate::SIMULATE_CODES)]
    Simulate(simulate::SimulateArgs),
}

/// A session key (or agent id): the one rule of [`crate::limits::check_key`].
pub(crate) fn parse_key(s: &str) -> Result<String, String> {
    crate::limits::check_key("the key", s)
        .map(|()| s.to_string())
        .map_err(|e| e.to_string())
}

/// A duration flag (humantime, or bare seconds), at most `max_ms`.
fn duration_at_most(
    what: &'static str,
    max_ms: u64,
) -> impl Fn(&str) -> Result<u64, String> + Clone {
    move |s: &str| crate::limits::parse_duration_ms(what, s, max_ms).map_err(|e| e.to_string())
}

fn grace_duration(s: &str) -> Result<u64, String> {
    duration_at_most("the grace", crate::limits::MAX_GRACE_MS)(s)
}

fn grace_millis(s: &str) -> Result<u64, String> {
    let ms: u64 = s
        .trim()
        .parse()
        .map_err(|_| format!("'{s}' is not a number of milliseconds"))?;
    crate::limits::check_grace_ms("the grace", ms).map_err(|e| e.to_string())
}

/// The grace between SIGTERM and SIGKILL: `--grace DURATION`, or `--grace-ms N` (milliseconds;
/// kept for scripts written before durations).
#[derive(Debug, Args, Clone, Copy, Default)]
pub struct GraceArg {
    /// Time between SIGTERM and SIGKILL, e.g. 500ms, 3s, 1m (at most 1h) [default: 3s for exec
    /// and serve; each lease's own for close and reap]
    #[arg(long, value_name = "DURATION", value_parser = grace_duration, conflicts_with = "grace_ms")]
    pub grace: Option<u64>,
    /// The same in milliseconds (kept for older scripts)
    #[arg(long, value_name = "MS", value_parser = grace_millis)]
    pub grace_ms: Option<u64>,
}

impl GraceArg {
    /// The grace in milliseconds, if one was given.
    pub fn ms(&self) -> Option<u64> {
        self.grace.or(self.grace_ms)
    }
}

#[derive(Debug, Args)]
pub struct ExecArgs {
    /// Session key (default: lease:<lease id>)
    #[arg(long, value_name = "KEY", value_parser = parse_key)]
    pub session: Option<String>,
    /// Agent id of the session
    #[arg(long, value_name = "ID", value_parser = parse_key)]
    pub agent: Option<String>,
    /// Session key of the session that owns this one
    #[arg(long, value_name = "KEY", value_parser = parse_key)]
    pub owner: Option<String>,
    /// Session key of the session that spawned this one
    #[arg(long, value_name = "KEY", value_parser = parse_key)]
    pub spawned_by: Option<String>,
    /// Parent session key
    #[arg(long, value_name = "KEY", value_parser = parse_key)]
    pub parent: Option<String>,
    /// [default: 3s]
    #[command(flatten)]
    pub grace: GraceArg,
    /// The pid of the process that spawns leash exec (the gateway). If our parent is not that
    /// process any more, nothing is started and the lease is recorded lost.
    #[arg(long, value_name = "PID", value_parser = clap::value_parser!(i32).range(1..))]
    pub owner_pid: Option<i32>,
    /// The lease id to use (a canonical UUID no lease row has; default: a fresh UUIDv7), so the
    /// spawner can record its launch before it starts leash exec
    #[arg(long, value_name = "UUID")]
    pub lease_id: Option<String>,
    /// Memory limit of the session's cgroup (memory.max), e.g. 512M, 2G; refused where the
    /// memory controller is not enabled for leash's cgroups
    #[arg(long, value_name = "SIZE", value_parser = parse_memory_max)]
    pub memory_max: Option<u64>,
    /// Process limit of the session's cgroup (pids.max)
    #[arg(long, value_name = "N", value_parser = parse_pids_max)]
    pub pids_max: Option<u64>,
    /// CPU limit of the session's cgroup (cpu.max): CPUs (e.g. 0.5), or "QUOTA PERIOD" in µs
    #[arg(long, value_name = "CPUS", value_parser = parse_cpu_max)]
    pub cpu_max: Option<String>,
    /// Remove this variable from the adapter's environment (repeatable), e.g. a provider
    /// credential the adapter must not inherit; the lease markers always survive
    #[arg(long, value_name = "NAME", conflicts_with = "clear_env", value_parser = parse_env_name)]
    pub unset_env: Vec<String>,
    /// Start the adapter from an empty environment: only the --keep-env names and the lease
    /// markers pass (keep PATH and HOME if the adapter needs them)
    #[arg(long)]
    pub clear_env: bool,
    /// With --clear-env: let this variable through (repeatable)
    #[arg(long, value_name = "NAME", requires = "clear_env", value_parser = parse_env_name)]
    pub keep_env: Vec<String>,
    /// The adapter command and its arguments
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<OsString>,
}

fn parse_containment(s: &str) -> Result<crate::cgroup::Requested, String> {
    s.parse()
}

/// An environment variable name, checked before anything (even the state root) is touched.
fn parse_env_name(s: &str) -> Result<String, String> {
    match crate::envpolicy::check_name("the name", s) {
        Ok(()) => Ok(s.to_string()),
        Err(crate::envpolicy::EnvNameError::Empty { .. }) => {
            Err("an environment variable name must not be empty".into())
        }
        Err(_) => Err("an environment variable name must not contain '=' or NUL".into()),
    }
}

fn parse_memory_max(s: &str) -> Result<u64, String> {
    let bytes = crate::cgroup::parse_size(s).map_err(|e| e.to_string())?;
    // The daemon's `memoryMax` is checked by the same rule.
    crate::limits::check_cgroup_limit("--memory-max", bytes).map_err(|e| e.to_string())
}

fn parse_pids_max(s: &str) -> Result<u64, String> {
    let n: u64 = s
        .trim()
        .parse()
        .map_err(|_| format!("'{s}' is not a number of processes"))?;
    // The daemon's `pidsMax` is checked by the same rule.
    crate::limits::check_cgroup_limit("--pids-max", n).map_err(|e| e.to_string())
}

fn parse_cpu_max(s: &str) -> Result<String, String> {
    crate::cgroup::parse_cpu_max(s).map_err(|e| e.to_string())
}

#[derive(Debug, Args)]
pub struct JsonArg {
    /// Print JSON (errors too, as one JSON line on stderr)
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct LeasesArgs {
    /// Only leases in this state
    #[arg(long, value_name = "STATE", value_parser = state_parser())]
    pub state: Option<LeaseState>,
    #[command(flatten)]
    pub json: JsonArg,
}

/// A lease is named the same way by every command: its id, as `LEASE` or `--lease ID`, or its
/// session, `--session KEY`; a command given none says so and names all three.
#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("target").required(true).args(["lease", "lease_flag", "session"])))]
pub struct TargetArgs {
    /// Lease id (or give --lease ID, or --session)
    #[arg(value_name = "LEASE")]
    pub lease: Option<String>,
    /// Lease id (the same as LEASE)
    #[arg(long = "lease", value_name = "ID")]
    pub lease_flag: Option<String>,
    /// The active lease of this session
    #[arg(long, value_name = "KEY", value_parser = parse_key)]
    pub session: Option<String>,
    /// With a daemon: the ACP session whose turn to cancel (the daemon writes a session/cancel
    /// notification for it to the adapter); inferred when the daemon knows just one
    #[arg(long, value_name = "ID", value_parser = parse_key)]
    pub acp_session: Option<String>,
    #[command(flatten)]
    pub json: JsonArg,
}

impl TargetArgs {
    fn target(&self) -> LeaseRef {
        match (
            self.lease.as_ref().or(self.lease_flag.as_ref()),
            &self.session,
        ) {
            (Some(id), _) => LeaseRef::Id(id.clone()),
            (None, Some(k)) => LeaseRef::Session(k.clone()),
            (None, None) => unreachable!("clap requires one"),
        }
    }
}

#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("target").required(true).multiple(true).args(["leases", "lease_flags", "session"])))]
pub struct CloseArgs {
    /// Lease ids (several are closed together, their grace periods running concurrently)
    #[arg(value_name = "LEASE")]
    pub leases: Vec<String>,
    /// Lease id, the same as LEASE (repeatable)
    #[arg(long = "lease", value_name = "ID")]
    pub lease_flags: Vec<String>,
    /// The active lease of this session (repeatable)
    #[arg(long, value_name = "KEY", value_parser = parse_key)]
    pub session: Vec<String>,
    /// [default: the lease's own]
    #[command(flatten)]
    pub grace: GraceArg,
    #[command(flatten)]
    pub json: JsonArg,
}

#[derive(Debug, Args)]
pub struct ReapArgs {
    /// Print what would be signalled and why; change nothing, signal nothing
    #[arg(long)]
    pub dry_run: bool,
    /// Treat leases whose owner is alive as orphans too
    #[arg(long)]
    pub include_live: bool,
    /// Delete closed, ended and lost leases that ended longer ago than this (e.g. 7d, 12h, 30m)
    #[arg(long, value_name = "DURATION", default_value = crate::limits::DEFAULT_RETENTION, value_parser = parse_retention)]
    pub retention: Duration,
    /// [default: each lease's own]
    #[command(flatten)]
    pub grace: GraceArg,
    #[command(flatten)]
    pub json: JsonArg,
}

#[derive(Debug, Subcommand)]
pub enum LegacyCommand {
    /// Import records of the old gateway from a JSON file
    #[command(
        long_about = "Import records of the old gateway (processes started before leases existed) \
from FILE, a JSON array of {\"sessionKey\": KEY, \"pid\": PID, \"command\": \"CMD LINE\", \
\"wrapperPath\": PATH (optional)}. `leash reap` then handles them fail-safe: a record is \
terminated only if its pid still runs that command from the wrapper directory, else it is marked \
lost or left alone with the reason. Creates the state directory when needed.

With --acpx DIR, imports the acpx extension's own state instead, as it is on disk: its open and \
closing process leases (DIR/process-leases.json and the SQLite keyed store, namespace \
process-leases), its gateway instance id (which becomes this root's own) and its session records \
(ownership rows). All or nothing: a malformed file changes nothing. `leash reap` then ends a \
lease's orphans only when its wrapper still carries the lease's own markers."
    )]
    Import {
        /// The JSON file to import (leash's own legacy format)
        #[arg(
            value_name = "FILE",
            required_unless_present = "acpx",
            conflicts_with = "acpx"
        )]
        file: Option<PathBuf>,
        /// Directory the old gateway's wrappers live in (default: this gateway's wrapper root)
        #[arg(long, value_name = "DIR", conflicts_with = "acpx")]
        wrapper_root: Option<PathBuf>,
        /// Import the acpx extension's own state from its acpx directory (`<OpenClaw state
        /// dir>/acpx`): its process leases (process-leases.json and the SQLite keyed store),
        /// its gateway instance id and its session records
        #[arg(long, value_name = "DIR")]
        acpx: Option<PathBuf>,
        /// The OpenClaw state directory holding gateway-instance-id and the SQLite stores
        /// (default: the parent of --acpx)
        #[arg(long, value_name = "DIR", requires = "acpx")]
        openclaw_state: Option<PathBuf>,
        /// The acpx session records' directory (default: <--acpx>/sessions)
        #[arg(long, value_name = "DIR", requires = "acpx")]
        acpx_sessions: Option<PathBuf>,
        /// Adopt the incumbent's gateway instance id although this state root already uses
        /// another (refused while the root has open or closing leases)
        #[arg(long, requires = "acpx")]
        adopt_gateway_id: bool,
        #[command(flatten)]
        json: JsonArg,
    },
    /// List legacy records
    List(JsonArg),
}

/// `open`, `closing`, `closed` or `lost`, listed in `--help` and in the error.
fn state_parser() -> impl clap::builder::TypedValueParser<Value = LeaseState> {
    use clap::builder::TypedValueParser;
    clap::builder::PossibleValuesParser::new(LeaseState::ALL.map(LeaseState::as_str))
        .map(|s| s.parse::<LeaseState>().expect("one of the listed states"))
}

/// Parses a duration (humantime syntax: `7d`, `12h`, `30m`, `45s`, `500ms`; a bare number is
/// seconds).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    crate::limits::parse_duration(s).map_err(|e| e.to_string())
}

fn parse_retention(s: &str) -> Result<Duration, String> {
    duration_at_most("the retention", crate::limits::MAX_RETENTION_MS)(s).map(Duration::from_millis)
}

/// An error with the exit code it maps to and its cause in the protocol's words (`code` of an
/// error reply: `not_found`, `conflict`, ...), for `--error-format json`. Both come from its
/// [`Kind`] through the one exit-code table ([`leash_core::kind::KINDS`]); a daemon's error keeps the
/// daemon's more specific code as its cause.
#[derive(Debug)]
pub struct Failure {
    pub code: u8,
    pub message: String,
    pub cause: String,
}

impl Failure {
    pub fn new(kind: Kind, message: impl Into<String>) -> Failure {
        Failure {
            code: kind.exit_code(),
            message: message.into(),
            cause: kind.cause().to_string(),
        }
    }

    /// The same failure with a more specific cause.
    pub fn with_cause(mut self, cause: impl Into<String>) -> Failure {
        self.cause = cause.into();
        self
    }

    /// The same failure as a failure of `leash exec` itself: exit 125 whatever its kind (so it
    /// never collides with an adapter's status), the cause kept.
    pub fn of_exec(mut self) -> Failure {
        self.code = Kind::SpawnFailed.exit_code();
        self
    }

    /// The JSON error line: `{"error":{"code","message","exitCode"}}`, like the daemon's error
    /// replies.
    pub fn to_json(&self) -> String {
        serde_json::json!({"error": {
            "code": self.cause,
            "message": self.message,
            "exitCode": self.code,
        }})
        .to_string()
    }
}

/// Every module error becomes a failure of its kind, with its message.
impl<E: HasKind> From<E> for Failure {
    fn from(e: E) -> Failure {
        Failure::new(e.kind(), e.to_string())
    }
}

/// The exit code of a batch of closes: the worst outcome's (a lease left open because it could
/// not be verified is 6, one another process holds is 3, closed or lost is 0). The direct path
/// and the daemon path both end here.
pub(crate) fn close_exit_code(outcomes: &[crate::controller::CloseOutcome]) -> u8 {
    outcomes
        .iter()
        .map(|o| match o.result {
            CloseResult::Closed | CloseResult::Lost => exitcode::OK,
            CloseResult::LeftOpen => Kind::Unverified.exit_code(),
            CloseResult::Conflict => Kind::Conflict.exit_code(),
        })
        .max()
        .unwrap_or(exitcode::OK)
}

/// Writes to stdout. The one place the CLI's output goes through: when the reader went away
/// (EPIPE: `leash close … | head -2`), the command ends as SIGPIPE ends other tools, quietly
/// (`println!` would panic with "Broken pipe" and a backtrace); any other write error is said
/// once on stderr, exit 1. Output is written only after a command's work is done, so nothing is
/// left half-done.
pub(crate) fn write_stdout(args: std::fmt::Arguments<'_>) {
    use std::io::Write;
    if let Err(e) = std::io::stdout().lock().write_fmt(args) {
        stdout_failed(&e)
    }
}

/// See [`write_stdout`].
pub(crate) fn stdout_failed(e: &std::io::Error) -> ! {
    use std::io::Write;
    if e.kind() == std::io::ErrorKind::BrokenPipe {
        crate::sys::die_of_sigpipe()
    }
    let _ = writeln!(std::io::stderr(), "leash: cannot write to stdout: {e}");
    std::process::exit(i32::from(Kind::Internal.exit_code()))
}

pub fn main() -> ExitCode {
    let args: Vec<OsString> = std::env::args_os().collect();
    let cli = match parse(&args) {
        Ok(cli) => cli,
        Err(e) => return usage_error(e, &args),
    };
    match &cli.command {
        Command::Serve(a) => logging::init(cli.global.verbose, true, a.log_format),
        _ => logging::init(cli.global.verbose, false, logging::LogFormat::Text),
    }
    let json_errors = match cli.global.error_format {
        Some(f) => f == ErrorFormat::Json,
        None => wants_json(&cli.command),
    };
    match run(cli) {
        Ok(code) => ExitCode::from(code),
        Err(f) => {
            if json_errors {
                eprintln!("{}", f.to_json());
            } else {
                eprintln!("leash: {}", f.message);
            }
            ExitCode::from(f.code)
        }
    }
}

/// A command line clap refused: help and version go out as clap prints them; errors exit 2, or
/// 125 for `leash exec` (every failure of exec itself is 125, so it never collides with an
/// adapter's status), as one JSON line when JSON errors were asked for.
fn usage_error(e: clap::Error, args: &[OsString]) -> ExitCode {
    use clap::error::ErrorKind;
    if matches!(
        e.kind(),
        ErrorKind::DisplayHelp
            | ErrorKind::DisplayVersion
            | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
    ) {
        let _ = e.print();
        return ExitCode::from(
            if e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
                Kind::Usage.exit_code()
            } else {
                exitcode::OK
            },
        );
    }
    let (exec, json) = scan_args(args);
    let code = if exec {
        Kind::SpawnFailed.exit_code()
    } else {
        Kind::Usage.exit_code()
    };
    // `leash exec sleep 1`: the adapter command goes after `--` (so its own flags are never
    // taken for leash's); say so instead of clap's "unexpected argument".
    let hint = (exec && !args.iter().any(|a| a == "--") && exec_missing_dashdash(&e)).then(|| {
        "the adapter command goes after `--`: leash exec [OPTIONS] -- CMD [ARGS...]".to_string()
    });
    // clap quotes the refused value whole: a 100 KB key would come back whole.
    let rendered = shorten_long_words(e.render().to_string(), args);
    if json {
        let mut message = rendered
            .lines()
            .next()
            .unwrap_or("bad usage")
            .trim_start_matches("error: ")
            .to_string();
        if let Some(h) = &hint {
            message = format!("{message}; {h}");
        }
        let f = Failure {
            code,
            message,
            cause: Kind::Usage.cause().to_string(),
        };
        eprintln!("{}", f.to_json());
    } else {
        eprint!("{rendered}");
        if let Some(h) = &hint {
            eprintln!("leash: {h}");
        }
    }
    ExitCode::from(code)
}

/// Did clap refuse `leash exec` because the command was not after `--` (a word it took for an
/// unexpected argument, or no command at all)?
fn exec_missing_dashdash(e: &clap::Error) -> bool {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    match e.kind() {
        ErrorKind::MissingRequiredArgument => true,
        ErrorKind::UnknownArgument => match e.get(ContextKind::InvalidArg) {
            Some(ContextValue::String(a)) => !a.starts_with('-'),
            _ => false,
        },
        _ => false,
    }
}

/// `text` with every command-line word longer than [`crate::limits::MAX_KEY_BYTES`] replaced by
/// its shortened form ([`crate::limits::show_key`]).
fn shorten_long_words(mut text: String, args: &[OsString]) -> String {
    for a in args.iter().skip(1) {
        let w = a.to_string_lossy();
        if w.len() > crate::limits::MAX_KEY_BYTES && text.contains(w.as_ref()) {
            text = text.replace(w.as_ref(), &crate::limits::show_key(&w));
        }
    }
    text
}

/// From a command line clap refused: is it `leash exec`, and were JSON errors asked for
/// (`--error-format json`, or `--json`)? Global options with a value are skipped; the first
/// other word is the subcommand.
fn scan_args(args: &[OsString]) -> (bool, bool) {
    let words: Vec<String> = args
        .iter()
        .skip(1)
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let mut subcommand = None;
    let mut json = false;
    let mut i = 0;
    while i < words.len() {
        let w = words[i].as_str();
        match w {
            "--" => break,
            "--json" => json = true,
            "--error-format=json" => json = true,
            "--error-format" => {
                json = words.get(i + 1).map(String::as_str) == Some("json");
                i += 1;
            }
            "--state-dir" | "--socket" if subcommand.is_none() => i += 1,
            _ if !w.starts_with('-') && subcommand.is_none() => subcommand = Some(w.to_string()),
            _ => {}
        }
        i += 1;
    }
    (subcommand.as_deref() == Some("exec"), json)
}

/// Did the command ask for JSON output (so errors are JSON too)?
fn wants_json(c: &Command) -> bool {
    match c {
        Command::Leases(a) => a.json.json,
        Command::Status(a) => a.json,
        Command::Close(a) => a.json.json,
        Command::Cancel(a) => a.json.json,
        Command::Reap(a) => a.json.json,
        Command::Legacy(LegacyCommand::List(a)) => a.json,
        Command::Legacy(LegacyCommand::Import { json, .. }) => json.json,
        Command::Sessions(c) => c.json(),
        Command::Simulate(a) => a.json,
        // exec, serve, legacy import (and commands without --json): text unless
        // --error-format json.
        _ => false,
    }
}

/// The containment settings of this invocation, put into the environment too, where
/// `Controller::open` and every `leash exec` the daemon spawns read them.
fn containment_settings(cli: &Cli) -> crate::cgroup::Settings {
    let settings = settings_of(&cli.global);
    // Single-threaded still: nothing else reads the environment concurrently.
    for (name, value) in settings.env() {
        match value {
            Some(v) => std::env::set_var(name, v),
            None => std::env::remove_var(name),
        }
    }
    settings
}

fn settings_of(global: &GlobalArgs) -> crate::cgroup::Settings {
    crate::cgroup::Settings {
        requested: global.containment.unwrap_or_default(),
        root: global.cgroup_root.clone(),
    }
}

pub fn run(cli: Cli) -> Result<u8, Failure> {
    // These need no state root.
    match &cli.command {
        Command::Completions(a) => return docs::completions(a),
        Command::Man(a) => return docs::man(a),
        Command::Simulate(_) => {
            let Command::Simulate(a) = cli.command else {
                unreachable!("matched above")
            };
            return simulate::run_simulate(a);
        }
        _ => {}
    }
    let settings = containment_settings(&cli);
    // A verb sent to a named daemon socket needs no state root of the caller's own: without
    // --state-dir / LEASH_STATE_DIR it works on the root that daemon serves, and a named root
    // need not hold a database yet (the connection may be what starts the daemon, under socket
    // activation, in the empty directory systemd made for it).
    let to_named_socket = cli.global.socket.is_some()
        && !cli.global.no_daemon
        && matches!(
            cli.command,
            Command::Leases(_)
                | Command::Status(_)
                | Command::Close(_)
                | Command::Cancel(_)
                | Command::Reap(_)
                | Command::Sessions(_)
                | Command::Verify(_)
        );
    let dir = match (&cli.global.socket, &cli.global.state_dir) {
        (Some(socket), None) if to_named_socket => {
            backend::served_root(&crate::state::absolute(socket)?)?
        }
        _ => StateRoot::resolve(cli.global.state_dir.as_deref()).map_err(|e| {
            let f = Failure::from(e);
            match cli.command {
                // Every failure of exec itself is 125.
                Command::Exec(_) => f.of_exec(),
                _ => f,
            }
        })?,
    };
    // Only the commands that start something (and `legacy import`, which records the old
    // gateway's processes before any session runs) may create a state root: a typo in
    // --state-dir must not silently become a second gateway.
    let creates = matches!(
        cli.command,
        Command::Exec(_) | Command::Serve(_) | Command::Legacy(LegacyCommand::Import { .. })
    );
    if let Command::Exec(a) = cli.command {
        let json_errors = cli.global.error_format == Some(ErrorFormat::Json);
        let req = exec_request(a, settings, json_errors);
        return run_exec(&dir, req, cli.global.no_daemon);
    }
    // The first directory of the state root's path that does not exist yet: what a failed
    // `leash serve` removes again (see `remove_unused_root`).
    let made_from = match cli.command {
        Command::Serve(_) => first_missing(&dir),
        _ => None,
    };
    let root = if creates {
        StateRoot::open(&dir)?
    } else if to_named_socket {
        StateRoot::open_existing_dir(&dir)?
    } else {
        StateRoot::open_existing(&dir)?
    };
    let socket = match cli.global.socket {
        Some(p) => Some(crate::state::absolute(&p)?),
        None => None,
    };
    // These commands go through the daemon when one serves the state root, else work on the
    // database directly: the same verb, the same typed result, one rendering (`backend.rs`).
    let backend = || backend::open(&root, socket.as_deref(), cli.global.no_daemon);
    match cli.command {
        Command::Exec(_) => unreachable!("handled above"),
        Command::Leases(a) => run_leases(&mut *backend()?, a),
        Command::Status(a) => run_status(&mut *backend()?, a),
        Command::Close(a) => run_close(&mut *backend()?, a),
        Command::Cancel(a) => run_cancel(&mut *backend()?, a),
        Command::Reap(a) => run_reap(&mut *backend()?, a),
        Command::Legacy(c) => run_legacy(root, c),
        Command::Ps(a) => run_ps(&root, a),
        Command::Serve(a) => serve::run_serve(root.clone(), socket, a).inspect_err(|_| {
            if let Some(from) = &made_from {
                remove_unused_root(&root, from);
            }
        }),
        Command::Sessions(c) => sessions::run(&mut *backend()?, c),
        Command::Verify(a) => verify::run(&mut *backend()?, &a),
        Command::Completions(_) | Command::Man(_) => unreachable!("handled above"),
        Command::Mcp(a) => mcp::run(root, a),
        Command::Snapshot(a) => simulate::run_snapshot(root, a),
        Command::Simulate(_) => unreachable!("handled above"),
    }
}

/// The first of `dir` and its ancestors that does not exist (the top of what creating `dir`
/// makes), or `None` when `dir` exists.
fn first_missing(dir: &std::path::Path) -> Option<std::path::PathBuf> {
    let mut top = None;
    let mut p = Some(dir);
    while let Some(d) = p {
        if std::fs::symlink_metadata(d).is_ok() {
            break;
        }
        top = Some(d.to_path_buf());
        p = d.parent();
    }
    top
}

/// A `leash serve` that failed before it served (a busy `--metrics` port, a taken socket) in a
/// state root it created leaves nothing behind: its lock file and the empty `wrappers/` and
/// `run/` go, then the directories it made, up to `from`. Only what is empty is removed: a root
/// that holds a database (the daemon got as far as opening it, or another process made one
/// meanwhile) is kept, whole.
fn remove_unused_root(root: &StateRoot, from: &std::path::Path) {
    use std::os::unix::fs::OpenOptionsExt;
    if std::fs::symlink_metadata(root.db_path()).is_ok() {
        return;
    }
    // The lock file only while nobody holds it (another `leash serve` that started meanwhile
    // would otherwise lose its lock, and a third could start beside it).
    let lock = root.daemon_lock_path();
    if let Ok(f) = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&lock)
    {
        if let Ok(_held) = nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockExclusiveNonblock) {
            let _ = std::fs::remove_file(&lock);
        }
    }
    let _ = std::fs::remove_dir(root.wrapper_root());
    let _ = std::fs::remove_dir(root.run_dir());
    let mut d = Some(root.dir());
    while let Some(dir) = d {
        if std::fs::remove_dir(dir).is_err() || dir == from {
            break;
        }
        d = dir.parent();
    }
}

/// `leash exec`'s request from its command line.
fn exec_request(
    a: ExecArgs,
    containment: crate::cgroup::Settings,
    json_errors: bool,
) -> ExecRequest {
    ExecRequest {
        containment,
        limits: crate::cgroup::Limits {
            memory_max: a.memory_max,
            pids_max: a.pids_max,
            cpu_max: a.cpu_max,
        },
        session_key: a.session,
        agent_id: a.agent,
        owner_session_key: a.owner,
        spawned_by: a.spawned_by,
        parent_session_key: a.parent,
        grace_ms: a.grace.ms().unwrap_or(DEFAULT_GRACE_MS),
        owner_pid: a.owner_pid,
        json_errors,
        env: crate::envpolicy::EnvPolicy {
            unset: a.unset_env,
            clear: a.clear_env,
            keep: a.keep_env,
        },
        lease_id: a.lease_id,
        command: a.command,
        report_dir: None,
    }
}

fn run_exec(dir: &std::path::Path, mut req: ExecRequest, no_daemon: bool) -> Result<u8, Failure> {
    // Before the state root is made: a refused exec changes nothing.
    crate::controller::exec::check_owner(req.owner_pid).map_err(|e| {
        let kind = e.kind();
        Failure::new(kind, e.to_string()).of_exec()
    })?;
    req.report_dir = crate::state::resolve_reports_dir(&|k| std::env::var_os(k))
        .map_err(|e| Failure::new(e.kind(), e.to_string()).of_exec())?;
    let root = StateRoot::open(dir)
        .map_err(|e| Failure::new(Kind::Internal, format!("{e}; nothing started")).of_exec())?;
    // A daemon of this state root commits the lease on its warm connection; without
    // one (or with --no-daemon) the lease is committed here.
    let through = crate::client::exec::ExecThroughDaemon { root: &root };
    let through: &dyn crate::controller::exec::ExecDaemon = &through;
    let daemon = (!no_daemon).then_some(through);
    match crate::controller::exec::exec(&root, req, daemon) {
        Ok(never) => match never {},
        Err(e) => {
            let kind = e.kind();
            let msg = crate::controller::exec::cli_message(&e);
            Err(Failure::new(kind, msg).of_exec())
        }
    }
}

fn run_leases(b: &mut dyn backend::Backend, a: LeasesArgs) -> Result<u8, Failure> {
    let rows = b.leases(a.state)?;
    output::leases(&rows, a.json.json);
    Ok(exitcode::OK)
}

fn run_status(b: &mut dyn backend::Backend, a: JsonArg) -> Result<u8, Failure> {
    output::status(&b.status()?, a.json);
    Ok(exitcode::OK)
}

fn run_ps(root: &StateRoot, a: JsonArg) -> Result<u8, Failure> {
    let mut report = Controller::open(root.clone(), &LiveTable)?.ps()?;
    report
        .sessions
        .sort_by_key(|s| std::cmp::Reverse(s.totals.rss_bytes));
    output::ps(&report, a.json);
    Ok(exitcode::OK)
}

fn run_close(b: &mut dyn backend::Backend, a: CloseArgs) -> Result<u8, Failure> {
    let targets: Vec<LeaseRef> = a
        .leases
        .iter()
        .chain(&a.lease_flags)
        .map(|l| LeaseRef::Id(l.clone()))
        .chain(a.session.iter().map(|s| LeaseRef::Session(s.clone())))
        .collect();
    let outcomes = b.close(&targets, a.grace.ms())?;
    output::close(&outcomes, a.json.json);
    Ok(close_exit_code(&outcomes))
}

fn run_cancel(b: &mut dyn backend::Backend, a: TargetArgs) -> Result<u8, Failure> {
    let out = b.cancel(&a.target(), a.acp_session.as_deref())?;
    output::cancelled(&out, a.json.json);
    Ok(exitcode::OK)
}

fn run_reap(b: &mut dyn backend::Backend, a: ReapArgs) -> Result<u8, Failure> {
    let opts = ReapOptions {
        include_live: a.include_live,
        retention_ms: i64::try_from(a.retention.as_millis()).unwrap_or(i64::MAX),
        now_ms: crate::lease::now_ms(),
        grace_ms: a.grace.ms(),
    };
    if a.dry_run {
        let plan = b.reap_plan(&opts)?;
        output::reap_plan(&plan, a.json.json);
        return Ok(exitcode::OK);
    }
    let report = b.reap(&opts)?;
    output::reap_report(&report, a.json.json);
    Ok(reap_exit_code(&report))
}

/// A reap that left a lease open because it could not verify it exits 6, so a gateway's startup
/// script can tell "nothing to do" from "something needs a look".
pub(crate) fn reap_exit_code(report: &crate::controller::ReapReport) -> u8 {
    let unverified = report
        .leases
        .iter()
        .any(|o| o.result == CloseResult::LeftOpen);
    if unverified {
        Kind::Unverified.exit_code()
    } else {
        exitcode::OK
    }
}

fn run_legacy(root: StateRoot, c: LegacyCommand) -> Result<u8, Failure> {
    let ctl = Controller::open(root, &LiveTable)?;
    match c {
        LegacyCommand::Import {
            file,
            wrapper_root,
            acpx: Some(acpx_dir),
            openclaw_state,
            acpx_sessions,
            adopt_gateway_id,
            json,
        } => {
            let _ = (file, wrapper_root);
            let src = crate::controller::AcpxSources {
                acpx_dir,
                openclaw_state,
                sessions_dir: acpx_sessions,
            };
            let (r, skipped) = ctl
                .legacy_import_acpx(&src, adopt_gateway_id)
                .map_err(Failure::from)?;
            output::acpx_imported(&r, skipped, json.json);
            Ok(exitcode::OK)
        }
        LegacyCommand::Import {
            file,
            wrapper_root,
            json,
            ..
        } => {
            let file = file.expect("clap requires FILE without --acpx");
            let n = ctl
                .legacy_import(&file, wrapper_root.as_deref())
                .map_err(Failure::from)?;
            output::legacy_imported(n, json.json);
            Ok(exitcode::OK)
        }
        LegacyCommand::List(j) => {
            let recs = ctl.legacy_records(false)?;
            output::legacy(&recs, j.json);
            Ok(exitcode::OK)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cli_is_well_formed() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }

    /// `leash exec`'s command lines go through the one parser: global options and the exec's
    /// own anywhere before `--`, everything after it the command; and what it refuses, it refuses
    /// as a usage error of `leash exec`.
    #[test]
    fn exec_lines_parse_with_the_one_parser() {
        let words = |line: &str| -> Vec<OsString> { line.split(' ').map(OsString::from).collect() };
        let accepted = [
            ("leash exec -- /bin/true", &["/bin/true"][..]),
            (
                "leash exec --session s1 --agent a --owner o --spawned-by p --parent q -- cat -n",
                &["cat", "-n"],
            ),
            ("leash exec --grace 500ms --owner-pid 1 -- x", &["x"]),
            (
                "leash exec --grace-ms 700 --lease-id 0190b1f2-7c3a-7d4e-8f00-1234567890ab -- x",
                &["x"],
            ),
            (
                "leash exec --memory-max 512M --pids-max 10 --cpu-max 0.5 -- x --flag",
                &["x", "--flag"],
            ),
            ("leash exec --unset-env A --unset-env B -- x", &["x"]),
            ("leash exec --clear-env --keep-env PATH -- x", &["x"]),
            (
                "leash exec --state-dir /tmp/s -vv --error-format json --containment off -- x",
                &["x"],
            ),
            (
                "leash exec --cgroup-root /sys/fs/cgroup/x --socket /tmp/x.sock --no-daemon -- x",
                &["x"],
            ),
            ("leash exec --session=k -- -- x", &["--", "x"]),
        ];
        for (line, command) in accepted {
            let cli = parse(&words(line)).unwrap_or_else(|e| panic!("{line}: {e}"));
            let Command::Exec(a) = cli.command else {
                panic!("{line}: not exec");
            };
            assert_eq!(a.command, words(&command.join(" ")), "{line}");
        }
        let global = parse(&words("leash exec --state-dir /tmp/s -vv --no-daemon -- x")).unwrap();
        assert_eq!(
            global.global.state_dir.as_deref(),
            Some(std::path::Path::new("/tmp/s"))
        );
        assert_eq!((global.global.verbose, global.global.no_daemon), (2, true));
        let refused = [
            "leash exec",
            "leash exec /bin/true",
            "leash exec --grace 2h -- x",
            "leash exec --grace 1s --grace-ms 5 -- x",
            "leash exec --keep-env PATH -- x",
            "leash exec --clear-env --unset-env A -- x",
            "leash exec --session  -- x",
            "leash exec --owner-pid 0 -- x",
            "leash exec --bogus -- x",
            "leash exec --containment maybe -- x",
        ];
        for line in refused {
            let e = parse(&words(line)).expect_err(line);
            assert!(e.use_stderr(), "{line}: a usage error, not help");
        }
    }

    /// The daemon path and the direct path exit alike: a daemon's error reply (read by the
    /// client, or wrapped by `sessions send`) exits with its wire code's kind. Before the one
    /// table, `sessions send` exited 1 for `not_visible` and `bad_request`, and the thin client
    /// 1 for `not_supervised`.
    #[test]
    fn a_daemon_error_exits_with_its_codes_kind() {
        use crate::client::ClientError;
        use leash_core::kind::CODES;
        for (code, name, kind) in CODES {
            let remote = || ClientError::Remote {
                code: name.to_string(),
                message: "m".into(),
                data: Default::default(),
            };
            assert_eq!(Failure::from(remote()).code, kind.exit_code(), "{code:?}");
            let wrapped = crate::client::session_input::undelivered("k", remote());
            assert_eq!(Failure::from(wrapped).code, kind.exit_code(), "{code:?}");
        }
        assert_eq!(
            Failure::from(ClientError::Closed).code,
            exitcode::FAILURE,
            "a broken connection is internal"
        );
    }
}
