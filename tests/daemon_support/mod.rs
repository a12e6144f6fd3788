//! Helpers for the daemon's live tests (`tests/daemon_*.rs`): start a `leash serve` the test
//! owns (its stderr kept in a log file that failing tests print), talk to it over its socket
//! with a small NDJSON client, and the adapter scripts the tests run under it.
#![allow(dead_code)]

use crate::common::*;
use serde_json::{json, Value};
use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::Duration;

/// A `leash serve` started by the test. Dropping it SIGKILLs the daemon if it still runs (its
/// wrappers then take their adapters down).
pub struct Daemon {
    pub state: PathBuf,
    pub socket: PathBuf,
    pub log: PathBuf,
    pub pid: Pid,
    child: Option<Child>,
}

impl Daemon {
    /// Starts `leash --state-dir STATE serve ARGS…` and waits until its socket answers.
    pub fn start(state: &Path, args: &[&str]) -> Daemon {
        Daemon::start_logging(state, args, "info")
    }

    /// [`Daemon::start`] with another log filter (`debug` logs every request).
    pub fn start_logging(state: &Path, args: &[&str], filter: &str) -> Daemon {
        Daemon::start_with_env(state, args, filter, &[])
    }

    /// [`Daemon::start_logging`] with variables added to the daemon's environment.
    pub fn start_with_env(
        state: &Path,
        args: &[&str],
        filter: &str,
        env: &[(&str, &str)],
    ) -> Daemon {
        let log = unique_log(state);
        let child = spawn_serve(state, args, &log, filter, env);
        let pid = Pid::of(child.id() as i32).expect("daemon started");
        let mut d = Daemon {
            state: state.to_path_buf(),
            socket: state.join("leash.sock"),
            log,
            pid,
            child: Some(child),
        };
        if let Some(i) = args.iter().position(|a| *a == "--socket") {
            d.socket = PathBuf::from(args[i + 1]);
        }
        let socket = d.socket.clone();
        let lock = state.join("daemon.lock");
        // Ready: the daemon records itself in the lock file once its socket is bound and set up.
        let ok = wait_for(|| {
            if let Some(status) = d.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("leash serve exited early ({status}):\n{}", d.log_text());
            }
            let recorded = std::fs::read_to_string(&lock)
                .ok()
                .and_then(|t| serde_json::from_str::<Value>(&t).ok())
                .is_some_and(|v| v["pid"] == pid.pid);
            recorded && UnixStream::connect(&socket).is_ok()
        });
        assert!(ok, "daemon never listened:\n{}", d.log_text());
        d
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn connect(&self) -> Conn {
        Conn::open(&self.socket)
    }

    /// Sends SIGTERM and waits for the exit status.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        signal(self.pid, libc::SIGTERM);
        self.wait()
    }

    /// Sends SIGKILL and waits for it to be gone.
    pub fn kill9(&mut self) {
        signal(self.pid, libc::SIGKILL);
        self.wait();
    }

    pub fn wait(&mut self) -> std::process::ExitStatus {
        let mut child = self.child.take().expect("daemon not waited for yet");
        let mut status = None;
        let ok = wait_for(|| {
            status = child.try_wait().unwrap();
            status.is_some()
        });
        assert!(ok, "daemon did not exit:\n{}", self.log_text());
        status.unwrap()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            if self.pid.alive() {
                signal(self.pid, libc::SIGKILL);
            }
            let _ = c.wait();
        }
        if std::thread::panicking() {
            eprintln!(
                "--- daemon log ({}) ---\n{}",
                self.log.display(),
                self.log_text()
            );
        }
    }
}

fn unique_log(state: &Path) -> PathBuf {
    let dir = state.parent().unwrap_or(state);
    for i in 0.. {
        let p = dir.join(format!("serve-{i}.log"));
        if !p.exists() {
            return p;
        }
    }
    unreachable!()
}

fn spawn_serve(
    state: &Path,
    args: &[&str],
    log: &Path,
    filter: &str,
    env: &[(&str, &str)],
) -> Child {
    let log_file = std::fs::File::create(log).unwrap();
    leash(state)
        .arg("serve")
        .args(args)
        .env("LEASH_LOG", filter)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log_file)
        .spawn()
        .expect("start leash serve")
}

/// Runs `leash --state-dir STATE serve ARGS…` expecting it to exit by itself (a refused start).
pub fn serve_once(state: &Path, args: &[&str]) -> Output {
    let out = leash(state)
        .arg("serve")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run leash serve");
    Output {
        code: out.status.code(),
        signal: None,
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// A client connection. Replies are matched by id; stream items that arrive meanwhile are kept
/// for [`Conn::next_item`].
pub struct Conn {
    pub stream: UnixStream,
    reader: BufReader<UnixStream>,
    queued: VecDeque<Value>,
    next_id: u64,
}

impl Conn {
    pub fn open(socket: &Path) -> Conn {
        let stream = UnixStream::connect(socket)
            .unwrap_or_else(|e| panic!("connect {}: {e}", socket.display()));
        stream
            .set_read_timeout(Some(PATIENCE))
            .expect("read timeout");
        let reader = BufReader::new(stream.try_clone().unwrap());
        Conn {
            stream,
            reader,
            queued: VecDeque::new(),
            next_id: 1000,
        }
    }

    pub fn send_raw(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).expect("write to the daemon");
    }

    /// The next line from the daemon (not a queued one).
    pub fn read_line(&mut self) -> Value {
        let mut line = String::new();
        let n = self
            .reader
            .read_line(&mut line)
            .expect("read from the daemon");
        assert!(n > 0, "the daemon closed the connection");
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("bad line from daemon ({e}): {line}"))
    }

    /// Reads until the reply (a line with `ok`) to `id`.
    pub fn reply_to(&mut self, id: &Value) -> Value {
        loop {
            let v = self.read_line();
            if &v["id"] == id && v.get("ok").is_some() {
                return v;
            }
            self.queued.push_back(v);
        }
    }

    /// Sends `{"id", "op", …fields}` and returns the whole reply.
    pub fn request(&mut self, op: &str, fields: Value) -> Value {
        self.next_id += 1;
        let id = json!(self.next_id);
        let mut req = fields;
        if req.is_null() {
            req = json!({});
        }
        req["id"] = id.clone();
        req["op"] = json!(op);
        let mut line = serde_json::to_vec(&req).unwrap();
        line.push(b'\n');
        self.send_raw(&line);
        self.reply_to(&id)
    }

    /// The id of the last request sent with [`Conn::request`] (its stream items carry it).
    pub fn last_id(&self) -> u64 {
        self.next_id
    }

    /// The `result` of a request that must succeed.
    pub fn call(&mut self, op: &str, fields: Value) -> Value {
        let r = self.request(op, fields.clone());
        assert_eq!(r["ok"], true, "{op} {fields} failed: {r}");
        r["result"].clone()
    }

    /// The error code of a request that must fail.
    pub fn error_code(&mut self, op: &str, fields: Value) -> String {
        let r = self.request(op, fields.clone());
        assert_eq!(r["ok"], false, "{op} {fields} should have failed: {r}");
        r["error"]["code"].as_str().unwrap().to_string()
    }

    /// The next stream item of request `id` (queued ones first).
    pub fn next_item(&mut self, id: &Value) -> Value {
        if let Some(i) = self.queued.iter().position(|v| &v["id"] == id) {
            return self.queued.remove(i).unwrap();
        }
        loop {
            let v = self.read_line();
            if &v["id"] == id {
                return v;
            }
            self.queued.push_back(v);
        }
    }

    /// Starts an attach and returns its id and the reply.
    pub fn attach(&mut self, session: &str, since: i64) -> (Value, Value) {
        self.next_id += 1;
        let id = json!(self.next_id);
        let req = json!({"id": id, "op": "attach", "session": session, "since": since});
        let mut line = serde_json::to_vec(&req).unwrap();
        line.push(b'\n');
        self.send_raw(&line);
        let reply = self.reply_to(&id);
        (id, reply)
    }
}

/// `ensure` with just a key and an argv (and a short grace).
pub fn ensure(c: &mut Conn, session: &str, argv: &[&str]) -> Value {
    c.call(
        "ensure",
        json!({"session": session, "argv": argv, "graceMs": 500}),
    )
}

/// Starts `session` through the daemon with the trap script as its adapter (it logs every
/// catchable signal to `<dir>/<session>.log` and ignores them), with this grace. Returns the
/// lease id and the adapter, once it runs.
#[allow(dead_code)]
pub fn ensure_trap(c: &mut Conn, dir: &Path, session: &str, grace_ms: u64) -> (String, Logged) {
    let trap = trap_script(dir);
    let log = dir.join(format!("{session}.log"));
    let started = c.call(
        "ensure",
        json!({"session": session, "argv": [trap.to_str().unwrap(), log.to_str().unwrap()], "graceMs": grace_ms}),
    );
    let lease_id = started["leaseId"].as_str().unwrap().to_string();
    (lease_id, Logged::wait_started(log))
}

/// Starts `session` with the recorder script as its adapter (it writes its stdin to
/// `<dir>/<log_name>` and its pid to `<log>.pid`), with `extra` fields merged into the `ensure`
/// request. Returns the `ensure` result, the log path and the adapter.
pub fn ensure_recorder(
    c: &mut Conn,
    dir: &Path,
    session: &str,
    log_name: &str,
    extra: Value,
) -> (Value, PathBuf, Pid) {
    let recorder = recorder_script(dir);
    let log = dir.join(log_name);
    let mut req = json!({
        "session": session,
        "argv": [recorder.to_str().unwrap(), log.to_str().unwrap()],
    });
    if let Value::Object(m) = extra {
        req.as_object_mut().unwrap().extend(m);
    }
    let started = c.call("ensure", req);
    let adapter = read_pid_file(&dir.join(format!("{log_name}.pid")));
    (started, log, adapter)
}

/// The set-up of the tests that talk to one live session: a scratch directory, a daemon on its
/// own state root (`<scratch>/state`), a connection, and one session started by
/// [`ensure_recorder`] (its adapter under the guard). Fields drop in order: the connection,
/// the adapter's guard, the daemon, then the scratch directory.
pub struct OneSession {
    pub c: Conn,
    pub guard: Guard,
    pub daemon: Daemon,
    /// The `ensure` result and its lease id.
    pub started: Value,
    pub lease_id: String,
    /// The session's adapter (also under the guard).
    pub adapter: Pid,
    /// The recorder's log of what reached the adapter's stdin.
    pub log: PathBuf,
    pub state: PathBuf,
    pub tmp: TempDir,
}

impl OneSession {
    /// A `leash serve` with no options; see [`OneSession::start_with`].
    pub fn start(tag: &str, session: &str, log_name: &str, extra: Value) -> OneSession {
        Self::start_with(
            tag,
            |state| Daemon::start(state, &[]),
            session,
            log_name,
            extra,
        )
    }

    /// `daemon` starts the daemon on the state root it is given; the session is `session` with
    /// `extra` merged into its `ensure` (see [`ensure_recorder`]).
    pub fn start_with(
        tag: &str,
        daemon: impl FnOnce(&Path) -> Daemon,
        session: &str,
        log_name: &str,
        extra: Value,
    ) -> OneSession {
        let tmp = TempDir::new(tag);
        let state = tmp.join("state");
        let daemon = daemon(&state);
        let mut guard = Guard::new();
        let mut c = daemon.connect();
        let (started, log, adapter) = ensure_recorder(&mut c, tmp.path(), session, log_name, extra);
        guard.add(adapter);
        let lease_id = started["leaseId"].as_str().unwrap().to_string();
        OneSession {
            c,
            guard,
            daemon,
            started,
            lease_id,
            adapter,
            log,
            state,
            tmp,
        }
    }
}

/// The daemon's view of one session (from `status`).
pub fn session_status(c: &mut Conn, session: &str) -> Option<Value> {
    let st = c.call("status", json!({}));
    st["daemon"]["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["sessionKey"] == session)
        .cloned()
}

/// The lease row with this id (from the `leases` op).
pub fn lease_row(c: &mut Conn, lease_id: &str) -> Value {
    let rows = c.call("leases", json!({}));
    rows.as_array()
        .unwrap()
        .iter()
        .find(|l| l["leaseId"] == lease_id)
        .cloned()
        .unwrap_or_else(|| panic!("no lease {lease_id}"))
}

/// The persisted lifecycle event kinds of a session, in seq order.
pub fn event_kinds(c: &mut Conn, session: &str) -> Vec<String> {
    c.call("events", json!({"session": session}))
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["kind"].as_str().unwrap().to_string())
        .collect()
}

/// An adapter stand-in that speaks just enough JSON-RPC: it appends every stdin line to
/// `$1`, logs any catchable signal to `$1.signals`, writes its pid to `$1.pid`, and answers a
/// line containing `"respond"` with a response to request id 1.
pub fn recorder_script(dir: &Path) -> PathBuf {
    script(
        dir,
        "recorder.sh",
        r#"log="$1"
for s in TERM INT HUP QUIT USR1 USR2 ALRM PIPE; do trap "echo $s >> '$log.signals'" $s; done
echo $$ > "$log.pid"
: > "$log"
while IFS= read -r line; do
  printf '%s\n' "$line" >> "$log"
  case "$line" in
    *'"respond"'*) printf '%s\n' '{"jsonrpc":"2.0","id":1,"result":{"stopReason":"end_turn"}}' ;;
  esac
done"#,
    )
}

/// Prints `1..=N` (one number a line), pausing now and then so the stream takes a while, and
/// then waits on stdin (so the session stays up).
pub fn counter_script(dir: &Path) -> PathBuf {
    script(
        dir,
        "counter.sh",
        r#"n="$1"; i=0
echo $$ > "$2"
while [ "$i" -lt "$n" ]; do
  i=$((i+1)); echo "$i"
  case "$i" in *00|*50) sleep 0.01;; esac
done
exec cat"#,
    )
}

/// A JSON-RPC `session/prompt` request with id 1 for an ACP session.
pub fn prompt(acp_session: &str) -> String {
    json!({"jsonrpc": "2.0", "id": 1, "method": "session/prompt",
           "params": {"sessionId": acp_session, "prompt": [{"type": "text", "text": "hi"}]}})
    .to_string()
}

/// Waits for a file to have at least `n` lines and returns them.
pub fn wait_lines(path: &Path, n: usize) -> Vec<String> {
    let mut lines = Vec::new();
    let ok = wait_for(|| {
        lines = std::fs::read_to_string(path)
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect();
        lines.len() >= n
    });
    assert!(ok, "{} never reached {n} lines: {lines:?}", path.display());
    lines
}

/// Waits until a condition on the daemon holds, polling over one connection.
pub fn wait_daemon(c: &mut Conn, mut cond: impl FnMut(&mut Conn) -> bool) -> bool {
    wait_for_within(PATIENCE, || cond(c))
}

pub const SHORT: Duration = Duration::from_millis(300);
