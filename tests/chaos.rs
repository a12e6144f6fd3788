//! Chaos: random SIGKILLs at every point of the lease lifecycle, over several state roots at once,
//! among decoys that must never be signalled; afterwards one final `reap` per root must leave
//! nothing behind.
//!
//! # What it does
//!
//! Every state root gets a worker thread. Each iteration picks, with a seeded RNG, one action:
//! - `leash exec` SIGKILLed at the entry of its execve of the wrapper, i.e. after the lease
//!   commit and before the wrapper exists (strace's syscall fault injection; skipped where strace
//!   is not installed);
//! - `leash exec` spawned by the harness and SIGKILLed a few milliseconds later. The kill is
//!   aimed by first SIGSTOPping the process and looking at what exists (is the lease row there?
//!   is the process still the `leash` binary or already the wrapper? has the adapter started?),
//!   so each kill is recorded with the lifecycle point it hit: `before-commit`,
//!   `commit-to-exec`, `wrapper-before-adapter` or `adapter-running`;
//! - sessions started by the root's **owner**, sometimes SIGKILLed while those sessions are still
//!   starting. An owner is either a gateway stand-in (a shell that runs
//!   `leash exec --owner-pid $$` for each line the harness writes to it) or the supervisor
//!   daemon `leash serve`, asked for sessions with `ensure` over its socket;
//! - SIGKILL of the owner (the wrappers then drain on their own), followed by a startup reap
//!   during the wrappers' grace, a reap that is itself SIGKILLed part-way, two reapers racing
//!   (through the daemon and directly), or a new daemon whose own startup reap settles the dead
//!   owner's leases — sometimes SIGKILLed part-way through it;
//! - SIGKILL of a session's wrapper, adapter or another descendant (adapters come in four kinds:
//!   polite, stubborn (ignores SIGTERM), escaper (leaves a `setsid` descendant that ignores
//!   SIGTERM), family (a child that ignores SIGTERM), and where containment is on, ghost (a
//!   double-forked, `setsid`, `env -i` descendant that ignores SIGTERM: only its lease's cgroup
//!   links it to the lease; counted as a leak by its argv tag));
//! - `leash close` with a short grace (through the daemon when one serves the root), and SIGKILL
//!   of the closer, the wrapper, the adapter or the daemon during that grace;
//! - (as root, one at a time) PID reuse: a harness-owned session's wrapper is killed and its pid
//!   handed through `/proc/sys/kernel/ns_last_pid` to a decoy, or to a session of *another*
//!   root; the dead lease is then closed.
//!
//! Decoys trap and log every catchable signal: processes running the adapters' exact argv with no
//! lease (`decoy`), a long-lived session per root that no chaos action touches (`sentinel`: an
//! other root's live session, until that root's own final reap), the pid-reuse decoys, and the
//! owners themselves (the harness only ever SIGKILLs them, which they cannot log).
//!
//! # The final check, and what the three numbers mean
//!
//! When the iterations or the time run out, every owner is SIGKILLed (a gateway dying), the
//! harness waits for `leash exec` processes still starting to settle (a lease committed after a
//! reap is the next reap's business, not this one's), and then runs one
//! `leash reap --include-live` per root, in random order. `--include-live` is needed because the
//! harness itself (alive) owns the sessions it spawned directly; it makes every open lease a
//! candidate, so the one reap must settle everything.
//!
//! - **leak**: a live (non-zombie) process whose initial environment carries
//!   `OPENCLAW_GATEWAY_INSTANCE_ID` of one of the chaos roots (any lease id), still there once
//!   its root's final reap has returned and a settle of up to 3 s has passed (reap waits for what
//!   it SIGKILLs, so the settle only absorbs exit bookkeeping). Every process of a session
//!   carries the markers, the wrapper included, and no decoy does, so this is exactly "something
//!   leash started outlived its lease". All of `/proc` is scanned; the roots' gateway ids are
//!   fresh UUIDs, so nothing else can match.
//! - **wrong signal**: a decoy that logged any signal or is no longer alive, counted once per
//!   decoy. Sentinels are checked before and after every final reap of another root; owners'
//!   logs at the end.
//! - **stuck**: a lease that is not `closed` or `lost` after its root's final reap, or has no
//!   reason recorded.
//!
//! Also failing the test: a `leash` command that exits with a code leash never uses for these
//! operations (a panic, or 1: an error such as a corrupt or locked database).
//!
//! # Running it
//!
//! `LEASH_CHAOS_ITERATIONS` (default 150, over all roots), `LEASH_CHAOS_SECONDS` (default 30: no
//! iteration starts later), `LEASH_CHAOS_SEED` (default: from the clock; printed either way, so a
//! failing run can be replayed: the choices replay exactly, the timing of a busy machine cannot)
//! and `LEASH_CHAOS_ROOTS` (default 3). A long run:
//! `LEASH_CHAOS_ITERATIONS=100000 LEASH_CHAOS_SECONDS=3600 cargo test --workspace --test chaos -- --nocapture`.
//! The one summary line is `chaos: iterations=N kills=K leaks=0 wrong_signals=0 stuck=0`.
//!
//! The two kinds of owner are [`OwnerKind`]; the daemon's kill points are `kill_owner` (idle,
//! during the shutdown a SIGTERM starts, and the next daemon killed during its startup reap),
//! `owner_spawns` (ensures in flight) and `close_with_chaos` (a close it is carrying out).
mod common;
use common::*;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const ENV_LEASE: &str = "OPENCLAW_ACPX_LEASE_ID";
const ENV_GATEWAY: &str = "OPENCLAW_GATEWAY_INSTANCE_ID";
const ENV_SENTINEL: &str = "CHAOS_SENTINEL";

/// A lease row as the harness reads it: id, session key, state, reason.
type Row = (String, String, String, Option<String>);

// ---------------------------------------------------------------------------------------------
// Configuration and randomness

struct Config {
    iterations: u64,
    seconds: u64,
    seed: u64,
    roots: usize,
}

fn env_num(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(v) => v
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v} is not a number")),
        Err(_) => default,
    }
}

fn config() -> Config {
    let clock = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    Config {
        iterations: env_num("LEASH_CHAOS_ITERATIONS", 150),
        seconds: env_num("LEASH_CHAOS_SECONDS", 30),
        seed: env_num(
            "LEASH_CHAOS_SEED",
            clock ^ (std::process::id() as u64) << 32,
        ),
        roots: env_num("LEASH_CHAOS_ROOTS", 3).clamp(1, 16) as usize,
    }
}

/// splitmix64: tiny, seedable, good enough to pick actions and delays.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next() % n
        }
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }

    /// A delay for aiming a kill at a process that is starting: mostly within the first few
    /// milliseconds (where `leash exec` commits and execs), sometimes later.
    fn early_delay(&mut self) -> Duration {
        let us = if self.chance(75) {
            self.below(6_000)
        } else {
            self.below(40_000)
        };
        Duration::from_micros(us)
    }
}

// ---------------------------------------------------------------------------------------------
// /proc scanning

/// A live process carrying lease markers.
#[derive(Debug, Clone)]
struct Marked {
    pid: Pid,
    ppid: i32,
    lease: String,
    gateway: String,
    sentinel: bool,
    exe: Option<PathBuf>,
    argv: String,
    /// An env-less escapee (mode `ghost`): found by its argv tag, not by markers.
    ghost: bool,
}

/// The argv tag of a `ghost` escapee of gateway `gw` (it has no environment to carry markers).
fn ghost_tag(gw: &str) -> String {
    format!("chaos-ghost-{gw}")
}

fn environ_vars(pid: i32) -> Option<HashMap<String, String>> {
    let raw = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    let mut out = HashMap::new();
    for kv in raw.split(|&b| b == 0) {
        let kv = String::from_utf8_lossy(kv);
        if let Some((k, v)) = kv.split_once('=') {
            if k == ENV_LEASE || k == ENV_GATEWAY || k == ENV_SENTINEL {
                out.insert(k.to_string(), v.to_string());
            }
        }
    }
    Some(out)
}

fn proc_state(pid: i32) -> Option<String> {
    stat_fields(pid)?.first().cloned()
}

fn cmdline(pid: i32) -> String {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
        .unwrap_or_default()
}

/// Every live, non-zombie process whose environment names one of `gateways`.
fn scan_marked(gateways: &HashSet<String>) -> Vec<Marked> {
    let mut out = Vec::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return out;
    };
    for e in dir.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        let Some(vars) = environ_vars(pid) else {
            continue;
        };
        let argv = cmdline(pid);
        let ghost = gateways
            .iter()
            .find(|g| vars.is_empty() && argv.contains(&ghost_tag(g)));
        let Some(gateway) = vars
            .get(ENV_GATEWAY)
            .filter(|g| gateways.contains(*g))
            .or(ghost)
        else {
            continue;
        };
        let Some(p) = Pid::of(pid) else { continue };
        if !p.alive() {
            continue;
        }
        out.push(Marked {
            ghost: ghost.is_some(),
            pid: p,
            ppid: ppid(pid).unwrap_or(0),
            lease: vars.get(ENV_LEASE).cloned().unwrap_or_default(),
            gateway: gateway.clone(),
            sentinel: vars.contains_key(ENV_SENTINEL),
            exe: std::fs::read_link(format!("/proc/{pid}/exe")).ok(),
            argv,
        });
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Shared harness state

/// A process that must never be signalled (or, for a sentinel, not before its own root's final
/// reap).
#[derive(Debug, Clone)]
struct Decoy {
    pid: Pid,
    log: PathBuf,
    what: String,
    /// A sentinel session of this root: its root's final reap ends it legitimately.
    sentinel_of: Option<usize>,
}

impl Decoy {
    fn problem(&self) -> Option<String> {
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        if !log.is_empty() {
            return Some(format!(
                "{} (pid {}) logged signals: {}",
                self.what,
                self.pid.pid,
                log.trim().replace('\n', ",")
            ));
        }
        if !self.pid.alive() {
            return Some(format!("{} (pid {}) is gone", self.what, self.pid.pid));
        }
        None
    }
}

struct RootInfo {
    index: usize,
    adapter: PathBuf,
    state: PathBuf,
    work: PathBuf,
    gateway: String,
    wrapper_root: PathBuf,
}

impl RootInfo {
    fn leash(&self) -> Command {
        let mut c = leash(&self.state);
        c.env("CHAOS_SIGDIR", self.work.join("sig"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(self.work.join("leash-stderr.log"))
                    .unwrap(),
            );
        c
    }

    /// A read-only connection to the root's database (never blocks a writer in WAL mode).
    fn reader(&self) -> rusqlite::Connection {
        rusqlite::Connection::open_with_flags(
            self.state.join("leash.db"),
            rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
        )
        .unwrap()
    }

    /// Lease rows (id, session, state, reason), read directly: no leash command may wait on a
    /// `leash exec` the harness holds stopped.
    fn rows(&self) -> Vec<Row> {
        self.rows_within(Duration::from_secs(30))
            .unwrap_or_else(|e| panic!("reading root {}'s leases: {e}", self.index))
    }

    /// The rows, or the error when the database stays locked past `busy` (a process the harness
    /// stopped may hold it: WAL recovery, or the checkpoint of a last connection closing).
    fn rows_within(&self, busy: Duration) -> rusqlite::Result<Vec<Row>> {
        let conn = self.reader();
        conn.busy_timeout(busy)?;
        let mut st =
            conn.prepare("SELECT lease_id, session_key, state, state_reason FROM leases")?;
        let rows = st
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))?
            .collect();
        rows
    }
}

#[derive(Default)]
struct Registry {
    procs: Vec<Pid>,
    /// Keyed by instance, not pid number: with pids forced and recycled all the time, a pid
    /// number can name several of the harness's children over a run.
    children: Vec<(Pid, Child)>,
    /// Exit statuses of owners reaped by `reap_children` before `check_owner` looked: kept so
    /// an unexpected owner death can still say how it ended.
    exited_owners: Vec<(Pid, std::process::ExitStatus)>,
}

struct Shared {
    roots: Vec<RootInfo>,
    deadline: Instant,
    iterations_left: AtomicU64,
    iterations: AtomicU64,
    kills: AtomicU64,
    points: Mutex<BTreeMap<String, u64>>,
    decoys: Mutex<Vec<Decoy>>,
    owner_logs: Mutex<Vec<PathBuf>>,
    /// Every owner started (shell stand-ins and daemons): all are SIGKILLed before the final reap.
    owners: Mutex<Vec<Pid>>,
    /// Non-zero exits of leash commands that leash never uses for them.
    unexpected: Mutex<Vec<String>>,
    registry: Mutex<Registry>,
    forcing_pids: Mutex<()>,
    next_id: AtomicU64,
    adapter: PathBuf,
    trap: PathBuf,
    owner_script: PathBuf,
}

impl Shared {
    fn point(&self, name: &str) {
        *self
            .points
            .lock()
            .unwrap()
            .entry(name.to_string())
            .or_default() += 1;
    }

    /// SIGKILLs a process the harness started (or one of its descendants, found by our markers),
    /// re-identified by start time. Counted as a chaos kill.
    fn kill(&self, p: Pid, point: &str) {
        if p.alive() {
            signal(p, libc::SIGKILL);
            self.kills.fetch_add(1, Ordering::Relaxed);
            self.point(point);
        }
    }

    fn register(&self, c: Child) -> Pid {
        let p = Pid::of(c.id() as i32).expect("just spawned");
        let mut r = self.registry.lock().unwrap();
        r.procs.push(p);
        r.children.push((p, c));
        p
    }

    fn register_pid(&self, p: Pid) {
        self.registry.lock().unwrap().procs.push(p);
    }

    /// Reaps registered children that have exited (keeps zombies from piling up).
    fn reap_children(&self) {
        let owners = self.owners.lock().unwrap().clone();
        let mut r = self.registry.lock().unwrap();
        let mut exited = Vec::new();
        r.children.retain_mut(|(p, c)| match c.try_wait() {
            Ok(Some(status)) => {
                if owners.contains(p) {
                    exited.push((*p, status));
                }
                false
            }
            _ => true,
        });
        r.exited_owners.extend(exited);
    }

    /// How a registered child ended: its exit status (reaping it now if it is a zombie), or why
    /// none is known.
    fn exit_status_of(&self, pid: Pid) -> String {
        let mut r = self.registry.lock().unwrap();
        if let Some(&(_, status)) = r.exited_owners.iter().find(|(p, _)| *p == pid) {
            return format!("{status}");
        }
        let Some(i) = r.children.iter().position(|(p, _)| *p == pid) else {
            return "unknown (not a registered child)".to_string();
        };
        // `alive()` is false for a zombie, so the status is there or about to be.
        let deadline = Instant::now() + Duration::from_secs(2);
        loop {
            match r.children[i].1.try_wait() {
                Ok(Some(status)) => {
                    r.children.swap_remove(i);
                    return format!("{status}");
                }
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(5))
                }
                Ok(None) => return "still running (its pid no longer reads as alive)".into(),
                Err(e) => return format!("unknown (try_wait: {e})"),
            }
        }
    }

    fn wait_child(&self, pid: Pid) {
        let mut r = self.registry.lock().unwrap();
        if let Some(i) = r.children.iter().position(|(p, _)| *p == pid) {
            let (_, mut c) = r.children.swap_remove(i);
            drop(r);
            let _ = c.wait();
        }
    }

    fn session_key(&self, root: usize, tag: &str) -> String {
        format!(
            "r{root}-{tag}-{}",
            self.next_id.fetch_add(1, Ordering::Relaxed)
        )
    }

    fn add_decoy(&self, d: Decoy) {
        self.register_pid(d.pid);
        self.decoys.lock().unwrap().push(d);
    }

    fn note_exit(&self, what: &str, status: std::process::ExitStatus, allowed: &[i32]) {
        use std::os::unix::process::ExitStatusExt;
        match (status.code(), status.signal()) {
            (Some(c), _) if allowed.contains(&c) => {}
            (None, Some(libc::SIGKILL)) => {} // ours
            (code, sig) => self
                .unexpected
                .lock()
                .unwrap()
                .push(format!("{what}: exit code {code:?}, signal {sig:?}")),
        }
    }

    /// Starts a decoy running the adapter's exact argv, with no lease, in its own process group.
    fn start_argv_decoy(&self, mode: &str, tag: &str) {
        let log = self.roots[0].work.join(format!("decoy-{tag}.log"));
        let c = Command::new(&self.adapter)
            .arg(mode)
            .env("DECOY_LOG", &log)
            .env_remove(ENV_LEASE)
            .env_remove(ENV_GATEWAY)
            .process_group(0)
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        self.register(c);
        let d = Logged::wait_started(log.clone());
        self.add_decoy(Decoy {
            pid: d.pid,
            log,
            what: format!("same-argv decoy '{mode}'"),
            sentinel_of: None,
        });
    }

    /// A harness-owned session whose adapter logs every signal and that no chaos action
    /// touches: an other root's live session for every other root.
    fn start_sentinel(&self, root: usize, cmd: Option<&mut Command>) -> Option<Pid> {
        let r = &self.roots[root];
        let key = self.session_key(root, "sentinel");
        let log = r.work.join(format!("{key}.log"));
        let mut own;
        let cmd = match cmd {
            Some(c) => c,
            None => {
                own = r.leash();
                &mut own
            }
        };
        cmd.args(["exec", "--session", &key, "--grace-ms", "200", "--"])
            .arg(&self.trap)
            .arg(&log)
            .env(ENV_SENTINEL, "1");
        let wrapper = self.register(cmd.spawn().ok()?);
        let adapter = Logged::wait_started(log.clone());
        self.add_decoy(Decoy {
            pid: adapter.pid,
            log,
            what: format!("sentinel session {key} of root {root}"),
            sentinel_of: Some(root),
        });
        Some(wrapper)
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        // Cleanup, also on failure: what we registered, then anything still carrying our
        // roots' markers (descendants of what we started), each re-identified by start time.
        let r = self.registry.get_mut().unwrap();
        for p in &r.procs {
            if p.alive() {
                signal(*p, libc::SIGKILL);
            }
        }
        let gateways: HashSet<String> = self.roots.iter().map(|r| r.gateway.clone()).collect();
        for m in scan_marked(&gateways) {
            signal(m.pid, libc::SIGKILL);
        }
        for (_, c) in &mut r.children {
            let _ = c.wait();
        }
        for root in &self.roots {
            let _ = std::fs::remove_dir_all(&root.work);
        }
    }
}

use std::os::unix::process::CommandExt;

// ---------------------------------------------------------------------------------------------
// Owners

/// A root's owner: the process that spawns sessions and whose death their wrappers must notice.
struct Owner {
    pid: Pid,
    kind: OwnerKind,
}

enum OwnerKind {
    /// A gateway stand-in: a shell that runs `leash exec --owner-pid $$` for each line
    /// `KEY GRACE MODE` written to its stdin, and otherwise just lives. It traps and logs every
    /// catchable signal: leash must never signal an owner.
    Shell { stdin: ChildStdin },
    /// `leash serve`: it spawns each session's `leash exec` itself, so it is the
    /// wrappers' parent; sessions are asked for with `ensure` over its socket.
    Daemon { socket: PathBuf },
}

impl Owner {
    fn name(&self) -> &'static str {
        match self.kind {
            OwnerKind::Shell { .. } => "owner",
            OwnerKind::Daemon { .. } => "daemon",
        }
    }

    fn start_shell(sh: &Shared, root: &RootInfo, generation: u64) -> Owner {
        let log = root.work.join(format!("owner-{generation}.log"));
        let mut c = Command::new(&sh.owner_script)
            .arg(&log)
            .env("LEASH_BIN", leash_bin())
            .env("STATE", &root.state)
            .env("ADAPTER", &sh.adapter)
            .env("ERRLOG", root.work.join("leash-stderr.log"))
            .env("CHAOS_SIGDIR", root.work.join("sig"))
            .env_remove("LEASH_STATE_DIR")
            .env_remove("LEASH_LOG")
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        let stdin = c.stdin.take().unwrap();
        let pid = sh.register(c);
        sh.owners.lock().unwrap().push(pid);
        read_pid_file(&PathBuf::from(format!("{}.pid", log.display())));
        sh.owner_logs.lock().unwrap().push(log);
        Owner {
            pid,
            kind: OwnerKind::Shell { stdin },
        }
    }

    /// Starts `leash serve` for the root. It reaps its predecessors' leases before it listens;
    /// `ready` waits for the socket (false: return at once, e.g. to kill it during that reap).
    fn start_daemon(sh: &Shared, root: &RootInfo, ready: bool) -> Owner {
        let mut cmd = root.leash();
        cmd.args(["serve", "--grace-ms", "300"]);
        let pid = sh.register(cmd.spawn().unwrap());
        sh.owners.lock().unwrap().push(pid);
        let socket = root.state.join("leash.sock");
        if ready {
            // Ready means this daemon holds the lock (daemon.lock names it) and the socket
            // answers: a connect alone can reach a listener a SIGKILLed predecessor left open in
            // a child it was forking, and this daemon may still be about to refuse to start.
            let lock = root.state.join("daemon.lock");
            let named = format!("\"pid\":{}", pid.pid);
            let up = wait_for(|| {
                !pid.alive()
                    || (std::fs::read_to_string(&lock).is_ok_and(|t| t.contains(&named))
                        && std::os::unix::net::UnixStream::connect(&socket).is_ok())
            });
            if !(up && pid.alive()) {
                let status = sh.exit_status_of(pid);
                let log = tail(&root.work.join("leash-stderr.log"), 40);
                panic!(
                    "leash serve for root {} (pid {}) did not come up: {status}; \
                     daemon.lock is open in: {}; last lines of leash-stderr.log:\n{log}",
                    root.index,
                    pid.pid,
                    holders(&lock)
                );
            }
        }
        Owner {
            pid,
            kind: OwnerKind::Daemon { socket },
        }
    }

    /// Asks the owner to start sessions `(key, grace, mode)`. With `wait`, until each has
    /// started (the daemon answered its `ensure`); without, the requests are only sent.
    fn spawn(&mut self, root: &RootInfo, sessions: &[(String, u64, &str)], wait: bool) {
        match &mut self.kind {
            OwnerKind::Shell { stdin } => {
                for (key, grace, mode) in sessions {
                    let _ = writeln!(stdin, "{key} {grace} {mode}").and_then(|()| stdin.flush());
                }
            }
            OwnerKind::Daemon { socket } => {
                let Ok(mut conn) = std::os::unix::net::UnixStream::connect(&*socket) else {
                    return;
                };
                let _ = conn.set_read_timeout(Some(PATIENCE));
                for (i, (key, grace, mode)) in sessions.iter().enumerate() {
                    let req = serde_json::json!({
                        "id": i,
                        "op": "ensure",
                        "session": key,
                        "argv": [root.adapter.display().to_string(), mode],
                        "graceMs": grace,
                        "env": {"CHAOS_SIGDIR": root.work.join("sig").display().to_string()},
                    });
                    if writeln!(conn, "{req}").is_err() {
                        return;
                    }
                }
                if wait {
                    // One reply line per request (ensure does not stream).
                    use std::io::BufRead;
                    let mut lines = std::io::BufReader::new(conn).lines();
                    for _ in sessions {
                        if !matches!(lines.next(), Some(Ok(_))) {
                            break;
                        }
                    }
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// One root's worker

/// Adapter kinds. `ghost` (double fork, setsid, `env -i`, TERM ignored: nothing links it to its
/// lease but its cgroup) only where containment is on: without a cgroup nothing can find it.
fn modes() -> &'static [&'static str] {
    const ALL: [&str; 5] = ["polite", "stubborn", "escaper", "family", "ghost"];
    let contained = std::env::var_os("LEASH_CGROUP_ROOT").is_some()
        && std::env::var("LEASH_CONTAINMENT").as_deref() != Ok("off");
    if contained {
        &ALL
    } else {
        &ALL[..4]
    }
}

struct Worker<'a> {
    sh: &'a Shared,
    root: &'a RootInfo,
    rng: Rng,
    owner: Option<Owner>,
    generation: u64,
    used_keys: Vec<String>,
}

/// A session's live processes, by role.
struct Session {
    lease: String,
    wrapper: Option<Pid>,
    adapter: Option<Pid>,
    others: Vec<Pid>,
}

impl<'a> Worker<'a> {
    fn run(&mut self) {
        loop {
            if Instant::now() >= self.sh.deadline {
                break;
            }
            let left =
                self.sh
                    .iterations_left
                    .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
            if left.is_err() {
                break;
            }
            self.sh.iterations.fetch_add(1, Ordering::Relaxed);
            self.check_owner();
            match self.rng.below(16) {
                0..=1 => self.exec_early_kill(),
                2 => self.exec_killed_at_execve(),
                3..=5 => self.owner_spawns(),
                6..=7 => self.kill_owner(),
                8..=10 => self.kill_member(),
                11..=12 => self.close_with_chaos(),
                13 => self.racing_reapers(),
                14 => self.pid_reuse(),
                _ => {
                    self.owner_spawns();
                    self.kill_member();
                }
            }
            self.sh.reap_children();
        }
    }

    fn grace(&mut self) -> u64 {
        100 + self.rng.below(500)
    }

    /// The root's live sessions (sentinels excluded), grouped by lease.
    fn sessions(&self) -> Vec<Session> {
        let gw: HashSet<String> = [self.root.gateway.clone()].into();
        let mut by: BTreeMap<String, Vec<Marked>> = BTreeMap::new();
        for m in scan_marked(&gw) {
            if !m.sentinel && !m.ghost {
                by.entry(m.lease.clone()).or_default().push(m);
            }
        }
        by.into_iter()
            .map(|(lease, ms)| {
                let wrapper = ms
                    .iter()
                    .find(|m| {
                        m.exe
                            .as_ref()
                            .is_some_and(|e| e.starts_with(&self.root.wrapper_root))
                    })
                    .map(|m| m.pid);
                let adapter = wrapper.and_then(|w| {
                    ms.iter()
                        .find(|m| m.ppid == w.pid && m.argv.contains("adapter.sh"))
                        .map(|m| m.pid)
                });
                let others = ms
                    .iter()
                    .map(|m| m.pid)
                    .filter(|p| Some(*p) != wrapper && Some(*p) != adapter)
                    .collect();
                Session {
                    lease,
                    wrapper,
                    adapter,
                    others,
                }
            })
            .collect()
    }

    /// The root's owner, started when there is none: a shell stand-in or a daemon.
    fn ensure_owner(&mut self) -> &mut Owner {
        if self.owner.is_none() {
            self.generation += 1;
            self.owner = Some(if self.rng.chance(50) {
                self.sh.point("owner-started:daemon");
                Owner::start_daemon(self.sh, self.root, true)
            } else {
                Owner::start_shell(self.sh, self.root, self.generation)
            });
        }
        self.owner.as_mut().unwrap()
    }

    /// An owner dies only when the harness kills it.
    fn check_owner(&mut self) {
        if let Some(o) = &self.owner {
            if !o.pid.alive() {
                // The root's work directory (and its log) goes with the temporary directory:
                // keep the evidence in the failure message.
                let status = self.sh.exit_status_of(o.pid);
                let log = tail(&self.root.work.join("leash-stderr.log"), 40);
                self.sh.unexpected.lock().unwrap().push(format!(
                    "the {} of root {} (pid {}) died without being killed: {status}; \
                     last lines of leash-stderr.log:\n{log}",
                    o.name(),
                    self.root.index,
                    o.pid.pid
                ));
                self.owner = None;
            }
        }
    }

    /// `leash exec` SIGKILLed exactly between its lease commit and its exec of the wrapper:
    /// strace(1) injects SIGKILL at the entry of the process's first execve after its own start,
    /// which is the wrapper's. Falls back to a stop-and-classify kill where strace is missing.
    fn exec_killed_at_execve(&mut self) {
        if !has_strace() {
            return self.exec_early_kill();
        }
        let key = self.sh.session_key(self.root.index, "execve");
        let mode = *self.rng.pick(modes());
        let mut cmd = Command::new("strace");
        cmd.args(["-qq", "-o", "/dev/null", "-e", "trace=execve"])
            .args(["-e", "inject=execve:signal=KILL:when=1"])
            .arg(leash_bin())
            .arg("--state-dir")
            .arg(&self.root.state)
            .args(["exec", "--session", &key, "--grace-ms", "200", "--"])
            .arg(&self.sh.adapter)
            .arg(mode)
            .env_remove("LEASH_STATE_DIR")
            .env("CHAOS_SIGDIR", self.root.work.join("sig"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let tracer = self.sh.register(cmd.spawn().unwrap());
        self.sh.wait_child(tracer);
        let committed = self.root.rows().iter().any(|r| r.1 == key);
        if committed {
            self.sh.kills.fetch_add(1, Ordering::Relaxed);
            self.sh.point("kill:commit-to-exec(strace)");
        } else {
            self.sh.point("strace-kill-missed");
        }
    }

    /// `leash exec` spawned by the harness, stopped at a random early moment, classified by what
    /// exists, and SIGKILLed.
    fn exec_early_kill(&mut self) {
        let key = self.sh.session_key(self.root.index, "early");
        let mode = *self.rng.pick(modes());
        let grace = self.grace();
        let delay = self.rng.early_delay();
        let mut cmd = self.root.leash();
        cmd.args([
            "exec",
            "--session",
            &key,
            "--grace-ms",
            &grace.to_string(),
            "--",
        ])
        .arg(&self.sh.adapter)
        .arg(mode);
        // Half the time the stop is aimed at the moment the row appears: the window between
        // the commit and the exec (closing the database, building the wrapper's command) is
        // far too narrow for a random delay to land in often.
        let on_commit = self.rng.chance(50);
        let watch = on_commit.then(|| self.root.reader());
        let p = self.sh.register(cmd.spawn().unwrap());
        let mut seen_row = false;
        match watch {
            Some(conn) => {
                let deadline = Instant::now() + Duration::from_secs(5);
                while Instant::now() < deadline && p.alive() {
                    let seen = conn
                        .query_row(
                            "SELECT COUNT(*) FROM leases WHERE session_key = ?1",
                            [&key],
                            |r| r.get::<_, i64>(0),
                        )
                        .is_ok_and(|n| n > 0);
                    if seen {
                        seen_row = true;
                        break;
                    }
                }
            }
            None => std::thread::sleep(delay),
        }
        if !p.alive() {
            self.sh.point("exec-exited-before-kill");
            self.sh.wait_child(p);
            return;
        }
        signal(p, libc::SIGSTOP);
        let stopped = wait_for_within(Duration::from_secs(10), || {
            !p.alive() || proc_state(p.pid).as_deref() == Some("T")
        });
        assert!(stopped, "leash exec {} did not stop", p.pid);
        let exe = std::fs::read_link(format!("/proc/{}/exe", p.pid)).ok();
        let rows = self.root.rows_within(Duration::from_millis(300));
        let committed = seen_row
            || rows
                .as_ref()
                .is_ok_and(|rows| rows.iter().any(|r| r.1 == key));
        let point = match exe {
            Some(e) if e.starts_with(&self.root.wrapper_root) => {
                if children(p.pid).is_empty() {
                    "kill:wrapper-before-adapter"
                } else {
                    "kill:adapter-running"
                }
            }
            Some(_) if committed => "kill:commit-to-exec",
            // Stopped inside a transaction (or the checkpoint of a closing connection).
            Some(_) if rows.is_err() => "kill:holding-the-database-lock",
            Some(_) => "kill:before-commit",
            None => "kill:exec-exiting",
        };
        self.sh.kill(p, point);
        self.sh.wait_child(p);
    }

    /// The owner starts sessions; sometimes it dies while they are still starting.
    fn owner_spawns(&mut self) {
        let n = 1 + self.rng.below(3);
        let mut keys = Vec::new();
        for _ in 0..n {
            // Now and then a session key reused: a second exec for a session whose lease may
            // still be active (refused) or gone (superseded).
            let key = if !self.used_keys.is_empty() && self.rng.chance(15) {
                self.rng.pick(&self.used_keys).clone()
            } else {
                self.sh.session_key(self.root.index, "own")
            };
            let grace = self.grace();
            let mode = *self.rng.pick(modes());
            keys.push((key, grace, mode));
        }
        let kill_soon = self.rng.chance(25);
        let delay = self.rng.early_delay();
        let root = self.root;
        let owner = self.ensure_owner();
        owner.spawn(root, &keys, !kill_soon);
        let (pid, name) = (owner.pid, owner.name());
        self.used_keys.extend(keys.into_iter().map(|k| k.0));
        if kill_soon {
            std::thread::sleep(delay);
            self.sh
                .kill(pid, &format!("kill:{name}-while-sessions-start"));
            self.owner = None;
            self.sh.wait_child(pid);
        } else if name == "owner" {
            // Let them start, so later actions find them (the daemon answered once they had).
            std::thread::sleep(Duration::from_millis(20 + self.rng.below(80)));
        }
    }

    /// The gateway dies; at its restart, a startup reap (maybe killed part-way, maybe two).
    fn kill_owner(&mut self) {
        let Some(owner) = self.owner.take() else {
            self.owner_spawns();
            return;
        };
        if matches!(owner.kind, OwnerKind::Daemon { .. }) && self.rng.chance(30) {
            // A daemon asked to stop (SIGTERM: it records the busy sessions and closes them all
            // through the normal close path), SIGKILLed part-way through that shutdown.
            signal(owner.pid, libc::SIGTERM);
            std::thread::sleep(Duration::from_millis(self.rng.below(400)));
            self.sh.kill(owner.pid, "kill:daemon-during-shutdown");
        } else {
            self.sh.kill(owner.pid, &format!("kill:{}", owner.name()));
        }
        self.sh.wait_child(owner.pid);
        match self.rng.below(12) {
            0..=3 => self.reap(false, None),
            4..=6 => {
                let d = Duration::from_millis(self.rng.below(400));
                self.reap(false, Some(d))
            }
            7..=8 => self.racing_reapers(),
            // The gateway comes back as a daemon: its startup reap settles the dead owner's
            // leases, sometimes with the new daemon SIGKILLed part-way through it.
            9..=10 => {
                let kill = self.rng.chance(50);
                let d = Duration::from_millis(self.rng.below(300));
                let daemon = Owner::start_daemon(self.sh, self.root, !kill);
                if kill {
                    std::thread::sleep(d);
                    self.sh.kill(daemon.pid, "kill:daemon-during-startup-reap");
                    self.sh.wait_child(daemon.pid);
                } else {
                    self.sh.point("daemon-startup-reap");
                    self.owner = Some(daemon);
                }
            }
            _ => {}
        }
    }

    /// One `leash reap` (startup semantics: live owners are skipped), maybe SIGKILLed after
    /// `kill_after`.
    fn reap(&mut self, include_live: bool, kill_after: Option<Duration>) {
        let grace = self.grace().to_string();
        let mut cmd = self.root.leash();
        cmd.args(["reap", "--grace-ms", &grace]);
        if include_live {
            cmd.arg("--include-live");
        }
        let p = self.sh.register(cmd.spawn().unwrap());
        if let Some(d) = kill_after {
            std::thread::sleep(d);
            self.sh.kill(p, "kill:reaper-mid-reap");
        }
        self.finish(p, "reap", &[0, 6]);
    }

    fn racing_reapers(&mut self) {
        let grace = self.grace().to_string();
        let spawn = |w: &Self| {
            let mut cmd = w.root.leash();
            cmd.args(["reap", "--grace-ms", &grace]);
            w.sh.register(cmd.spawn().unwrap())
        };
        let a = spawn(self);
        // With a daemon serving the root the CLI goes through it; `--no-daemon` makes the second
        // reaper work on the database directly: the daemon and a CLI racing.
        let direct = self.rng.chance(50);
        let b = {
            let mut cmd = self.root.leash();
            cmd.args(["reap", "--grace-ms", &grace]);
            if direct {
                cmd.arg("--no-daemon");
            }
            self.sh.register(cmd.spawn().unwrap())
        };
        self.sh.point("two-reapers-race");
        if self.rng.chance(40) {
            std::thread::sleep(Duration::from_millis(self.rng.below(300)));
            self.sh.kill(a, "kill:one-of-two-reapers");
        }
        self.finish(a, "racing reap", &[0, 6]);
        self.finish(b, "racing reap", &[0, 6]);
    }

    /// Waits for a leash command the harness started and records an unexpected exit.
    fn finish(&self, p: Pid, what: &str, allowed: &[i32]) {
        let mut r = self.sh.registry.lock().unwrap();
        let Some(i) = r.children.iter().position(|(q, _)| *q == p) else {
            return;
        };
        let (_, mut c) = r.children.swap_remove(i);
        drop(r);
        let status = c.wait().unwrap();
        self.sh.note_exit(
            &format!("leash {what} in root {}", self.root.index),
            status,
            allowed,
        );
    }

    fn kill_member(&mut self) {
        let sessions = self.sessions();
        if sessions.is_empty() {
            return;
        }
        let s = self.rng.pick(&sessions);
        let choice = self.rng.below(3);
        let (target, point) = match choice {
            0 => (s.wrapper, "kill:wrapper"),
            1 => (s.adapter, "kill:adapter"),
            _ => (
                (!s.others.is_empty()).then(|| *self.rng.pick(&s.others)),
                "kill:descendant",
            ),
        };
        if let Some(t) = target.or(s.wrapper).or(s.others.first().copied()) {
            let point = if target.is_some() {
                point
            } else {
                "kill:leftover"
            };
            self.sh.kill(t, point);
        }
    }

    /// `leash close` of a live session, with a SIGKILL of the closer, the wrapper or the adapter
    /// while the close's grace runs.
    fn close_with_chaos(&mut self) {
        let sessions: Vec<Session> = self
            .sessions()
            .into_iter()
            .filter(|s| s.wrapper.is_some())
            .collect();
        if sessions.is_empty() {
            self.owner_spawns();
            return;
        }
        let s = self.rng.pick(&sessions);
        let grace = self.grace();
        let mut cmd = self.root.leash();
        cmd.args(["close", &s.lease, "--grace-ms", &grace.to_string()]);
        let closer = self.sh.register(cmd.spawn().unwrap());
        let daemon = self
            .owner
            .as_ref()
            .filter(|o| matches!(o.kind, OwnerKind::Daemon { .. }))
            .map(|o| o.pid);
        let victim = self.rng.below(if daemon.is_some() { 5 } else { 4 });
        let mut allowed = vec![0, 3, 6];
        if victim != 3 {
            // Into the grace: the lease is claimed (closing) and SIGTERM is out.
            let lease = s.lease.clone();
            wait_for_within(Duration::from_secs(5), || {
                !closer.alive()
                    || self
                        .root
                        .rows()
                        .iter()
                        .any(|r| r.0 == lease && r.2 == "closing")
            });
            std::thread::sleep(Duration::from_millis(self.rng.below(grace)));
            match victim {
                0 => self.sh.kill(closer, "kill:closer-in-grace"),
                1 => {
                    if let Some(w) = s.wrapper {
                        self.sh.kill(w, "kill:wrapper-in-close-grace")
                    }
                }
                2 => {
                    if let Some(a) = s.adapter {
                        self.sh.kill(a, "kill:adapter-in-close-grace")
                    }
                }
                _ => {
                    // The daemon carrying out this close dies in its grace: the client fails
                    // (exit 1, "via the daemon"), the wrappers drain on their own.
                    if let Some(d) = daemon {
                        self.sh.kill(d, "kill:daemon-in-close-grace");
                        self.sh.wait_child(d);
                        self.owner = None;
                        allowed.push(1);
                    }
                }
            }
        }
        self.finish(closer, "close", &allowed);
    }

    /// PID reuse: a dead root's pid handed to a decoy, or to another root's session; the dead
    /// lease is then closed. Root only (ns_last_pid), one at a time.
    fn pid_reuse(&mut self) {
        if !is_root() {
            static SAID: std::sync::Once = std::sync::Once::new();
            SAID.call_once(|| {
                skip("the pid-reuse action: forcing pids needs root (an early-kill exec runs instead)")
            });
            return self.exec_early_kill();
        }
        let _one = self
            .sh
            .forcing_pids
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let key = self.sh.session_key(self.root.index, "reuse");
        let mut cmd = self.root.leash();
        cmd.args(["exec", "--session", &key, "--grace-ms", "200", "--"])
            .arg(&self.sh.adapter)
            .arg("polite");
        let wrapper = self.sh.register(cmd.spawn().unwrap());
        let mut adapter = None;
        wait_for(|| {
            adapter = children(wrapper.pid).first().and_then(|&c| Pid::of(c));
            adapter.is_some() || !wrapper.alive()
        });
        let Some(adapter) = adapter else {
            return;
        };
        let Some(lease) = self
            .root
            .rows()
            .into_iter()
            .find(|r| r.1 == key)
            .map(|r| r.0)
        else {
            return;
        };
        self.sh.kill(wrapper, "kill:wrapper-for-pid-reuse");
        self.sh.wait_child(wrapper);
        wait_for(|| !adapter.alive());

        let other = self.rng.below(self.sh.roots.len() as u64) as usize;
        let to_other_root = other != self.root.index && self.rng.chance(50);
        let tag = self.sh.next_id.fetch_add(1, Ordering::Relaxed);
        let log = self.root.work.join(format!("reuse-decoy-{tag}.log"));
        let mut cmd = if to_other_root {
            let mut c = self.sh.roots[other].leash();
            c.args([
                "exec",
                "--session",
                &format!("r{other}-sentinel-reuse-{tag}"),
                "--grace-ms",
                "200",
                "--",
            ])
            .arg(&self.sh.trap)
            .arg(&log)
            .env(ENV_SENTINEL, "1");
            c
        } else {
            let mut c = Command::new(&self.sh.trap);
            c.arg(&log).stdin(Stdio::null());
            c
        };
        let Some(child) = spawn_with_pid(wrapper.pid, &mut cmd) else {
            self.sh.point("pid-reuse-missed");
            return;
        };
        self.sh.register(child);
        let d = Logged::wait_started(log.clone());
        self.sh.add_decoy(Decoy {
            pid: d.pid,
            log,
            what: if to_other_root {
                format!(
                    "root {other}'s session on root {}'s reused pid",
                    self.root.index
                )
            } else {
                format!(
                    "decoy on root {}'s reused pid {}",
                    self.root.index, wrapper.pid
                )
            },
            sentinel_of: to_other_root.then_some(other),
        });
        self.sh.point(if to_other_root {
            "pid-reuse:other-root-session"
        } else {
            "pid-reuse:decoy"
        });
        let mut cmd = self.root.leash();
        cmd.args(["close", &lease, "--grace-ms", "200"]);
        let closer = self.sh.register(cmd.spawn().unwrap());
        self.finish(closer, "close of a reused root pid", &[0, 3]);
    }
}

fn has_strace() -> bool {
    static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *HAS.get_or_init(|| {
        Command::new("strace")
            .arg("-V")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    })
}

/// Spawns `cmd` so that it gets pid `target`, retrying when another process takes the pid first.
/// The processes that have `path` open (pid, state, argv): who holds a lock a daemon was refused.
fn holders(path: &Path) -> String {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let fds = std::fs::read_dir(entry.path().join("fd"))
            .into_iter()
            .flatten();
        if fds
            .flatten()
            .any(|fd| std::fs::read_link(fd.path()).is_ok_and(|t| t == path))
        {
            let argv = std::fs::read(entry.path().join("cmdline"))
                .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
                .unwrap_or_default();
            found.push(format!(
                "pid {pid} state {:?} ppid {:?}: {argv}",
                proc_state(pid),
                ppid_of(pid)
            ));
        }
    }
    if found.is_empty() {
        "no process".into()
    } else {
        found.join("; ")
    }
}

fn ppid_of(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// The last `n` lines of a log file (or why it could not be read).
fn tail(path: &Path, n: usize) -> String {
    match std::fs::read(path) {
        Ok(bytes) => {
            let text = String::from_utf8_lossy(&bytes);
            let lines: Vec<&str> = text.lines().collect();
            lines[lines.len().saturating_sub(n)..].join("\n")
        }
        Err(e) => format!("(cannot read {}: {e})", path.display()),
    }
}

fn spawn_with_pid(target: i32, cmd: &mut Command) -> Option<Child> {
    for _ in 0..200 {
        if Pid::of(target).is_some() {
            return None;
        }
        std::fs::write("/proc/sys/kernel/ns_last_pid", (target - 1).to_string()).ok()?;
        let mut child = cmd.spawn().ok()?;
        if child.id() as i32 == target {
            return Some(child);
        }
        child.kill().unwrap();
        child.wait().unwrap();
    }
    None
}

// ---------------------------------------------------------------------------------------------
// Scripts

const ADAPTER: &str = r#"# A chaos adapter. polite exits on SIGTERM; stubborn ignores it; escaper leaves a setsid'd
# descendant that ignores SIGTERM; family adds a child that ignores it; ghost leaves a
# double-forked, setsid'd, env -i descendant that ignores SIGTERM (tagged by its $0). Run with DECOY_LOG set
# (and no lease) it is a decoy with the very same argv.
if [ -n "$DECOY_LOG" ]; then log="$DECOY_LOG"; else log="$CHAOS_SIGDIR/$OPENCLAW_ACPX_LEASE_ID.log"; fi
for s in INT HUP QUIT USR1 USR2 ALRM; do trap "echo $s >> '$log'" $s; done
if [ "$1" = polite ]; then trap "echo TERM >> '$log'; exit 143" TERM; else trap "echo TERM >> '$log'" TERM; fi
case "$1" in
  escaper) setsid sh -c 'trap "" TERM; while :; do sleep 1; done' </dev/null >/dev/null 2>&1 & ;;
  family) sh -c 'trap "" TERM; while :; do sleep 1; done' </dev/null >/dev/null 2>&1 & ;;
  ghost) ( setsid env -i /bin/sh -c 'trap "" TERM; while :; do sleep 1; done' "chaos-ghost-$OPENCLAW_GATEWAY_INSTANCE_ID" </dev/null >/dev/null 2>&1 & ) ;;
esac
if [ -n "$DECOY_LOG" ]; then echo $$ > "$DECOY_LOG.pid"; fi
while :; do sleep 1 & wait $!; done"#;

const OWNER: &str = r#"# A gateway stand-in: one leased session per line "KEY GRACE MODE" on stdin.
log="$1"
for s in TERM INT HUP QUIT USR1 USR2 ALRM; do trap "echo $s >> '$log'" $s; done
echo $$ > "$log.pid"
while read -r key grace mode; do
  "$LEASH_BIN" --state-dir "$STATE" exec --owner-pid $$ --session "$key" --grace-ms "$grace" -- "$ADAPTER" "$mode" </dev/null >/dev/null 2>>"$ERRLOG" &
done
while :; do sleep 1 & wait $!; done"#;

// ---------------------------------------------------------------------------------------------
// The test

#[test]
fn chaos_leaves_no_leak_no_wrong_signal_and_no_stuck_lease() {
    let cfg = config();
    println!(
        "chaos seed: {} (replay with LEASH_CHAOS_SEED={}); iterations<={} seconds<={} roots={}",
        cfg.seed, cfg.seed, cfg.iterations, cfg.seconds, cfg.roots
    );
    let tmp = TempDir::new("chaos");
    let adapter = script(tmp.path(), "adapter.sh", ADAPTER);
    let owner_script = script(tmp.path(), "owner.sh", OWNER);
    let trap = trap_script(tmp.path());

    let mut roots = Vec::new();
    for i in 0..cfg.roots {
        let state = tmp.join(&format!("state{i}"));
        let work = tmp.join(&format!("work{i}"));
        std::fs::create_dir_all(work.join("sig")).unwrap();
        // The first exec creates the root (read-only commands never do).
        assert_eq!(run(&state, &["exec", "--", "true"]).code, Some(0));
        let status = run_json(&state, &["status", "--json"]);
        roots.push(RootInfo {
            index: i,
            adapter: adapter.clone(),
            gateway: status["gatewayInstanceId"].as_str().unwrap().to_string(),
            wrapper_root: PathBuf::from(status["wrapperRoot"].as_str().unwrap()),
            state: PathBuf::from(status["stateDir"].as_str().unwrap()),
            work,
        });
    }
    let sh = Arc::new(Shared {
        roots,
        deadline: Instant::now() + Duration::from_secs(cfg.seconds),
        iterations_left: AtomicU64::new(cfg.iterations),
        iterations: AtomicU64::new(0),
        kills: AtomicU64::new(0),
        points: Mutex::new(BTreeMap::new()),
        decoys: Mutex::new(Vec::new()),
        owner_logs: Mutex::new(Vec::new()),
        owners: Mutex::new(Vec::new()),
        unexpected: Mutex::new(Vec::new()),
        registry: Mutex::new(Registry::default()),
        forcing_pids: Mutex::new(()),
        next_id: AtomicU64::new(0),
        adapter,
        trap,
        owner_script,
    });

    // Decoys: the adapters' exact argv without a lease, and a sentinel session per root.
    for (i, mode) in ["polite", "stubborn"].iter().enumerate() {
        sh.start_argv_decoy(mode, &i.to_string());
    }
    for r in 0..cfg.roots {
        sh.start_sentinel(r, None).expect("sentinel session");
    }

    std::thread::scope(|s| {
        for r in 0..cfg.roots {
            let sh = &*sh;
            let seed = cfg.seed ^ (r as u64 + 1).wrapping_mul(0xA24B_AED4_963E_E407);
            s.spawn(move || {
                Worker {
                    sh,
                    root: &sh.roots[r],
                    rng: Rng(seed),
                    owner: None,
                    generation: 0,
                    used_keys: Vec::new(),
                }
                .run()
            });
        }
    });

    // Final: every gateway dies; `leash exec`s still starting settle; one reap per root.
    let mut rng = Rng(cfg.seed ^ 0x5EED);
    let owners: Vec<Pid> = sh.owners.lock().unwrap().clone();
    for p in owners {
        signal(p, libc::SIGKILL);
        sh.wait_child(p);
    }
    let dirs: Vec<String> = sh
        .roots
        .iter()
        .map(|r| r.state.display().to_string())
        .collect();
    let leash_exe = std::fs::canonicalize(leash_bin()).unwrap();
    let starting = || -> Vec<i32> {
        let mut out = Vec::new();
        for e in std::fs::read_dir("/proc").unwrap().flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
                continue;
            };
            let exe = std::fs::read_link(format!("/proc/{pid}/exe")).ok();
            let argv = cmdline(pid);
            if exe.as_deref() == Some(leash_exe.as_path())
                && argv.contains(" exec ")
                && dirs.iter().any(|d| argv.contains(d.as_str()))
            {
                out.push(pid);
            }
        }
        out
    };
    let settled = wait_for(|| starting().is_empty());
    assert!(
        settled,
        "leash exec processes never settled: {:?}",
        starting()
    );

    let mut bad: BTreeMap<String, String> = BTreeMap::new();
    let check_decoys = |reaped: &HashSet<usize>, bad: &mut BTreeMap<String, String>| {
        for d in sh.decoys.lock().unwrap().iter() {
            if d.sentinel_of.is_some_and(|r| reaped.contains(&r)) {
                continue;
            }
            if let Some(p) = d.problem() {
                bad.entry(d.what.clone()).or_insert(p);
            }
        }
    };
    let mut reaped = HashSet::new();
    check_decoys(&reaped, &mut bad);
    let mut order: Vec<usize> = (0..cfg.roots).collect();
    for i in (1..order.len()).rev() {
        order.swap(i, rng.below(i as u64 + 1) as usize);
    }
    let mut final_reaps = Vec::new();
    for &r in &order {
        let out = run(
            &sh.roots[r].state,
            &["reap", "--include-live", "--grace-ms", "300", "--json"],
        );
        if out.code != Some(0) {
            sh.unexpected.lock().unwrap().push(format!(
                "final reap of root {r}: exit {:?}: {}",
                out.code, out.stderr
            ));
        }
        final_reaps.push((r, out.stdout));
        reaped.insert(r);
        check_decoys(&reaped, &mut bad);
    }
    for log in sh.owner_logs.lock().unwrap().iter() {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        if !text.is_empty() {
            bad.insert(
                format!("owner {}", log.display()),
                format!("owner logged signals: {}", text.trim()),
            );
        }
    }

    // Leaks: anything still carrying a root's markers once its reap is done (settle ≤ 3 s).
    let gateways: HashSet<String> = sh.roots.iter().map(|r| r.gateway.clone()).collect();
    wait_for_within(Duration::from_secs(3), || scan_marked(&gateways).is_empty());
    let leaked = scan_marked(&gateways);
    for m in &leaked {
        let root = sh.roots.iter().position(|r| r.gateway == m.gateway);
        eprintln!(
            "LEAK root {root:?} lease {} pid {} ppid {}: {}",
            m.lease, m.pid.pid, m.ppid, m.argv
        );
    }

    // Stuck: leases neither closed, ended nor lost with a reason.
    let mut stuck = 0;
    for r in &sh.roots {
        for (id, key, state, reason) in r.rows() {
            let settled = (state == "closed" || state == "ended" || state == "lost")
                && reason.as_deref().is_some_and(|s| !s.is_empty());
            if !settled {
                stuck += 1;
                eprintln!(
                    "STUCK root {} lease {id} session {key}: {state} ({reason:?})",
                    r.index
                );
            }
        }
    }
    for (what, p) in &bad {
        eprintln!("WRONG SIGNAL {what}: {p}");
    }
    if !leaked.is_empty() || stuck > 0 || !bad.is_empty() {
        for (r, out) in &final_reaps {
            eprintln!("final reap of root {r}: {out}");
        }
    }
    let points = sh.points.lock().unwrap().clone();
    println!(
        "chaos points: {}",
        points
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(" ")
    );
    let unexpected = sh.unexpected.lock().unwrap().clone();
    for u in &unexpected {
        eprintln!("UNEXPECTED {u}");
    }
    println!(
        "chaos: iterations={} kills={} leaks={} wrong_signals={} stuck={}",
        sh.iterations.load(Ordering::Relaxed),
        sh.kills.load(Ordering::Relaxed),
        leaked.len(),
        bad.len(),
        stuck
    );
    assert!(
        leaked.is_empty() && bad.is_empty() && stuck == 0,
        "chaos found leaks, wrong signals or stuck leases (seed {}); see above",
        cfg.seed
    );
    assert!(
        unexpected.is_empty(),
        "leash exited unexpectedly (seed {}): {unexpected:?}",
        cfg.seed
    );
}
