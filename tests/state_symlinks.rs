//! leash follows no symlink inside its state root. A symlinked `wrappers/` or `run/` is refused
//! (its target is not chmodded, nothing is installed there), a symlinked `leash.db` (or
//! `-wal`/`-shm`) is refused without turning its target into a database, and a client trusts a
//! socket only if its path is not a symlink and its peer is the daemon recorded in `daemon.lock`
//! (`SO_PEERCRED`).
mod common;
mod daemon_support;
use common::*;
use daemon_support::*;
use serde_json::Value;
use std::os::unix::fs::{symlink, PermissionsExt};

fn exec_true(state: &std::path::Path) -> Output {
    run(state, &["exec", "--session", "s", "--", "true"])
}

#[test]
fn symlinked_directories_inside_the_state_root_are_refused() {
    for sub in ["wrappers", "run"] {
        let tmp = TempDir::new("symlink-dir");
        let state = tmp.join("state");
        std::fs::create_dir_all(&state).unwrap();
        let target = tmp.join("elsewhere");
        std::fs::create_dir_all(&target).unwrap();
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o755)).unwrap();
        symlink(&target, state.join(sub)).unwrap();
        let out = exec_true(&state);
        assert_eq!(out.code, Some(125), "{sub}: {}", out.stderr);
        assert!(
            out.stderr.contains("symbolic link"),
            "{sub}: {}",
            out.stderr
        );
        let mode = std::fs::metadata(&target).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o755, "{sub}: the link's target was chmodded");
        assert_eq!(
            std::fs::read_dir(&target).unwrap().count(),
            0,
            "{sub}: something was put in the link's target"
        );
    }
}

#[test]
fn a_symlinked_database_is_refused_and_its_target_left_alone() {
    for name in ["leash.db", "leash.db-wal", "leash.db-shm"] {
        let tmp = TempDir::new("symlink-db");
        let state = tmp.join("state");
        std::fs::create_dir_all(&state).unwrap();
        let precious = tmp.join("precious.txt");
        std::fs::write(&precious, b"not a database\n").unwrap();
        symlink(&precious, state.join(name)).unwrap();
        let out = exec_true(&state);
        assert_eq!(out.code, Some(125), "{name}: {}", out.stderr);
        assert!(
            out.stderr.contains("symbolic link"),
            "{name}: {}",
            out.stderr
        );
        assert_eq!(
            std::fs::read(&precious).unwrap(),
            b"not a database\n",
            "{name}: the link's target was changed"
        );
    }
}

#[test]
fn a_symlinked_socket_is_not_trusted() {
    let tmp = TempDir::new("symlink-sock");
    let a = tmp.join("a");
    let b = tmp.join("b");
    let _daemon = Daemon::start(&a, &[]);
    // Root b exists (its own database), and its socket path is a link to a's daemon.
    assert_eq!(exec_true(&b).code, Some(0));
    symlink(a.join("leash.sock"), b.join("leash.sock")).unwrap();
    let out = run(&b, &["status", "--json"]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let v: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(
        v["stateDir"].as_str().map(std::path::PathBuf::from),
        Some(std::fs::canonicalize(&b).unwrap()),
        "answered by another root's daemon through a link: {v}"
    );
    assert!(v.get("daemon").is_none(), "{v}");
    let out = run(
        &b,
        &["--socket", b.join("leash.sock").to_str().unwrap(), "status"],
    );
    assert_ne!(out.code, Some(0));
    assert!(out.stderr.contains("symbolic link"), "{}", out.stderr);
}

#[test]
fn a_socket_whose_peer_is_not_the_recorded_daemon_is_not_trusted() {
    use std::io::{BufRead, BufReader, Write};
    let tmp = TempDir::new("impostor");
    let state = tmp.join("state");
    let _daemon = Daemon::start(&state, &[]);
    let canonical = std::fs::canonicalize(&state).unwrap();
    // An impostor (this test process) on another socket, answering every request with a
    // status that claims this state root.
    let fake = tmp.join("fake.sock");
    let listener = std::os::unix::net::UnixListener::bind(&fake).unwrap();
    let answer = serde_json::json!({"stateDir": canonical}).to_string();
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            let mut w = conn.try_clone().unwrap();
            for line in BufReader::new(conn).lines().map_while(Result::ok) {
                let v: Value = serde_json::from_str(&line).unwrap_or_default();
                let reply = format!("{{\"id\":{},\"ok\":true,\"result\":{answer}}}\n", v["id"]);
                if w.write_all(reply.as_bytes()).is_err() {
                    break;
                }
            }
        }
    });
    let out = run(&state, &["--socket", fake.to_str().unwrap(), "leases"]);
    assert_ne!(out.code, Some(0), "{}", out.stdout);
    assert!(
        out.stderr.contains("not the daemon pid"),
        "the impostor was trusted: {}",
        out.stderr
    );
}
