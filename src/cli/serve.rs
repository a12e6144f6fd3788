//! `leash serve` and the thin-client side of the CLI: `status`, `leases`, `close`, `cancel` and
//! `reap` go through the daemon when one serves the state root (found by probing its socket),
//! print exactly what they print without it, and exit with the same codes. `--no-daemon` makes
//! them work on the database directly.

use super::{output, CloseArgs, Failure, GraceArg, JsonArg, LeasesArgs, ReapArgs, TargetArgs};
use crate::daemon::client::{Client, ClientError};
use crate::daemon::session::Limits;
use crate::daemon::{serve, ServeConfig};
use crate::exec::DEFAULT_GRACE_MS;
use crate::exitcode;
use crate::kind::{HasKind, Kind};
use crate::lease::Lease;
use crate::lifecycle::{CancelOutcome, CloseOutcome, ReapReport};
use crate::plan::ReapPlan;
use crate::state::StateRoot;
use clap::Args;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::time::Duration;

pub(super) const SERVE_ABOUT: &str = "Run the supervisor daemon for this state root on a Unix \
socket (mode 0600, peers must run as the same user). It spawns each session's adapter through \
`leash exec` as its own child, so it owns the wrappers and sessions outlive the clients that \
asked for them; clients attach and replay missed output by seq. One daemon per state root. At \
start it reaps the leases of a previous daemon; on SIGTERM, SIGINT or SIGHUP it records which \
sessions were busy (reported by the next daemon), closes every session, removes the socket and \
exits 0. The protocol (newline-delimited JSON) is in docs/protocol.md.";

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
    #[arg(long, value_name = "DURATION", default_value = "7d", value_parser = super::parse_retention)]
    pub retention: Duration,
    /// Run the orphans-only reap of this state root this often (leases of sessions started
    /// outside the daemon whose owner died or whose wrapper is gone); 0 disables
    #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = super::parse_duration)]
    pub reconcile_interval: Duration,
    /// Serve Prometheus/OpenMetrics metrics over HTTP on ADDR (e.g. 127.0.0.1:9464, or a port on
    /// loopback); off by default. The `metrics` op serves the same text over the socket
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
    /// Milliseconds `ensure` watches a new adapter for an early death (it stops at the first
    /// line of output); an adapter that dies within it fails the ensure with its exit status and
    /// last stderr lines. 0 turns it off
    #[arg(long, value_name = "N",
          default_value_t = crate::daemon::DEFAULT_ENSURE_WAIT.as_millis() as u64)]
    pub ensure_wait_ms: u64,
}

pub(super) fn run_serve(
    root: StateRoot,
    socket: Option<PathBuf>,
    a: ServeArgs,
) -> Result<u8, Failure> {
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
    };
    match serve(root, cfg) {
        Ok(()) => Ok(exitcode::OK),
        Err(e) => Err(Failure::from(e)),
    }
}

fn parse_idle_close(s: &str) -> Result<Duration, String> {
    crate::limits::parse_duration_ms("--idle-close", s, crate::limits::MAX_IDLE_CLOSE_MS)
        .map(Duration::from_millis)
        .map_err(|e| e.to_string())
}

/// The daemon serving `root`, if one does (and `--no-daemon` is not given). A socket named with
/// `--socket` must answer, and serve this state root.
pub(super) fn connect(
    root: &StateRoot,
    socket: Option<&Path>,
    no_daemon: bool,
) -> Result<Option<Client>, Failure> {
    if no_daemon {
        return Ok(None);
    }
    let Some(path) = socket else {
        return Ok(Client::probe(root));
    };
    let mut c = Client::connect_to_daemon(root, path).map_err(|e| {
        Failure::new(
            Kind::DaemonNeeded,
            format!("{e}; without --socket leash works on the state database directly"),
        )
    })?;
    let status = c.call("status", json!({})).map_err(remote)?;
    let serves = status["stateDir"].as_str().map(PathBuf::from);
    if serves.as_deref() != Some(root.dir()) {
        return Err(Failure::new(
            Kind::Usage,
            format!(
                "the daemon on {} serves state root {}, not {}",
                path.display(),
                serves.map_or("?".into(), |p| p.display().to_string()),
                root.dir().display()
            ),
        ));
    }
    Ok(Some(c))
}

/// Maps a daemon error to the exit code the same failure has without a daemon, its message in
/// the CLI's words (flags, not wire fields), its cause the daemon's code.
pub(super) fn remote(e: ClientError) -> Failure {
    let f = Failure::new(
        e.kind(),
        format!("{} (via the daemon)", cli_words(&e.to_string())),
    );
    match e.code() {
        Some(c) => f.with_cause(c.as_str()),
        None => f,
    }
}

/// A daemon message with the wire fields the CLI sets named as the flags that set them.
pub(super) fn cli_words(msg: &str) -> String {
    const FIELDS: &[(&str, &str)] = &[
        ("\"acpSessionId\"", "--acp-session"),
        ("\"graceMs\"", "--grace"),
        ("\"retentionMs\"", "--retention"),
        ("\"requesterSessionKey\"", "--as"),
        ("\"a2aAllow\"", "--a2a-allow"),
        ("\"sessions\"", "--session"),
        ("\"session\"", "--session"),
        ("\"leases\"", "LEASE"),
        ("\"lease\"", "LEASE"),
        ("\"state\"", "--state"),
    ];
    let mut out = msg.to_string();
    for (wire, flag) in FIELDS {
        out = out.replace(wire, flag);
    }
    out
}

pub(super) fn decode<T: serde::de::DeserializeOwned>(v: Value, what: &str) -> Result<T, Failure> {
    serde_json::from_value(v).map_err(|e| {
        Failure::new(
            Kind::Internal,
            format!("the daemon's {what} reply does not parse ({e}); is it another leash version?"),
        )
    })
}

pub(super) fn status(mut c: Client, a: &JsonArg) -> Result<u8, Failure> {
    let v = c.call("status", json!({})).map_err(remote)?;
    output::status(&v, a.json);
    if a.json {
        return Ok(exitcode::OK);
    }
    let d = &v["daemon"];
    println!(
        "daemon            pid {} on {}",
        d["pid"],
        d["socket"].as_str().unwrap_or("?")
    );
    let sessions = d["sessions"].as_array().cloned().unwrap_or_default();
    println!(
        "sessions          {} supervised, {} busy",
        sessions.len(),
        d["busy"].as_array().map_or(0, Vec::len)
    );
    for s in &sessions {
        println!(
            "  {}  {}{}  lease {}  last seq {}",
            s["sessionKey"].as_str().unwrap_or("?"),
            s["phase"].as_str().unwrap_or("?"),
            if s["busy"] == true { ", busy" } else { "" },
            s["leaseId"].as_str().unwrap_or("-"),
            s["lastSeq"]
        );
    }
    let rc = &d["reconcile"];
    match rc["intervalMs"].as_u64() {
        Some(ms) => {
            let last = &rc["last"];
            let what = if last.is_null() {
                "no pass yet".to_string()
            } else if let Some(e) = last["error"].as_str() {
                format!("pass {} failed: {e}", last["passes"])
            } else {
                format!(
                    "pass {}: {} active, {} closed, {} lost, {} left open, {} expired",
                    last["passes"],
                    last["active"],
                    last["closed"],
                    last["lost"],
                    last["leftOpen"],
                    last["expired"]
                )
            };
            println!("reconcile         every {} ms; {what}", ms);
        }
        None => println!("reconcile         off"),
    }
    if let Some(m) = d["metrics"].as_str() {
        println!("metrics           http://{m}/metrics");
    }
    for r in d["resumable"].as_array().into_iter().flatten() {
        println!(
            "resumable         {} (busy when the previous daemon stopped)",
            r["sessionKey"].as_str().unwrap_or("?")
        );
    }
    Ok(exitcode::OK)
}

pub(super) fn leases(mut c: Client, a: &LeasesArgs) -> Result<u8, Failure> {
    let fields = match a.state {
        Some(s) => json!({"state": s.as_str()}),
        None => json!({}),
    };
    let v = c.call("leases", fields).map_err(remote)?;
    if a.json.json {
        output::print_json(&v);
        return Ok(exitcode::OK);
    }
    let rows: Vec<Result<Lease, String>> = v
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .map(|r| match r.get("error").and_then(Value::as_str) {
            Some(e) => Err(e.to_string()),
            None => serde_json::from_value(r).map_err(|e| format!("unreadable lease: {e}")),
        })
        .collect();
    output::leases(&rows, false);
    Ok(exitcode::OK)
}

pub(super) fn close(mut c: Client, a: &CloseArgs) -> Result<u8, Failure> {
    let v = c
        .call(
            "close",
            json!({"leases": a.leases, "sessions": a.session, "graceMs": a.grace.ms()}),
        )
        .map_err(remote)?;
    let outcomes: Vec<CloseOutcome> = decode(v, "close")?;
    output::close(&outcomes, a.json.json);
    Ok(super::close_exit_code(&outcomes))
}

pub(super) fn cancel(mut c: Client, a: &TargetArgs) -> Result<u8, Failure> {
    let mut fields = match (&a.lease, &a.session) {
        (Some(id), _) => json!({"lease": id}),
        (None, Some(k)) => json!({"session": k}),
        (None, None) => unreachable!("clap requires one"),
    };
    if let Some(acp) = &a.acp_session {
        fields["acpSessionId"] = json!(acp);
    }
    let v = c.call("cancel", fields).map_err(remote)?;
    if a.json.json {
        output::print_json(&v);
        return Ok(exitcode::OK);
    }
    let notified = v["notified"] == true;
    let supervised = v["supervised"] == true;
    let acp = v["acpSessionId"].as_str().map(str::to_owned);
    let out: CancelOutcome = decode(v, "cancel")?;
    output::cancel(&out, false);
    match (notified, acp) {
        (true, Some(acp)) => {
            println!("session/cancel written to the adapter for ACP session {acp}")
        }
        (false, _) if supervised => println!(
            "no notification written: the daemon knows no single ACP session of this session \
             (give --acp-session ID)"
        ),
        _ => println!("no notification written: the daemon does not supervise this session"),
    }
    Ok(exitcode::OK)
}

pub(super) fn reap(mut c: Client, a: &ReapArgs) -> Result<u8, Failure> {
    let v = c
        .call(
            "reap",
            json!({
                "dryRun": a.dry_run,
                "includeLive": a.include_live,
                "retentionMs": u64::try_from(a.retention.as_millis()).unwrap_or(u64::MAX),
                "graceMs": a.grace.ms(),
            }),
        )
        .map_err(remote)?;
    if a.dry_run {
        let plan: ReapPlan = decode(v, "reap")?;
        output::reap_plan(&plan, a.json.json);
        return Ok(exitcode::OK);
    }
    let report: ReapReport = decode(v, "reap")?;
    output::reap_report(&report, a.json.json);
    Ok(super::reap_exit_code(&report))
}
