//! The floor under `leash exec` through a daemon (issue 24): a server of the bench's own that
//! answers the front door's `execArgv` with the least any daemon must do, so that the cost of the
//! architecture (the front door's process, the round trip, the wrapper's options) and the cost of
//! leash's own op are told apart in the same turns.
//!
//! It speaks to the real front door (`leash exec`, the 35 KB program): it holds a state root's
//! `daemon.lock` (an exclusive `flock`, the JSON naming its pid and socket) and answers on that
//! socket, from a thread of the bench process, one connection at a time. Two levels:
//!
//! - [`Floor::Null`]: the answer at once, naming the bare wrapper (no option): the front door's
//!   process, its lock-file read, the round trip and its `execve` of the wrapper; no evidence, no
//!   row, no cgroup.
//! - [`Floor::Commit`]: what the issue calls the floor: the peer proven by the kernel
//!   (`SO_PEERCRED`, then its `/proc/<pid>/stat` for its parent and start time), one row
//!   committed to SQLite in WAL with `synchronous=NORMAL` (leash's settings; one table, its key
//!   the only index), the lease's cgroup made (`mkdir` of the gateway's directory when missing,
//!   then of the lease's, then its inode read, as leash does), and the wrapper named with the
//!   options leash gives it (`--grace-ms`, `--owner-pid`, `--report`, `--cgroup`,
//!   `--remove-empty-parent`), so the wrapper's side costs what it costs under leash.
//!
//! Not a daemon: no parser of the command line, no containment resolution, no install check, no
//! events or sessions rows, no replay. What `leash serve` does above this is leash's own cost.

use std::io::{BufRead, BufReader, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Floor {
    Null,
    Commit,
}

/// The server: the listening socket, the lock it holds, its thread. Stopped on drop.
pub struct FloorServer {
    listener: UnixListener,
    /// Connections it could not answer as asked (each one sends the front door to `leash-main`,
    /// whose time would then be counted as the floor's): a run with any is not a measurement.
    failed: Arc<AtomicUsize>,
    thread: Option<std::thread::JoinHandle<()>>,
    _lock: std::fs::File,
}

impl FloorServer {
    /// Serves `state` (made here), naming `wrap` in its answers; with [`Floor::Commit`] its
    /// cgroups go under `cgroup_root/floor-<pid>` (`None`: no cgroup, as leash without
    /// containment).
    pub fn start(
        state: &Path,
        floor: Floor,
        wrap: &Path,
        cgroup_root: Option<&Path>,
    ) -> Result<FloorServer, String> {
        let err = |what: &str, e: &dyn std::fmt::Display| format!("floor server: {what}: {e}");
        std::fs::create_dir_all(state.join("run")).map_err(|e| err("state dir", &e))?;
        let socket = state.join("leash.sock");
        let listener = UnixListener::bind(&socket).map_err(|e| err("bind", &e))?;
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .open(state.join("daemon.lock"))
            .map_err(|e| err("lock file", &e))?;
        // SAFETY: flock on a descriptor this function owns.
        if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            return Err(err("flock", &std::io::Error::last_os_error()));
        }
        let info = serde_json::json!({
            "pid": std::process::id(),
            "socket": socket.to_str().ok_or("floor server: the socket path is not UTF-8")?,
        });
        (&lock)
            .write_all(info.to_string().as_bytes())
            .map_err(|e| err("lock file", &e))?;
        let conn = match floor {
            Floor::Null => None,
            Floor::Commit => {
                let db = rusqlite::Connection::open(state.join("floor.db"))
                    .map_err(|e| err("open", &e))?;
                db.execute_batch(
                    "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;
                     CREATE TABLE leases (lease_id TEXT PRIMARY KEY, root_pid INTEGER NOT NULL,
                       root_start INTEGER NOT NULL, owner_pid INTEGER NOT NULL,
                       cgroup TEXT, created_ms INTEGER NOT NULL);",
                )
                .map_err(|e| err("schema", &e))?;
                Some(db)
            }
        };
        let cfg = Serving {
            state: state.to_path_buf(),
            wrap: wrap
                .to_str()
                .ok_or("floor server: wrapper path not UTF-8")?
                .into(),
            gateway: cgroup_root
                .filter(|_| floor == Floor::Commit)
                .map(|r| r.join(format!("floor-{}", std::process::id()))),
        };
        let l = listener.try_clone().map_err(|e| err("listener", &e))?;
        let failed = Arc::new(AtomicUsize::new(0));
        let f = failed.clone();
        let thread = std::thread::Builder::new()
            .name("floor-server".into())
            .spawn(move || serve(l, conn, cfg, &f))
            .map_err(|e| err("thread", &e))?;
        Ok(FloorServer {
            listener,
            failed,
            thread: Some(thread),
            _lock: lock,
        })
    }
}

impl FloorServer {
    /// An error when a connection was not answered as asked.
    pub fn check(&self) -> Result<(), String> {
        match self.failed.load(Ordering::SeqCst) {
            0 => Ok(()),
            n => Err(format!(
                "the floor server failed {n} request(s): its figures are not the floor's"
            )),
        }
    }
}

impl Drop for FloorServer {
    fn drop(&mut self) {
        // A listening socket shut down fails the blocked accept (EINVAL): the thread ends.
        // SAFETY: shutdown on a descriptor this struct owns.
        unsafe { libc::shutdown(self.listener.as_raw_fd(), libc::SHUT_RDWR) };
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

struct Serving {
    state: PathBuf,
    wrap: String,
    /// The gateway's cgroup directory, made when missing (the wrapper removes it with the last
    /// lease: `--remove-empty-parent`).
    gateway: Option<PathBuf>,
}

fn serve(
    listener: UnixListener,
    db: Option<rusqlite::Connection>,
    cfg: Serving,
    failed: &AtomicUsize,
) {
    let mut insert = db.as_ref().map(|db| {
        db.prepare(
            "INSERT INTO leases (lease_id, root_pid, root_start, owner_pid, cgroup, created_ms)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        )
        .expect("prepare the insert")
    });
    loop {
        let Ok((stream, _)) = listener.accept() else {
            return;
        };
        if let Err(e) = answer(stream, insert.as_mut(), &cfg) {
            failed.fetch_add(1, Ordering::SeqCst);
            eprintln!("leash-bench: floor server: {e}");
        }
    }
}

/// One connection: the request line, the work of the level, the answer line.
fn answer(
    stream: UnixStream,
    insert: Option<&mut rusqlite::Statement<'_>>,
    cfg: &Serving,
) -> Result<(), String> {
    let mut line = String::new();
    let mut r = BufReader::new(&stream);
    r.read_line(&mut line).map_err(|e| e.to_string())?;
    if !line.contains(r#""op":"execArgv""#) {
        return Err(format!("not the front door's execArgv: {line:?}"));
    }
    let lease_id = line
        .split_once(r#""leaseId":""#)
        .and_then(|(_, rest)| rest.split_once('"'))
        .map(|(id, _)| id.to_string())
        .ok_or_else(|| format!("no lease id in {line:?}"))?;
    let cred = nix::sys::socket::getsockopt(&stream, nix::sys::socket::sockopt::PeerCredentials)
        .map_err(|e| e.to_string())?;
    let pid = cred.pid();
    let mut args: Vec<String> = match insert {
        None => Vec::new(),
        Some(insert) => {
            // The peer's parent (the owner) and start time, from the kernel.
            let stat =
                std::fs::read_to_string(format!("/proc/{pid}/stat")).map_err(|e| e.to_string())?;
            let f: Vec<&str> = stat
                .rsplit_once(')')
                .ok_or("no ) in stat")?
                .1
                .split_whitespace()
                .collect();
            let field = |i: usize, what: &str| -> Result<i64, String> {
                f.get(i)
                    .and_then(|v| v.parse().ok())
                    .ok_or_else(|| format!("no {what} in /proc/{pid}/stat"))
            };
            let ppid = field(1, "parent")?;
            let start = field(19, "start time")?;
            let cgroup = match &cfg.gateway {
                None => None,
                Some(gw) => {
                    match std::fs::create_dir(gw) {
                        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => {
                            return Err(format!("mkdir {}: {e}", gw.display()))
                        }
                        _ => {}
                    }
                    let p = gw.join(&lease_id);
                    std::fs::create_dir(&p).map_err(|e| format!("mkdir {}: {e}", p.display()))?;
                    std::fs::metadata(&p).map_err(|e| e.to_string())?;
                    Some(p.to_str().ok_or("cgroup path not UTF-8")?.to_string())
                }
            };
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as i64);
            insert
                .execute(rusqlite::params![lease_id, pid, start, ppid, cgroup, now])
                .map_err(|e| e.to_string())?;
            let report = cfg.state.join("run").join(format!("{lease_id}.json"));
            let mut a = vec![
                "--grace-ms".into(),
                "5000".into(),
                "--owner-pid".into(),
                ppid.to_string(),
                "--report".into(),
                report.to_str().ok_or("report path not UTF-8")?.to_string(),
            ];
            if let Some(c) = cgroup {
                a.extend(["--cgroup".into(), c, "--remove-empty-parent".into()]);
            }
            a
        }
    };
    args.push("--".into());
    // The front door's own command line is `leash exec -- CMD...`: the command at index 3.
    let reply = serde_json::json!({
        "id": 1,
        "ok": true,
        "result": {
            "outcome": "committed",
            "leaseId": lease_id,
            "rootPid": pid,
            "wrapper": cfg.wrap,
            "args": args,
            "commandAt": 3,
            "env": {
                "base": [],
                "clear": false,
                "keep": [],
                "unset": [],
                "set": [["LEASH_LEASE_ID", lease_id], ["LEASH_GATEWAY_ID", "floor"]],
            },
        },
    });
    let mut text = reply.to_string();
    text.push('\n');
    (&stream)
        .write_all(text.as_bytes())
        .map_err(|e| e.to_string())
}
