//! Helpers of the live-upgrade tests (`tests/daemon_upgrade*.rs`): other builds of leash without
//! a rebuild, and a session that counts on its stdout and writes down any signal it gets.
//!
//! Another build is a copy of the binary cargo built whose build marker — a fixed-length field
//! in the binary's data, `LEASH-BUILD-MARKER:` and 32 bytes (src/daemon/version.rs) — is
//! replaced byte for byte: the copy is the same program and reports the package version with
//! `+MARKER`, so a test can tell which program serves. leash-wrap is copied beside it (leash
//! finds its wrapper next to itself).
#![allow(dead_code)]

use crate::common::*;
use crate::daemon_support::*;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

const MARKER_PREFIX: &[u8] = b"LEASH-BUILD-MARKER:";
const MARKER_LEN: usize = 32;

/// A copy of leash (and leash-wrap beside it) in `dir` whose build marker is `marker`.
pub fn build_copy(dir: &Path, marker: &str) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let mut bin = std::fs::read(leash_bin()).unwrap();
    let at = bin
        .windows(MARKER_PREFIX.len())
        .position(|w| w == MARKER_PREFIX)
        .expect("the binary has a build marker");
    assert!(
        !bin[at + 1..]
            .windows(MARKER_PREFIX.len())
            .any(|w| w == MARKER_PREFIX),
        "the build marker is found once"
    );
    assert!(marker.len() <= MARKER_LEN);
    let field = &mut bin[at + MARKER_PREFIX.len()..at + MARKER_PREFIX.len() + MARKER_LEN];
    field.fill(0);
    field[..marker.len()].copy_from_slice(marker.as_bytes());
    let leash = dir.join("leash");
    std::fs::write(&leash, &bin).unwrap();
    let wrap = dir.join("leash-wrap");
    std::fs::copy(wrap_bin(), &wrap).unwrap();
    for p in [&leash, &wrap] {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    leash
}

/// The package version as the daemon reports it, with `+marker` for a copy.
pub fn version(marker: Option<&str>) -> String {
    let v = env!("CARGO_PKG_VERSION");
    marker.map_or(v.to_string(), |m| format!("{v}+{m}"))
}

/// A session's adapter: prints 1, 2, 3, … (a line every millisecond or so) and writes any
/// catchable signal it gets to `signals` before it exits.
pub fn ensure_counter(c: &mut Conn, session: &str, signals: &Path) -> Value {
    let body = format!(
        "trap 'echo \"$$ got a signal\" >> {}; exit 1' TERM INT HUP USR1 USR2\ni=0\nwhile :; do i=$((i+1)); echo $i; case $i in *0) sleep 0.01;; esac; done",
        signals.display()
    );
    c.call(
        "ensure",
        json!({"session": session, "argv": ["sh", "-c", body], "graceMs": 500}),
    )
}

/// The daemon's part of `status`.
pub fn daemon_status(c: &mut Conn) -> Value {
    c.call("status", json!({}))["daemon"].clone()
}

/// Reads `n` more output lines of attach `id` and checks that they go on from `last` with no
/// hole and no repeat (and seqs that only go up); returns the last number and seq.
pub fn follow(c: &mut Conn, id: &Value, mut last: u64, mut seq: i64, n: u64) -> (u64, i64) {
    let until = last + n;
    while last < until {
        let item = c.next_item(id);
        assert_ne!(item["type"], "gap", "{item}");
        assert_ne!(item["type"], "end", "{item}");
        if let Some(s) = item["seq"].as_i64() {
            assert!(s > seq, "seq {s} after {seq}");
            seq = s;
        }
        if item["type"] == "output" {
            let k: u64 = item["line"].as_str().unwrap().parse().unwrap();
            assert_eq!(k, last + 1, "line {k} after {last}");
            last = k;
        }
    }
    (last, seq)
}

/// The sessions of `status` as `(key, phase, wrapper pid)`, sorted.
pub fn sessions(c: &mut Conn) -> Vec<(String, String, i64)> {
    let d = daemon_status(c);
    let mut v: Vec<(String, String, i64)> = d["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["sessionKey"].as_str().unwrap().to_string(),
                s["phase"].as_str().unwrap().to_string(),
                s["rootPid"].as_i64().unwrap_or(0),
            )
        })
        .collect();
    v.sort();
    v
}

/// What a handoff, done or refused, keeps: every session as it was (`before`: same phase, same
/// wrapper), each of `leases` open.
pub fn assert_kept(c: &mut Conn, before: &[(String, String, i64)], leases: &[Value]) {
    assert_eq!(
        sessions(c),
        before,
        "every session kept, running, same wrapper"
    );
    for lease in leases {
        let row = lease_row(c, lease.as_str().unwrap());
        assert_eq!(row["state"], "open", "{row}");
    }
}

/// No adapter of the counting sessions got a signal (each writes one down in `signals`).
pub fn assert_unsignalled(signals: &Path) {
    assert!(
        !signals.exists(),
        "an adapter got a signal: {}",
        std::fs::read_to_string(signals).unwrap_or_default()
    );
}
