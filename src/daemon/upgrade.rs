//! The live upgrade: the daemon hands itself over to a new program of itself, as the same
//! process, and every session goes on — the wrappers watch their owner's pid, and `execve`
//! keeps the pid, the children, the pipes and the lock.
//!
//! `hand_over` reads as a checklist: `preflight` (the new program must say it reads this
//! daemon's handoff format) → close the gate of the ops that change something and let those in
//! flight finish ([`super::gate`]) → freeze the sessions' readers between two reads and their
//! waiters before a reap ([`super::session::Freeze`]) → write the handoff to a memfd
//! ([`super::handoff`]) → keep the descriptors it names across the exec → `execve` the new
//! program with this program's own arguments and `--takeover-fd N`. Anything that fails before
//! the exec undoes what was done (the freeze, the gate) and the daemon serves on, with a log
//! line and an error to whoever asked.
//!
//! `take_over` is the other side, in the new program: it adopts what the handoff names, reaps
//! nothing and signals nothing, and answers whoever asked. Until its sessions' threads start,
//! a failure (an error, a panic) hands back: the old program was kept open before the exec, and
//! is `fexecve`d with the same handoff and `--takeover-failed WHY`; it takes over as a new
//! program would, and answers the upgrade with the failure. Only if that fails too does the
//! daemon exit — and then, as on any death of the daemon, its wrappers see their owner gone and
//! end their sessions.

use super::handoff::{self, Check, Handoff, Requester};
use super::session::{self, HandedSession};
use super::socket;
use super::start::{Start, StartState};
use super::state::{Daemon, ServeConfig, ServeError};
use crate::controller::Controller;
use crate::proc::LiveTable;
use crate::protocol::{self, LastHandoff, Upgraded};
use crate::state::StateRoot;
use serde_json::Value;
use std::ffi::{CString, OsString};
use std::fs::File;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::UnixListener;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long the ops in flight get to finish before a handoff is refused.
const QUIESCE: Duration = Duration::from_secs(10);

/// How long the sessions' readers get to stop (each stops after its current read).
const FREEZE: Duration = Duration::from_secs(5);

/// How long a new program holds each session's output for the clients attached before the
/// handoff to attach again (a client that attaches ends the hold of its session at once).
const REATTACH_HOLD: Duration = Duration::from_secs(10);

/// How long the new program gets to answer `--handoff-check`.
const CHECK_TIMEOUT: Duration = Duration::from_secs(10);

/// The environment variable that makes a program whose build marker it names panic during its
/// takeover, after reading the handoff: the fault the handoff tests stage (a copy of the binary
/// with that marker, see `version.rs`). No other program is affected.
pub const ENV_TEST_TAKEOVER_PANIC: &str = "LEASH_TEST_TAKEOVER_PANIC";

/// The descriptors `serve` holds that a handoff keeps open.
pub(super) struct Held {
    lock_fd: RawFd,
    listener_fd: RawFd,
    metrics_fd: Option<RawFd>,
    listener_pid: Option<i32>,
}

impl Held {
    pub(super) fn of(
        lock: &nix::fcntl::Flock<File>,
        listening: &socket::Listening,
        metrics: Option<&std::net::TcpListener>,
    ) -> Held {
        Held {
            lock_fd: lock.as_raw_fd(),
            listener_fd: listening.listener.as_raw_fd(),
            metrics_fd: metrics.map(|m| m.as_raw_fd()),
            listener_pid: listening.listener_pid,
        }
    }
}

/// `leash serve --handoff-check`: the formats this program reads, as one JSON line.
pub fn print_check() {
    println!(
        "{}",
        serde_json::to_string(&Check::of_this_program()).expect("serialises")
    );
}

// ---------------------------------------------------------------------------------------------
// Handing over

/// Carries out the upgrade asked for, if any. Returns only when the handoff did not happen: the
/// daemon serves on, and whoever asked was told why.
pub(super) fn hand_over(d: &Arc<Daemon>, held: &Held) {
    // None asked: SIGHUP, an upgrade nobody waits for.
    let ask = d.asks.take().unwrap_or_else(|| super::ask::Ask {
        at_ns: crate::sys::monotonic_ns(),
        requester: None,
        refuse: None,
    });
    let program = d.program().upgrade_program.clone();
    tracing::info!(program = %program.display(), "upgrade: handing over to a new program");
    let why = match try_hand_over(d, held, &program, &ask) {
        Err(why) => why,
        Ok(never) => match never {},
    };
    let message = format!(
        "upgrade refused, {} serves on: {why}",
        super::version::version()
    );
    tracing::error!(program = %program.display(), "{message}");
    record_failure(d, super::version::version(), why, None);
    if let Some(refuse) = ask.refuse {
        refuse(message);
    }
}

/// The handoff's steps; `Err` (why) when it did not happen, everything undone.
fn try_hand_over(
    d: &Arc<Daemon>,
    held: &Held,
    program: &Path,
    ask: &super::ask::Ask,
) -> Result<std::convert::Infallible, String> {
    let begun = Instant::now();
    let check = preflight(program, d.root.dir())?;
    tracing::info!(program = %program.display(), version = %check.version, ms = begun.elapsed().as_secs_f64() * 1e3, "upgrade: the new program reads this handoff format");
    d.gate.close(QUIESCE).map_err(|n| {
        format!("{n} requests still in flight after {QUIESCE:?} (a long close or send); try again")
    })?;
    tracing::info!(
        ms = begun.elapsed().as_secs_f64() * 1e3,
        "upgrade: requests quiesced"
    );
    let frozen = d
        .freeze
        .freeze(FREEZE)
        .map_err(|e| format!("the sessions did not stop in time: {e}"));
    if let Err(e) = frozen {
        d.gate.open();
        return Err(e);
    }
    tracing::info!(
        ms = begun.elapsed().as_secs_f64() * 1e3,
        "upgrade: sessions frozen"
    );
    let result = write_and_exec(d, held, program, ask);
    d.freeze.thaw();
    d.gate.open();
    result
}

/// Writes the handoff and execs the new program; returns only if that failed (the descriptors
/// are close-on-exec again by then).
fn write_and_exec(
    d: &Arc<Daemon>,
    held: &Held,
    program: &Path,
    ask: &super::ask::Ask,
) -> Result<std::convert::Infallible, String> {
    let sessions = d
        .all_sessions()
        .iter()
        .map(|s| s.handed())
        .collect::<Result<Vec<HandedSession>, String>>()?;
    // The running program, kept open for the new one to hand back to if it cannot take over.
    let previous = File::open("/proc/self/exe")
        .map_err(|e| format!("cannot open this program (/proc/self/exe) to keep it: {e}"))?;
    let mut h = Handoff {
        format: handoff::FORMAT,
        from_version: super::version::version(),
        requested_at_ns: ask.at_ns,
        started_at: d.started_at,
        upgrade_program: program.to_path_buf(),
        lock_fd: held.lock_fd,
        listener_fd: held.listener_fd,
        metrics_fd: held.metrics_fd,
        previous_program_fd: previous.as_raw_fd(),
        socket: d.socket.clone(),
        activated: d.activated,
        listener_pid: held.listener_pid,
        socket_inode: d.socket_inode,
        sessions,
        resumable: d
            .resumable
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone(),
        startup_reap: d.startup_reap.clone(),
        last_reconcile: d
            .last_reconcile
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone(),
        counters: d.metrics.counters(),
        requester: ask.requester.as_ref().map(|(fd, id)| Requester {
            fd: *fd,
            id: id.clone(),
        }),
    };
    let memfd = h
        .write_memfd()
        .map_err(|e| format!("cannot write the handoff: {e}"))?;
    tracing::info!(
        bytes = memfd.metadata().map(|m| m.len()).unwrap_or(0),
        "upgrade: handoff written"
    );
    let mut kept = h.fds();
    kept.push(memfd.as_raw_fd());
    let args = next_args(&d.cfg.args, memfd.as_raw_fd(), None);
    let argv0 = program.as_os_str().to_owned();
    let error = with_kept(&kept, || {
        tracing::info!(program = %program.display(), sessions = h.sessions.len(), "upgrade: exec");
        exec(&argv0, &args, |argv, env| {
            let path = CString::new(program.as_os_str().as_bytes()).map_err(|e| e.to_string())?;
            nix::unistd::execve(&path, argv, env).map_err(|e| e.to_string())
        })
    });
    drop(previous);
    Err(format!("cannot exec {}: {error}", program.display()))
}

/// Runs `f` (an exec) with `fds` kept across the exec and the stop signals blocked (pending
/// over the exec, they reach the new program's handlers); both undone when `f` returns.
fn with_kept(fds: &[RawFd], f: impl FnOnce() -> String) -> String {
    for &fd in fds {
        if let Err(e) = crate::sys::keep_across_exec(fd, true) {
            tracing::warn!(fd, error = %e, "cannot keep a descriptor across the exec");
        }
    }
    crate::sys::block_stop_signals(true);
    let error = f();
    crate::sys::block_stop_signals(false);
    for &fd in fds {
        let _ = crate::sys::keep_across_exec(fd, false);
    }
    error
}

/// Execs through `f` (execve or fexecve) with `argv0`, `args` and this process's environment;
/// returns the error when the exec failed.
fn exec(
    argv0: &std::ffi::OsStr,
    args: &[OsString],
    f: impl FnOnce(&[CString], &[CString]) -> Result<std::convert::Infallible, String>,
) -> String {
    let c = |s: &std::ffi::OsStr| CString::new(s.as_bytes()).map_err(|e| e.to_string());
    let argv: Result<Vec<CString>, String> = std::iter::once(argv0)
        .chain(args.iter().map(OsString::as_os_str))
        .map(c)
        .collect();
    let env: Result<Vec<CString>, String> = std::env::vars_os()
        .map(|(k, v)| {
            let mut kv = k;
            kv.push("=");
            kv.push(v);
            c(&kv)
        })
        .collect();
    match (argv, env) {
        (Ok(argv), Ok(env)) => match f(&argv, &env) {
            Err(e) => e,
            Ok(never) => match never {},
        },
        (Err(e), _) | (_, Err(e)) => e,
    }
}

/// This program's arguments for the next one: without the takeover options of this program's
/// own takeover, with `--takeover-fd` (and `--takeover-failed`) of the next.
fn next_args(args: &[OsString], fd: RawFd, failed: Option<&str>) -> Vec<OsString> {
    let mut out = Vec::with_capacity(args.len() + 4);
    let mut skip = false;
    for a in args {
        if skip {
            skip = false;
            continue;
        }
        let s = a.to_string_lossy();
        if s == "--takeover-fd" || s == "--takeover-failed" {
            skip = true;
            continue;
        }
        if s.starts_with("--takeover-fd=") || s.starts_with("--takeover-failed=") {
            continue;
        }
        out.push(a.clone());
    }
    out.push("--takeover-fd".into());
    out.push(fd.to_string().into());
    if let Some(why) = failed {
        out.push("--takeover-failed".into());
        out.push(why.into());
    }
    out
}

/// Runs `program serve --handoff-check` and reads its answer: the handoff formats it reads. Refused
/// when it is missing, not executable, fails, takes too long or does not read ours.
fn preflight(program: &Path, state_dir: &Path) -> Result<Check, String> {
    use std::os::unix::fs::PermissionsExt;
    let shown = program.display();
    let meta = std::fs::metadata(program)
        .map_err(|e| format!("the new program {shown} cannot be used: {e}"))?;
    if !meta.is_file() || meta.permissions().mode() & 0o111 == 0 {
        return Err(format!("the new program {shown} is not an executable file"));
    }
    // On this daemon's state root, which exists: a `serve` without one would make the default.
    let mut child = std::process::Command::new(program)
        .arg("--state-dir")
        .arg(state_dir)
        .args(["serve", "--handoff-check"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run the new program {shown}: {e}"))?;
    let deadline = Instant::now() + CHECK_TIMEOUT;
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break s,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
            Ok(None) => {
                // Not signalled (leash signals only what a lease proves): refused, and reaped
                // whenever it ends.
                let _ = std::thread::Builder::new()
                    .name("handoff-check".into())
                    .stack_size(super::stack::SMALL_STACK)
                    .spawn(move || {
                        let _ = child.wait();
                    });
                return Err(format!(
                    "the new program {shown} did not answer --handoff-check within {CHECK_TIMEOUT:?}"
                ));
            }
            Err(e) => return Err(format!("cannot wait for {shown} --handoff-check: {e}")),
        }
    };
    let out = child
        .wait_with_output()
        .map_err(|e| format!("cannot read {shown} --handoff-check: {e}"))?;
    if !status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        return Err(format!(
            "the new program {shown} refused --handoff-check ({status}): {}",
            err.trim().lines().last().unwrap_or("no message")
        ));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let check: Check = text
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str(l).ok())
        .ok_or_else(|| {
            format!("the new program {shown} does not read handoffs (its --handoff-check printed no formats)")
        })?;
    if !check.handoff_formats.contains(&handoff::FORMAT) {
        return Err(format!(
            "the new program {shown} ({}) reads handoff formats {:?}, not this daemon's {}",
            check.version,
            check.handoff_formats,
            handoff::FORMAT
        ));
    }
    Ok(check)
}

// ---------------------------------------------------------------------------------------------
// Taking over

/// What a takeover carries past the start-up, to [`adopt_sessions`] and [`taken_over`].
pub(super) struct Taken {
    sessions: Vec<HandedSession>,
    /// How many sessions were taken over.
    count: usize,
    requester: Option<Requester>,
    from_version: String,
    requested_at_ns: u64,
    resumable: Vec<protocol::Resumable>,
    last_reconcile: Value,
    /// Why the new program this one took back from could not take over (a fall-back).
    failed: Option<String>,
    fallback: Arc<Fallback>,
    previous: OwnedFd,
    memfd: File,
}

/// How to hand back to the previous program: everything a panic hook needs, prepared first.
struct Fallback {
    previous_fd: RawFd,
    memfd_fd: RawFd,
    fds: Vec<RawFd>,
    args: Vec<OsString>,
    /// This program is itself the fall-back: there is nothing to hand back to.
    is_fallback: bool,
}

/// Hands back to the previous program with the same handoff; never returns (the process exits
/// when even that fails).
fn fall_back(plan: &Fallback, why: &str) -> ! {
    if plan.is_fallback {
        tracing::error!(
            "the previous program could not take the daemon back either ({why}); the daemon exits and its sessions end with it"
        );
        std::process::exit(70);
    }
    tracing::error!(
        "the new program cannot take over ({why}); handing back to the previous program"
    );
    let _ = nix::unistd::lseek(plan.memfd_fd, 0, nix::unistd::Whence::SeekSet);
    let mut fds = plan.fds.clone();
    fds.extend([plan.memfd_fd, plan.previous_fd]);
    let args = next_args(&plan.args, plan.memfd_fd, Some(why));
    let argv0 = std::env::args_os().next().unwrap_or_else(|| "leash".into());
    let error = with_kept(&fds, || {
        exec(&argv0, &args, |argv, env| {
            nix::unistd::fexecve(plan.previous_fd, argv, env).map_err(|e| e.to_string())
        })
    });
    tracing::error!(error = %error, "cannot hand back to the previous program; the daemon exits and its sessions end with it");
    std::process::exit(70)
}

/// The takeover's start: the handoff read, a panic hook that hands back, then the lock, the
/// socket, the controller and the store — no reap, no signal.
pub(super) fn take_over(
    root: &StateRoot,
    cfg: &mut ServeConfig,
    fd: RawFd,
) -> Result<(Start, Taken), ServeError> {
    let handed = crate::sys::adopt_handed_fd(fd)
        .map_err(|e| ServeError::Handoff(format!("descriptor {fd}: {e}")))?;
    let mut memfd = File::from(handed);
    // The way back to the previous program, with these descriptors kept across its exec.
    let memfd_fd = memfd.as_raw_fd();
    let plan = |previous_fd: RawFd, fds: Vec<RawFd>| Fallback {
        previous_fd,
        memfd_fd,
        fds,
        args: cfg.args.clone(),
        is_fallback: cfg.takeover_failed.is_some(),
    };
    let h = match Handoff::read(&mut memfd) {
        Ok(h) => h,
        Err(e) => {
            // Nothing is adopted yet: every descriptor the handoff names is still open and kept
            // across an exec, so the previous program can take it all back if it can be found.
            let previous = e.previous_program_fd.ok_or_else(|| {
                ServeError::Handoff(format!(
                    "{}; the previous program's descriptor is not in it either",
                    e.why
                ))
            })?;
            fall_back(&plan(previous, Vec::new()), &e.why);
        }
    };
    let fallback = Arc::new(plan(h.previous_program_fd, h.fds()));
    let on_panic = fallback.clone();
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        hook(info);
        fall_back(&on_panic, &format!("it panicked: {info}"));
    }));
    let fail = |why: String| -> ! { fall_back(&fallback, &why) };
    if let (Ok(m), Some(ours)) = (
        std::env::var(ENV_TEST_TAKEOVER_PANIC),
        super::version::marker(),
    ) {
        if m == ours {
            panic!("{ENV_TEST_TAKEOVER_PANIC} names this program's build marker {ours}");
        }
    }
    let take = |fd: RawFd| {
        crate::sys::adopt_handed_fd(fd).unwrap_or_else(|e| fail(format!("descriptor {fd}: {e}")))
    };
    let previous = take(h.previous_program_fd);
    let lock = nix::fcntl::Flock::lock(
        File::from(take(h.lock_fd)),
        nix::fcntl::FlockArg::LockExclusiveNonblock,
    )
    .unwrap_or_else(|(_, e)| fail(format!("the lock file's flock: {e}")));
    let listener = UnixListener::from(take(h.listener_fd));
    let metrics_listener = h.metrics_fd.map(|fd| std::net::TcpListener::from(take(fd)));
    if let Some(l) = &metrics_listener {
        cfg.metrics = l.local_addr().ok().or(cfg.metrics);
    }
    let ctl = Controller::open(root.clone(), &LiveTable).unwrap_or_else(|e| fail(e.to_string()));
    let (ctl, store, containment) =
        super::start::contain(root, ctl).unwrap_or_else(|e| fail(e.to_string()));
    let metrics = super::metrics::Metrics::new();
    metrics.restore(&h.counters);
    let program = super::state::ProgramInfo {
        serving_since: crate::lease::now_ms(),
        last: None,
        upgrade_program: cfg
            .upgrade_program
            .clone()
            .unwrap_or(h.upgrade_program.clone()),
    };
    let start = Start {
        state: StartState {
            ctl,
            store,
            containment,
            startup_reap: h.startup_reap,
            metrics,
            started_at: h.started_at,
            socket: h.socket,
            program,
        },
        lock,
        listening: socket::Listening {
            listener,
            activated: h.activated,
            listener_pid: h.listener_pid,
            bound: h.socket_inode,
        },
        metrics_listener,
        resumable: Vec::new(),
    };
    Ok((
        start,
        Taken {
            sessions: h.sessions,
            count: 0,
            requester: h.requester,
            from_version: h.from_version,
            requested_at_ns: h.requested_at_ns,
            resumable: h.resumable,
            last_reconcile: h.last_reconcile,
            failed: cfg.takeover_failed.clone(),
            fallback,
            previous,
            memfd,
        },
    ))
}

/// Adopts the handed sessions into the daemon, then — the last step that can still hand back —
/// gives the panic hook back and starts their threads.
pub(super) fn adopt_sessions(d: &Arc<Daemon>, mut t: Taken) -> Taken {
    let spec = d.spawn_spec();
    let handed = std::mem::take(&mut t.sessions);
    t.count = handed.len();
    let mut adopted = Vec::with_capacity(handed.len());
    for h in handed {
        let key = h.key.clone();
        match session::adopt(&spec, h) {
            Ok(a) => adopted.push(a),
            Err(e) => fall_back(&t.fallback, &format!("session {key}: {e}")),
        }
    }
    *d.resumable.lock().unwrap_or_else(|p| p.into_inner()) = t.resumable.clone();
    *d.last_reconcile.lock().unwrap_or_else(|p| p.into_inner()) = t.last_reconcile.clone();
    // From here on a panic is the new program's own: its sessions' readers run.
    // `take_hook` puts std's default hook back (the one the program started with). A hook may
    // not itself take or set a hook: from a panicking thread that aborts the process.
    drop(std::panic::take_hook());
    let mut sessions = d.sessions();
    for a in adopted {
        let s = a.start(&d.ctl);
        sessions.insert(s.key.clone(), s);
    }
    t
}

/// The takeover is done: the handoff is counted (or, in a fall-back, its failure recorded), and
/// whoever asked is answered on the connection it asked on.
pub(super) fn taken_over(d: &Daemon, t: Taken) {
    let ms = crate::sys::monotonic_ns().saturating_sub(t.requested_at_ns) as f64 / 1e6;
    let to = super::version::version();
    let n = t.count;
    let answer: Result<Upgraded, String> = match &t.failed {
        None => {
            d.program().last = Some(LastHandoff {
                at: crate::lease::now_ms(),
                from: t.from_version.clone(),
                to: to.clone(),
                ok: true,
                error: None,
                duration_ms: Some(ms),
            });
            // `inc` answers the count before it.
            let handoffs = d.metrics.handoffs.inc() + 1;
            d.metrics.handoff_seconds.set(ms / 1e3);
            tracing::info!(from = %t.from_version, to = %to, sessions = n, handoff_ms = ms, "upgrade: took over");
            Ok(Upgraded {
                from: t.from_version.clone(),
                to,
                handoff_ms: ms,
                sessions: n,
                handoffs,
            })
        }
        Some(why) => {
            let message = format!(
                "the new program could not take over ({why}); {to} took the daemon back and serves on, every session with it"
            );
            tracing::error!("upgrade: {message}");
            record_failure(d, t.from_version.clone(), why.clone(), Some(ms));
            Err(message)
        }
    };
    if let Some(r) = &t.requester {
        answer_requester(r, answer);
    }
    let sessions = d.all_sessions();
    let _ = std::thread::Builder::new()
        .name("reattach-hold".into())
        .stack_size(super::stack::SMALL_STACK)
        .spawn(move || {
            std::thread::sleep(REATTACH_HOLD);
            for s in sessions {
                s.release_handoff_hold();
            }
        });
    drop(t.previous);
    drop(t.memfd);
}

/// A handoff that did not happen, for `status` (to: the program it was for) and the metrics.
fn record_failure(d: &Daemon, from: String, why: String, duration_ms: Option<f64>) {
    let mut p = d.program();
    p.last = Some(LastHandoff {
        at: crate::lease::now_ms(),
        from,
        to: p.upgrade_program.display().to_string(),
        ok: false,
        error: Some(why),
        duration_ms,
    });
    drop(p);
    d.metrics.handoff_failures.inc();
}

/// Writes the `upgrade` op's reply on the asking connection (inherited across the exec), then
/// closes it.
fn answer_requester(r: &Requester, answer: Result<Upgraded, String>) {
    use std::io::Write;
    let Ok(fd) = crate::sys::adopt_handed_fd(r.fd) else {
        return;
    };
    let mut stream = std::os::unix::net::UnixStream::from(fd);
    let line = match answer {
        Ok(u) => protocol::ok_line(&r.id, &u),
        Err(m) => protocol::err_line(
            &r.id,
            leash_core::kind::Code::Conflict,
            &m,
            &protocol::ErrorData::default(),
        ),
    };
    let _ = stream.set_write_timeout(Some(Duration::from_secs(5)));
    let _ = stream.write_all(&line);
}
