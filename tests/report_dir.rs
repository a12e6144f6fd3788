//! Where the wrappers' reports go (the exec path): a private runtime directory on
//! tmpfs (`LEASH_RUNTIME_DIR`, else `$XDG_RUNTIME_DIR/leash`, `/run/leash` for root,
//! `/dev/shm/leash-<uid>`), named in each lease's row (`reportDir`), so every reader finds the
//! report whatever its own environment; the state root's `run/` where none can be used. The row's
//! claim is checked before a report is read or removed: a forged `report_dir` reads and removes
//! nothing. A squatted or linked default is passed over; an explicit `LEASH_RUNTIME_DIR` that
//! cannot be used is refused, and nothing starts. Live: real `leash exec`s both ways (direct,
//! and through a daemon's `exec` op), real SQLite, real files.
mod common;
mod daemon_support;
use common::*;
use daemon_support::Daemon;
use serde_json::Value;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The lease of `session`, read from the database (the reports folded in).
fn row_of(state: &Path, session: &str) -> Value {
    db_lease_of(state, session).unwrap_or_else(|| panic!("no lease for session {session}"))
}

/// The `.json` files directly in `dir`.
fn reports_in(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|x| x == "json"))
                .collect()
        })
        .unwrap_or_default()
}

fn mode(p: &Path) -> u32 {
    std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777
}

/// A directory of this test under the test binary's runtime directory (tmpfs where
/// `/dev/shm` is), not made yet: leash makes it.
fn fresh_dir(tag: &str) -> PathBuf {
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let _ = leash_bin(); // the binary's runtime directory exists from here on
    test_runtime_dir().join(format!("{tag}-{n}"))
}

/// The system's default reports directory for this user without `LEASH_RUNTIME_DIR` and
/// `XDG_RUNTIME_DIR` (`None`: the state root's `run/`).
fn system_default() -> Option<PathBuf> {
    let uid = nix::unistd::geteuid().as_raw();
    if uid == 0 && on_tmpfs(Path::new("/run")) {
        Some(PathBuf::from("/run/leash"))
    } else if on_tmpfs(Path::new("/dev/shm")) {
        Some(PathBuf::from(format!("/dev/shm/leash-{uid}")))
    } else {
        None
    }
}

fn on_tmpfs(p: &Path) -> bool {
    nix::sys::statfs::statfs(p).is_ok_and(|f| f.filesystem_type() == nix::sys::statfs::TMPFS_MAGIC)
}

/// Runs `f`, which may make the system's default reports directory; removes it again after if
/// it did not exist before and is empty (another user of it may have put a report there). One
/// test at a time, so one cannot take the other's directory for the system's.
fn leaving_the_system_default_as_found<T>(f: impl FnOnce() -> T) -> T {
    static ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = ONE.lock().unwrap_or_else(|e| e.into_inner());
    let dir = system_default();
    let existed = dir.as_ref().is_some_and(|d| d.exists());
    struct Tidy(Option<PathBuf>, bool);
    impl Drop for Tidy {
        fn drop(&mut self) {
            if let (Some(d), false) = (&self.0, self.1) {
                let _ = std::fs::remove_dir(d);
            }
        }
    }
    let _tidy = Tidy(dir, existed);
    f()
}

/// Runs `cmd` (a `leash exec` of an adapter that exits 3) to its end.
fn exec_exit3(mut cmd: Command, session: &str) -> std::process::Output {
    cmd.args(["exec", "--session", session, "--", "sh", "-c", "exit 3"])
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

/// The report went to `dir`, the row names it, the end it reported was folded into the row, and
/// the report is gone once the lease settled; `run/` got none.
fn assert_reported_in(state: &Path, session: &str, dir: &Path, how: &str) {
    let l = row_of(state, session);
    assert_eq!(l["reportDir"], dir.to_str().unwrap(), "{how}: {l}");
    assert_eq!(l["state"], "ended", "{how}: the report's end was read: {l}");
    assert_eq!(l["exitStatus"], 3, "{how}: {l}");
    let id = l["leaseId"].as_str().unwrap();
    assert!(
        !dir.join(format!("{id}.json")).exists(),
        "{how}: the report of a settled lease is removed"
    );
    assert!(
        reports_in(&state.join("run")).is_empty(),
        "{how}: no report in run/"
    );
}

#[test]
fn every_door_writes_the_report_in_the_runtime_dir_its_row_names() {
    let tmp = TempDir::new("report-dir-doors");
    // Direct: `leash exec --no-daemon`.
    let state = tmp.join("direct");
    let dir = fresh_dir("direct");
    let mut c = leash(&state);
    c.env("LEASH_RUNTIME_DIR", &dir).arg("--no-daemon");
    let out = exec_exit3(c, "d");
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    assert_eq!(
        mode(&dir),
        0o700,
        "leash made the reports directory private"
    );
    assert_reported_in(&state, "d", &dir, "direct");

    // Through a daemon (`exec`: the client sends what it picked).
    {
        let (name, cmd, committed) = (
            "daemon",
            leash as fn(&Path) -> Command,
            "exec: lease committed for the peer",
        );
        let state = tmp.join(&name.replace(' ', "-"));
        let dir = fresh_dir("daemon");
        let mut daemon = Daemon::start_logging(&state, &[], "debug");
        let mut c = cmd(&state);
        c.env("LEASH_RUNTIME_DIR", &dir);
        let out = exec_exit3(c, "s");
        assert_eq!(out.status.code(), Some(3), "{name}: {out:?}");
        assert!(
            daemon.log_text().contains(committed),
            "{name}: the daemon committed it: {}",
            daemon.log_text()
        );
        assert_reported_in(&state, "s", &dir, name);
        assert!(daemon.terminate().success());
    }
}

/// Without `LEASH_RUNTIME_DIR`: `$XDG_RUNTIME_DIR/leash` when that is a safe tmpfs directory;
/// without it, `/run/leash` (root, on tmpfs) or `/dev/shm/leash-<uid>`.
#[test]
fn the_default_is_a_private_directory_on_tmpfs() {
    let tmp = TempDir::new("report-dir-default");
    let base = fresh_dir("xdg");
    std::fs::create_dir(&base).unwrap();
    std::fs::set_permissions(&base, std::fs::Permissions::from_mode(0o700)).unwrap();
    if !on_tmpfs(&base) {
        skip(format!(
            "report_dir: {} is not on tmpfs (no /dev/shm here)",
            base.display()
        ));
        return;
    }
    let state = tmp.join("xdg-state");
    let mut c = leash(&state);
    c.env_remove("LEASH_RUNTIME_DIR")
        .env("XDG_RUNTIME_DIR", &base)
        .arg("--no-daemon");
    let out = exec_exit3(c, "x");
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    assert_eq!(mode(&base.join("leash")), 0o700);
    assert_reported_in(&state, "x", &base.join("leash"), "XDG_RUNTIME_DIR");

    // No XDG_RUNTIME_DIR: the system's default (made here only if missing, and then removed).
    let state = tmp.join("default-state");
    let (out, l) = leaving_the_system_default_as_found(|| {
        let mut c = leash(&state);
        c.env_remove("LEASH_RUNTIME_DIR")
            .env_remove("XDG_RUNTIME_DIR")
            .arg("--no-daemon");
        let out = exec_exit3(c, "y");
        (out, row_of(&state, "y"))
    });
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    match system_default() {
        None => assert!(l["reportDir"].is_null(), "{l}"),
        Some(d) => {
            assert_eq!(l["reportDir"], d.to_str().unwrap(), "{l}");
            assert!(
                !d.join(format!("{}.json", l["leaseId"].as_str().unwrap()))
                    .exists(),
                "the settled lease's report is removed"
            );
        }
    }
    assert_eq!(l["state"], "ended", "{l}");
    assert_eq!(l["exitStatus"], 3, "{l}");
}

/// A default someone else prepared is passed over: another user's `leash` directory (a squatter
/// in a shared tmpfs; root only, to make one), a symlink in its place, a parent others may write
/// (who could swap our directory for a link). Nothing is written there; the report goes to the
/// next choice, and the lease still ends with its status.
#[test]
fn a_squatted_linked_or_exposed_default_is_passed_over() {
    let tmp = TempDir::new("report-dir-squat");
    let mut cases: Vec<(&str, PathBuf)> = Vec::new();
    // A symlink to a private directory of ours.
    let linked = fresh_dir("linked");
    std::fs::create_dir(&linked).unwrap();
    std::fs::set_permissions(&linked, std::fs::Permissions::from_mode(0o700)).unwrap();
    let target = linked.join("target");
    std::fs::create_dir(&target).unwrap();
    std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::os::unix::fs::symlink(&target, linked.join("leash")).unwrap();
    cases.push(("a symlink", linked.clone()));
    // A parent writable by others, without the sticky bit.
    let exposed = fresh_dir("exposed");
    std::fs::create_dir(&exposed).unwrap();
    std::fs::set_permissions(&exposed, std::fs::Permissions::from_mode(0o777)).unwrap();
    cases.push(("a parent others may write", exposed.clone()));
    // Another user's directory.
    let squatted = fresh_dir("squatted");
    if nix::unistd::geteuid().is_root() {
        std::fs::create_dir(&squatted).unwrap();
        std::fs::set_permissions(&squatted, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::create_dir(squatted.join("leash")).unwrap();
        std::fs::set_permissions(
            squatted.join("leash"),
            std::fs::Permissions::from_mode(0o777),
        )
        .unwrap();
        std::os::unix::fs::chown(squatted.join("leash"), Some(65534), Some(65534)).unwrap();
        cases.push(("another user's directory", squatted.clone()));
    } else {
        skip("report_dir: another user's directory needs root to make (chown)");
    }
    for (i, (what, xdg)) in cases.iter().enumerate() {
        let state = tmp.join(&format!("s{i}"));
        let mut c = leash(&state);
        c.env_remove("LEASH_RUNTIME_DIR")
            .env("XDG_RUNTIME_DIR", xdg)
            .arg("--no-daemon");
        // Passed over, the report goes to the system's default.
        let (out, l) = leaving_the_system_default_as_found(|| {
            let out = exec_exit3(c, "q");
            (out, row_of(&state, "q"))
        });
        assert_eq!(out.status.code(), Some(3), "{what}: {out:?}");
        assert_ne!(
            l["reportDir"].as_str().map(Path::new),
            Some(xdg.join("leash").as_path()),
            "{what}: passed over: {l}"
        );
        assert_eq!(l["state"], "ended", "{what}: {l}");
        assert_eq!(l["exitStatus"], 3, "{what}: {l}");
        // Nothing written where it was passed over.
        let inside = if *what == "a symlink" {
            target.clone()
        } else {
            xdg.join("leash")
        };
        assert!(
            reports_in(&inside).is_empty(),
            "{what}: {}",
            inside.display()
        );
        if *what == "a parent others may write" {
            assert!(!xdg.join("leash").exists(), "{what}: nothing made in it");
        }
        if *what == "another user's directory" {
            assert_eq!(std::fs::metadata(xdg.join("leash")).unwrap().uid(), 65534);
            assert_eq!(mode(&xdg.join("leash")), 0o777, "{what}: left as it was");
        }
    }
}

/// An explicit `LEASH_RUNTIME_DIR` that cannot be used is an error at the edge: a clear message,
/// nothing started, no lease.
#[test]
fn an_unusable_leash_runtime_dir_is_refused_and_nothing_starts() {
    let tmp = TempDir::new("report-dir-refused");
    let file = tmp.join("a-file");
    std::fs::write(&file, b"x").unwrap();
    let real = tmp.join("real");
    std::fs::create_dir(&real).unwrap();
    let link = tmp.join("link");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    let mut cases: Vec<(&str, PathBuf, &str)> = vec![
        ("relative", PathBuf::from("rel/dir"), "not an absolute path"),
        ("a file", file, "not a directory"),
        ("a symlink", link, "symbolic link"),
        ("no parent", tmp.join("no/such/parent"), "No such file"),
    ];
    let foreign = tmp.join("foreign");
    if nix::unistd::geteuid().is_root() {
        std::fs::create_dir(&foreign).unwrap();
        std::os::unix::fs::chown(&foreign, Some(65534), Some(65534)).unwrap();
        cases.push(("another user's", foreign, "owned by uid 65534"));
    } else {
        skip("report_dir: another user's directory needs root to make (chown)");
    }
    for (i, (what, dir, says)) in cases.iter().enumerate() {
        for door in ["leash", "--no-daemon"] {
            let state = tmp.join(&format!("s{i}-{}", door.replace(' ', "-")));
            let ran = tmp.join(&format!("ran{i}"));
            let mut c = leash(&state);
            if door == "--no-daemon" {
                c.arg("--no-daemon");
            }
            let out = c
                .env("LEASH_RUNTIME_DIR", dir)
                .args(["exec", "--session", "r", "--", "touch"])
                .arg(&ran)
                .stdin(Stdio::null())
                .output()
                .unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(125), "{what} ({door}): {err}");
            assert!(
                err.contains("LEASH_RUNTIME_DIR") && err.contains(says),
                "{what} ({door}): {err}"
            );
            assert!(!ran.exists(), "{what} ({door}): nothing ran");
            assert!(db_leases(&state).is_empty(), "{what} ({door}): no lease");
        }
    }
    assert!(
        std::fs::read_dir(&real).unwrap().next().is_none(),
        "nothing written through the link"
    );
}

/// The row's `report_dir` is a claim. A forged one (a directory others may read, or a symlink)
/// is neither read (its forged end record is not folded into the row) nor written nor cleaned:
/// the decoy file in it survives the lease's close.
#[test]
fn a_forged_report_dir_is_neither_read_nor_removed() {
    let tmp = TempDir::new("report-dir-forged");
    let decoys = tmp.join("decoys");
    std::fs::create_dir(&decoys).unwrap();
    std::fs::set_permissions(&decoys, std::fs::Permissions::from_mode(0o755)).unwrap();
    let private = tmp.join("private");
    std::fs::create_dir(&private).unwrap();
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700)).unwrap();
    let linked = tmp.join("linked");
    std::os::unix::fs::symlink(&private, &linked).unwrap();
    for (i, (what, forged, holds)) in [
        ("a directory others may read", &decoys, &decoys),
        ("a symlink", &linked, &private),
    ]
    .into_iter()
    .enumerate()
    {
        let state = tmp.join(&format!("s{i}"));
        let mut guard = Guard::new();
        let mut cmd = leash(&state);
        cmd.args(["--no-daemon", "exec"]);
        let (wrapper, l) = sleeping_lease(&mut guard, cmd, &state, "f");
        let id = l["leaseId"].as_str().unwrap().to_string();
        // A forged end record naming the lease's own wrapper, where the forged row points.
        let decoy = holds.join(format!("{id}.json"));
        let forged_record = format!(
            "{{\"wrapperPid\":{},\"wrapperStartTime\":{},\"adapterPid\":null,\"adapterStartTime\":null,\"processGroupId\":null,\"exitStatus\":99,\"endReason\":\"adapter-exited\",\"startError\":null}}\n",
            l["rootPid"], l["rootStartTime"]
        );
        std::fs::write(&decoy, &forged_record).unwrap();
        tamper_with(&state, &id, "report_dir = ?2", &[&forged.to_str().unwrap()]);
        let l = row_of(&state, "f");
        assert_eq!(l["reportDir"], forged.to_str().unwrap(), "{what}: {l}");
        assert!(
            l["exitStatus"].is_null(),
            "{what}: the forged end was not read: {l}"
        );
        let out = run(
            &state,
            &[
                "--no-daemon",
                "close",
                "--session",
                "f",
                "--grace-ms",
                "100",
            ],
        );
        assert_eq!(out.code, Some(0), "{what}: {}", out.stderr);
        assert!(
            wait_for(|| !wrapper.alive()),
            "{what}: the close took it down"
        );
        assert_eq!(
            std::fs::read_to_string(&decoy).unwrap(),
            forged_record,
            "{what}: the decoy is left as it was"
        );
    }
}

/// A database of before the column (schema 6): its rows name no reports directory, and their
/// reports are read and removed in `run/`, as before.
#[test]
fn rows_of_an_older_schema_keep_their_reports_in_run() {
    let tmp = TempDir::new("report-dir-migration");
    let state = tmp.join("state");
    let mut guard = Guard::new();
    // The wrapper writes where a leash of schema 6 had it write: `run/`.
    std::fs::create_dir_all(state.join("run")).unwrap();
    for d in [&state, &state.join("run")] {
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o700)).unwrap();
    }
    let mut cmd = leash(&state);
    cmd.env("LEASH_RUNTIME_DIR", state.join("run"))
        .args(["--no-daemon", "exec"]);
    let (wrapper, l) = sleeping_lease(&mut guard, cmd, &state, "m");
    let id = l["leaseId"].as_str().unwrap().to_string();
    let in_run = state.join("run").join(format!("{id}.json"));
    assert!(in_run.exists());
    // Back to schema 6: the column gone.
    let db = rusqlite::Connection::open(state.join("leash.db")).unwrap();
    db.busy_timeout(std::time::Duration::from_secs(10)).unwrap();
    db.execute_batch("ALTER TABLE leases DROP COLUMN report_dir; PRAGMA user_version = 6;")
        .unwrap();
    drop(db);
    let l = row_of(&state, "m");
    assert!(l["reportDir"].is_null(), "{l}");
    let out = run(
        &state,
        &[
            "--no-daemon",
            "close",
            "--session",
            "m",
            "--grace-ms",
            "100",
        ],
    );
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert!(wait_for(|| !wrapper.alive()));
    let l = row_of(&state, "m");
    assert!(
        l["exitStatus"].is_number(),
        "the wrapper's end, written to the report in run/ it was given, was read: {l}"
    );
    assert!(
        !in_run.exists(),
        "the settled lease's report in run/ is removed"
    );
}

/// A client whose mounts are not the daemon's (here a private `/dev/shm` in a mount namespace of
/// its own) names a reports directory the daemon would find elsewhere: the daemon's `exec` op
/// answers `direct`, and the client commits the lease itself. Root only (a mount namespace).
#[test]
fn a_client_in_other_mounts_commits_its_lease_itself() {
    if !nix::unistd::geteuid().is_root() {
        skip("report_dir: a mount namespace of the client's own needs root");
        return;
    }
    let Some(unshare) = ["/usr/bin/unshare", "/bin/unshare"]
        .into_iter()
        .map(Path::new)
        .find(|p| p.exists())
    else {
        skip("report_dir: no unshare(1) here");
        return;
    };
    let tmp = TempDir::new("report-dir-mounts");
    let state = tmp.join("state");
    // The same path in both views: the daemon's is the test binary's directory, the client's a
    // directory of the same name on its own tmpfs.
    let dir = fresh_dir("mounts");
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    let mut daemon = Daemon::start_logging(&state, &[], "debug");
    let script = r#"set -e
mount -t tmpfs -o mode=1777 leash-test /dev/shm
mkdir -p -m 700 "$3"
LEASH_RUNTIME_DIR="$3" exec "$0" --state-dir "$1" exec --session "$2" -- sh -c 'exit 3'"#;
    let out = Command::new(unshare)
        .args(["--mount", "--propagation", "private", "sh", "-c", script])
        .arg(leash_bin())
        .arg(&state)
        .arg("u")
        .arg(&dir)
        .env_remove("LEASH_STATE_DIR")
        .env_remove("LEASH_LOG")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    let log = daemon.log_text();
    assert!(
        log.contains("exec: the client commits directly") && log.contains("sees other mounts"),
        "{log}"
    );
    assert!(
        !log.contains("exec: lease committed for the peer"),
        "the daemon committed nothing: {log}"
    );
    let l = row_of(&state, "u");
    assert_eq!(l["reportDir"], dir.to_str().unwrap(), "{l}");
    assert!(
        reports_in(&dir).is_empty(),
        "the client's report went to its own /dev/shm, not the daemon's"
    );
    assert!(daemon.terminate().success());
}
