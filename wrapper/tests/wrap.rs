//! The wrapper on its own (`leash-wrap -- CMD`, no lease): exit statuses, the stdout contract,
//! usage errors, and the owner check.
use std::process::{Command, Stdio};

fn wrap() -> Command {
    Command::new(env!("CARGO_BIN_EXE_leash-wrap"))
}

fn run(args: &[&str]) -> (Option<i32>, String, String) {
    let out = wrap().args(args).stdin(Stdio::null()).output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn exit_status_is_the_adapters() {
    assert_eq!(run(&["--", "true"]).0, Some(0));
    assert_eq!(run(&["--", "sh", "-c", "exit 42"]).0, Some(42));
    assert_eq!(run(&["sh", "-c", "exit 3"]).0, Some(3), "-- is optional");
    assert_eq!(run(&["--", "sh", "-c", "kill -TERM $$"]).0, Some(143));
    assert_eq!(run(&["--", "sh", "-c", "kill -KILL $$"]).0, Some(137));
}

#[test]
fn cannot_run_gives_127_or_126_and_one_line() {
    let (code, out, err) = run(&["--", "/nonexistent/x"]);
    assert_eq!(code, Some(127));
    assert!(out.is_empty());
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.starts_with("leash-wrap["), "{err}");
    // A directory cannot be executed, even by root: EACCES.
    let dir = std::env::temp_dir();
    let (code, _, err) = run(&["--", dir.to_str().unwrap()]);
    assert_eq!(code, Some(126), "{err}");
}

#[test]
fn usage_errors_are_125_and_help_goes_to_stderr() {
    let (code, out, err) = run(&[]);
    assert_eq!(code, Some(125));
    assert!(out.is_empty() && err.contains("no command"), "{err}");
    let (code, _, err) = run(&["--grace-ms", "x", "--", "true"]);
    assert_eq!(code, Some(125), "{err}");
    let (code, out, err) = run(&["--help"]);
    assert_eq!(code, Some(0));
    assert!(out.is_empty(), "help must not touch stdout");
    assert!(err.contains("usage: leash-wrap"));
}

#[test]
fn happy_path_is_silent_and_stdout_is_the_adapters_only() {
    let (code, out, err) = run(&["--", "sh", "-c", "printf 'a\\nb'"]);
    assert_eq!(code, Some(0));
    assert_eq!(out, "a\nb");
    assert!(err.is_empty(), "{err}");
}

#[test]
fn an_owner_that_is_not_the_parent_means_nothing_starts() {
    let dir = std::env::temp_dir().join(format!("leash-wrap-owner-{}", std::process::id()));
    let _ = std::fs::remove_file(&dir);
    let marker = dir.to_str().unwrap().to_string();
    let (code, _, err) = run(&["--owner-pid", "1", "--", "touch", &marker]);
    assert_eq!(code, Some(125), "{err}");
    assert!(err.contains("not starting the command"), "{err}");
    assert!(!dir.exists());
}

/// A scratch directory of this test's own, removed at the end whatever happens.
struct Scratch(std::path::PathBuf);
impl Scratch {
    fn new(name: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("leash-wrap-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }
}
impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The report's records: its lines, each a whole JSON object (the last one may be cut short
/// only while it is being written, which these tests never read).
fn records(path: &std::path::Path) -> Vec<String> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    assert!(
        text.is_empty() || text.ends_with('\n'),
        "a record without its newline: {text:?}"
    );
    text.lines().map(str::to_string).collect()
}

#[test]
fn the_report_is_a_start_record_then_an_end_record_each_a_whole_line() {
    use std::io::Write;
    use std::os::unix::fs::PermissionsExt;
    let dir = Scratch::new("report");
    let report = dir.0.join("r.json");
    let mut child = wrap()
        .arg("--report")
        .arg(&report)
        .args(["--", "sh", "-c", "read line; exit 5"])
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    // The start record, while the adapter runs: its pid and group, no exit status yet.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let start = loop {
        if let [one] = records(&report).as_slice() {
            break one.clone();
        }
        assert!(std::time::Instant::now() < deadline, "no start record");
        std::thread::sleep(std::time::Duration::from_millis(2));
    };
    assert!(start.contains("\"adapterPid\":"), "{start}");
    assert!(!start.contains("\"adapterPid\":null"), "{start}");
    assert!(start.contains("\"exitStatus\":null"), "{start}");
    assert!(start.contains("\"endReason\":null"), "{start}");
    child.stdin.take().unwrap().write_all(b"go\n").unwrap();
    assert_eq!(child.wait().unwrap().code(), Some(5));
    // The end record follows it: the start record is still the first line, unchanged.
    let lines = records(&report);
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert_eq!(lines[0], start);
    assert!(lines[1].contains("\"exitStatus\":5"), "{}", lines[1]);
    assert!(
        lines[1].contains("\"endReason\":\"adapter-exited\""),
        "{}",
        lines[1]
    );
    let mode = std::fs::metadata(&report).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let leftovers = std::fs::read_dir(&dir.0).unwrap().count();
    assert_eq!(leftovers, 1, "nothing but the report");
}

/// Waits for the report's first record (the start) and returns the report's lines.
fn wait_start_record(report: &std::path::Path) -> String {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        if let [one] = records(report).as_slice() {
            return one.clone();
        }
        assert!(std::time::Instant::now() < deadline, "no start record");
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
}

/// A line another process appends while the adapter runs is not the end record: the wrapper
/// writes its end record just after its start record, over what was added there.
#[test]
fn the_end_record_follows_the_start_record_over_a_line_added_between() {
    use std::io::Write;
    let dir = Scratch::new("report-forged");
    let report = dir.0.join("r.json");
    let mut child = wrap()
        .arg("--report")
        .arg(&report)
        .args(["--", "sh", "-c", "read line; exit 5"])
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    let start = wait_start_record(&report);
    let forged = start.replace("\"exitStatus\":null", "\"exitStatus\":0");
    let padded = format!("{forged}{}\n", " ".repeat(64));
    std::fs::OpenOptions::new()
        .append(true)
        .open(&report)
        .unwrap()
        .write_all(padded.as_bytes())
        .unwrap();
    child.stdin.take().unwrap().write_all(b"go\n").unwrap();
    assert_eq!(child.wait().unwrap().code(), Some(5));
    let lines = records(&report);
    assert_eq!(lines[0], start);
    assert!(lines[1].contains("\"exitStatus\":5"), "{lines:?}");
    assert!(!lines[1].contains("\"exitStatus\":0"), "{lines:?}");
}

/// A report the `--report` path cannot take (here: its directory does not exist) goes to
/// `--report-fallback`, start and end; the adapter runs all the same, and says so once.
#[test]
fn a_report_the_report_path_cannot_take_goes_to_the_fallback() {
    use std::io::Write;
    let dir = Scratch::new("report-fallback");
    let report = dir.0.join("gone/r.json");
    let fallback = dir.0.join("run-r.json");
    let mut child = wrap()
        .arg("--report")
        .arg(&report)
        .arg("--report-fallback")
        .arg(&fallback)
        .args(["--", "sh", "-c", "read line; exit 6"])
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = wait_start_record(&fallback);
    assert!(start.contains("\"exitStatus\":null"), "{start}");
    child.stdin.take().unwrap().write_all(b"go\n").unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(6));
    let lines = records(&fallback);
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert!(lines[1].contains("\"exitStatus\":6"), "{lines:?}");
    assert!(!report.exists());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("cannot write report") && err.contains("run-r.json"),
        "{err}"
    );
}

#[test]
fn a_file_or_symlink_left_at_the_report_path_is_replaced_not_written_through() {
    use std::os::unix::fs::PermissionsExt;
    let dir = Scratch::new("report-left");
    let report = dir.0.join("r.json");
    // A left-over file, world-writable, with a record of its own.
    std::fs::write(&report, "{\"wrapperPid\":1}\n").unwrap();
    std::fs::set_permissions(&report, std::fs::Permissions::from_mode(0o666)).unwrap();
    let (code, _, err) = run(&["--report", report.to_str().unwrap(), "--", "true"]);
    assert_eq!(code, Some(0), "{err}");
    let lines = records(&report);
    assert_eq!(lines.len(), 2, "only the wrapper's own records: {lines:?}");
    assert!(
        lines.iter().all(|l| !l.contains("\"wrapperPid\":1}")),
        "{lines:?}"
    );
    let mode = std::fs::metadata(&report).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "a new file, not the old one with its mode");

    // A symlink at the path: the link goes, its target is not written.
    let target = dir.0.join("target");
    std::fs::write(&target, "untouched\n").unwrap();
    std::fs::remove_file(&report).unwrap();
    std::os::unix::fs::symlink(&target, &report).unwrap();
    let (code, _, err) = run(&["--report", report.to_str().unwrap(), "--", "true"]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "untouched\n");
    assert!(!std::fs::symlink_metadata(&report)
        .unwrap()
        .file_type()
        .is_symlink());
    assert_eq!(records(&report).len(), 2);
}

#[test]
fn a_forwarded_sigterm_wakes_a_stopped_adapter() {
    // The adapter handles SIGTERM (exit 7) and stops itself. SIGTERM to the wrapper is forwarded
    // to its group followed by SIGCONT, so the handler runs; without the SIGCONT the adapter
    // would stay stopped and the wrapper would wait for ever.
    let mut child = wrap()
        .args([
            "--",
            "sh",
            "-c",
            "trap 'exit 7' TERM; kill -STOP $$; while :; do sleep 1 & wait $!; done",
        ])
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let wrapper = child.id() as i32;
    let stat = |pid: i32| std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let state_of = |pid: i32| {
        let s = stat(pid);
        s.rfind(')')
            .and_then(|i| s[i + 1..].split_whitespace().next().map(str::to_owned))
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let adapter = loop {
        let kids = std::fs::read_to_string(format!("/proc/{wrapper}/task/{wrapper}/children"))
            .unwrap_or_default();
        if let Some(a) = kids
            .split_whitespace()
            .next()
            .and_then(|p| p.parse::<i32>().ok())
        {
            if state_of(a).as_deref() == Some("T") {
                break a;
            }
        }
        assert!(
            std::time::Instant::now() < deadline,
            "adapter never stopped"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    };
    // SAFETY: kill(2) on the wrapper this test spawned (still our unreaped child).
    unsafe { libc::kill(wrapper, libc::SIGTERM) };
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if std::time::Instant::now() >= deadline {
            // SAFETY: our own children, by pid; the adapter is unreaped under the wrapper.
            unsafe {
                libc::kill(adapter, libc::SIGKILL);
                libc::kill(wrapper, libc::SIGKILL);
            }
            let _ = child.wait();
            panic!("the stopped adapter never acted on the forwarded SIGTERM");
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    };
    assert_eq!(status.code(), Some(7));
}

#[test]
fn an_oversize_grace_is_capped_at_one_hour() {
    // `--grace-ms 2^64-1` meant "never SIGKILL": a TERM-ignoring adapter outlived its owner for
    // good. The wrapper caps the grace at one hour (and its deadline arithmetic saturates); its
    // parent-death message says which grace it applies.
    let dir = std::env::temp_dir().join(format!("leash-wrap-grace-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let err = dir.join("wrap.err");
    let pidfile = dir.join("wrap.pid");
    let script = format!(
        "'{}' --grace-ms 18446744073709551615 -- sleep 1000 2>'{}' </dev/null &\necho $! > '{}'\nwait",
        env!("CARGO_BIN_EXE_leash-wrap"),
        err.display(),
        pidfile.display()
    );
    let mut spawner = Command::new("sh").args(["-c", &script]).spawn().unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let wrapper: i32 = loop {
        if let Some(p) = std::fs::read_to_string(&pidfile)
            .ok()
            .and_then(|t| t.trim().parse().ok())
        {
            break p;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "wrapper never started"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    };
    // Wait for the adapter, so the wrapper is in its supervision loop.
    while std::fs::read_to_string(format!("/proc/{wrapper}/task/{wrapper}/children"))
        .unwrap_or_default()
        .trim()
        .is_empty()
    {
        assert!(
            std::time::Instant::now() < deadline,
            "adapter never started"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    spawner.kill().unwrap(); // SIGKILL to the sh this test spawned: the wrapper's parent dies
    let _ = spawner.wait();
    let text = loop {
        let t = std::fs::read_to_string(&err).unwrap_or_default();
        let gone = std::fs::read_to_string(format!("/proc/{wrapper}/stat")).is_err();
        if gone && t.contains("SIGKILL after") {
            break t;
        }
        assert!(std::time::Instant::now() < deadline, "no teardown: {t}");
        std::thread::sleep(std::time::Duration::from_millis(5));
    };
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(text.contains("SIGKILL after 3600000 ms"), "{text}");
}

/// Fields of `/proc/<pid>/status` (`State`, `ShdPnd`, `SigPnd`, ...), or none once it is gone.
fn status_field(pid: i32, key: &str) -> Option<String> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .map(|v| v.trim().to_string())
}

/// Waits until the wrapper has taken every signal sent to it and sleeps again in its loop:
/// nothing pending for the process, and state S (or it exited). Whatever it did about those
/// signals (a wrongful SIGTERM to the adapter included) it did before it slept.
fn wait_until_wrapper_idle(wrapper: i32, deadline: std::time::Instant) {
    loop {
        let text = std::fs::read_to_string(format!("/proc/{wrapper}/status")).unwrap_or_default();
        let field = |key: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
                .map(|v| v.trim().to_string())
                .unwrap_or_default()
        };
        let nothing_pending =
            field("ShdPnd").chars().all(|c| c == '0') && field("SigPnd").chars().all(|c| c == '0');
        let state = field("State");
        if nothing_pending && state.starts_with('S') || state.starts_with('Z') || text.is_empty() {
            return; // asleep again, or it exited: either way it has done what it did
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the wrapper never went back to sleep: {text}"
        );
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
}

/// Kills, by pid, the wrapper this test started if the test fails before it reaped it (disarmed
/// once reaped: the pid may be anyone's after that). Its adapter follows by its own
/// PR_SET_PDEATHSIG; the adapter's pid is not signalled, the wrapper may have reaped it.
struct KillOnDrop(Vec<i32>);
impl Drop for KillOnDrop {
    fn drop(&mut self) {
        for &pid in &self.0 {
            // SAFETY: kill(2) on the wrapper, our unreaped child until `wait`: the pid is its.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
}

#[test]
fn the_exit_of_the_parent_thread_is_not_the_parents_death() {
    // The wrapper watches its parent *process* (a pidfd on it). When the thread that forked the
    // wrapper exits while that process lives on, the kernel hands the wrapper to a sibling
    // thread, and would send a PR_SET_PDEATHSIG (which tini's -p relies on; the wrapper does not
    // arm one, see docs/benchmarks.md). That is not the parent's death: the adapter must not be
    // signalled, and the wrapper keeps supervising.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let (mut child, tid, adapter) = std::thread::spawn(move || {
        // SAFETY: gettid cannot fail.
        let tid = unsafe { libc::gettid() };
        let child = wrap()
            .args(["--grace-ms", "100", "--", "sleep", "1000"])
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        let wrapper = child.id() as i32;
        // The thread exits only once the wrapper runs its loop (adapter started).
        let adapter = loop {
            let kids = std::fs::read_to_string(format!("/proc/{wrapper}/task/{wrapper}/children"))
                .unwrap_or_default();
            if let Some(a) = kids.split_whitespace().next().and_then(|p| p.parse().ok()) {
                break a;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "adapter never started"
            );
            std::thread::sleep(std::time::Duration::from_millis(2));
        };
        (child, tid, adapter)
    })
    .join()
    .unwrap();
    let wrapper = child.id() as i32;
    let mut guard = KillOnDrop(vec![wrapper]);
    // pthread_join returns when the thread's tid is cleared, early in its exit; the kernel
    // re-parents the wrapper (and would send a PR_SET_PDEATHSIG) later, in its exit_notify,
    // before the thread is released and its task entry goes.
    while std::path::Path::new(&format!("/proc/self/task/{tid}")).exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "the spawning thread never went"
        );
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    let untouched = |when: &str| {
        assert_eq!(
            status_field(adapter, "PPid").as_deref(),
            Some(wrapper.to_string().as_str()),
            "{when}: the adapter is gone"
        );
        // Asleep in its `sleep` (an adapter still starting up on a loaded host is running for a
        // moment: wait for it, never judge that instant).
        let state = loop {
            let state = status_field(adapter, "State").unwrap_or_default();
            if !state.starts_with('R') {
                break state;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{when}: adapter state {state}"
            );
            std::thread::sleep(std::time::Duration::from_millis(2));
        };
        assert!(state.starts_with('S'), "{when}: adapter state {state}");
        for key in ["ShdPnd", "SigPnd"] {
            let pending = status_field(adapter, key).unwrap_or_default();
            assert!(
                pending.chars().all(|c| c == '0'),
                "{when}: the adapter was signalled ({key} {pending})"
            );
        }
    };
    wait_until_wrapper_idle(wrapper, deadline);
    untouched("after the parent thread's exit");
    // Still supervising: a SIGTERM is forwarded and the wrapper exits with the adapter's status.
    // SAFETY: kill(2) on the wrapper this test started (our unreaped child).
    unsafe { libc::kill(wrapper, libc::SIGTERM) };
    let status = child.wait().unwrap();
    guard.0.clear();
    assert_eq!(status.code(), Some(143));
}
