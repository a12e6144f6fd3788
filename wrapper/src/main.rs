//! `leash-wrap`: the per-session wrapper of leash.
//!
//! It sits between a gateway and one ACP adapter and enforces a single local rule: the adapter's
//! process tree does not outlive the wrapper's parent. It never decides session policy.
//!
//! `main` reads as a checklist, in the manner of tini:
//! `parse_args → configure_signals → register_subreaper → watch_parent → spawn_adapter →
//! write_report`, then a loop that waits on one `poll` for a signal (via `signalfd`) or the
//! parent's exit (via a pidfd on the parent), reaps zombies, forwards signals, and drains the tree
//! (SIGTERM → grace → SIGKILL) when the parent dies or the adapter exits leaving descendants.
//!
//! Hard rules: nothing is ever written to stdout (it is the adapter's JSON-RPC stream); on the
//! happy path nothing is written to stderr either; diagnostics are one line each, prefixed
//! `leash-wrap[PID]:` (or, with `--error-format json`, one JSON error line in leash's format).
//! Exit status is the adapter's: its code, or 128+N for death by signal N; 127/126 when the
//! command cannot be started (not found / not executable: the lease's report says so, with the
//! reason); 125 when the wrapper itself could not do its job (its set-up, or placing the adapter
//! in its cgroup: a refused move is told with its cause and the fix).

// One wrapper starts per session, so its start-up is on every session's path: std's runtime
// start-up is skipped and `sys::c_main` is the entry point (see there for what that saves).
#![cfg_attr(not(test), no_main)]

mod sys;

use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Exit status for failures of the wrapper itself (bad usage, a setup syscall failed, the parent
/// was already gone before the adapter could be started). Same convention as `env` and docker.
const EXIT_WRAPPER_FAILED: i32 = 125;
const EXIT_CANNOT_EXECUTE: i32 = 126;
const EXIT_NOT_FOUND: i32 = 127;

const DEFAULT_GRACE_MS: u64 = 3_000;
/// The longest grace: one hour, as in leash (`leash::lease::MAX_GRACE_MS`). A larger
/// `--grace-ms` is taken as this, so no value can overflow the deadline arithmetic or leave a
/// tree alive for days after its owner died.
const MAX_GRACE_MS: u64 = 3_600_000;

/// While SIGKILLs are out, how often to sweep again for descendants that were re-parented to us
/// after the last sweep (their parent died from our SIGKILL).
const KILL_SWEEP_INTERVAL: Duration = Duration::from_millis(20);

/// How long the wrapper waits idle after start-up before it unmaps its image (`sys::trim_image`):
/// an adapter that exits at once (a bad command line, `true`) costs the trim nothing, and for
/// the others it happens off the start path, while the adapter starts up.
const TRIM_AFTER_IDLE: Duration = Duration::from_millis(10);

/// Parent polling interval, used only on kernels without `pidfd_open` (< 5.3).
const PARENT_POLL_FALLBACK: Duration = Duration::from_millis(50);

const USAGE: &str = "\
usage: leash-wrap [--grace-ms N] [--owner-pid PID] [--report PATH] [--report-fallback PATH]
                  [--cgroup DIR] [--remove-empty-parent] [--error-format text|json]
                  [--] CMD [ARGS...]

Runs CMD in its own process group and keeps its whole tree from outliving this wrapper's parent.

  --grace-ms N      after SIGTERM, wait N ms before SIGKILL (default 3000; at most 3600000,
                    larger values are taken as 3600000)
  --owner-pid PID   the parent this wrapper must have; if it is already gone, CMD is not started
                    (default: the parent at start)
  --report PATH     write pids, start times, group id and the exit status to PATH (one JSON
                    line per record: the start, then the end; later lines are not the report)
  --report-fallback PATH
                    where a record goes that cannot be written to --report's PATH (a full
                    or missing directory): the same records, from the one that failed on
  --error-format F  text (default) or json: how a failure to start CMD is told on stderr
                    (json: leash's error line, {\"error\":{\"code\",\"message\",\"exitCode\"}})
  --cgroup DIR      start CMD inside this cgroup v2 directory (clone3 CLONE_INTO_CGROUP, else
                    cgroup.procs before exec); the wrapper stays outside it, kills its members
                    (cgroup.kill when every process in it is one) when it drains the tree, and
                    removes it before exiting
  --remove-empty-parent
                    after removing the --cgroup directory, remove its parent too if it is
                    empty (leash's per-gateway directory, after the gateway's last session)
  -h, --help        this text
  -V, --version     print the version (to stderr: stdout belongs to CMD)

Signals TERM, INT, HUP and QUIT are forwarded to CMD's process group (TERM followed by CONT, so
a stopped process acts on it). When the parent process exits, the group and every re-parented
descendant get SIGTERM and SIGCONT, then SIGKILL after the grace, and
the wrapper exits only when all of them are gone. Exit status: CMD's code, 128+N if CMD died of
signal N, 127 if CMD was not found, 126 if it could not be executed, 125 if leash-wrap failed.
leash-wrap never writes to stdout.";

struct Args {
    grace: Duration,
    owner_pid: Option<i32>,
    report: Option<PathBuf>,
    /// `--report-fallback`: where the report goes when `report` cannot be written.
    report_fallback: Option<PathBuf>,
    cgroup: Option<PathBuf>,
    /// `--error-format json`: a failure to start the command is told as leash's JSON error line.
    json_errors: bool,
    /// `--remove-empty-parent`: after removing the cgroup, remove its parent if it is empty.
    remove_empty_parent: bool,
    cmd: Vec<OsString>,
}

/// Called by the entry point, `sys::c_main`.
fn main() -> ! {
    let args = parse_args();
    let code = run(args);
    std::process::exit(code);
}

fn run(args: Args) -> i32 {
    let sigfd = match sys::configure_signals() {
        Ok(fd) => fd,
        Err(e) => return fail(&format!("cannot set up signal handling: {e}")),
    };
    if let Err(e) = sys::set_child_subreaper() {
        return fail(&format!(
            "cannot become a child subreaper: {e} (needs Linux >= 3.4)"
        ));
    }
    let mut report = args
        .report
        .as_deref()
        .map(|p| Report::new(p, args.report_fallback.as_deref()));
    let cgroup = match args.cgroup.as_deref().map(open_cgroup).transpose() {
        Ok(c) => c,
        Err(msg) => return end_early(&mut report, fail(&msg), "cannot-start"),
    };
    let parent = match watch_parent(args.owner_pid) {
        Ok(p) => p,
        Err(msg) => {
            remove_cgroup(cgroup.as_ref(), args.remove_empty_parent);
            return end_early(&mut report, fail(&msg), "owner-gone");
        }
    };
    let mut child = match spawn_adapter(&args.cmd, cgroup.as_ref(), args.json_errors) {
        Ok(c) => c,
        Err((code, why)) => {
            remove_cgroup(cgroup.as_ref(), args.remove_empty_parent);
            if let (Some(r), Some(why)) = (&mut report, why) {
                r.write_start_error(code, &why);
                return code;
            }
            return end_early(&mut report, code, "cannot-start");
        }
    };
    if let Some(r) = &mut report {
        r.adapter_started(&child);
        r.write(None, None);
    }
    let status = supervise(&mut child, &parent, sigfd, args.grace, cgroup.as_ref());
    remove_cgroup(cgroup.as_ref(), args.remove_empty_parent);
    if let Some(r) = &mut report {
        r.write(Some(status.code), Some(status.end));
    }
    status.code
}

/// Opens the lease's cgroup. A lease recorded with a cgroup never runs outside it: if it cannot
/// be opened, nothing is started.
fn open_cgroup(path: &std::path::Path) -> Result<sys::Cgroup, String> {
    let force = std::env::var_os("LEASH_WRAP_CGROUP_PROCS_WRITE").is_some_and(|v| v == "1");
    sys::Cgroup::open(path, force).map_err(|e| {
        format!(
            "cannot open cgroup {}: {e}; not starting the command",
            path.display()
        )
    })
}

/// Removes the lease's cgroup once it is empty (the lease keeps its path and id, and `leash`
/// finds it gone). A failure is told once and otherwise harmless: `leash reap` sweeps it.
///
/// With `--remove-empty-parent` the directory above it (leash's `<root>/<gateway id>`) goes too
/// when this was its last lease: the last session of a gateway run without a daemon leaves
/// nothing behind. `rmdir` of a cgroup fails while it has children or members (EBUSY,
/// ENOTEMPTY), so a gateway with other sessions keeps it; and `leash exec` makes it again for the
/// next lease (it retries when the directory vanishes between its two mkdirs).
fn remove_cgroup(cgroup: Option<&sys::Cgroup>, remove_empty_parent: bool) {
    if let Some(cg) = cgroup {
        if let Err(e) = cg.remove() {
            diag(&format!(
                "cannot remove cgroup {}: {e}",
                cg.path().display()
            ));
            return;
        }
        if remove_empty_parent {
            if let Some(parent) = cg.path().parent() {
                // Best effort, silent: busy or gone is the common, harmless answer.
                let _ = std::fs::remove_dir(parent);
            }
        }
    }
}

/// The adapter never ran: say so in the report (so the lease can be settled) and exit.
fn end_early(report: &mut Option<Report>, code: i32, why: &str) -> i32 {
    if let Some(r) = report {
        r.write(Some(code), Some(why));
    }
    code
}

// ---------------------------------------------------------------------------------------------
// Arguments

fn parse_args() -> Args {
    let mut grace = Duration::from_millis(DEFAULT_GRACE_MS);
    let mut owner_pid = None;
    let mut report = None;
    let mut report_fallback = None;
    let mut cgroup = None;
    let mut json_errors = false;
    let mut remove_empty_parent = false;
    let mut it = std::env::args_os().skip(1).peekable();
    let mut cmd = Vec::new();
    while let Some(arg) = it.next() {
        let bytes = arg.as_bytes();
        match bytes {
            b"--" => {
                cmd.extend(it.by_ref());
                break;
            }
            b"-h" | b"--help" => {
                diag_raw(USAGE);
                std::process::exit(0);
            }
            b"-V" | b"--version" => {
                diag_raw(concat!("leash-wrap ", env!("CARGO_PKG_VERSION")));
                std::process::exit(0);
            }
            b"--grace-ms" => {
                let ms = parse_num(it.next(), "--grace-ms").min(MAX_GRACE_MS);
                grace = Duration::from_millis(ms);
            }
            b"--owner-pid" => {
                let pid = parse_num(it.next(), "--owner-pid");
                if pid == 0 || pid > i32::MAX as u64 {
                    usage_error("--owner-pid must be a positive pid");
                }
                owner_pid = Some(pid as i32);
            }
            b"--report" => match it.next() {
                Some(p) => report = Some(PathBuf::from(p)),
                None => usage_error("--report needs a path"),
            },
            b"--report-fallback" => match it.next() {
                Some(p) => report_fallback = Some(PathBuf::from(p)),
                None => usage_error("--report-fallback needs a path"),
            },
            b"--error-format" => match it.next().as_ref().map(|v| v.as_bytes()) {
                Some(b"json") => json_errors = true,
                Some(b"text") => json_errors = false,
                _ => usage_error("--error-format needs text or json"),
            },
            b"--remove-empty-parent" => remove_empty_parent = true,
            b"--cgroup" => match it.next() {
                Some(p) if p.as_bytes().starts_with(b"/") => cgroup = Some(PathBuf::from(p)),
                _ => usage_error("--cgroup needs an absolute path"),
            },
            _ if bytes.starts_with(b"-") && bytes.len() > 1 => {
                usage_error(&format!("unknown option '{}'", arg.to_string_lossy()));
            }
            _ => {
                cmd.push(arg);
                cmd.extend(it.by_ref());
                break;
            }
        }
    }
    if cmd.is_empty() {
        usage_error("no command given");
    }
    Args {
        grace,
        owner_pid,
        report,
        report_fallback,
        cgroup,
        json_errors,
        remove_empty_parent,
        cmd,
    }
}

fn parse_num(v: Option<OsString>, flag: &str) -> u64 {
    v.and_then(|s| s.to_str().and_then(|s| s.parse().ok()))
        .unwrap_or_else(|| usage_error(&format!("{flag} needs a non-negative integer")))
}

fn usage_error(msg: &str) -> ! {
    diag(&format!("{msg}; see leash-wrap --help"));
    std::process::exit(EXIT_WRAPPER_FAILED);
}

// ---------------------------------------------------------------------------------------------
// Diagnostics: stderr only, one line, never a panic when stderr is gone (the gateway that read it
// may be dead, which is exactly when we have something to say).

fn diag(msg: &str) {
    diag_raw(&format!("leash-wrap[{}]: {msg}", std::process::id()));
}

/// Says why the adapter did not start, as JSON (`--error-format json`) or as text.
fn tell(json: bool, cause: &str, why: &str, code: i32) {
    if json {
        diag_raw(&json_error(cause, why, code));
    } else {
        diag(&format!("{why} (exit {code})"));
    }
}

fn diag_raw(msg: &str) {
    let mut line = Vec::with_capacity(msg.len() + 1);
    line.extend_from_slice(msg.as_bytes());
    line.push(b'\n');
    sys::write_stderr(&line);
}

fn fail(msg: &str) -> i32 {
    diag(msg);
    EXIT_WRAPPER_FAILED
}

// ---------------------------------------------------------------------------------------------
// Parent watch

/// How we learn that our parent process is gone.
enum ParentWatch {
    /// A pidfd on the parent: readable when the whole process (not a thread) has exited.
    Pidfd { pid: i32, fd: sys::Fd },
    /// Kernels without pidfd_open: compare `getppid()` on a short timer.
    Poll { pid: i32 },
}

impl ParentWatch {
    fn pid(&self) -> i32 {
        match self {
            ParentWatch::Pidfd { pid, .. } | ParentWatch::Poll { pid } => *pid,
        }
    }
}

/// Opens a pidfd on the expected parent, then re-checks `getppid()`: if the parent died before
/// the pidfd was opened, we have already been re-parented and the check fails. This closes the
/// race of a parent that dies before the wrapper starts watching.
fn watch_parent(expected: Option<i32>) -> Result<ParentWatch, String> {
    let ppid = sys::getppid();
    let owner = expected.unwrap_or(ppid);
    let watch = match sys::pidfd_open(owner) {
        Ok(fd) => ParentWatch::Pidfd { pid: owner, fd },
        Err(e) if e.raw_os_error() == Some(libc::ENOSYS) => ParentWatch::Poll { pid: owner },
        Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {
            return Err(format!(
                "owner process {owner} is already gone; not starting the command"
            ))
        }
        Err(e) => return Err(format!("cannot watch parent process {owner}: {e}")),
    };
    let now = sys::getppid();
    if now != owner {
        return Err(format!(
            "owner process {owner} is not our parent (parent is {now}): it exited before the \
             wrapper started; not starting the command"
        ));
    }
    Ok(watch)
}

// ---------------------------------------------------------------------------------------------
// Adapter

struct Adapter {
    pid: i32,
    /// The adapter's process group id (== its pid: it leads its own group).
    pgid: i32,
    /// A pidfd on the leader, opened while it was our unreaped child. On Linux >= 6.9 it signals
    /// the group it names even after the leader is reaped and its pid number recycled.
    pidfd: Option<sys::Fd>,
    /// Set once reaped; from then on the pid (and the group id) may name a stranger, so `killpg`
    /// by number is no longer used.
    reaped: bool,
}

/// Starts the adapter. On failure: the exit status, and for a command that could not be started
/// (127 not found, 126 not executable) the reason in words, as the lease records it.
fn spawn_adapter(
    cmd: &[OsString],
    cgroup: Option<&sys::Cgroup>,
    json_errors: bool,
) -> Result<Adapter, (i32, Option<String>)> {
    let wrapper_pid = std::process::id() as i32;
    // Like tini: if we own the terminal's foreground, hand it to the adapter's new group so an
    // interactive adapter is not stopped by SIGTTIN.
    let hand_tty = sys::owns_foreground_tty();
    match sys::spawn(cmd, wrapper_pid, hand_tty, cgroup) {
        Ok(pid) => {
            // The child is unreaped (we have not waited), so its pid cannot have been recycled.
            let pidfd = sys::pidfd_open(pid).ok();
            Ok(Adapter {
                pid,
                pgid: pid,
                pidfd,
                reaped: false,
            })
        }
        Err(sys::SpawnError::Cgroup(e)) => {
            let why = cgroup_refusal(cgroup, &e);
            tell(json_errors, CAUSE_WRAPPER_FAILED, &why, EXIT_WRAPPER_FAILED);
            Err((EXIT_WRAPPER_FAILED, Some(why)))
        }
        Err(sys::SpawnError::Start(e)) => {
            let name = cmd[0].to_string_lossy();
            if e.raw_os_error() == Some(libc::ESRCH) {
                // The child found the wrapper gone between clone and exec.
                diag(&format!(
                    "not running '{name}': the wrapper's parent changed"
                ));
                return Err((EXIT_WRAPPER_FAILED, None));
            }
            let (code, cause, what) = match e.raw_os_error() {
                Some(libc::ENOENT) if !name.contains('/') => (
                    EXIT_NOT_FOUND,
                    CAUSE_NOT_FOUND,
                    "not found on PATH".to_string(),
                ),
                Some(libc::ENOENT) => (EXIT_NOT_FOUND, CAUSE_NOT_FOUND, "not found".to_string()),
                Some(libc::EACCES) => (
                    EXIT_CANNOT_EXECUTE,
                    CAUSE_NOT_EXECUTABLE,
                    "not executable (permission denied)".to_string(),
                ),
                _ => (
                    EXIT_CANNOT_EXECUTE,
                    CAUSE_NOT_EXECUTABLE,
                    format!("cannot be executed: {e}"),
                ),
            };
            let why = format!("the adapter could not be started: {name}: {what}");
            tell(json_errors, cause, &why, code);
            Err((code, Some(why)))
        }
    }
}

/// The cause words of leash's JSON error line for a command that could not be started: those of
/// leash's `Kind::AdapterNotFound`, `Kind::AdapterNotExecutable` and `Kind::SpawnFailed`
/// (core/src/kind.rs).
const CAUSE_NOT_FOUND: &str = "adapter_not_found";
const CAUSE_NOT_EXECUTABLE: &str = "adapter_not_executable";
const CAUSE_WRAPPER_FAILED: &str = "spawn_failed";

/// Why the adapter could not be started in the lease's cgroup, and for a refused move what to do.
/// The kernel lets a process move (or be cloned) into a cgroup only when the mover may write
/// `cgroup.procs` of the common ancestor of its own cgroup and the target: an ordinary user whose
/// process sits outside the subtree delegated to it is refused (EACCES) whatever the target's
/// owner, so its sessions cannot start contained until it runs from inside the subtree.
fn cgroup_refusal(cgroup: Option<&sys::Cgroup>, e: &std::io::Error) -> String {
    let dir = cgroup.map_or_else(String::new, |c| format!(" {}", c.path().display()));
    if !matches!(e.raw_os_error(), Some(libc::EACCES) | Some(libc::EPERM)) {
        return format!("the adapter could not be started in its cgroup{dir}: {e}");
    }
    let own = std::fs::read_to_string("/proc/self/cgroup")
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("0::").map(str::to_owned))
        })
        .map_or_else(String::new, |c| format!(" {c}"));
    format!(
        "the adapter could not be started in its cgroup{dir}: the kernel refused to move it \
         there from this process's cgroup{own} ({e}): moving a process between cgroups needs \
         write access to cgroup.procs of their common ancestor, which an ordinary user has only \
         inside the subtree delegated to it; run leash from inside that subtree (write the \
         shell's pid to cgroup.procs of a cgroup in it), or under \
         `systemd-run --user --scope -p Delegate=yes`, or with --containment off"
    )
}

/// leash's JSON error line: `{"error":{"code","message","exitCode"}}`.
fn json_error(cause: &str, message: &str, code: i32) -> String {
    format!(
        "{{\"error\":{{\"code\":{},\"message\":{},\"exitCode\":{code}}}}}",
        json_str(cause),
        json_str(message)
    )
}

/// A JSON string literal (no serde in the wrapper: it stays libc-only).
fn json_str(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

// ---------------------------------------------------------------------------------------------
// Report (side channel to the controller; never stdout)

struct Report {
    path: PathBuf,
    /// `--report-fallback`: where the records go once `path` could not take one.
    fallback: Option<PathBuf>,
    wrapper_pid: i32,
    wrapper_start: u64,
    /// Adapter pid, its start time and its group id, once spawned.
    adapter: Option<(i32, u64, i32)>,
    /// The file the records go to, open for writing just after the wrapper's last record, once
    /// the first is written.
    file: Option<std::fs::File>,
    /// Whether the records go to `fallback`: `path` could not take one.
    fell_back: bool,
}

impl Report {
    fn new(path: &std::path::Path, fallback: Option<&std::path::Path>) -> Report {
        let wrapper_pid = std::process::id() as i32;
        Report {
            path: path.to_path_buf(),
            fallback: fallback.map(std::path::Path::to_path_buf),
            wrapper_pid,
            wrapper_start: sys::start_time(wrapper_pid).unwrap_or(0),
            adapter: None,
            file: None,
            fell_back: false,
        }
    }

    fn adapter_started(&mut self, adapter: &Adapter) {
        // The adapter is our unreaped child: its /proc entry exists even if it already exited.
        let start = sys::start_time(adapter.pid).unwrap_or(0);
        self.adapter = Some((adapter.pid, start, adapter.pgid));
    }

    /// Writes a record of the report: one whole JSON line with every field known so far. The
    /// first record makes the file; the second (the end) is written just after it, at the
    /// wrapper's own offset (the file is not opened for appending), so a line another process
    /// added in between is overwritten, not read as the wrapper's. A reader takes the first
    /// line, and the second when the first has no exit status (`leash`'s `report.rs`); a line
    /// without its newline is a record still being written, or cut short, and is not read.
    ///
    /// A record `path` cannot take (its directory full, out of inodes, gone) goes to the
    /// fallback (`--report-fallback`, the state root's `run/`), and so does every record
    /// after it: the reader looks there for what the report lacks. Failures are said once on
    /// stderr and otherwise ignored: the lease already identifies the wrapper; the report only
    /// adds detail, and the adapter runs whether it can be written or not.
    ///
    /// Why not a temporary file renamed over the report, as until 2026-12: two renames in
    /// a `leash exec`'s path, the second one over an existing file, which ext4 follows with a
    /// flush of the new file's data (`auto_da_alloc`); 0.04–0.4 ms each on this host.
    fn write(&mut self, exit_status: Option<i32>, end: Option<&str>) {
        self.write_with(exit_status, end, None)
    }

    /// The command could not be started: the status (127/126) and the reason, which the lease
    /// records as why nothing ran.
    fn write_start_error(&mut self, exit_status: i32, why: &str) {
        self.write_with(Some(exit_status), Some("cannot-start"), Some(why))
    }

    fn write_with(
        &mut self,
        exit_status: Option<i32>,
        end: Option<&str>,
        start_error: Option<&str>,
    ) {
        let num = |v: Option<String>| v.unwrap_or_else(|| "null".to_string());
        let (apid, astart, pgid) = match self.adapter {
            Some((p, s, g)) => (
                Some(p.to_string()),
                Some(s.to_string()),
                Some(g.to_string()),
            ),
            None => (None, None, None),
        };
        let body = format!(
            "{{\"wrapperPid\":{},\"wrapperStartTime\":{},\"adapterPid\":{},\"adapterStartTime\":{},\
             \"processGroupId\":{},\"exitStatus\":{},\"endReason\":{},\"startError\":{}}}\n",
            self.wrapper_pid,
            self.wrapper_start,
            num(apid),
            num(astart),
            num(pgid),
            num(exit_status.map(|c| c.to_string())),
            num(end.map(|e| format!("\"{e}\""))),
            num(start_error.map(json_str)),
        );
        // One line: `json_str` escapes every control character, a newline included.
        if !self.fell_back {
            let err = match self.put(body.as_bytes()) {
                Ok(()) => return,
                Err(e) => e,
            };
            let Some(fallback) = &self.fallback else {
                diag(&format!(
                    "cannot write report {}: {err}",
                    self.path.display()
                ));
                return;
            };
            diag(&format!(
                "cannot write report {}: {err}; writing it to {}",
                self.path.display(),
                fallback.display()
            ));
            self.fell_back = true;
            self.file = None;
        }
        if let Err(e) = self.put(body.as_bytes()) {
            let path = self.fallback.as_deref().unwrap_or(&self.path);
            diag(&format!("cannot write report {}: {e}", path.display()));
        }
    }

    /// Writes one record to the current file (`path`, or the fallback once fallen back),
    /// making it with the first.
    fn put(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        if let Some(file) = &mut self.file {
            return write_whole(file, bytes);
        }
        let path = match (&self.fallback, self.fell_back) {
            (Some(f), true) => f,
            _ => &self.path,
        };
        self.file = Some(create_private(path, bytes)?);
        Ok(())
    }
}

/// Makes `path` a new file of mode 0600 whatever the umask (`std::fs::write` makes it 0666 less
/// the umask: world-writable under umask 0), never through a symlink, holding `bytes`, and
/// returns it open for writing just after them. A left-over file at `path` (lease ids are not
/// reused, so only a stray or a forgery) is removed and replaced, never reused with its mode or
/// its lines.
fn create_private(path: &std::path::Path, bytes: &[u8]) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let open = || {
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(path)
    };
    let mut f = match open() {
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            std::fs::remove_file(path)?;
            open()?
        }
        other => other?,
    };
    f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    if let Err(e) = write_whole(&mut f, bytes) {
        // A file without its first whole record is no report: leave none behind.
        drop(f);
        let _ = std::fs::remove_file(path);
        return Err(e);
    }
    Ok(f)
}

/// Writes one record with a single `write` at the file's own offset: a record is a few hundred
/// bytes, which a regular file takes whole unless its filesystem is full. A record cut short
/// has no newline, so a reader does not take it.
fn write_whole(f: &mut std::fs::File, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let n = f.write(bytes)?;
    if n == bytes.len() {
        return Ok(());
    }
    Err(std::io::Error::new(
        std::io::ErrorKind::WriteZero,
        format!("wrote {n} of {} bytes", bytes.len()),
    ))
}

// ---------------------------------------------------------------------------------------------
// Supervision loop

struct Outcome {
    code: i32,
    /// Why the wrapper ended: `adapter-exited` or `parent-died`.
    end: &'static str,
}

enum Phase {
    Running,
    /// SIGTERM is out; SIGKILL follows at `deadline`.
    Terminating {
        deadline: Instant,
    },
    /// SIGKILL is out; keep sweeping until no descendant is left.
    Killing,
}

fn supervise(
    adapter: &mut Adapter,
    parent: &ParentWatch,
    sigfd: sys::Fd,
    grace: Duration,
    cgroup: Option<&sys::Cgroup>,
) -> Outcome {
    let mut phase = Phase::Running;
    let mut adapter_code: Option<i32> = None;
    let mut parent_died = false;
    let mut children_left = true;
    let mut trimmed = false;

    loop {
        let mut timeout = match phase {
            Phase::Running => match parent {
                ParentWatch::Pidfd { .. } => None,
                ParentWatch::Poll { .. } => Some(PARENT_POLL_FALLBACK),
            },
            Phase::Terminating { deadline } => {
                Some(deadline.saturating_duration_since(Instant::now()))
            }
            Phase::Killing => Some(KILL_SWEEP_INTERVAL),
        };
        let parent_fd = match parent {
            ParentWatch::Pidfd { fd, .. } if !parent_died => Some(fd),
            _ => None,
        };
        if !trimmed {
            timeout = Some(timeout.map_or(TRIM_AFTER_IDLE, |t| t.min(TRIM_AFTER_IDLE)));
        }
        let ready = sys::poll2(&sigfd, parent_fd, timeout);
        if !trimmed && !ready.signal && !ready.parent {
            // Idle since start-up: what stays mapped from here on is what the loop uses.
            sys::trim_image();
            trimmed = true;
        }

        if ready.signal {
            for sig in sys::read_signals(&sigfd) {
                if sig == libc::SIGCHLD {
                    continue; // reaped below in every iteration
                }
                forward(adapter, sig);
            }
        }
        if !parent_died {
            let gone = match parent {
                ParentWatch::Pidfd { .. } => ready.parent,
                ParentWatch::Poll { pid } => sys::getppid() != *pid,
            };
            if gone {
                parent_died = true;
                if matches!(phase, Phase::Running) {
                    // Signals first, words after: the line costs formatting and a write, and
                    // the adapter should not wait for them (nor for the rest of the sweep: it
                    // yields the CPU right after the group's signal).
                    let n = sweep(adapter, libc::SIGTERM, cgroup);
                    phase = Phase::Terminating {
                        deadline: deadline_after(grace),
                    };
                    diag(&format!(
                        "parent process {} exited; sent SIGTERM to adapter group {} and {n} \
                         descendant(s) (SIGKILL after {} ms)",
                        parent.pid(),
                        adapter.pgid,
                        grace.as_millis()
                    ));
                }
            }
        }

        // Reap every zombie that is ready; note the adapter's status.
        loop {
            match sys::reap_one() {
                sys::Reaped::Child { pid, code } => {
                    if pid == adapter.pid {
                        adapter.reaped = true;
                        adapter_code = Some(code);
                    }
                }
                sys::Reaped::NoneReady => break,
                sys::Reaped::NoChildren => {
                    children_left = false;
                    break;
                }
            }
        }

        if let Some(code) = adapter_code {
            // A member of the cgroup that is not our descendant (an escapee that left the tree)
            // goes with the rest; a process moved in from outside, which fails the member check
            // (started before the wrapper, another uid, another lease's id), is not the lease's:
            // it is neither signalled nor waited for.
            let contained_left = !children_left && cgroup.is_some_and(sys::Cgroup::has_members);
            if !children_left && !contained_left {
                return Outcome {
                    code,
                    end: if parent_died {
                        "parent-died"
                    } else {
                        "adapter-exited"
                    },
                };
            }
            if matches!(phase, Phase::Running) {
                // The adapter is gone but left descendants: they are ours to clean up.
                sweep(adapter, libc::SIGTERM, cgroup);
                phase = Phase::Terminating {
                    deadline: deadline_after(grace),
                };
            }
        }

        match phase {
            Phase::Terminating { deadline } if Instant::now() >= deadline => {
                if let Some(cg) = cgroup {
                    cg.kill();
                }
                let n = sweep(adapter, libc::SIGKILL, cgroup);
                diag(&format!(
                    "grace of {} ms expired; sent SIGKILL to the adapter group and {n} \
                     descendant(s)",
                    grace.as_millis()
                ));
                phase = Phase::Killing;
            }
            Phase::Killing => {
                if let Some(cg) = cgroup {
                    cg.kill();
                }
                sweep(adapter, libc::SIGKILL, cgroup);
            }
            _ => {}
        }
    }
}

/// `now + grace`, saturating: a grace too large for the clock ends at the farthest instant the
/// clock can hold instead of overflowing (`--grace-ms` is capped anyway; this is the second
/// guard, so the arithmetic can never panic and abort the wrapper mid-teardown).
fn deadline_after(grace: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(grace)
        .or_else(|| now.checked_add(Duration::from_millis(MAX_GRACE_MS)))
        .unwrap_or(now)
}

/// Forwards an ordinary termination signal to the adapter's group, and, once the adapter is
/// gone, to its remaining descendants one by one.
fn forward(adapter: &Adapter, sig: i32) {
    signal_group(adapter, sig);
    if adapter.reaped {
        sys::for_each_descendant(|pidfd| send_one(pidfd, sig));
    }
}

/// Signals the adapter's group, every member of the lease's cgroup, and every descendant of the
/// wrapper found by walking `/proc/<pid>/task/<tid>/children`, including those re-parented to us
/// after escaping the group with `setsid()`. Returns how many descendants were signalled
/// individually.
///
/// Between the group and the rest it yields the CPU. The rest (the walk of `/proc` for
/// re-parented descendants and the cgroup's members) is some 30 syscalls; the adapter, just
/// woken by the group's signal, is often queued on this very CPU, and the scheduler does not
/// preempt us for it: after its owner's death it waited until we slept, 0.1-0.2 ms, which made
/// the wrapper's median 0.07-0.1 ms slower than tini's (traced with perf: docs/benchmarks.md,
/// "Parent death: where the time went"). tini sleeps right after its one kill(2); we yield, and
/// go on once what we signalled has had its turn.
#[cold]
#[inline(never)]
fn sweep(adapter: &Adapter, sig: i32, cgroup: Option<&sys::Cgroup>) -> usize {
    signal_group(adapter, sig);
    sys::yield_cpu();
    if let Some(cg) = cgroup {
        cg.for_each_member(|pidfd| send_one(pidfd, sig));
    }
    sys::for_each_descendant(|pidfd| send_one(pidfd, sig))
}

/// One pinned process: `sig`, and after a SIGTERM a SIGCONT, so a stopped process acts on the
/// SIGTERM now instead of sitting out the grace until the SIGKILL (as systemd does).
fn send_one(pidfd: &sys::Fd, sig: i32) {
    sys::pidfd_signal(pidfd, sig);
    if sig == libc::SIGTERM {
        sys::pidfd_signal(pidfd, libc::SIGCONT);
    }
}

/// The adapter's group: `sig`, and after a SIGTERM a SIGCONT (see [`send_one`]).
fn signal_group(adapter: &Adapter, sig: i32) {
    signal_group_once(adapter, sig);
    if sig == libc::SIGTERM {
        signal_group_once(adapter, libc::SIGCONT);
    }
}

fn signal_group_once(adapter: &Adapter, sig: i32) {
    if let Some(fd) = &adapter.pidfd {
        match sys::pidfd_signal_group(fd, sig) {
            // ESRCH: the group is empty.
            Ok(()) => return,
            Err(e) if e.raw_os_error() == Some(libc::ESRCH) => return,
            Err(_) => {} // EINVAL: a kernel without PIDFD_SIGNAL_PROCESS_GROUP (< 6.9)
        }
    }
    // killpg by number is safe only while the leader is unreaped: its zombie pins the id. After
    // that, the descendant walk in `sweep` reaches every remaining member.
    if !adapter.reaped {
        sys::killpg(adapter.pgid, sig);
    }
}
