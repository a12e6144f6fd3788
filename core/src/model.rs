//! The model: the plain data every decision reads. A [`Lease`] (its [`LeaseState`] owns its
//! transitions, so no code path can move a lease from `closed` back to `open` by accident), a
//! process instance ([`ProcessId`]), what is known of a live process ([`ProcessInfo`], its lease
//! markers in [`LeaseEnv`]), a [`Snapshot`] of the process table with its walks, what was seen of
//! a cgroup ([`Observation`]), a legacy record ([`LegacyRecord`]) and a session's row
//! ([`SessionRow`]).
//!
//! Reading them is the `leash` crate's business (`/proc` behind its `ProcessTable`, the cgroup
//! files, the store); here they are only data, built by the caller.

use crate::kind::{HasKind, Kind};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

/// The directory a running daemon keeps in its gateway's cgroup directory (`<cgroup root>/<gateway
/// id>/daemon-hold`): empty, never a lease's (no UUID), so that the gateway's directory is not
/// removed by the wrapper of the last lease and made again by the next `leash exec` — a `mkdir`
/// and an `rmdir` of a cgroup on every session start of a gateway that runs one at a time. The
/// stray sweep passes it over; the daemon removes it when it stops.
pub const GATEWAY_HOLD: &str = "daemon-hold";

/// Name of the environment variable that carries the lease id into the wrapper and every
/// descendant of the adapter (the incumbent's contract; keep the name).
pub const ENV_LEASE_ID: &str = "OPENCLAW_ACPX_LEASE_ID";
/// Name of the environment variable that carries the gateway instance id.
pub const ENV_GATEWAY_ID: &str = "OPENCLAW_GATEWAY_INSTANCE_ID";

/// `open → closing → closed | lost`, `open → ended`, plus the two ways back that keep a lease
/// from getting stuck: `closing → open` when the live tree could not be verified (nothing was
/// signalled), and `open → lost` when its processes are found gone without any close and without
/// a word from the wrapper.
///
/// `ended` and `lost` differ in what leash saw: `ended` is an end leash observed (the wrapper
/// reported the adapter's exit status, or that the adapter could not be started, and its tree was
/// then found gone); `lost` is a tree leash lost sight of without seeing it end (a wrapper
/// SIGKILLed or vanished without a report, a superseded lease whose processes were found gone).
/// docs/cli.md ("Lease states") defines every state for operators.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LeaseState {
    Open,
    Closing,
    Closed,
    Lost,
    /// The adapter's end was observed: it exited (status recorded) or could not be started.
    Ended,
}

impl LeaseState {
    pub const ALL: [LeaseState; 5] = [
        LeaseState::Open,
        LeaseState::Closing,
        LeaseState::Closed,
        LeaseState::Lost,
        LeaseState::Ended,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            LeaseState::Open => "open",
            LeaseState::Closing => "closing",
            LeaseState::Closed => "closed",
            LeaseState::Lost => "lost",
            LeaseState::Ended => "ended",
        }
    }

    /// The allowed transitions. Everything else is a bug or a tampered row.
    pub fn can_become(self, to: LeaseState) -> bool {
        use LeaseState::*;
        matches!(
            (self, to),
            (Open, Closing)
                | (Closing, Closed)
                | (Closing, Lost)
                | (Closing, Open)
                | (Open, Lost)
                | (Open, Ended)
        )
    }

    /// Open and closing leases may still have live processes.
    pub fn is_active(self) -> bool {
        matches!(self, LeaseState::Open | LeaseState::Closing)
    }

    pub fn is_terminal(self) -> bool {
        !self.is_active()
    }
}

impl fmt::Display for LeaseState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A lease state that is none of the five (a tampered or corrupt row).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadState(pub String);

impl fmt::Display for BadState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "unknown lease state '{}' (expected open, closing, closed, lost or ended)",
            self.0
        )
    }
}

impl std::error::Error for BadState {}

impl FromStr for LeaseState {
    type Err = BadState;
    fn from_str(s: &str) -> Result<Self, BadState> {
        match s {
            "open" => Ok(LeaseState::Open),
            "closing" => Ok(LeaseState::Closing),
            "closed" => Ok(LeaseState::Closed),
            "lost" => Ok(LeaseState::Lost),
            "ended" => Ok(LeaseState::Ended),
            other => Err(BadState(other.to_string())),
        }
    }
}

/// A process instance: a pid alone names whatever process holds that number now; the start time
/// (field 22 of `/proc/<pid>/stat`, clock ticks since boot) pins the one we mean.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProcessId {
    pub pid: i32,
    pub start_time: u64,
}

/// One lease row. Field names (camelCase in JSON) follow the seed's `AcpxProcessLease`, plus the
/// evidence that makes verification strong (start times, owner, adapter).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Lease {
    pub lease_id: String,
    pub gateway_instance_id: String,
    pub session_key: String,
    pub agent_id: Option<String>,
    /// Directory the wrapper binary of this gateway is installed in; the live `/proc/<pid>/exe` of
    /// the root must lie under it.
    pub wrapper_root: String,
    /// The exact wrapper binary the root was exec'd as.
    pub wrapper_path: String,
    /// The wrapper's pid (the pid that ran `leash exec`, kept across its exec).
    pub root_pid: i32,
    pub root_start_time: u64,
    /// The root's pidfs inode where the kernel has pidfs (>= 6.9): unique for the life of the
    /// system, it tells the root apart from a process that reused its pid within one clock tick.
    #[serde(default)]
    pub root_pidfs_ino: Option<u64>,
    /// The lease's cgroup (containment on): `<leash cgroup root>/<gateway id>/<lease id>`,
    /// created before the wrapper started; the adapter was started inside it.
    #[serde(default)]
    pub cgroup_path: Option<String>,
    /// That directory's inode (the cgroup id): a directory made again under the same name has
    /// another, and is not the lease's.
    #[serde(default)]
    pub cgroup_id: Option<u64>,
    /// The directory the wrapper writes its report in (`<dir>/<lease id>.json`), when it is not
    /// the state root's `run/`: a private runtime directory on tmpfs (`leash::state::
    /// resolve_reports_dir`). A claim like every stored fact: a reader uses it only when it is a
    /// private directory of its own user.
    #[serde(default)]
    pub report_dir: Option<String>,
    /// The adapter's process group (reported by the wrapper after spawn).
    pub process_group_id: Option<i32>,
    pub adapter_pid: Option<i32>,
    pub adapter_start_time: Option<u64>,
    /// SHA-256 of the adapter argv (NUL-separated), hex.
    pub command_hash: String,
    /// The adapter argv, for operators.
    pub command: Vec<String>,
    /// The process the wrapper treats as its parent (whoever spawned `leash exec`).
    pub owner_pid: i32,
    pub owner_start_time: u64,
    /// Unix time in milliseconds.
    pub started_at: i64,
    pub grace_ms: u64,
    pub state: LeaseState,
    /// Why the lease is in its state (set on every transition but the first).
    pub state_reason: Option<String>,
    pub closed_at: Option<i64>,
    /// The adapter's exit status as the wrapper reported it (code, or 128+signal).
    pub exit_status: Option<i32>,
    /// Who holds a `closing` lease: the closer's pid and start time. A closing lease whose
    /// claimant is gone may be claimed again, so no lease stays stuck in `closing`.
    pub claimed_by: Option<ProcessId>,
}

impl Lease {
    pub fn root(&self) -> ProcessId {
        ProcessId {
            pid: self.root_pid,
            start_time: self.root_start_time,
        }
    }

    pub fn owner(&self) -> ProcessId {
        ProcessId {
            pid: self.owner_pid,
            start_time: self.owner_start_time,
        }
    }

    /// The adapter, once the wrapper's report has been folded into the row.
    pub fn adapter(&self) -> Option<ProcessId> {
        Some(ProcessId {
            pid: self.adapter_pid?,
            start_time: self.adapter_start_time?,
        })
    }
}

/// Hash of an argv as the adapter will receive it. NUL separates tokens because no token can
/// contain one, so `["a b"]` and `["a", "b"]` never collide; quoting plays no part.
pub fn command_hash<S: AsRef<[u8]>>(argv: &[S]) -> String {
    use sha2::Digest;
    let mut h = sha2::Sha256::new();
    for (i, a) in argv.iter().enumerate() {
        if i > 0 {
            h.update([0u8]);
        }
        h.update(a.as_ref());
    }
    format!("{:x}", h.finalize())
}

// ---------------------------------------------------------------------------------------------
// Sessions

/// A session row as the store keeps it: its ownership metadata (who owns it, who spawned it, its
/// parent), its agent, and its lease. The store reads and writes it; the visibility check
/// (`crate::visibility`) reads only its fields.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionRow {
    pub session_key: String,
    pub agent_id: Option<String>,
    pub owner_session_key: Option<String>,
    pub spawned_by: Option<String>,
    pub parent_session_key: Option<String>,
    pub backend: String,
    pub gateway_instance_id: String,
    pub created_at: i64,
    pub lease_id: Option<String>,
}

// ---------------------------------------------------------------------------------------------
// Processes

/// What leash knows about one live process.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProcessInfo {
    pub pid: i32,
    pub ppid: i32,
    pub pgid: i32,
    pub sid: i32,
    pub uid: u32,
    /// Field 22 of `/proc/<pid>/stat`: clock ticks since boot.
    pub start_time: u64,
    /// The state letter (`R`, `S`, `Z`, ...).
    #[serde(default = "default_state")]
    pub state: char,
    /// `readlink /proc/<pid>/exe`; `None` when unreadable (permission, kernel thread).
    #[serde(default)]
    pub exe: Option<String>,
    /// The argv; `None` when unreadable.
    #[serde(default)]
    pub argv: Option<Vec<String>>,
    /// The lease markers from `environ`; `None` when `environ` is unreadable.
    #[serde(default)]
    pub env: Option<LeaseEnv>,
    /// The pidfs inode (Linux >= 6.9): unique for the life of the system, so it tells apart two
    /// processes that got the same pid within one clock tick. `None` where unknown.
    #[serde(default)]
    pub pidfs_ino: Option<u64>,
}

fn default_state() -> char {
    'S'
}

impl ProcessInfo {
    pub fn id(&self) -> ProcessId {
        ProcessId {
            pid: self.pid,
            start_time: self.start_time,
        }
    }

    /// The exe path with the kernel's " (deleted)" suffix removed (a wrapper binary replaced by a
    /// newer build while it runs still lies where it was).
    pub fn exe_path(&self) -> Option<&str> {
        self.exe
            .as_deref()
            .map(|e| e.strip_suffix(" (deleted)").unwrap_or(e))
    }
}

/// The two lease environment variables, as found in a process's initial environment.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LeaseEnv {
    #[serde(default)]
    pub lease_id: Option<String>,
    #[serde(default)]
    pub gateway_instance_id: Option<String>,
}

/// A set of processes read at (about) one moment.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    procs: HashMap<i32, ProcessInfo>,
    children: HashMap<i32, Vec<i32>>,
    // Indexes, so that verifying many leases against one snapshot stays linear.
    by_pgid: HashMap<i32, Vec<i32>>,
    by_lease: HashMap<String, Vec<i32>>,
    /// What was observed of the leases' cgroups when the snapshot was taken.
    cgroups: HashMap<PathBuf, Observation>,
    /// What was seen of leash's own leases, for telling them from a legacy record's processes.
    leash: LeashSeen,
}

/// What the host shows of leash's own leases when a snapshot is taken: the evidence that a
/// process is leash's and never an incumbent's (see `legacy::leash_claim`). Read by the machine
/// room; a process found here is never part of a legacy record's tree.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LeashSeen {
    /// Lease ids a leash store holds (this root's rows, of any state) or that name a lease
    /// cgroup under leash's cgroup root (any state root on the host).
    pub lease_ids: std::collections::HashSet<String>,
    /// Processes in a lease cgroup under leash's cgroup root (any gateway), with its path.
    pub cgroup_members: HashMap<i32, String>,
}

impl Snapshot {
    pub fn new(list: impl IntoIterator<Item = ProcessInfo>) -> Snapshot {
        let mut procs = HashMap::new();
        let mut children: HashMap<i32, Vec<i32>> = HashMap::new();
        let mut by_pgid: HashMap<i32, Vec<i32>> = HashMap::new();
        let mut by_lease: HashMap<String, Vec<i32>> = HashMap::new();
        for p in list {
            children.entry(p.ppid).or_default().push(p.pid);
            by_pgid.entry(p.pgid).or_default().push(p.pid);
            if let Some(id) = p.env.as_ref().and_then(|e| e.lease_id.clone()) {
                by_lease.entry(id).or_default().push(p.pid);
            }
            procs.insert(p.pid, p);
        }
        for v in children
            .values_mut()
            .chain(by_pgid.values_mut())
            .chain(by_lease.values_mut())
        {
            v.sort_unstable();
        }
        Snapshot {
            procs,
            children,
            by_pgid,
            by_lease,
            cgroups: HashMap::new(),
            leash: LeashSeen::default(),
        }
    }

    /// Records what was seen of leash's own leases (see [`LeashSeen`]).
    pub fn set_leash_seen(&mut self, seen: LeashSeen) {
        self.leash = seen;
    }

    /// What was seen of leash's own leases.
    pub fn leash_seen(&self) -> &LeashSeen {
        &self.leash
    }

    /// Adds what was observed of a cgroup directory.
    pub fn add_cgroup(&mut self, obs: Observation) {
        self.cgroups.insert(obs.path.clone(), obs);
    }

    /// The observation of a cgroup directory, if one was made.
    pub fn cgroup(&self, path: &Path) -> Option<&Observation> {
        self.cgroups.get(path)
    }

    pub fn get(&self, pid: i32) -> Option<&ProcessInfo> {
        self.procs.get(&pid)
    }

    /// The process with this pid, if it is the same instance (same start time).
    pub fn instance(&self, id: ProcessId) -> Option<&ProcessInfo> {
        self.get(id.pid).filter(|p| p.start_time == id.start_time)
    }

    pub fn children_of(&self, pid: i32) -> &[i32] {
        self.children.get(&pid).map_or(&[], Vec::as_slice)
    }

    /// Members of a process group, by pid.
    pub fn group(&self, pgid: i32) -> impl Iterator<Item = &ProcessInfo> {
        self.by_pgid
            .get(&pgid)
            .into_iter()
            .flatten()
            .filter_map(|pid| self.procs.get(pid))
    }

    /// Processes whose environment carries this lease id, by pid.
    pub fn marked(&self, lease_id: &str) -> impl Iterator<Item = &ProcessInfo> {
        self.by_lease
            .get(lease_id)
            .into_iter()
            .flatten()
            .filter_map(|pid| self.procs.get(pid))
    }

    pub fn iter(&self) -> impl Iterator<Item = &ProcessInfo> {
        self.procs.values()
    }

    /// `root` and its descendants by parent links.
    pub fn subtree(&self, root: i32) -> Snapshot {
        let mut out = Vec::new();
        let mut stack = vec![root];
        // A cycle in the parent links (a corrupt fixture, or pids recycled between two reads)
        // must not loop forever nor list a process twice.
        let mut seen = std::collections::HashSet::new();
        while let Some(pid) = stack.pop() {
            if !seen.insert(pid) {
                continue;
            }
            if let Some(p) = self.get(pid) {
                out.push(p.clone());
                stack.extend_from_slice(self.children_of(pid));
            }
        }
        Snapshot::new(out)
    }

    pub fn len(&self) -> usize {
        self.procs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.procs.is_empty()
    }
}

/// The process table could not be read: nothing can be verified, so nothing is signalled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TableError {
    Unavailable(String),
}

impl fmt::Display for TableError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TableError::Unavailable(why) => write!(f, "the process table is unavailable: {why}"),
        }
    }
}

impl std::error::Error for TableError {}

/// A process table that cannot be read: nothing can be verified, so nothing is signalled.
impl HasKind for TableError {
    fn kind(&self) -> Kind {
        Kind::Unverified
    }
}

// ---------------------------------------------------------------------------------------------
// Cgroups

/// What was seen of one cgroup directory at one moment. Pure data: the verifier reads it from
/// the snapshot it judges.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Observation {
    pub path: PathBuf,
    /// The directory's inode (cgroup id); `None` when it does not exist.
    pub id: Option<u64>,
    /// From `cgroup.events`.
    pub populated: bool,
    /// `cgroup.procs`.
    pub procs: Vec<i32>,
    /// Why it could not be read, when it exists but could not.
    pub error: Option<String>,
}

// ---------------------------------------------------------------------------------------------
// Legacy records

/// A legacy record in the store.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LegacyRecord {
    pub id: i64,
    pub session_key: String,
    pub pid: i32,
    pub command: String,
    pub wrapper_path: Option<String>,
    /// The directory the old gateway's wrappers live in (given at import).
    pub wrapper_root: Option<String>,
    pub state: String,
    pub state_reason: Option<String>,
    pub imported_at: i64,
    /// The importer's start time in clock ticks since boot: a process that started later cannot
    /// be the one the record describes.
    pub imported_ticks: u64,
    /// `acpx` for a lease imported from the acpx extension's own store (`leash legacy import
    /// --acpx`); `None` for leash's own legacy format.
    #[serde(default)]
    pub source: Option<String>,
    /// The incumbent's lease id: its wrapper carries it as `--openclaw-acpx-lease-id` and in
    /// `OPENCLAW_ACPX_LEASE_ID`.
    #[serde(default)]
    pub acpx_lease_id: Option<String>,
    /// The gateway instance id the incumbent's lease names (`--openclaw-gateway-instance-id`).
    #[serde(default)]
    pub acpx_gateway_id: Option<String>,
    /// The incumbent's `commandHash`: sha256 (hex) of the wrapper command string it launched.
    #[serde(default)]
    pub command_hash: Option<String>,
    #[serde(default)]
    pub process_group_id: Option<i32>,
    /// The incumbent's `startedAt` (ms since the epoch, its clock): shown, never evidence.
    #[serde(default)]
    pub acpx_started_at: Option<i64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transitions_follow_the_lifecycle() {
        use LeaseState::*;
        assert!(Open.can_become(Closing));
        assert!(Closing.can_become(Closed));
        assert!(Closing.can_become(Lost));
        assert!(Closing.can_become(Open));
        assert!(Open.can_become(Lost));
        assert!(Open.can_become(Ended));
        assert!(
            !Closing.can_become(Ended),
            "a close in progress ends closed or lost"
        );
        for to in LeaseState::ALL {
            assert!(!Closed.can_become(to), "closed -> {to}");
            assert!(!Lost.can_become(to), "lost -> {to}");
            assert!(!Ended.can_become(to), "ended -> {to}");
        }
        assert!(Ended.is_terminal());
        assert!(!Open.can_become(Closed), "closing must come first");
        assert!(!Open.can_become(Open));
    }

    #[test]
    fn state_round_trips_and_rejects_garbage() {
        for s in LeaseState::ALL {
            assert_eq!(s.as_str().parse::<LeaseState>().unwrap(), s);
        }
        assert!("OPEN".parse::<LeaseState>().is_err());
        assert!("".parse::<LeaseState>().is_err());
    }

    #[test]
    fn command_hash_separates_tokens() {
        assert_ne!(command_hash(&["a b"]), command_hash(&["a", "b"]));
        assert_eq!(command_hash(&["x", "y"]), command_hash(&["x", "y"]));
        assert_eq!(command_hash(&["x"]).len(), 64);
    }

    #[test]
    fn command_hash_of_a_known_argv() {
        // sha256 of "node", "/opt/adapter.js", "--stdio" joined by NUL (Python's hashlib).
        assert_eq!(
            command_hash(&["node", "/opt/adapter.js", "--stdio"]),
            "7a3ceef00b0a733887c79105443ffaaccd3451e3845597ef64430ac944772aad"
        );
        assert_eq!(
            command_hash::<&str>(&[]),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }

    /// The `command_hash` stored in lease rows, pinned: SHA-256 of the tokens joined by NUL, in
    /// lowercase hex, as Python's hashlib computes it. Rows written by any build of leash carry
    /// these values for these argvs: one block, an empty token, the padding boundaries at 55, 56
    /// and 64 bytes, several blocks, bytes that are not UTF-8.
    #[test]
    fn stored_command_hashes_read_the_same() {
        let pinned: [(&[&[u8]], &str); 7] = [
            (
                &[b"", b""],
                "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
            ),
            (
                &[&[b'x'; 55]],
                "d5e285683cd4efc02d021a5c62014694958901005d6f71e89e0989fac77e4072",
            ),
            (
                &[&[b'x'; 56]],
                "04c26261370ee7541549d16dee320c723e3fd14671e66a099afe0a377c16888e",
            ),
            (
                &[&[b'x'; 64]],
                "7ce100971f64e7001e8fe5a51973ecdfe1ced42befe7ee8d5fd6219506b5393c",
            ),
            (
                &[
                    b"/usr/bin/env",
                    b"OPENCLAW_ACPX_LEASE_ID=0190b1f2-7c3a-7d4e-8f00-1234567890ab",
                    b"node",
                    b"/opt/adapters/codex-acp/dist/index.js",
                    b"--stdio",
                ],
                "299120abc0d95519aeed79344f89bf9a91ba3fcc422dcbc61a4fc212158b17f3",
            ),
            (
                &[b"f\xffo", b"two words"],
                "9895b2288b62f76878810772542c719288ee10ebd4b6ca0f1537206910b04755",
            ),
            (
                &[b"node", b"/opt/adapter.js", b"--stdio"],
                "7a3ceef00b0a733887c79105443ffaaccd3451e3845597ef64430ac944772aad",
            ),
        ];
        for (argv, want) in pinned {
            assert_eq!(command_hash(argv), want, "{argv:?}");
        }
    }
}
