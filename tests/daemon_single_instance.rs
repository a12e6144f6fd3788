//! The daemon's socket is 0600, a second daemon on the same state root is refused with a clear
//! message (and leaves the first one's socket alone), and a clean SIGTERM exits 0 and removes the
//! socket.
mod common;
mod daemon_support;
use common::*;
use daemon_support::*;
use serde_json::json;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};

#[test]
fn one_daemon_per_state_root_on_a_private_socket() {
    let tmp = TempDir::new("d-single");
    let state = tmp.join("state");
    let mut first = Daemon::start(&state, &[]);

    let meta = std::fs::symlink_metadata(&first.socket).unwrap();
    assert!(meta.file_type().is_socket());
    assert_eq!(meta.permissions().mode() & 0o777, 0o600, "socket mode");

    // A second daemon on the same root, even on another socket path, is refused.
    let other_socket = tmp.join("other.sock");
    for args in [vec![], vec!["--socket", other_socket.to_str().unwrap()]] {
        let out = serve_once(&state, &args);
        assert_eq!(out.code, Some(3), "second daemon {args:?}: {}", out.stderr);
        assert!(
            out.stderr.contains("already serves state root")
                && out.stderr.contains(&first.pid.pid.to_string()),
            "unclear refusal: {}",
            out.stderr
        );
    }
    assert!(!other_socket.exists(), "the refused daemon bound a socket");

    // The first one still serves, on its socket.
    let mut c = first.connect();
    let st = c.call("status", json!({}));
    assert_eq!(st["daemon"]["pid"], first.pid.pid);
    drop(c);

    let status = first.terminate();
    assert_eq!(status.code(), Some(0), "clean exit:\n{}", first.log_text());
    assert!(
        !first.socket.exists(),
        "socket left behind after a clean exit"
    );

    // With the first one gone, a new daemon starts.
    let mut again = Daemon::start(&state, &[]);
    assert_eq!(again.terminate().code(), Some(0));
}
