//! `leash serve` under systemd's protocols, for real. `systemd-socket-activate` (from Debian's
//! systemd package; no systemd as PID 1 needed) holds the listening socket and execs the daemon on
//! the first connection, which the daemon then serves on fd 3; a datagram socket named by
//! NOTIFY_SOCKET plays the service manager and must see READY=1 only after the start-up reap (an
//! orphan staged before the start is already settled in the database when READY=1 arrives) and
//! STOPPING=1 on SIGTERM. The activated socket is systemd's: the daemon leaves it.
mod common;
use common::*;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixDatagram, UnixStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Messages sent to NOTIFY_SOCKET, until one contains `want` (or the patience runs out).
fn wait_notify(sock: &UnixDatagram, seen: &mut Vec<String>, want: &str) -> bool {
    let deadline = Instant::now() + PATIENCE;
    let mut buf = [0u8; 4096];
    while Instant::now() < deadline {
        if seen.iter().any(|m| m.lines().any(|l| l == want)) {
            return true;
        }
        if let Ok(n) = sock.recv(&mut buf) {
            seen.push(String::from_utf8_lossy(&buf[..n]).into_owned());
        }
    }
    seen.iter().any(|m| m.lines().any(|l| l == want))
}

fn lease_state_in_db(state: &std::path::Path, session: &str) -> String {
    let conn = rusqlite::Connection::open(state.join("leash.db")).unwrap();
    conn.query_row(
        "SELECT state FROM leases WHERE session_key = ?1 ORDER BY started_at DESC LIMIT 1",
        [session],
        |r| r.get(0),
    )
    .unwrap()
}

#[test]
fn socket_activation_ready_after_the_startup_reap_and_stopping() {
    let activate = match apt::tool("systemd-socket-activate", "systemd") {
        Ok(p) => p,
        Err(why) => {
            common::skip(why);
            return;
        }
    };
    let tmp = TempDir::new("activate");
    let state = tmp.join("state");
    let socket = tmp.join("leash.sock");
    let mut guard = Guard::new();

    // An orphan for the start-up reap: its wrapper SIGKILLed, its owner gone, an escapee left.
    let (owner, wrapper, escapee) =
        outside_session(&mut guard, &state, tmp.path(), "orphan", "true");
    signal(wrapper, libc::SIGKILL);
    assert!(wait_for(|| !owner.alive()));
    assert_eq!(lease_state_in_db(&state, "orphan"), "open");

    let notify = UnixDatagram::bind(tmp.join("notify.sock")).unwrap();
    notify
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let mut child = activator_command(
        activate,
        &tmp,
        &state,
        &socket,
        &[format!(
            "NOTIFY_SOCKET={}",
            tmp.join("notify.sock").display()
        )],
    )
    .spawn()
    .unwrap();
    let pid = Pid::of(child.id() as i32).unwrap();
    guard.add(pid);
    let log_text = || std::fs::read_to_string(tmp.join("serve.log")).unwrap_or_default();
    assert!(
        wait_for(|| log_text().contains("Listening on")),
        "{}",
        log_text()
    );
    // Nothing started yet: the activator holds the socket, no daemon has locked the state root.
    let exe = || std::fs::read_link(format!("/proc/{}/exe", pid.pid)).unwrap_or_default();
    let is_leash = |p: std::path::PathBuf| {
        p.file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("leash"))
    };
    assert!(!is_leash(exe()), "started before any connection");
    assert!(!state.join("daemon.lock").exists());
    let mut seen = Vec::new();

    // The first connection starts the daemon, which answers it on the passed fd.
    let mut c = UnixStream::connect(&socket).unwrap();
    c.set_read_timeout(Some(PATIENCE)).unwrap();
    c.write_all(b"{\"id\":1,\"op\":\"status\"}\n").unwrap();
    assert!(
        wait_notify(&notify, &mut seen, "READY=1"),
        "no READY=1: {seen:?}\n{}",
        log_text()
    );
    // READY=1 came after the start-up reap: its STATUS= reports the reap's result, and the
    // orphan is settled already.
    let ready = seen
        .iter()
        .find(|m| m.lines().any(|l| l == "READY=1"))
        .unwrap();
    assert!(
        ready
            .lines()
            .any(|l| l.starts_with("STATUS=serving; start-up reap: closed 1,")),
        "READY=1 without the start-up reap's result: {ready:?}"
    );
    assert_eq!(
        lease_state_in_db(&state, "orphan"),
        "closed",
        "{}",
        log_text()
    );
    assert!(!escapee.pid.alive());
    let mut line = String::new();
    BufReader::new(c.try_clone().unwrap())
        .read_line(&mut line)
        .unwrap();
    let v: serde_json::Value = serde_json::from_str(&line).unwrap();
    assert_eq!(v["ok"], true, "{line}");
    let d = &v["result"]["daemon"];
    assert_eq!(d["socketActivated"], true, "{line}");
    assert_eq!(d["pid"], pid.pid, "the activator execs the daemon in place");
    assert_eq!(d["socket"], socket.display().to_string());
    // The unit's `leash serve`, the very binary the unit names.
    assert!(exe().ends_with("leash"), "{}", exe().display());
    assert!(
        !seen.iter().any(|m| m.contains("STOPPING=1")),
        "stopping too early: {seen:?}"
    );

    signal(pid, libc::SIGTERM);
    assert!(
        wait_notify(&notify, &mut seen, "STOPPING=1"),
        "no STOPPING=1: {seen:?}\n{}",
        log_text()
    );
    let mut status = None;
    assert!(wait_for(|| {
        status = child.try_wait().unwrap();
        status.is_some()
    }));
    assert_eq!(status.unwrap().code(), Some(0), "{}", log_text());
    let ready_at = seen.iter().position(|m| m.contains("READY=1")).unwrap();
    let stopping_at = seen.iter().position(|m| m.contains("STOPPING=1")).unwrap();
    assert!(ready_at < stopping_at, "{seen:?}");
    // The socket is systemd's: left in place for the next activation.
    assert!(socket.exists(), "the daemon removed the activated socket");
}

/// A real service manager listens on the socket itself and forks the daemon, so clients see the
/// manager (not the daemon) as their peer. The daemon records the listener's pid beside its own,
/// and the leash CLI — the first client, started while the daemon is still starting — waits for
/// it and is served through it. No systemd needed: this test process plays the manager.
#[test]
fn clients_trust_a_daemon_behind_a_forking_service_manager() {
    use std::os::fd::AsRawFd;
    use std::os::unix::process::CommandExt;
    let tmp = TempDir::new("activate-fork");
    let state = tmp.join("state");
    let socket = tmp.join("manager.sock");
    let mut guard = Guard::new();
    let (_owner, wrapper, _escapee) =
        outside_session(&mut guard, &state, tmp.path(), "live", "sleep 1000 & wait");
    let listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    let fd = listener.as_raw_fd();
    let log = std::fs::File::create(tmp.join("serve.log")).unwrap();
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg(format!(
            "LISTEN_PID=$$ LISTEN_FDS=1 exec '{}' --state-dir '{}' serve --reconcile-interval 0",
            leash_bin().display(),
            state.display()
        ))
        .env_remove("LEASH_STATE_DIR")
        .env("LEASH_LOG", "info")
        .stdin(Stdio::null())
        .stderr(log);
    // SAFETY: dup2 and fcntl are async-signal-safe; the listener stays open in the parent.
    unsafe {
        cmd.pre_exec(move || {
            if fd == 3 {
                let flags = libc::fcntl(3, libc::F_GETFD);
                libc::fcntl(3, libc::F_SETFD, flags & !libc::FD_CLOEXEC);
            } else if libc::dup2(fd, 3) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let daemon = guard.child(cmd.spawn().unwrap());
    let daemon_pid = Pid::of(daemon.id() as i32).unwrap();
    let log_text = || std::fs::read_to_string(tmp.join("serve.log")).unwrap_or_default();

    // The first client: the CLI, through the manager's socket, at once.
    let out = leash(&state)
        .arg("--socket")
        .arg(&socket)
        .args(["verify", "--session", "live", "--json"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        log_text()
    );
    let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(v["answer"], "owned");
    assert_eq!(v["rootPid"], wrapper.pid);
    // It was the daemon that answered (its log has the verify), and it knows the manager.
    assert!(
        wait_for(|| log_text().contains("op=\"verify\"")),
        "{}",
        log_text()
    );
    let lock: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(state.join("daemon.lock")).unwrap()).unwrap();
    assert_eq!(lock["pid"], daemon_pid.pid);
    assert_eq!(lock["listenerPid"], std::process::id());
    // Without --socket, the CLI finds it through the lock file and is served too.
    let out = leash(&state)
        .args(["verify", "--session", "live"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert!(
        !String::from_utf8_lossy(&out.stderr).contains("not trusting"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    signal(daemon_pid, libc::SIGTERM);
    assert!(wait_for(|| !daemon_pid.alive()), "{}", log_text());
    drop(listener);
}

/// `systemd-socket-activate` (at `activate`) listening on `socket`, set to exec `leash
/// --state-dir state serve` on the first connection with `extra_env` (`NAME=value`) and this
/// binary's cgroup root, containment and reports directory passed through (the activator passes
/// only what -E names: the daemon contains under this binary's own cgroup root and its wrappers
/// report into this binary's own runtime directory, never the default ones); its stderr goes to
/// `serve.log` in `tmp`.
fn activator_command(
    activate: std::path::PathBuf,
    tmp: &TempDir,
    state: &std::path::Path,
    socket: &std::path::Path,
    extra_env: &[String],
) -> Command {
    // leash_bin() first: it sets the test's cgroup root and reports directory passed below.
    let bin = leash_bin();
    let log = std::fs::File::create(tmp.join("serve.log")).unwrap();
    let mut cmd = Command::new(activate);
    for var in [
        "LEASH_CGROUP_ROOT",
        "LEASH_CONTAINMENT",
        "LEASH_RUNTIME_DIR",
    ] {
        if let Some(v) = std::env::var_os(var) {
            let mut kv = std::ffi::OsString::from(format!("{var}="));
            kv.push(v);
            cmd.arg("-E").arg(kv);
        }
    }
    cmd.arg("-l").arg(socket);
    for kv in extra_env {
        cmd.arg("-E").arg(kv);
    }
    cmd.arg("-E")
        .arg(format!("PATH={}", std::env::var("PATH").unwrap()))
        .arg("-E")
        .arg("LEASH_LOG=info")
        .arg(bin)
        .arg("--state-dir")
        .arg(state)
        .args(["serve", "--reconcile-interval", "0"])
        .stdin(Stdio::null())
        .stderr(log);
    cmd
}

/// `systemd-socket-activate` listening on `socket`, set to exec `leash --state-dir state serve`
/// on the first connection (as leash.socket + leash.service do), with this binary's cgroup root,
/// containment and reports directory passed through. `None` (and a skip) without the tool.
fn activator(
    guard: &mut Guard,
    tmp: &TempDir,
    state: &std::path::Path,
    socket: &std::path::Path,
) -> Option<Pid> {
    let activate = match apt::tool("systemd-socket-activate", "systemd") {
        Ok(p) => p,
        Err(why) => {
            common::skip(why);
            return None;
        }
    };
    let child = activator_command(activate, tmp, state, socket, &[])
        .spawn()
        .unwrap();
    let pid = Pid::of(child.id() as i32).unwrap();
    guard.child(child);
    let log_text = || std::fs::read_to_string(tmp.join("serve.log")).unwrap_or_default();
    assert!(
        wait_for(|| log_text().contains("Listening on")),
        "{}",
        log_text()
    );
    Some(pid)
}

/// A client of a system daemon: `leash --socket S status` run by a user whose own default state
/// directory does not exist (HOME points at nothing, no LEASH_STATE_DIR or XDG_STATE_HOME).
fn client_of(socket: &std::path::Path, home: &std::path::Path) -> Command {
    let mut c = Command::new(leash_bin());
    c.arg("--socket")
        .arg(socket)
        .env_remove("LEASH_STATE_DIR")
        .env_remove("XDG_STATE_HOME")
        .env_remove("LEASH_LOG")
        .env("HOME", home)
        .stdin(Stdio::null());
    c
}

/// Runs a client's `status --json`: it must succeed (else its output and the daemon's log, in
/// `tmp`'s serve.log, are shown); its answer.
fn served_status(tmp: &TempDir, client: &mut Command) -> serde_json::Value {
    let out = client.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        std::fs::read_to_string(tmp.join("serve.log")).unwrap_or_default()
    );
    serde_json::from_str(&stdout).unwrap()
}

/// The empty state directory systemd's `StateDirectory=` makes before the first start.
fn empty_state_dir(tmp: &TempDir) -> std::path::PathBuf {
    use std::os::unix::fs::DirBuilderExt;
    let state = tmp.join("var-lib-leash");
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&state)
        .unwrap();
    state
}

/// A client that names only the socket needs no state directory of its own: its connection
/// starts the socket-activated daemon (in the empty directory systemd made), and it is served
/// on the root that daemon serves.
#[test]
fn a_client_naming_only_the_socket_starts_a_system_daemon_and_is_served() {
    let tmp = TempDir::new("activate-client");
    let state = empty_state_dir(&tmp);
    let socket = tmp.join("leash.sock");
    let mut guard = Guard::new();
    let Some(pid) = activator(&mut guard, &tmp, &state, &socket) else {
        return;
    };
    let home = tmp.join("no-such-home");
    let v = served_status(&tmp, client_of(&socket, &home).args(["status", "--json"]));
    assert_eq!(v["daemon"]["socketActivated"], true, "{v}");
    assert_eq!(v["daemon"]["pid"], pid.pid, "{v}");
    assert_eq!(
        v["stateDir"],
        std::fs::canonicalize(&state).unwrap().display().to_string()
    );
    assert!(
        state.join("leash.db").exists(),
        "the daemon made its database"
    );
    assert!(
        !home.exists(),
        "the client made a state directory of its own"
    );
    signal(pid, libc::SIGTERM);
    assert!(wait_for(|| !pid.alive()));
}

/// `--state-dir` naming the empty directory systemd made, with `--socket`: the directory exists,
/// so it is not "missing"; the client's connection starts the daemon, which serves it. Without
/// `--socket` the same directory is refused as holding no database yet (not as missing), and
/// nothing is created in it.
#[test]
fn a_named_empty_state_directory_with_the_socket_starts_the_daemon() {
    let tmp = TempDir::new("activate-empty");
    let state = empty_state_dir(&tmp);
    let socket = tmp.join("leash.sock");
    let mut guard = Guard::new();
    let home = tmp.join("no-such-home");
    let out = client_of(&socket, &home)
        .arg("--state-dir")
        .arg(&state)
        .arg("--no-daemon")
        .arg("status")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "{err}");
    assert!(
        err.contains("holds no state database (leash.db) yet") && !err.contains("does not exist"),
        "{err}"
    );
    assert_eq!(std::fs::read_dir(&state).unwrap().count(), 0);

    let Some(pid) = activator(&mut guard, &tmp, &state, &socket) else {
        return;
    };
    let v = served_status(
        &tmp,
        client_of(&socket, &home)
            .arg("--state-dir")
            .arg(&state)
            .args(["status", "--json"]),
    );
    // The daemon answered, not the database directly.
    assert_eq!(v["daemon"]["pid"], pid.pid, "{v}");
    assert!(state.join("leash.db").exists());
    signal(pid, libc::SIGTERM);
    assert!(wait_for(|| !pid.alive()));
}
