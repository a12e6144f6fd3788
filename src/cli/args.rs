//! The command line's definitions (clap): [`Cli`] with the global options, [`Command`] with one
//! variant per subcommand, and the flags of the subcommands defined here (the others' are in
//! their own files: `serve.rs`, `sessions.rs`, `verify.rs`, `docs.rs`, `mcp.rs`, `simulate.rs`).

use super::docs;
use super::exit::exit_codes_help;
use super::mcp;
use super::parse::{parse_containment, parse_cpu_max, parse_env_name, parse_key};
use super::parse::{parse_memory_max, parse_pids_max, parse_retention, state_parser, GraceArg};
use super::serve;
use super::sessions;
use super::simulate;
use super::verify;
use crate::controller::LeaseRef;
use clap::{Args, Parser, Subcommand};
use leash_core::model::LeaseState;
use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

const GLOBAL: &str = "Global options";

#[derive(Debug, Parser)]
#[command(
    name = "leash",
    version,
    about = "Lease-based process supervisor and reaper for agent gateways",
    long_about = "leash makes process ownership a durable fact: every adapter a gateway starts runs \
under a lease committed before it is spawned, no signal is sent unless live evidence matches a \
lease, and no process leash started outlives its owner.",
    after_help = exit_codes_help()
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

/// `defer`: each subcommand's arguments are defined only when that subcommand is parsed (or
/// when help, completions or man pages build the whole tree), so a `leash exec` does not build
/// the arguments of every other command first.
#[derive(Debug, Subcommand)]
#[command(defer = true)]
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
    /// Run the supervisor daemon: sessions outlive their clients (see leash-serve(1)).
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

// A lease is named the same way by every command: its id, as `LEASE` or `--lease ID`, or its
// session, `--session KEY`; a command given none says so and names all three.
// (A plain comment, not a doc comment: clap would take a doc comment on this struct as the
// `about` of every command whose arguments it holds, over that command's own.)
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
    pub(super) fn target(&self) -> LeaseRef {
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
    #[arg(long, value_name = "DURATION", default_value = leash_core::limits::DEFAULT_RETENTION, value_parser = parse_retention)]
    pub retention: Duration,
    /// [default: each lease's own]
    #[command(flatten)]
    pub grace: GraceArg,
    #[command(flatten)]
    pub json: JsonArg,
}

#[derive(Debug, Subcommand)]
#[command(defer = true)]
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
}
