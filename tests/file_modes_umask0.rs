//! Every file and directory leash makes has an explicit mode, whatever the umask: under umask 0
//! (a service manager's default for some units) `run/<lease>.json` was created 0666. The reports
//! directory (here one leash makes, under umask 0) is `0700` and each report in it `0600`. Each leash
//! here runs under umask 0 set in its own shell (`umask 0; exec leash …`), never in the test
//! process (the umask is process-wide, shared by every test thread).
mod common;
use common::*;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};

/// `leash ARGS…` under umask 0.
fn leash_umask0(state: &Path) -> Command {
    let mut c = Command::new("sh");
    c.arg("-c")
        .arg(r#"umask 0 && exec "$0" "$@""#)
        .arg(leash_bin())
        .arg("--state-dir")
        .arg(state);
    c.env_remove("LEASH_STATE_DIR").env_remove("LEASH_LOG");
    c.env("LEASH_RUNTIME_DIR", reports_dir(state));
    c
}

/// A reports directory leash makes itself (its parent, the test binary's, exists).
fn reports_dir(state: &Path) -> std::path::PathBuf {
    let tag = state.parent().and_then(Path::file_name).unwrap();
    test_runtime_dir().join(tag)
}

fn mode(p: &Path) -> u32 {
    std::fs::symlink_metadata(p)
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        .permissions()
        .mode()
        & 0o7777
}

#[test]
fn every_file_leash_makes_has_its_mode_under_umask_0() {
    let tmp = TempDir::new("umask0");
    let state = tmp.join("state");
    let mut guard = Guard::new();

    // exec: the state root, the database, the installed wrapper, the wrapper's report.
    // `leases` folds the report (it makes -wal/-shm if nothing did yet).
    let mut exec = leash_umask0(&state);
    exec.args(["exec", "--grace-ms", "100"]);
    let (wrapper, _) = sleeping_lease(&mut guard, exec, &state, "m");
    let report = report_file_of(&state, &lease_of(&state, "m"));
    assert_eq!(
        report.parent(),
        Some(reports_dir(&state).as_path()),
        "the report is in the reports directory LEASH_RUNTIME_DIR names"
    );
    let mut checked = vec![
        (state.clone(), 0o700),
        (state.join("wrappers"), 0o700),
        (state.join("run"), 0o700),
        (reports_dir(&state), 0o700),
        (report, 0o600),
        (state.join("leash.db"), 0o600),
        (state.join("leash.db-wal"), 0o600),
        (state.join("leash.db-shm"), 0o600),
    ];
    for e in std::fs::read_dir(state.join("wrappers")).unwrap().flatten() {
        // Executed by the wrapper's user: rwx for it, r-x for others, never writable by them.
        checked.push((e.path(), 0o755));
    }
    for (p, want) in &checked {
        assert_eq!(mode(p), *want, "{} is {:o}", p.display(), mode(p));
    }
    let out = run(&state, &["close", "--session", "m"]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert!(wait_for(|| !wrapper.alive()));

    // serve: the daemon's lock file and socket.
    let mut serve = leash_umask0(&state)
        .arg("serve")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let daemon = Pid::of(serve.id() as i32).unwrap();
    let lock = state.join("daemon.lock");
    let up = wait_for(|| {
        std::fs::read_to_string(&lock)
            .ok()
            .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
            .is_some_and(|v| v["pid"] == daemon.pid)
            && std::os::unix::net::UnixStream::connect(state.join("leash.sock")).is_ok()
    });
    let modes = [
        (mode(&lock), "daemon.lock"),
        (mode(&state.join("leash.sock")), "leash.sock"),
    ];
    signal(daemon, libc::SIGTERM);
    assert!(serve.wait().unwrap().success());
    assert!(up, "leash serve did not come up");
    for (m, name) in modes {
        assert_eq!(m, 0o600, "{name} is {m:o}");
    }

    // man --out-dir: pages are for every user (0644), their directory 0755.
    let man = tmp.join("man/man1");
    let out = leash_umask0(&state)
        .args(["man", "--out-dir"])
        .arg(&man)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(mode(&man), 0o755);
    let pages: Vec<_> = std::fs::read_dir(&man).unwrap().flatten().collect();
    assert!(pages.len() > 5, "{} pages", pages.len());
    for p in pages {
        assert_eq!(mode(&p.path()), 0o644, "{}", p.path().display());
    }
}
