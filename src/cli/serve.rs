//! `leash serve`: its flags and the daemon's configuration. The other commands' way through a
//! running daemon is `backend.rs`.

use super::exit::Failure;
use super::parse::GraceArg;
use crate::daemon::session::Limits;
use crate::daemon::{serve, ServeConfig};
use crate::state::StateRoot;
use clap::Args;
use leash_core::kind::exitcode;
use leash_core::limits::DEFAULT_GRACE_MS;
use std::path::PathBuf;
use std::time::Duration;

pub(super) const SERVE_ABOUT: &str = "Run the supervisor daemon for this state root on a Unix \
socket (mode 0600, peers must run as the same user). It spawns each session's adapter through \
`leash exec` as its own child, so it owns the wrappers and sessions outlive the clients that \
asked for them; clients attach and replay missed output by seq. One daemon per state root. At \
start it reaps the leases of a previous daemon; on SIGTERM or SIGINT it records which sessions \
were busy (reported by the next daemon), closes every session, removes the socket and exits 0. \
On SIGHUP, or when `leash serve --upgrade` asks, it hands itself over to a new program of itself \
(--upgrade-program, by default the path it was started from) as the same process, and every \
session goes on (leash-serve(1), UPGRADE). Clients speak newline-delimited JSON on the socket, \
one request and one reply per line, `hello` first (its reply lists the ops); the protocol's \
reference is protocol.md in leash's documentation.";

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Close sessions without traffic (a line either way) for this long, never a busy one
    /// (e.g. 30m); off by default
    #[arg(long, value_name = "DURATION", value_parser = parse_idle_close)]
    pub idle_close: Option<Duration>,
    /// Replay buffer per session: at most this many items (output lines and events)
    #[arg(long, value_name = "N", default_value_t = 10_000,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub replay_lines: u64,
    /// Replay buffer per session: at most this many bytes
    #[arg(long, value_name = "BYTES", default_value_t = 16 << 20,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub replay_bytes: u64,
    /// For sessions whose ensure names none [default: 3s]
    #[command(flatten)]
    pub grace: GraceArg,
    /// Startup reap and reconcile: delete closed and lost leases that ended longer ago than this
    #[arg(long, value_name = "DURATION", default_value = leash_core::limits::DEFAULT_RETENTION, value_parser = super::parse::parse_retention)]
    pub retention: Duration,
    /// Run the orphans-only reap of this state root this often (leases of sessions started
    /// outside the daemon whose owner died or whose wrapper is gone); 0 disables
    #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = super::parse::parse_duration)]
    pub reconcile_interval: Duration,
    /// Serve Prometheus/OpenMetrics metrics at http://ADDR/metrics (e.g. 127.0.0.1:9464, or a
    /// port on loopback); off by default. They carry session keys and have no authentication:
    /// keep ADDR on loopback (another address is logged as a warning). The `metrics` op serves
    /// the same text over the socket
    #[arg(long, value_name = "ADDR", value_parser = crate::daemon::metrics::parse_addr)]
    pub metrics: Option<std::net::SocketAddr>,
    /// Log format on stderr: text (the default) or json (one object per line, with lease_id,
    /// session, pid and op fields where they apply)
    #[arg(
        long,
        value_name = "FORMAT",
        default_value = "text",
        env = "LEASH_LOG_FORMAT"
    )]
    pub log_format: super::logging::LogFormat,
    /// Milliseconds `ensure` waits by default for a new adapter's first line of output (a
    /// request's waitMs overrides it): an exit before that line within the wait fails the ensure
    /// with start_failed; after it, the stream ends start_failed. 0 (the default) does not wait
    #[arg(long, value_name = "N",
          default_value_t = crate::daemon::DEFAULT_ENSURE_WAIT.as_millis() as u64,
          value_parser = parse_ensure_wait_ms)]
    pub ensure_wait_ms: u64,
    /// Ask the daemon serving this state root to upgrade: to hand itself over to its upgrade
    /// program (a new leash, e.g. after a package upgrade) as the same process, every session
    /// kept; prints the outcome, from the program that serves after it
    #[arg(long)]
    pub upgrade: bool,
    /// The program an upgrade execs (SIGHUP, `leash serve --upgrade`) [default: the path this
    /// leash was started from]
    #[arg(long, value_name = "PATH")]
    pub upgrade_program: Option<PathBuf>,
    /// Print the handoff formats this program reads, as JSON, and exit (the pre-flight check of
    /// an upgrade)
    #[arg(long, hide = true)]
    pub handoff_check: bool,
    /// Take over from the program that handed over, whose handoff is on this descriptor (set
    /// by the daemon itself when it execs its upgrade program)
    #[arg(long, value_name = "FD", hide = true)]
    pub takeover_fd: Option<i32>,
    /// With --takeover-fd: this program takes the daemon back from a new program that could not
    /// take over, for this reason
    #[arg(long, value_name = "WHY", hide = true, requires = "takeover_fd")]
    pub takeover_failed: Option<String>,
}

fn parse_ensure_wait_ms(s: &str) -> Result<u64, String> {
    let ms: u64 = s
        .trim()
        .parse()
        .map_err(|_| format!("'{s}' is not a number of milliseconds"))?;
    // The same range as a request's waitMs.
    leash_core::limits::check_ensure_wait_ms("--ensure-wait-ms", ms).map_err(|e| e.to_string())
}

pub(super) fn run_serve(
    root: StateRoot,
    socket: Option<PathBuf>,
    a: ServeArgs,
) -> Result<u8, Failure> {
    if a.handoff_check {
        crate::daemon::upgrade_check();
        return Ok(exitcode::OK);
    }
    if a.upgrade {
        return ask_upgrade(&root, socket.as_deref());
    }
    let cfg = ServeConfig {
        socket,
        idle_close: a.idle_close.filter(|d| !d.is_zero()),
        replay: Limits {
            lines: usize::try_from(a.replay_lines).unwrap_or(usize::MAX),
            bytes: usize::try_from(a.replay_bytes).unwrap_or(usize::MAX),
        },
        default_grace_ms: a.grace.ms().unwrap_or(DEFAULT_GRACE_MS),
        retention: a.retention,
        reconcile_interval: Some(a.reconcile_interval).filter(|d| !d.is_zero()),
        metrics: a.metrics,
        ensure_wait: Duration::from_millis(a.ensure_wait_ms),
        upgrade_program: a.upgrade_program,
        // Every option carries over to the program an upgrade execs.
        args: std::env::args_os().skip(1).collect(),
        takeover_fd: a.takeover_fd,
        takeover_failed: a.takeover_failed,
    };
    match serve(root, cfg) {
        Ok(()) => Ok(exitcode::OK),
        Err(e) => Err(Failure::from(e)),
    }
}

/// `leash serve --upgrade`: asks the daemon of this state root to hand over to its upgrade
/// program and prints the answer, which comes from the program that serves after the handoff.
fn ask_upgrade(root: &StateRoot, socket: Option<&std::path::Path>) -> Result<u8, Failure> {
    use crate::client::{socket_for, Client};
    use crate::protocol::UpgradeRequest;
    let path = socket.map_or_else(|| socket_for(root), std::path::Path::to_path_buf);
    let mut client = Client::connect_to_daemon(root, &path).map_err(|e| {
        Failure::new(
            leash_core::kind::Kind::DaemonNeeded,
            format!("{e}; an upgrade needs the running daemon"),
        )
    })?;
    // A handoff waits for the requests in flight (up to 10 s) and the new program's check.
    let _ = client.set_read_timeout(Some(Duration::from_secs(60)));
    let u = client
        .op::<UpgradeRequest>(serde_json::json!({}))
        .map_err(super::backend::remote)?;
    println!(
        "upgraded: {} -> {} in {:.1} ms, {} sessions kept (handoff {} of this daemon)",
        u.from, u.to, u.handoff_ms, u.sessions, u.handoffs
    );
    Ok(exitcode::OK)
}

fn parse_idle_close(s: &str) -> Result<Duration, String> {
    leash_core::limits::parse_duration_ms("--idle-close", s, leash_core::limits::MAX_IDLE_CLOSE_MS)
        .map(Duration::from_millis)
        .map_err(|e| e.to_string())
}
