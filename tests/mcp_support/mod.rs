//! Helpers for the `leash mcp` tests (`tests/mcp_*.rs`): a raw stdio client that starts `leash
//! mcp` and reads its stdout line by line with a deadline (for the framing tests and the
//! property test), and the official MCP Python SDK, installed on first use into a virtualenv
//! under `target/venv-mcp` (serialised across test threads and processes with a file lock), so
//! `cargo test --workspace` needs nothing installed beforehand but python3 (itself installed
//! with apt-get when missing and we are root).
#![allow(dead_code)]

use crate::common::*;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::Duration;

/// The PyPI package and version the SDK tests are written against.
pub const SDK: &str = "mcp==2.3.0";

/// `initialize` as a client sends it.
pub fn initialize(id: u64, version: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "initialize", "params": {
        "protocolVersion": version, "capabilities": {},
        "clientInfo": {"name": "leash-tests", "version": "0"}}})
}

/// A `tools/call` request.
pub fn tool_call(id: u64, name: &str, arguments: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
           "params": {"name": name, "arguments": arguments}})
}

/// A running `leash mcp`. Every stdout line is read by a thread and kept as raw bytes, so a test
/// can check that stdout carried nothing but JSON-RPC. Dropping it kills the server if it still
/// runs.
pub struct McpProc {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<Vec<u8>>,
    /// Every line read so far, raw.
    pub seen: Vec<Vec<u8>>,
}

impl McpProc {
    pub fn start(state: &Path, args: &[&str]) -> McpProc {
        let mut child = leash(state)
            .arg("mcp")
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start leash mcp");
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut r = BufReader::new(stdout);
            loop {
                let mut line = Vec::new();
                match r.read_until(b'\n', &mut line) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {
                        if tx.send(line).is_err() {
                            break;
                        }
                    }
                }
            }
        });
        // stderr is drained so the server never blocks on it; it is logging only.
        let mut stderr = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            let _ = std::io::copy(&mut stderr, &mut std::io::sink());
        });
        let stdin = child.stdin.take();
        McpProc {
            child,
            stdin,
            lines: rx,
            seen: Vec::new(),
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn send_raw(&mut self, bytes: &[u8]) {
        self.stdin
            .as_mut()
            .expect("stdin still open")
            .write_all(bytes)
            .expect("write to leash mcp");
    }

    pub fn send(&mut self, msg: &Value) {
        let mut line = serde_json::to_vec(msg).unwrap();
        line.push(b'\n');
        self.send_raw(&line);
    }

    /// The next stdout line as JSON; panics after [`PATIENCE`] or when stdout is not JSON.
    pub fn next(&mut self) -> Value {
        let line = match self.lines.recv_timeout(PATIENCE) {
            Ok(l) => l,
            Err(e) => panic!(
                "no line from leash mcp ({e:?}); seen so far: {:?}",
                self.seen_text()
            ),
        };
        self.seen.push(line.clone());
        assert_eq!(line.last(), Some(&b'\n'), "unterminated line");
        serde_json::from_slice(&line).unwrap_or_else(|e| {
            panic!(
                "stdout line is not JSON ({e}): {}",
                String::from_utf8_lossy(&line)
            )
        })
    }

    /// Sends a request and returns the next line (which must be its response).
    pub fn request(&mut self, msg: &Value) -> Value {
        self.send(msg);
        let r = self.next();
        assert_eq!(r["id"], msg["id"], "response out of order: {r}");
        r
    }

    /// Nothing more on stdout within `d` (used after notifications, bracketed by a ping).
    pub fn quiet_for(&mut self, d: Duration) -> bool {
        match self.lines.recv_timeout(d) {
            Ok(l) => {
                self.seen.push(l);
                false
            }
            Err(RecvTimeoutError::Timeout) => true,
            Err(RecvTimeoutError::Disconnected) => true,
        }
    }

    /// Closes stdin (EOF) and returns the exit code, waiting at most [`PATIENCE`].
    pub fn close_and_wait(&mut self) -> Option<i32> {
        drop(self.stdin.take());
        let mut status = None;
        let ok = wait_for(|| {
            status = self.child.try_wait().unwrap();
            status.is_some()
        });
        assert!(ok, "leash mcp did not exit after EOF");
        // Whatever it wrote before exiting.
        while let Ok(l) = self.lines.recv_timeout(Duration::from_millis(200)) {
            self.seen.push(l);
        }
        status.unwrap().code()
    }

    fn seen_text(&self) -> Vec<String> {
        self.seen
            .iter()
            .map(|l| String::from_utf8_lossy(l).into_owned())
            .collect()
    }

    /// Every stdout line so far was one JSON-RPC 2.0 message.
    pub fn assert_pure_jsonrpc(&self) {
        for l in &self.seen {
            let v: Value = serde_json::from_slice(l)
                .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(l)));
            assert_eq!(v["jsonrpc"], "2.0", "{v}");
            assert!(v.get("id").is_some(), "{v}");
            assert!(v.get("result").is_some() ^ v.get("error").is_some(), "{v}");
        }
    }
}

impl Drop for McpProc {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

/// Runs one `leash mcp` to completion: the given lines on stdin, then EOF. Returns the parsed
/// stdout lines and the exit code.
pub fn mcp_once(state: &Path, args: &[&str], input: &[Value]) -> (Vec<Value>, Option<i32>) {
    let mut p = McpProc::start(state, args);
    let mut bytes = Vec::new();
    for m in input {
        bytes.extend(serde_json::to_vec(m).unwrap());
        bytes.push(b'\n');
    }
    p.send_raw(&bytes);
    let code = p.close_and_wait();
    p.assert_pure_jsonrpc();
    let out = p
        .seen
        .iter()
        .map(|l| serde_json::from_slice(l).unwrap())
        .collect();
    (out, code)
}

/// `target/` of this build (the leash binary is `target/<profile>/leash`).
fn target_dir() -> PathBuf {
    leash_bin()
        .parent()
        .and_then(Path::parent)
        .expect("target dir")
        .to_path_buf()
}

/// The venv's python with the MCP SDK installed, installing it on first use.
pub fn python_sdk() -> PathBuf {
    let target = target_dir();
    let venv = target.join("venv-mcp");
    let python = venv.join("bin/python");
    let marker = venv.join(format!(".installed-{SDK}"));
    let lock_file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(target.join("venv-mcp.lock"))
        .expect("open the venv lock");
    // Held until this function returns: another test (thread or process) installing waits.
    assert_eq!(
        unsafe { libc::flock(lock_file.as_raw_fd(), libc::LOCK_EX) },
        0,
        "flock the venv lock"
    );
    if marker.is_file() && python.is_file() {
        return python;
    }
    eprintln!(
        "mcp tests: installing the MCP Python SDK ({SDK}) into {}",
        venv.display()
    );
    ensure_python3();
    let _ = std::fs::remove_dir_all(&venv);
    let ok = Command::new("python3")
        .args(["-m", "venv"])
        .arg(&venv)
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        apt_install(&["python3-venv"]);
        let _ = std::fs::remove_dir_all(&venv);
        let st = Command::new("python3")
            .args(["-m", "venv"])
            .arg(&venv)
            .status()
            .expect("run python3 -m venv");
        assert!(st.success(), "python3 -m venv {} failed", venv.display());
    }
    let st = Command::new(venv.join("bin/pip"))
        .args(["install", "--quiet", "--disable-pip-version-check", SDK])
        .status()
        .expect("run pip");
    assert!(
        st.success(),
        "pip install {SDK} failed (is PyPI reachable?)"
    );
    std::fs::write(&marker, SDK).unwrap();
    python
}

fn ensure_python3() {
    let present = Command::new("python3")
        .arg("--version")
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !present {
        apt_install(&["python3", "python3-venv"]);
    }
}

fn apt_install(pkgs: &[&str]) {
    assert!(
        is_root(),
        "the MCP SDK tests need {pkgs:?}; install them (apt-get install {}) or run as root",
        pkgs.join(" ")
    );
    let st = Command::new("apt-get").arg("update").status();
    assert!(st.is_ok_and(|s| s.success()), "apt-get update failed");
    let st = Command::new("apt-get")
        .args(["install", "-y", "--no-install-recommends"])
        .args(pkgs)
        .env("DEBIAN_FRONTEND", "noninteractive")
        .status();
    assert!(
        st.is_ok_and(|s| s.success()),
        "apt-get install {pkgs:?} failed"
    );
}

/// Runs the SDK driver (`tests/mcp_sdk/drive.py`) on a plan and returns what it printed.
pub fn drive_sdk(dir: &Path, plan: &Value) -> Value {
    let python = python_sdk();
    let plan_path = dir.join(format!("plan-{}.json", uuid::Uuid::new_v4().simple()));
    std::fs::write(&plan_path, serde_json::to_vec(plan).unwrap()).unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp_sdk/drive.py");
    let out = Command::new(python)
        .arg(&script)
        .arg(&plan_path)
        .stdin(Stdio::null())
        .output()
        .expect("run the SDK driver");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the SDK driver failed ({}):\n{stderr}",
        out.status
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(stdout.trim())
        .unwrap_or_else(|e| panic!("driver output is not JSON ({e}): {stdout}\n{stderr}"))
}
