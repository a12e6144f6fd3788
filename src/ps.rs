//! The reading behind `leash ps` (the verb itself is `controller/ps.rs`): what each open session
//! costs the machine, so an operator can find the one that is eating it. For each open or closing
//! lease: its members (pid, command, RSS, CPU time) and the session's totals. Read from the
//! lease's verified cgroup where there is one (`cgroup.procs`, `cpu.stat`, `memory.current`
//! where the memory controller is enabled: the cgroup's CPU time includes members that already
//! exited), else from the verified process tree. Reads only; the cost follows the sessions,
//! never the host. The daemon's `status` samples the same [`usage_of`].

use crate::cgroup::Verified;
use crate::proc::ProcessTable;
use leash_core::model::Snapshot;
use leash_core::model::{Lease, LeaseState};
use leash_core::verify::{verify_owned_tree, Expect, Verdict};
use serde::{Deserialize, Serialize};
use std::path::Path;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MemberUsage {
    pub pid: i32,
    pub command: String,
    pub rss_bytes: u64,
    pub cpu_ms: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Totals {
    pub processes: usize,
    /// Sum of the members' RSS (shared pages counted once per process).
    pub rss_bytes: u64,
    /// The cgroup's CPU time where there is one (exited members included), else the members'.
    pub cpu_ms: u64,
    /// `memory.current` of the cgroup, where the memory controller is enabled for it.
    pub memory_bytes: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionUsage {
    pub session_key: String,
    pub lease_id: String,
    pub state: LeaseState,
    /// `cgroup` (read from the verified cgroup), `tree` (from the verified process tree) or
    /// `none` (nothing verified alive; `reason` says why).
    pub source: String,
    pub cgroup: Option<String>,
    pub members: Vec<MemberUsage>,
    pub totals: Totals,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PsReport {
    pub sessions: Vec<SessionUsage>,
}

/// One lease's usage (also what `leash sessions status` and the daemon's status carry).
pub fn usage_of(
    lease: &Lease,
    expect: &Expect<'_>,
    table: &dyn ProcessTable,
    reader: &Reader,
) -> SessionUsage {
    let mut out = SessionUsage {
        session_key: lease.session_key.clone(),
        lease_id: lease.lease_id.clone(),
        state: lease.state,
        source: "none".into(),
        cgroup: lease.cgroup_path.clone(),
        members: Vec::new(),
        totals: Totals::default(),
        reason: None,
    };
    // Only proven members are listed, the same verdict `verify`, `reap --dry-run` and `close`
    // reach: a bystander moved into the lease's cgroup, or a process at a recorded pid that is
    // not the lease's, is never shown as the session's.
    let snap = match observe_lease(lease, expect, table) {
        Ok(s) => s,
        Err(e) => {
            out.reason = Some(e.to_string());
            return out;
        }
    };
    let verdict = verify_owned_tree(lease, expect, &snap);
    let tree = match verdict {
        Verdict::Owned(tree) => tree,
        Verdict::Gone { reason }
        | Verdict::NotOwned { reason }
        | Verdict::Unverifiable { reason } => {
            out.reason = Some(reason);
            return out;
        }
    };
    let mut pids: Vec<i32> = tree.children_first().map(|m| m.pid).collect();
    pids.reverse();
    out.members = pids.into_iter().filter_map(|p| reader.member(p)).collect();
    out.totals = totals(&out.members);
    if tree.root.is_none() {
        out.reason = Some(format!(
            "the wrapper is gone; {} escaped process(es) of the lease remain (reap takes them)",
            tree.len()
        ));
    }
    if !tree.excluded.is_empty() {
        let why: Vec<String> = tree
            .excluded
            .iter()
            .map(|e| format!("pid {}: {}", e.pid, e.reason))
            .collect();
        out.reason = Some(match out.reason.take() {
            Some(r) => format!("{r}; not listed: {}", why.join("; ")),
            None => format!("not listed: {}", why.join("; ")),
        });
    }
    out.source = "tree".into();
    if let Some(h) = verified_cgroup(lease, expect) {
        // The cgroup's counters include members that already exited.
        out.source = "cgroup".into();
        let usage = h.usage();
        if let Some(us) = usage.cpu_usec {
            out.totals.cpu_ms = us / 1000;
        }
        out.totals.memory_bytes = usage.memory_bytes;
    }
    out
}

/// The snapshot every ownership answer about one lease is read from (`verify`, `ps`, the
/// daemon's status): the root's subtree while the root runs (a live wrapper is a subreaper, so
/// its whole tree hangs below it), else the whole table (escapees are found by their markers);
/// in both cases plus what is observed of the lease's cgroup and the processes it lists.
/// `close` and `reap` read the same evidence from each lease down (`Controller::snapshot_for`).
pub fn observe_lease(
    lease: &Lease,
    expect: &Expect<'_>,
    table: &dyn ProcessTable,
) -> Result<Snapshot, leash_core::model::TableError> {
    let id = lease.root();
    let root_alive = table.liveness(id, lease.root_pidfs_ino)? == crate::proc::Liveness::Alive;
    let base = if root_alive {
        table.subtree(lease.root_pid)?
    } else {
        table.snapshot()?
    };
    let obs = expect.cgroup_root.and_then(|root| {
        let p = std::path::PathBuf::from(lease.cgroup_path.as_ref()?);
        (p == root.join(&lease.lease_id)).then(|| crate::cgroup::observe(&p))
    });
    let Some(obs) = obs else {
        return Ok(base);
    };
    let mut list: Vec<_> = base.iter().cloned().collect();
    for &pid in &obs.procs {
        if base.get(pid).is_none() {
            if let Some(p) = table.process(pid)? {
                list.push(p);
            }
        }
    }
    let mut snap = Snapshot::new(list);
    snap.add_cgroup(obs);
    Ok(snap)
}

fn verified_cgroup(lease: &Lease, expect: &Expect<'_>) -> Option<Verified> {
    let path = Path::new(lease.cgroup_path.as_deref()?);
    let root = expect.cgroup_root?;
    if path != root.join(&lease.lease_id) || lease.gateway_instance_id != expect.gateway_instance_id
    {
        return None;
    }
    Verified::open(path, lease.cgroup_id?).ok()
}

fn totals(members: &[MemberUsage]) -> Totals {
    Totals {
        processes: members.len(),
        rss_bytes: members.iter().map(|m| m.rss_bytes).sum(),
        cpu_ms: members.iter().map(|m| m.cpu_ms).sum(),
        memory_bytes: None,
    }
}

/// Reads one process's command, RSS and CPU time from `/proc`.
pub struct Reader {
    tick_ms: f64,
    page: u64,
}

impl Reader {
    pub fn new() -> Reader {
        let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
            .ok()
            .flatten()
            .unwrap_or(100)
            .max(1);
        let page = nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
            .ok()
            .flatten()
            .unwrap_or(4096)
            .max(1);
        Reader {
            tick_ms: 1000.0 / hz as f64,
            page: page as u64,
        }
    }

    pub fn member(&self, pid: i32) -> Option<MemberUsage> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let open = stat.find('(')?;
        let close = stat.rfind(')')?;
        let comm = stat.get(open + 1..close)?.to_string();
        let f: Vec<&str> = stat.get(close + 1..)?.split_whitespace().collect();
        // After the name: state is field 3, utime 14, stime 15, rss 24 (1-based in proc(5)).
        let num = |i: usize| {
            f.get(i - 3)
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0)
        };
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let command = if cmdline.is_empty() {
            format!("[{comm}]")
        } else {
            shell_words(&String::from_utf8_lossy(&cmdline))
        };
        Some(MemberUsage {
            pid,
            command,
            rss_bytes: num(24) * self.page,
            cpu_ms: ((num(14) + num(15)) as f64 * self.tick_ms) as u64,
        })
    }
}

/// A NUL-separated argv (`/proc/<pid>/cmdline`) as a shell would read it back:
/// `sh -c 'sleep 900 & sleep 901'`, not `sh -c sleep 900 & sleep 901`.
pub fn shell_words(cmdline: &str) -> String {
    let words: Vec<&str> = cmdline.trim_end_matches('\0').split('\0').collect();
    shlex::try_join(words.iter().copied()).unwrap_or_else(|_| words.join(" "))
}

impl Default for Reader {
    fn default() -> Self {
        Reader::new()
    }
}
