//! `main` and [`run`]: parse, set up logging and containment, resolve the state root, and hand
//! each subcommand to its `run_*` (or its file's `run`), which renders its one result once and
//! returns the exit code.

use super::args::{parse, Cli, CloseArgs, Command, ErrorFormat, GlobalArgs, JsonArg};
use super::args::{LeasesArgs, LegacyCommand, ReapArgs, TargetArgs};
use super::exec::{exec_request, run_exec};
use super::exit::{close_exit_code, reap_exit_code, Failure};
use super::usage::usage_error;
use super::{backend, docs, logging, mcp, output, serve, sessions, simulate, verify};
use crate::controller::Controller;
use crate::controller::LeaseRef;
use crate::proc::LiveTable;
use crate::state::StateRoot;
use clap::CommandFactory;
use leash_core::kind::exitcode;
use leash_core::plan::ReapOptions;
use std::ffi::OsString;
use std::process::ExitCode;

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
        Command::Completions(a) => return docs::completions(a, Cli::command()),
        Command::Man(a) => return docs::man(a, Cli::command()),
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
