//! The daemon checks each peer's uid (SO_PEERCRED) against its own. The socket is 0600, so another
//! user cannot even connect — except root, or when someone loosens the mode; this test loosens it
//! and connects as `nobody`, which the daemon refuses with `forbidden`. Needs root (to run the
//! client as another user); skipped otherwise.
mod common;
mod daemon_support;
use common::*;
use daemon_support::*;
use serde_json::json;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;

#[test]
fn a_peer_of_another_uid_is_refused() {
    if !is_root() {
        common::skip("needs root to connect as another user");
        return;
    }
    let tmp = TempDir::new("d-peer");
    let state = tmp.join("state");
    let sockdir = tmp.join("sock");
    std::fs::create_dir(&sockdir).unwrap();
    for d in [tmp.path(), sockdir.as_path()] {
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let socket = sockdir.join("leash.sock");
    let daemon = Daemon::start(&state, &["--socket", socket.to_str().unwrap()]);
    std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o666)).unwrap();

    let out = std::process::Command::new("perl")
        .args([
            "-MIO::Socket::UNIX",
            "-e",
            // The daemon may refuse (and hang up) before the request is written: no SIGPIPE.
            r#"$SIG{PIPE} = 'IGNORE';
               my $s = IO::Socket::UNIX->new(Peer => $ARGV[0]) or die "connect: $!\n";
               print $s qq({"id":1,"op":"status"}\n); my $l = <$s>; print $l;"#,
            socket.to_str().unwrap(),
        ])
        .uid(65534)
        .gid(65534)
        .output()
        .expect("run perl as nobody");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let reply: serde_json::Value =
        serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("no reply ({e}): {stdout}"));
    assert_eq!(reply["ok"], false, "{reply}");
    assert_eq!(reply["error"]["code"], "forbidden", "{reply}");
    assert!(
        reply["error"]["message"]
            .as_str()
            .unwrap()
            .contains("uid 65534"),
        "{reply}"
    );
    assert!(
        !stdout.contains("gatewayInstanceId"),
        "status leaked: {stdout}"
    );

    // Its own user is served.
    let st = daemon.connect().call("status", json!({}));
    assert_eq!(st["daemon"]["pid"], daemon.pid.pid);
}
