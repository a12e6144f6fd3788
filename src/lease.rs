//! The process lease: the durable record, committed before a wrapper is spawned, that says which
//! live processes belong to which session of which gateway. Its state is an enum that owns its
//! transitions, so no code path can move a lease from `closed` back to `open` by accident.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::fmt;
use std::str::FromStr;

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
/// README.md ("Lease states") defines every state for operators.
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

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown lease state '{0}' (expected open, closing, closed, lost or ended)")]
pub struct BadState(pub String);

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
    let mut h = Sha256::new();
    for (i, a) in argv.iter().enumerate() {
        if i > 0 {
            h.update([0u8]);
        }
        h.update(a.as_ref());
    }
    let digest = h.finalize();
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// A new lease id: UUID v7, so ids sort by creation time.
pub fn new_lease_id() -> String {
    uuid::Uuid::now_v7().to_string()
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
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
    fn lease_ids_are_v7_and_sortable() {
        let a = new_lease_id();
        std::thread::sleep(std::time::Duration::from_millis(2));
        let b = new_lease_id();
        assert!(a < b);
        assert_eq!(uuid::Uuid::parse_str(&a).unwrap().get_version_num(), 7);
    }
}
