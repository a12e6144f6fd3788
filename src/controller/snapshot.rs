//! `snapshot`: what a decision reads, written down as one JSON document that `simulate` replays
//! anywhere. The document is the fixtures' format (`fixtures/lifecycle/*.json`), versioned:
//! the gateway (id, wrapper root), the caller, the leases and legacy records, and the processes
//! that matter, each with its `stat` fields, uid, start time, pidfs inode, exe, argv and the
//! lease markers of its environment. No other environment value is ever read into it (the
//! process table keeps only the markers: [`crate::proc`]), and the document says so in its
//! `environment` field. Its JSON Schema is `docs/snapshot.schema.json`.
//!
//! Loading ([`SnapshotDoc::parse`]) is the edge: a file that is not a snapshot, of a newer
//! version, with leases that do not read, duplicate pids or a cycle in its parent links is
//! refused with what is wrong, never half-read.

use super::base::*;
use leash_core::model::{command_hash, LeaseEnv, ProcessInfo, ENV_GATEWAY_ID, ENV_LEASE_ID};
use serde_json::Value;
use std::collections::{BTreeSet, HashMap};

/// The `format` field of every snapshot.
pub const FORMAT: &str = "leash-snapshot";
/// The newest snapshot version this leash writes and reads.
pub const VERSION: u32 = 1;

/// The latest `takenAt` read: 2^53 - 1 ms, the largest integer JSON readers agree on.
const MAX_TIME_MS: i64 = (1 << 53) - 1;

/// The `environment` field: what of each process's environment the document holds.
pub fn environment_note() -> String {
    format!(
        "markers only: of each process's environment only the lease markers {ENV_LEASE_ID} and \
         {ENV_GATEWAY_ID} are written (env.leaseId, env.gatewayInstanceId); no other environment \
         value is read or written"
    )
}

/// One snapshot document (see the module doc and `docs/snapshot.schema.json`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotDoc {
    pub format: String,
    pub version: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// What of the environment is written ([`environment_note`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub environment: Option<String>,
    /// When it was taken (ms since the epoch); `simulate` plans at this time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub taken_at: Option<i64>,
    pub gateway: SnapGateway,
    pub caller: SnapCaller,
    /// Lease rows as the store holds them; `commandHash` may be left out (it is computed from
    /// `command`), so a fixture written by hand need not spell it.
    pub leases: Vec<Value>,
    #[serde(default)]
    pub legacy: Vec<LegacyRecord>,
    pub table: proc::FixtureTable,
    /// Containment on the host: where this gateway's lease cgroups are. Absent: off (the
    /// replay then reads processes only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub containment: Option<SnapContainment>,
    /// The leases' cgroups that exist, with the pids in each (`cgroup.procs`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cgroups: Vec<SnapCgroup>,
    /// What must and must not be signalled ([`Expectation`]), and the fixtures' plan
    /// expectations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expect: Option<Value>,
    /// How the processes exit when simulated (`script`: pid → [`crate::signal::Exit`]); absent,
    /// each exits at once on SIGTERM.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub simulate: Option<Value>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SnapGateway {
    pub gateway_instance_id: String,
    pub wrapper_root: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SnapContainment {
    /// This gateway's directory of lease cgroups (each lease's is `<gatewayRoot>/<lease id>`).
    pub gateway_root: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SnapCgroup {
    pub path: String,
    /// Its id (the directory's inode), as observed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<u64>,
    pub members: Vec<i32>,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct SnapCaller {
    pub pid: i32,
    pub pgid: i32,
    pub uid: u32,
}

impl From<SnapCaller> for Caller {
    fn from(c: SnapCaller) -> Caller {
        Caller {
            pid: c.pid,
            pgid: c.pgid,
            uid: c.uid,
        }
    }
}

/// The pids that must and must not be signalled: `--expect FILE`, or the snapshot's `expect`
/// section. `signalled` is the exact order in which processes first receive a signal (children
/// first); left out, only `notSignalled` is checked.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Expectation {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signalled: Option<Vec<i32>>,
    #[serde(default)]
    pub not_signalled: Vec<i32>,
}

impl Expectation {
    /// An expectation file: `{"signalled": [...], "notSignalled": [...]}`, or a snapshot (or any
    /// document) holding one under `expect`.
    pub fn parse(text: &str, path: &str) -> Result<Expectation, SnapshotError> {
        let v: Value = serde_json::from_str(text).map_err(|e| SnapshotError::Invalid {
            path: path.into(),
            detail: format!("not JSON: {e}"),
        })?;
        let v = match v.get("expect") {
            Some(e) => e.clone(),
            None => v,
        };
        if !v.is_object() || (v.get("signalled").is_none() && v.get("notSignalled").is_none()) {
            return Err(SnapshotError::Invalid {
                path: path.into(),
                detail: "no expectation: give \"signalled\" and/or \"notSignalled\" (pids)".into(),
            });
        }
        serde_json::from_value(v).map_err(|e| SnapshotError::Invalid {
            path: path.into(),
            detail: format!("expectation: {e}"),
        })
    }
}

/// Why a file is not replayed.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{path} is not a leash snapshot: {detail}")]
    NotASnapshot { path: String, detail: String },
    #[error(
        "{path} is snapshot version {found}, newer than this leash reads (version {VERSION} and \
         older): replay it with a newer leash"
    )]
    Newer { path: String, found: u64 },
    #[error("{path}: {detail}")]
    Invalid { path: String, detail: String },
    #[error(
        "{path}: the process table's parent links form a cycle ({cycle}); no host has one, so \
         the file is not replayed"
    )]
    Cycle { path: String, cycle: String },
}

impl HasKind for SnapshotError {
    fn kind(&self) -> Kind {
        match self {
            SnapshotError::Read { .. } => Kind::Internal,
            _ => Kind::Usage,
        }
    }
}

impl SnapshotDoc {
    /// Reads and checks a snapshot file ([`SnapshotDoc::parse`]).
    pub fn load(path: &std::path::Path) -> Result<SnapshotDoc, SnapshotError> {
        let name = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| SnapshotError::Read {
            path: name.clone(),
            source,
        })?;
        SnapshotDoc::parse(&text, &name)
    }

    /// Parses and checks a snapshot: `format` and `version` first (so a newer file is refused
    /// for what it is, not for a field this leash does not know), then the shape, the leases,
    /// and the process table (one entry per pid, parent links without a cycle).
    pub fn parse(text: &str, path: &str) -> Result<SnapshotDoc, SnapshotError> {
        let not = |detail: String| SnapshotError::NotASnapshot {
            path: path.into(),
            detail,
        };
        let invalid = |detail: String| SnapshotError::Invalid {
            path: path.into(),
            detail,
        };
        let v: Value = serde_json::from_str(text).map_err(|e| not(format!("not JSON ({e})")))?;
        let Some(obj) = v.as_object() else {
            return Err(not("not a JSON object".into()));
        };
        match obj.get("format").and_then(Value::as_str) {
            Some(FORMAT) => {}
            Some(other) => return Err(not(format!("format is {other:?}, not {FORMAT:?}"))),
            None => return Err(not(format!("no \"format\": {FORMAT:?} field"))),
        }
        match obj.get("version").and_then(Value::as_u64) {
            Some(n) if n > u64::from(VERSION) => {
                return Err(SnapshotError::Newer {
                    path: path.into(),
                    found: n,
                })
            }
            Some(n) if n >= 1 => {}
            _ => return Err(not("no \"version\" (a whole number from 1)".into())),
        }
        let doc: SnapshotDoc = serde_json::from_value(v).map_err(|e| invalid(e.to_string()))?;
        if uuid::Uuid::parse_str(&doc.gateway.gateway_instance_id).is_err() {
            return Err(invalid(format!(
                "gateway.gatewayInstanceId {:?} is not a UUID",
                doc.gateway.gateway_instance_id
            )));
        }
        let wr = std::path::Path::new(&doc.gateway.wrapper_root);
        if !wr.is_absolute() || wr.parent().is_none() {
            return Err(invalid(format!(
                "gateway.wrapperRoot {:?} is not an absolute directory below /",
                doc.gateway.wrapper_root
            )));
        }
        // Milliseconds since the epoch, up to JavaScript's exact integers (year 287,396).
        if let Some(t) = doc.taken_at.filter(|t| !(0..=MAX_TIME_MS).contains(t)) {
            return Err(invalid(format!(
                "takenAt {t} is not a time in ms since the epoch (0 to {MAX_TIME_MS})"
            )));
        }
        doc.leases().map_err(invalid)?;
        check_table(&doc.table.processes).map_err(|e| match e {
            TableFault::Duplicate(pid) => invalid(format!("pid {pid} is listed twice")),
            TableFault::Cycle(pids) => SnapshotError::Cycle {
                path: path.into(),
                cycle: pids
                    .iter()
                    .map(|p| p.to_string())
                    .collect::<Vec<_>>()
                    .join(" → "),
            },
        })?;
        Ok(doc)
    }

    /// The leases, each with its `commandHash` computed from `command` when left out.
    pub fn leases(&self) -> Result<Vec<Lease>, String> {
        self.leases
            .iter()
            .enumerate()
            .map(|(i, l)| {
                let mut l = l.clone();
                if let Some(obj) = l.as_object_mut() {
                    if !obj.contains_key("commandHash") {
                        let argv: Vec<String> = obj
                            .get("command")
                            .cloned()
                            .map(serde_json::from_value)
                            .transpose()
                            .map_err(|e| format!("leases[{i}].command: {e}"))?
                            .unwrap_or_default();
                        obj.insert("commandHash".into(), Value::String(command_hash(&argv)));
                    }
                }
                serde_json::from_value(l).map_err(|e| format!("leases[{i}]: {e}"))
            })
            .collect()
    }

    /// The expectation the snapshot carries in its `expect` section, if it has one.
    pub fn expectation(&self) -> Option<Expectation> {
        let e = self.expect.as_ref()?;
        (e.get("signalled").is_some() || e.get("notSignalled").is_some())
            .then(|| serde_json::from_value(e.clone()).ok())
            .flatten()
    }
}

enum TableFault {
    Duplicate(i32),
    /// The pids of the cycle, in parent-link order, the first repeated at the end.
    Cycle(Vec<i32>),
}

/// One entry per pid, and parent links that end (at a pid the table lacks, or 0).
fn check_table(procs: &[ProcessInfo]) -> Result<(), TableFault> {
    let mut parent: HashMap<i32, i32> = HashMap::with_capacity(procs.len());
    for p in procs {
        if parent.insert(p.pid, p.ppid).is_some() {
            return Err(TableFault::Duplicate(p.pid));
        }
    }
    // 0: not walked yet; 1: on the walk under way; 2: its chain ends.
    let mut mark: HashMap<i32, u8> = HashMap::with_capacity(procs.len());
    for p in procs {
        let mut path = Vec::new();
        let mut at = p.pid;
        loop {
            match mark.get(&at).copied().unwrap_or(0) {
                2 => break,
                1 => {
                    let from = path.iter().position(|&x| x == at).unwrap_or(0);
                    let mut cycle = path[from..].to_vec();
                    cycle.push(at);
                    return Err(TableFault::Cycle(cycle));
                }
                _ => {}
            }
            let Some(&pp) = parent.get(&at) else { break };
            mark.insert(at, 1);
            path.push(at);
            at = pp;
        }
        for x in path {
            mark.insert(x, 2);
        }
    }
    Ok(())
}

/// Which leases a snapshot holds: all, or those named (by id, or by session key).
#[derive(Debug, Clone, Default)]
pub struct SnapshotFilter {
    pub leases: Vec<String>,
    pub sessions: Vec<String>,
}

impl SnapshotFilter {
    fn all(&self) -> bool {
        self.leases.is_empty() && self.sessions.is_empty()
    }
    fn takes(&self, lease_id: &str, session_key: &str) -> bool {
        self.all()
            || self.leases.iter().any(|l| l == lease_id)
            || self.sessions.iter().any(|s| s == session_key)
    }
}

impl<'t> Controller<'t> {
    /// What a decision over these leases reads, from the store and one read of the process
    /// table: the leases and legacy records `filter` takes, and the processes that matter (see
    /// [`relevant`]). Signals nothing; like `leash leases`, it folds the wrappers' reports into
    /// the rows first.
    pub fn snapshot(&self, filter: &SnapshotFilter) -> Result<SnapshotDoc, StoreError> {
        // The wrappers' reports first, as every verb (and `leash leases`) folds them: the
        // adapter's pid and start time a reap would read are then in the rows written down.
        self.ingest_reports_marking_ended_lost()?;
        let (leases, legacy) = {
            let mut store = self.store();
            let leases: Vec<Lease> = store
                .leases(&[])?
                .into_iter()
                .filter_map(Result::ok)
                .filter(|l| filter.takes(&l.lease_id, &l.session_key))
                .collect();
            let legacy: Vec<LegacyRecord> = crate::legacy::records(&mut store, false)?
                .into_iter()
                .filter(|r| filter.all() || filter.sessions.contains(&r.session_key))
                .collect();
            (leases, legacy)
        };
        let containment = self.containment();
        let cgroups: Vec<SnapCgroup> = leases
            .iter()
            .filter_map(|l| l.cgroup_path.as_deref())
            .map(|p| self.table.cgroup(std::path::Path::new(p)))
            .filter(|o| o.id.is_some())
            .map(|o| SnapCgroup {
                path: o.path.display().to_string(),
                id: o.id,
                members: o.procs,
            })
            .collect();
        let table = match self.table.snapshot() {
            Ok(snap) => {
                let cgroup_members: Vec<i32> =
                    cgroups.iter().flat_map(|c| c.members.clone()).collect();
                let wrapper_root = self.wrapper_root();
                let keep = relevant(
                    &snap,
                    &leases,
                    &legacy,
                    &cgroup_members,
                    &wrapper_root,
                    filter.all().then_some(self.gateway.as_str()),
                );
                proc::FixtureTable {
                    processes: snap
                        .iter()
                        .filter(|p| keep.contains(&p.pid))
                        .cloned()
                        .map(markers_only)
                        .collect(),
                    unavailable: None,
                }
            }
            Err(e) => proc::FixtureTable {
                processes: Vec::new(),
                unavailable: Some(e.to_string()),
            },
        };
        Ok(SnapshotDoc {
            format: FORMAT.into(),
            version: VERSION,
            description: None,
            environment: Some(environment_note()),
            taken_at: Some(crate::lease::now_ms()),
            gateway: SnapGateway {
                gateway_instance_id: self.gateway.clone(),
                wrapper_root: self.wrapper_root().display().to_string(),
            },
            caller: SnapCaller {
                pid: self.caller.pid,
                pgid: self.caller.pgid,
                uid: self.caller.uid,
            },
            leases: leases
                .iter()
                .map(|l| serde_json::to_value(l).unwrap_or(Value::Null))
                .collect(),
            legacy,
            table,
            containment: containment
                .gateway_root
                .as_ref()
                .filter(|_| containment.is_on())
                .map(|g| SnapContainment {
                    gateway_root: g.display().to_string(),
                }),
            cgroups,
            expect: None,
            simulate: None,
        })
    }
}

/// A process as the snapshot writes it: the environment cut down to the two markers (the
/// table holds nothing else; this says it where the document is made).
fn markers_only(mut p: ProcessInfo) -> ProcessInfo {
    p.env = p.env.map(|e| LeaseEnv {
        lease_id: e.lease_id,
        gateway_instance_id: e.gateway_instance_id,
    });
    p
}

/// The pids a decision over `leases` and `legacy` can read: each lease's root and adapter and
/// whatever those pids name now, its process group, its cgroup's members, every process carrying
/// one of its markers (or, for an unfiltered snapshot, any lease marker, and every process whose
/// exe lies under the wrapper root), the legacy records' pids and groups, and every descendant of
/// all of those; then, without their descendants (a gateway's other children are not the
/// lease's), each lease's owner and claimant, and pid 1.
fn relevant(
    snap: &Snapshot,
    leases: &[Lease],
    legacy: &[LegacyRecord],
    cgroup_members: &[i32],
    wrapper_root: &std::path::Path,
    gateway: Option<&str>,
) -> BTreeSet<i32> {
    let ids: BTreeSet<&str> = leases.iter().map(|l| l.lease_id.as_str()).collect();
    let mut pids: BTreeSet<i32> = BTreeSet::new();
    let mut groups: BTreeSet<i32> = BTreeSet::new();
    for l in leases {
        pids.insert(l.root_pid);
        pids.extend(l.adapter_pid);
        groups.extend(l.process_group_id.filter(|&g| g > 1));
    }
    for r in legacy {
        pids.insert(r.pid);
        groups.insert(r.pid);
    }
    pids.extend(cgroup_members.iter().copied());
    for p in snap.iter() {
        let marked = p.env.as_ref().is_some_and(|e| {
            e.lease_id.as_deref().is_some_and(|id| ids.contains(id))
                || (gateway.is_some() && (e.lease_id.is_some() || e.gateway_instance_id.is_some()))
        });
        let wrapper = gateway.is_some()
            && p.exe
                .as_deref()
                .is_some_and(|x| std::path::Path::new(x).starts_with(wrapper_root));
        if marked || wrapper || groups.contains(&p.pgid) {
            pids.insert(p.pid);
        }
    }
    pids.retain(|&pid| pid > 1 && snap.get(pid).is_some());
    let roots: Vec<i32> = pids.iter().copied().collect();
    for root in roots {
        pids.extend(snap.subtree(root).iter().map(|p| p.pid));
    }
    pids.insert(1);
    for l in leases {
        pids.insert(l.owner_pid);
        pids.extend(l.claimed_by.map(|c| c.pid));
    }
    pids.retain(|&pid| pid > 0 && snap.get(pid).is_some());
    pids
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(pid: i32, ppid: i32) -> ProcessInfo {
        ProcessInfo {
            pid,
            ppid,
            pgid: pid,
            sid: pid,
            uid: 1000,
            start_time: 1,
            state: 'S',
            exe: None,
            argv: None,
            env: None,
            pidfs_ino: None,
        }
    }

    /// Chains that end pass; a two-process loop, a self-parent and a loop reached from a
    /// longer chain are found, with the loop's pids; a pid listed twice is named.
    #[test]
    fn table_check_finds_cycles_and_duplicates() {
        assert!(check_table(&[p(1, 0), p(5, 1), p(6, 5), p(7, 99)]).is_ok());
        let Err(TableFault::Cycle(c)) = check_table(&[p(1, 0), p(5, 6), p(6, 5)]) else {
            panic!("two-process loop")
        };
        assert_eq!(c, vec![5, 6, 5]);
        assert!(matches!(
            check_table(&[p(9, 9)]),
            Err(TableFault::Cycle(c)) if c == vec![9, 9]
        ));
        let Err(TableFault::Cycle(c)) = check_table(&[p(2, 3), p(3, 4), p(4, 5), p(5, 3)]) else {
            panic!("loop below a chain")
        };
        assert_eq!(c, vec![3, 4, 5, 3]);
        assert!(matches!(
            check_table(&[p(4, 1), p(4, 1)]),
            Err(TableFault::Duplicate(4))
        ));
    }
}
