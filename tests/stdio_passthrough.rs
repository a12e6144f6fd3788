//! Stdin/stdout pass straight through `leash exec`, byte for byte; nothing of leash's own reaches
//! stdout, and on the happy path nothing reaches stderr either.
mod common;
use common::*;
use std::io::{Read, Write};
use std::process::Stdio;

#[test]
fn ten_megabytes_of_random_bytes_arrive_unchanged() {
    let tmp = TempDir::new("stdio");
    let state = tmp.join("state");
    // 10 MiB + 7 bytes of pseudo-random data (xorshift), ending without a newline.
    let mut data = Vec::with_capacity(10 * 1024 * 1024 + 7);
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    while data.len() < 10 * 1024 * 1024 + 7 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        data.extend_from_slice(&x.to_le_bytes());
    }
    data.truncate(10 * 1024 * 1024 + 7);
    if data.last() == Some(&b'\n') {
        *data.last_mut().unwrap() = b'x';
    }
    let mut guard = Guard::new();
    let child = guard.child(
        leash(&state)
            .args(["exec", "--session", "cat", "--", "cat"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let input = data.clone();
    let writer = std::thread::spawn(move || {
        stdin.write_all(&input).unwrap();
        // dropping stdin closes it: cat sees EOF
    });
    let err_reader = std::thread::spawn(move || {
        let mut e = Vec::new();
        stderr.read_to_end(&mut e).unwrap();
        e
    });
    let mut got = Vec::new();
    stdout.read_to_end(&mut got).unwrap();
    writer.join().unwrap();
    let err = err_reader.join().unwrap();
    let status = child.wait().unwrap();
    assert!(status.success(), "{status:?}");
    assert_eq!(got.len(), data.len());
    assert!(got == data, "bytes changed on the way through");
    assert!(
        err.is_empty(),
        "stderr not empty: {}",
        String::from_utf8_lossy(&err)
    );
}

#[test]
fn failing_exec_says_why_on_stderr_and_nothing_on_stdout() {
    let tmp = TempDir::new("stdio-fail");
    let out = run(&tmp.join("state"), &["exec", "--", "/nonexistent/adapter"]);
    assert_eq!(out.code, Some(127));
    assert!(out.stdout.is_empty(), "stdout: {}", out.stdout);
    assert!(out.stderr.contains("leash-wrap["), "{}", out.stderr);
    assert!(
        out.stderr
            .contains("the adapter could not be started: /nonexistent/adapter: not found"),
        "{}",
        out.stderr
    );
    assert_eq!(out.stderr.lines().count(), 1, "one line: {}", out.stderr);
}
