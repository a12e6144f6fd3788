//! The `leash` command line: flags are parsed here, then each subcommand calls the library.
//! Output is for operators by default and JSON with `--json`; exit codes are in
//! [`crate::exitcode`].

mod mcp;
mod output;
mod serve;
pub mod sessions;

use crate::exec::{ExecError, ExecRequest, DEFAULT_GRACE_MS};
use crate::exitcode;
use crate::lease::LeaseState;
use crate::lifecycle::{CloseResult, Controller, LeaseRef, LifecycleError};
use crate::plan::ReapOptions;
use crate::proc::LiveTable;
use crate::state::{StateError, StateRoot};
use crate::store::{Store, StoreError};
use clap::{Args, Parser, Subcommand};
use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

const EXIT_CODES: &str = "\
Exit codes:
  0    success
  1    error (I/O, corrupt or locked database, ...): the message says what failed
  2    bad usage
  3    conflict: the session already has a live lease, or the lease is not open, or another
       process is closing it
  4    no such lease or session
  5    the requester may not see that session
  6    ownership could not be verified: nothing was signalled (the reason is printed and recorded)
  7    the operation needs a running daemon (leash serve)
  125  leash exec could not start the wrapper; any other status of leash exec is the adapter's";

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
    /// State directory (one per gateway installation) [default: $XDG_STATE_HOME/leash, else
    /// ~/.local/state/leash]
    #[arg(long, global = true, env = "LEASH_STATE_DIR", value_name = "DIR")]
    pub state_dir: Option<PathBuf>,

    /// More log output on stderr (-v: info, -vv: debug). LEASH_LOG overrides (tracing filter syntax).
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,

    /// The daemon's socket: where `leash serve` listens and where the other commands look for
    /// it [default: the one the running daemon recorded, else <state-dir>/leash.sock]
    #[arg(long, global = true, value_name = "PATH")]
    pub socket: Option<PathBuf>,

    /// Work on the state database directly even when a daemon serves the state root
    #[arg(long, global = true)]
    pub no_daemon: bool,

    #[command(subcommand)]
    pub command: Command,
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
and the new one proceeds.",
        after_help = "Exit status: the adapter's (its code, or 128+N if it died of signal N); 127 if \
CMD was not found, 126 if it could not be executed; 125 if leash could not start it."
    )]
    Exec(ExecArgs),
    /// List leases.
    Leases(LeasesArgs),
    /// Show the gateway instance id, state directory, wrapper root and lease counts.
    Status(JsonArg),
    /// Verify a lease's live tree, then terminate it children first (SIGTERM, grace, SIGKILL).
    Close(CloseArgs),
    /// Record the intent to cancel the active turn. Never signals; the lease stays open.
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
    /// Records of the old gateway that predate leases.
    #[command(subcommand)]
    Legacy(LegacyCommand),
    /// Run the supervisor daemon: sessions outlive their clients (protocol: docs/protocol.md).
    #[command(long_about = serve::SERVE_ABOUT)]
    Serve(serve::ServeArgs),
    /// Sessions as a requester sees them: list, history, send, status (one visibility check).
    #[command(subcommand)]
    Sessions(sessions::SessionsCommand),
    /// Serve the session tools to an agent over MCP (stdio), as one fixed requester.
    #[command(long_about = mcp::MCP_ABOUT)]
    Mcp(mcp::McpArgs),
}

#[derive(Debug, Args)]
pub struct ExecArgs {
    /// Session key (default: lease:<lease id>)
    #[arg(long, value_name = "KEY")]
    pub session: Option<String>,
    /// Agent id of the session
    #[arg(long, value_name = "ID")]
    pub agent: Option<String>,
    /// Session key of the session that owns this one
    #[arg(long, value_name = "KEY")]
    pub owner: Option<String>,
    /// Session key of the session that spawned this one
    #[arg(long, value_name = "KEY")]
    pub spawned_by: Option<String>,
    /// Parent session key
    #[arg(long, value_name = "KEY")]
    pub parent: Option<String>,
    /// Milliseconds between SIGTERM and SIGKILL when the tree is terminated
    #[arg(long, value_name = "N", default_value_t = DEFAULT_GRACE_MS)]
    pub grace_ms: u64,
    /// The pid of the process that spawns leash exec (the gateway). If our parent is not that
    /// process any more, nothing is started and the lease is recorded lost.
    #[arg(long, value_name = "PID", value_parser = clap::value_parser!(i32).range(1..))]
    pub owner_pid: Option<i32>,
    /// The adapter command and its arguments
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<OsString>,
}

#[derive(Debug, Args)]
pub struct JsonArg {
    /// Print JSON
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct LeasesArgs {
    /// Only leases in this state
    #[arg(long, value_name = "STATE", value_parser = parse_state)]
    pub state: Option<LeaseState>,
    #[command(flatten)]
    pub json: JsonArg,
}

#[derive(Debug, Args)]
pub struct TargetArgs {
    /// Lease id
    #[arg(
        value_name = "LEASE",
        required_unless_present = "session",
        conflicts_with = "session"
    )]
    pub lease: Option<String>,
    /// The active lease of this session
    #[arg(long, value_name = "KEY")]
    pub session: Option<String>,
    /// With a daemon: the ACP session whose turn to cancel (the daemon writes a session/cancel
    /// notification for it to the adapter); inferred when the daemon knows just one
    #[arg(long, value_name = "ID")]
    pub acp_session: Option<String>,
    #[command(flatten)]
    pub json: JsonArg,
}

impl TargetArgs {
    fn target(&self) -> LeaseRef {
        match (&self.lease, &self.session) {
            (Some(id), _) => LeaseRef::Id(id.clone()),
            (None, Some(k)) => LeaseRef::Session(k.clone()),
            (None, None) => unreachable!("clap requires one"),
        }
    }
}

#[derive(Debug, Args)]
pub struct CloseArgs {
    /// Lease ids (several are closed together, their grace periods running concurrently)
    #[arg(value_name = "LEASE", required_unless_present = "session")]
    pub leases: Vec<String>,
    /// The active lease of this session (repeatable)
    #[arg(long, value_name = "KEY")]
    pub session: Vec<String>,
    /// Milliseconds between SIGTERM and SIGKILL (default: the lease's own)
    #[arg(long, value_name = "N")]
    pub grace_ms: Option<u64>,
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
    /// Delete closed and lost leases that ended longer ago than this (e.g. 7d, 12h, 30m)
    #[arg(long, value_name = "DURATION", default_value = "7d", value_parser = parse_duration)]
    pub retention: Duration,
    /// Milliseconds between SIGTERM and SIGKILL (default: each lease's own)
    #[arg(long, value_name = "N")]
    pub grace_ms: Option<u64>,
    #[command(flatten)]
    pub json: JsonArg,
}

#[derive(Debug, Subcommand)]
pub enum LegacyCommand {
    /// Import records from a JSON array of {"sessionKey", "pid", "command", "wrapperPath"?}
    Import {
        file: PathBuf,
        /// Directory the old gateway's wrappers live in (default: this gateway's wrapper root)
        #[arg(long, value_name = "DIR")]
        wrapper_root: Option<PathBuf>,
    },
    /// List legacy records
    List(JsonArg),
}

fn parse_state(s: &str) -> Result<LeaseState, String> {
    s.parse().map_err(|e: crate::lease::BadState| e.to_string())
}

/// Parses `7d`, `12h`, `30m`, `45s`, `500ms` (or a bare number of seconds).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("'{s}' is not a duration (use e.g. 7d, 12h, 30m, 45s, 500ms)"))?;
    let ms = match unit {
        "ms" => n,
        "" | "s" => n.saturating_mul(1_000),
        "m" => n.saturating_mul(60_000),
        "h" => n.saturating_mul(3_600_000),
        "d" => n.saturating_mul(86_400_000),
        _ => {
            return Err(format!(
                "unknown unit '{unit}' in '{s}' (use ms, s, m, h or d)"
            ))
        }
    };
    Ok(Duration::from_millis(ms))
}

/// An error with the exit code it maps to.
pub struct Failure {
    pub code: u8,
    pub message: String,
}

impl Failure {
    pub fn new(code: u8, message: impl Into<String>) -> Failure {
        Failure {
            code,
            message: message.into(),
        }
    }
}

impl From<StoreError> for Failure {
    fn from(e: StoreError) -> Failure {
        let code = match e {
            StoreError::SessionBusy { .. } => exitcode::CONFLICT,
            _ => exitcode::FAILURE,
        };
        Failure::new(code, e.to_string())
    }
}

impl From<StateError> for Failure {
    fn from(e: StateError) -> Failure {
        Failure::new(exitcode::FAILURE, e.to_string())
    }
}

impl From<LifecycleError> for Failure {
    fn from(e: LifecycleError) -> Failure {
        let code = match e {
            LifecycleError::Store(_) => exitcode::FAILURE,
            LifecycleError::NoLease(_) | LifecycleError::NoActiveLease(_) => exitcode::NOT_FOUND,
            LifecycleError::NotOpen { .. } => exitcode::CONFLICT,
        };
        Failure::new(code, e.to_string())
    }
}

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.verbose, matches!(cli.command, Command::Serve(_)));
    match run(cli) {
        Ok(code) => ExitCode::from(code),
        Err(f) => {
            eprintln!("leash: {}", f.message);
            ExitCode::from(f.code)
        }
    }
}

fn init_logging(verbose: u8, daemon: bool) {
    let default = match verbose {
        0 if daemon => "info",
        0 => "warn",
        1 => "info",
        _ => "debug",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_env("LEASH_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false)
        .try_init();
}

fn open_root(cli_dir: Option<&std::path::Path>) -> Result<StateRoot, Failure> {
    let dir = StateRoot::resolve(cli_dir)?;
    Ok(StateRoot::open(&dir)?)
}

pub fn run(cli: Cli) -> Result<u8, Failure> {
    let root = open_root(cli.state_dir.as_deref())?;
    // These commands go through the daemon when one serves the state root.
    let daemon = || serve::connect(&root, cli.socket.as_deref(), cli.no_daemon);
    match cli.command {
        Command::Exec(a) => run_exec(&root, a),
        Command::Leases(a) => match daemon()? {
            Some(c) => serve::leases(c, &a),
            None => run_leases(&root, a),
        },
        Command::Status(a) => match daemon()? {
            Some(c) => serve::status(c, &a),
            None => run_status(&root, a),
        },
        Command::Close(a) => match daemon()? {
            Some(c) => serve::close(c, &a),
            None => run_close(root, a),
        },
        Command::Cancel(a) => match daemon()? {
            Some(c) => serve::cancel(c, &a),
            None => run_cancel(root, a),
        },
        Command::Reap(a) => match daemon()? {
            Some(c) => serve::reap(c, &a),
            None => run_reap(root, a),
        },
        Command::Legacy(c) => run_legacy(root, c),
        Command::Serve(a) => serve::run_serve(root, cli.socket, a),
        Command::Sessions(c) => {
            let client = daemon()?;
            sessions::run(root, c, client)
        }
        Command::Mcp(a) => mcp::run(root, a),
    }
}

fn run_exec(root: &StateRoot, a: ExecArgs) -> Result<u8, Failure> {
    let req = ExecRequest {
        session_key: a.session,
        agent_id: a.agent,
        owner_session_key: a.owner,
        spawned_by: a.spawned_by,
        parent_session_key: a.parent,
        grace_ms: a.grace_ms,
        owner_pid: a.owner_pid,
        command: a.command,
    };
    match crate::exec::exec(root, req) {
        Ok(never) => match never {},
        Err(e) => {
            let msg = match &e {
                ExecError::Store(_) | ExecError::State(_) | ExecError::Install(_) => {
                    format!("{e}; nothing started")
                }
                _ => e.to_string(),
            };
            Err(Failure::new(exitcode::EXEC_FAILED, msg))
        }
    }
}

fn run_leases(root: &StateRoot, a: LeasesArgs) -> Result<u8, Failure> {
    let table = LiveTable;
    let mut store = Store::open(&root.db_path())?;
    crate::report::ingest_reports(root, &mut store, &table)?;
    let states: Vec<LeaseState> = a.state.into_iter().collect();
    let rows = store.leases(&states)?;
    output::leases(&rows, a.json.json);
    Ok(exitcode::OK)
}

fn run_status(root: &StateRoot, a: JsonArg) -> Result<u8, Failure> {
    let table = LiveTable;
    let mut store = Store::open(&root.db_path())?;
    crate::report::ingest_reports(root, &mut store, &table)?;
    let counts = store.counts()?;
    let legacy_open = crate::legacy::records(&mut store, true)?.len();
    let status = serde_json::json!({
        "gatewayInstanceId": store.gateway_instance_id(),
        "stateDir": root.dir(),
        "database": root.db_path(),
        "wrapperRoot": root.wrapper_root(),
        "leases": counts,
        "legacyOpen": legacy_open,
    });
    output::status(&status, a.json);
    Ok(exitcode::OK)
}

fn run_close(root: StateRoot, a: CloseArgs) -> Result<u8, Failure> {
    let table = LiveTable;
    let mut ctl = Controller::open(root, &table)?;
    let targets: Vec<LeaseRef> = a
        .leases
        .iter()
        .map(|l| LeaseRef::Id(l.clone()))
        .chain(a.session.iter().map(|s| LeaseRef::Session(s.clone())))
        .collect();
    let outcomes = ctl.close(&targets, a.grace_ms)?;
    output::close(&outcomes, a.json.json);
    let code = outcomes
        .iter()
        .map(|o| match o.result {
            CloseResult::Closed | CloseResult::Lost => exitcode::OK,
            CloseResult::LeftOpen => exitcode::UNVERIFIED,
            CloseResult::Conflict => exitcode::CONFLICT,
        })
        .max()
        .unwrap_or(exitcode::OK);
    Ok(code)
}

fn run_cancel(root: StateRoot, a: TargetArgs) -> Result<u8, Failure> {
    let table = LiveTable;
    let mut ctl = Controller::open(root, &table)?;
    let detail = a
        .acp_session
        .as_ref()
        .map(|acp| serde_json::json!({"acpSessionId": acp, "notified": false}));
    let out = ctl.cancel(&a.target(), detail)?;
    output::cancel(&out, a.json.json);
    Ok(exitcode::OK)
}

fn run_reap(root: StateRoot, a: ReapArgs) -> Result<u8, Failure> {
    let table = LiveTable;
    let mut ctl = Controller::open(root, &table)?;
    let opts = ReapOptions {
        include_live: a.include_live,
        retention_ms: a.retention.as_millis() as i64,
        now_ms: crate::lease::now_ms(),
        grace_ms: a.grace_ms,
    };
    if a.dry_run {
        let plan = ctl.plan_reap(&opts)?;
        output::reap_plan(&plan, a.json.json);
        return Ok(exitcode::OK);
    }
    let report = ctl.reap(&opts)?;
    output::reap_report(&report, a.json.json);
    Ok(reap_exit_code(&report))
}

/// A reap that left a lease open because it could not verify it exits 6, so a gateway's startup
/// script can tell "nothing to do" from "something needs a look".
pub(crate) fn reap_exit_code(report: &crate::lifecycle::ReapReport) -> u8 {
    let unverified = report
        .leases
        .iter()
        .any(|o| o.result == CloseResult::LeftOpen);
    if unverified {
        exitcode::UNVERIFIED
    } else {
        exitcode::OK
    }
}

fn run_legacy(root: StateRoot, c: LegacyCommand) -> Result<u8, Failure> {
    let mut store = Store::open(&root.db_path())?;
    match c {
        LegacyCommand::Import { file, wrapper_root } => {
            let n = crate::legacy::import(&mut store, &file, wrapper_root.as_deref())
                .map_err(|e| Failure::new(exitcode::FAILURE, e.to_string()))?;
            eprintln!("leash: imported {n} legacy record(s)");
            Ok(exitcode::OK)
        }
        LegacyCommand::List(j) => {
            let recs = crate::legacy::records(&mut store, false)?;
            output::legacy(&recs, j.json);
            Ok(exitcode::OK)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(
            parse_duration("7d").unwrap(),
            Duration::from_secs(7 * 86400)
        );
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("30").unwrap(), Duration::from_secs(30));
        assert!(parse_duration("x").is_err());
        assert!(parse_duration("5y").is_err());
    }

    #[test]
    fn cli_is_well_formed() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
