//! The floor under `leash exec` through a daemon: a server of the bench's own that answers
//! `leash exec`'s `exec` op with the least any daemon must do, so that the cost of the
//! architecture (the client's process, the round trip, the wrapper's exec) and the cost of
//! leash's own op are told apart in the same turns.
//!
//! It speaks to the real `leash exec`: it holds a state root's `daemon.lock` (an exclusive
//! `flock`, the JSON naming its pid and socket) and answers on that socket, from a thread of the
//! bench process, one connection at a time. Two levels:
//!
//! - [`Floor::Null`]: the answer at once (the peer's pid and start time from the kernel, which
//!   the client checks), naming the wrapper the client installed: the client's process, its
//!   lock-file read, the round trip and its `execve` of the wrapper; no row, no cgroup.
//! - [`Floor::Commit`]: the floor: the peer proven by the kernel (`SO_PEERCRED`, then its parent
//!   and start time read as leash reads them, `leash::proc::parent_and_start_of`), one row
//!   committed to SQLite in WAL with `synchronous=NORMAL` (leash's settings; one table, its key
//!   the only index), and the lease's cgroup made by leash's own `create_lease_cgroup` in a
//!   gateway directory held as the daemon holds its own (`hold_gateway_dir`).
//!
//! Not a daemon: no containment check, no install check, no events or sessions rows, no
//! replay. What `leash serve` does above this is leash's own cost.

use leash::state::StateRoot;
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
    /// Connections it could not answer as asked (each one sends `leash exec` down its direct
    /// path, whose time would then be counted as the floor's): a run with any is not a
    /// measurement.
    failed: Arc<AtomicUsize>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// The gateway's cgroup directory it holds while it serves.
    _gateway: Option<HeldGateway>,
    _lock: std::fs::File,
}

impl FloorServer {
    /// Serves `state` (made here); with [`Floor::Commit`] its
    /// cgroups go under `cgroup_root/floor-<pid>`, held while it serves (`None`: no cgroup, as
    /// leash without containment).
    pub fn start(
        state: &Path,
        floor: Floor,
        cgroup_root: Option<&Path>,
    ) -> Result<FloorServer, String> {
        let err = |what: &str, e: &dyn std::fmt::Display| format!("floor server: {what}: {e}");
        let root = StateRoot::open(state).map_err(|e| err("state dir", &e))?;
        let socket = root.socket_path();
        let listener = UnixListener::bind(&socket).map_err(|e| err("bind", &e))?;
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .open(root.daemon_lock_path())
            .map_err(|e| err("lock file", &e))?;
        // SAFETY: flock on a descriptor this function owns.
        if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            return Err(err("flock", &std::io::Error::last_os_error()));
        }
        let info = leash::daemon::LockInfo {
            pid: std::process::id() as i32,
            socket,
            started_at: leash::lease::now_ms(),
            listener_pid: None,
        };
        let info = serde_json::to_string(&info).expect("the lock info serialises");
        (&lock)
            .write_all(info.as_bytes())
            .map_err(|e| err("lock file", &e))?;
        let conn = match floor {
            Floor::Null => None,
            Floor::Commit => {
                Some(floor_db(&root.dir().join("floor.db")).map_err(|e| err("database", &e))?)
            }
        };
        let gateway = match cgroup_root.filter(|_| floor == Floor::Commit) {
            Some(r) => Some(HeldGateway::new(
                r.join(format!("floor-{}", std::process::id())),
            )?),
            None => None,
        };
        let cfg = Serving {
            gateway: gateway.as_ref().map(|g| g.path().to_path_buf()),
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
            _gateway: gateway,
            _lock: lock,
        })
    }

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
        // Then the fields: the gateway's directory is released once no answer can name it.
    }
}

/// The floor's database at `path`: one table, its key the only index, in WAL with leash's
/// `synchronous=NORMAL`. The floor server commits to it, and so does `bench/issue-floor.c`,
/// whose INSERT names these columns.
pub fn floor_db(path: &Path) -> rusqlite::Result<rusqlite::Connection> {
    let db = rusqlite::Connection::open(path)?;
    db.execute_batch(
        "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;
         CREATE TABLE leases (lease_id TEXT PRIMARY KEY, root_pid INTEGER NOT NULL,
           root_start INTEGER NOT NULL, owner_pid INTEGER NOT NULL,
           cgroup TEXT, created_ms INTEGER NOT NULL);",
    )?;
    Ok(db)
}

/// A gateway's cgroup directory held as the daemon holds its own (`hold_gateway_dir`: no
/// wrapper's `--remove-empty-parent` removes it), released and removed when empty on drop, as a
/// stopping daemon does.
pub struct HeldGateway(PathBuf);

impl HeldGateway {
    pub fn new(path: PathBuf) -> Result<HeldGateway, String> {
        leash::cgroup::hold_gateway_dir(&path)
            .map_err(|e| format!("gateway cgroup {}: {e}", path.display()))?;
        Ok(HeldGateway(path))
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for HeldGateway {
    fn drop(&mut self) {
        leash::cgroup::release_gateway_dir(&self.0);
        leash::cgroup::remove_gateway_dir_if_empty(&self.0);
    }
}

struct Serving {
    /// The gateway's cgroup directory (held: no wrapper's `--remove-empty-parent` removes it).
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
    let ask: serde_json::Value = serde_json::from_str(&line).map_err(|e| e.to_string())?;
    if ask["op"] != "exec" {
        return Err(format!("not leash exec's `exec`: {line:?}"));
    }
    let text = |k: &str| {
        ask[k]
            .as_str()
            .map(str::to_owned)
            .ok_or_else(|| format!("no {k} in {line:?}"))
    };
    let (lease_id, wrapper) = (text("leaseId")?, text("wrapper")?);
    let cred = nix::sys::socket::getsockopt(&stream, nix::sys::socket::sockopt::PeerCredentials)
        .map_err(|e| e.to_string())?;
    let pid = cred.pid();
    // The peer's parent (the owner) and start time, from the kernel: the client checks that the
    // lease is rooted at it.
    let (ppid, start) =
        leash::proc::parent_and_start_of(pid).ok_or_else(|| format!("the peer {pid} is gone"))?;
    let mut cgroup = None;
    if let Some(insert) = insert {
        if let Some(gw) = &cfg.gateway {
            cgroup = Some(
                leash::cgroup::create_lease_cgroup(gw, &lease_id)
                    .map_err(|e| e.to_string())?
                    .0,
            );
        }
        let now = leash::lease::now_ms();
        let text = |p: &Path| p.to_str().map(str::to_owned);
        insert
            .execute(rusqlite::params![
                lease_id,
                pid,
                start as i64,
                ppid,
                cgroup.as_deref().and_then(text),
                now
            ])
            .map_err(|e| e.to_string())?;
    }
    let reply = serde_json::json!({
        "id": ask["id"],
        "ok": true,
        "result": {
            "outcome": "committed",
            "leaseId": lease_id,
            "gatewayId": "floor",
            "rootPid": pid,
            "rootStartTime": start,
            "wrapperPath": wrapper,
            "cgroupPath": cgroup,
        },
    });
    let mut text = reply.to_string();
    text.push('\n');
    (&stream)
        .write_all(text.as_bytes())
        .map_err(|e| e.to_string())
}
