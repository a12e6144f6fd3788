//! `simulate`: replays a snapshot ([`super::snapshot`]) through the real verbs. A private,
//! temporary state root gets the snapshot's gateway id, leases and legacy records; a controller
//! over it reads the snapshot's process table and signals through the recording signaller
//! ([`RecordingSignaller`]) on its scripted clock, so `reap`, `close` and `verify` run their own
//! plan, guards and TERM → grace → KILL escalation and nobody is signalled. What comes back is
//! the plan `reap --dry-run` prints, the verb's typed outcome and the timeline of signals.
//!
//! The temporary state root's wrapper directory stands in for the snapshot's wrapper root: every
//! path under the one is rewritten to the other on the way in, and back on the way out, so the
//! results name the snapshot's paths (and `<state>` for the temporary root itself). Likewise,
//! when the snapshot's host contained its leases, a temporary directory stands in for the
//! gateway's cgroup directory, with a directory per lease cgroup the snapshot lists (its inode
//! the cgroup's id) whose members the recording signaller holds, and a `cgroup.kill` of one is
//! recorded, never written. (A cgroup id a row recorded for a cgroup other than the one
//! observed stays as it is, so it disagrees in the replay as it did on the host.)

use super::base::*;
use super::close::CloseOutcome;
use super::reap::ReapReport;
use super::snapshot::{Expectation, SnapshotDoc};
use crate::signal::{Exit, RecordingSignaller, SimEvent, SimWhat};
use crate::store::NewLegacyRecord;
use leash_core::answer::VerifyReport;
use serde::de::DeserializeOwned;
use serde_json::Value;
use std::collections::HashMap;

/// Which verb to replay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SimVerb {
    Reap,
    Close(String),
    Verify(String),
}

/// What a replay did.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Simulation {
    /// `reap`, `close` or `verify`.
    pub verb: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_id: Option<String>,
    /// What `reap --dry-run` prints for this host.
    pub plan: ReapPlan,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reap: Option<ReapReport>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub close: Option<Vec<CloseOutcome>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verify: Option<VerifyReport>,
    /// Every signal, refusal and cgroup kill, in order, on the scripted clock.
    pub timeline: Vec<SimEvent>,
    /// The pids that received a signal, in the order they first did (children first).
    pub signalled: Vec<i32>,
    /// When each process of the table exited (ms on the scripted clock), in the table's order.
    pub exits: Vec<(i32, u64)>,
    /// The expectation checked, and what disagreed with it (empty: it held).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expect: Option<ExpectResult>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExpectResult {
    pub expected: Expectation,
    /// One line per disagreement; empty when the plan agrees.
    pub diff: Vec<String>,
}

impl Simulation {
    /// Whether any process would receive a signal (a cgroup kill counts).
    pub fn signals_any(&self) -> bool {
        !self.signalled.is_empty()
    }
}

/// Why a replay did not run.
#[derive(Debug, thiserror::Error)]
pub enum SimulateError {
    #[error("cannot set up the simulation: {0}")]
    Setup(String),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("the snapshot has no lease {0}")]
    NoLease(String),
    #[error("{0}")]
    Verb(String),
}

impl HasKind for SimulateError {
    fn kind(&self) -> Kind {
        match self {
            SimulateError::Setup(_) => Kind::Internal,
            SimulateError::Store(e) => e.kind(),
            SimulateError::NoLease(_) | SimulateError::Verb(_) => Kind::Usage,
        }
    }
}

/// A private directory removed (with what is in it) when dropped.
struct TempDir(std::path::PathBuf);

impl TempDir {
    fn new() -> Result<TempDir, SimulateError> {
        use std::os::unix::fs::DirBuilderExt;
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let dir =
            std::env::temp_dir().join(format!("leash-simulate-{}-{nanos:x}", std::process::id()));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .map_err(|e| SimulateError::Setup(format!("{}: {e}", dir.display())))?;
        Ok(TempDir(dir))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Every string equal to `from` or below it (`from/...`) rewritten to lie below `to`.
fn rebase(v: &mut Value, from: &str, to: &str) {
    match v {
        Value::String(s) => {
            if s == from {
                *s = to.to_string();
            } else if let Some(rest) = s.strip_prefix(from).filter(|r| r.starts_with('/')) {
                *s = format!("{to}{rest}");
            }
        }
        Value::Array(a) => a.iter_mut().for_each(|x| rebase(x, from, to)),
        Value::Object(o) => o.values_mut().for_each(|x| rebase(x, from, to)),
        _ => {}
    }
}

/// `t` with every mention of the temporary wrapper root and state root replaced by the
/// snapshot's wrapper root and `<state>`.
fn unmap<T: Serialize + DeserializeOwned>(
    t: T,
    pairs: &[(String, String)],
) -> Result<T, SimulateError> {
    let mut text = serde_json::to_string(&t).map_err(|e| SimulateError::Setup(e.to_string()))?;
    for (from, to) in pairs {
        // JSON-escaped, as the paths appear in the text.
        let esc = |s: &str| serde_json::to_string(s).unwrap_or_default();
        let (f, t) = (esc(from), esc(to));
        text = text.replace(&f[1..f.len() - 1], &t[1..t.len() - 1]);
    }
    serde_json::from_str(&text).map_err(|e| SimulateError::Setup(e.to_string()))
}

/// The pids a timeline signals, in the order they are first reached: the target of each
/// delivered signal, then the members a group signal or a cgroup kill reached.
pub fn signalled(timeline: &[SimEvent]) -> Vec<i32> {
    let mut out: Vec<i32> = Vec::new();
    let mut add = |pid: i32| {
        if !out.contains(&pid) {
            out.push(pid);
        }
    };
    for e in timeline {
        match &e.what {
            SimWhat::Signal {
                delivery, members, ..
            } => {
                if *delivery != Delivery::AlreadyGone {
                    add(e.pid);
                }
                members.iter().copied().for_each(&mut add);
            }
            SimWhat::CgroupKill { members, .. } => members.iter().copied().for_each(&mut add),
            SimWhat::Refused { .. } => {}
        }
    }
    out
}

/// Where the plan disagrees with `expect`: one line per pid signalled that must not be, per pid
/// missing or extra, and the two orders when they differ.
pub fn check(expect: &Expectation, got: &[i32]) -> Vec<String> {
    let mut diff = Vec::new();
    for never in &expect.not_signalled {
        if got.contains(never) {
            diff.push(format!("- pid {never} is signalled but must not be"));
        }
    }
    if let Some(want) = &expect.signalled {
        for p in want {
            if !got.contains(p) {
                diff.push(format!("- pid {p} must be signalled but is not"));
            }
        }
        for p in got {
            if !want.contains(p) && !expect.not_signalled.contains(p) {
                diff.push(format!("+ pid {p} is signalled but not expected"));
            }
        }
        if diff.is_empty() && want != got {
            diff.push(format!("~ order: expected {want:?}, got {got:?}"));
        }
    }
    diff
}

/// Replays `verb` over `doc`; with `expect`, checks the signals against it.
pub fn simulate(
    doc: &SnapshotDoc,
    verb: &SimVerb,
    expect: Option<&Expectation>,
) -> Result<Simulation, SimulateError> {
    let tmp = TempDir::new()?;
    let root =
        StateRoot::open(&tmp.0.join("state")).map_err(|e| SimulateError::Setup(e.to_string()))?;
    {
        let mut store = Store::open(&root.db_path())?;
        store.set_meta(
            "gateway_instance_id",
            Some(&doc.gateway.gateway_instance_id),
        )?;
    }
    let from = doc.gateway.wrapper_root.trim_end_matches('/').to_string();
    let to = root.wrapper_root().display().to_string();
    let mut text = serde_json::to_value(doc).map_err(|e| SimulateError::Setup(e.to_string()))?;
    rebase(&mut text, &from, &to);
    // Containment: a directory of stand-ins for the gateway's lease cgroups (each one's inode
    // its id), in which the recording signaller holds the members the snapshot lists.
    let cg_root = tmp.0.join("cgroups");
    let stand_in = cg_root.join("gateway");
    let real_gw = doc
        .containment
        .as_ref()
        .map(|c| c.gateway_root.trim_end_matches('/').to_string());
    if let Some(gw) = &real_gw {
        std::fs::create_dir_all(&stand_in)
            .map_err(|e| SimulateError::Setup(format!("{}: {e}", stand_in.display())))?;
        rebase(&mut text, gw, &stand_in.display().to_string());
    }
    let doc: SnapshotDoc =
        serde_json::from_value(text).map_err(|e| SimulateError::Setup(e.to_string()))?;
    let leases = doc.leases().map_err(SimulateError::Setup)?;
    let script: HashMap<i32, Exit> = match doc.simulate.as_ref().and_then(|s| s.get("script")) {
        None => HashMap::new(),
        Some(s) => {
            let raw: HashMap<String, Exit> = serde_json::from_value(s.clone())
                .map_err(|e| SimulateError::Verb(format!("simulate.script: {e}")))?;
            raw.into_iter()
                .map(|(pid, exit)| {
                    pid.parse::<i32>()
                        .map(|p| (p, exit))
                        .map_err(|_| SimulateError::Verb(format!("simulate.script: pid {pid:?}")))
                })
                .collect::<Result<_, _>>()?
        }
    };
    let mut sim = RecordingSignaller::new(doc.table.clone(), script);
    // Stand-in id of each lease cgroup whose observed id the row recorded.
    let mut ids: HashMap<String, (Option<u64>, u64)> = HashMap::new();
    if real_gw.is_some() {
        for c in &doc.cgroups {
            let path = std::path::PathBuf::from(&c.path);
            // Only a direct child of the gateway's directory is a lease cgroup.
            if path.parent() != Some(stand_in.as_path()) {
                continue;
            }
            std::fs::create_dir_all(&path)
                .map_err(|e| SimulateError::Setup(format!("{}: {e}", path.display())))?;
            let ino = std::os::unix::fs::MetadataExt::ino(
                &std::fs::metadata(&path).map_err(|e| SimulateError::Setup(e.to_string()))?,
            );
            ids.insert(c.path.clone(), (c.id, ino));
            sim = sim.with_cgroup(path, c.members.clone());
        }
    }
    let ctl = Controller::open(root.clone(), &sim)?;
    let ctl = match &real_gw {
        None => ctl.with_containment(&cgroup::Settings::default_off()),
        Some(_) => ctl.with_resolved_containment(cgroup::Containment {
            mode: "on".into(),
            root: Some(cg_root.clone()),
            gateway_root: Some(stand_in.clone()),
            mount: None,
            controllers: Vec::new(),
            reason: None,
        }),
    }
    .with_signaller(&sim, &sim, doc.caller.into());
    for mut l in leases.clone() {
        // The row's cgroup id names the stand-in when it named the cgroup observed.
        if let Some((observed, ino)) = l.cgroup_path.as_ref().and_then(|p| ids.get(p)) {
            if l.cgroup_id.is_some() && l.cgroup_id == *observed {
                l.cgroup_id = Some(*ino);
            }
        }
        // A replay reads no file of any host: a wrapper report the row points at stays unread
        // (what it said is in the row already, or the snapshot's host had not folded it yet).
        l.report_dir = None;
        ctl.store().insert_lease(&l, None, |_| None)?;
    }
    for r in &doc.legacy {
        ctl.store().import_legacy(
            &[NewLegacyRecord {
                session_key: &r.session_key,
                pid: r.pid as i64,
                command: &r.command,
                wrapper_path: r.wrapper_path.as_deref(),
            }],
            r.wrapper_root.as_deref(),
            r.imported_ticks,
            r.imported_at,
        )?;
    }
    let opts = ReapOptions {
        include_live: false,
        // Nothing expires in a replay: expiry deletes rows and signals nobody.
        retention_ms: i64::MAX / 4,
        now_ms: doc.taken_at.unwrap_or_else(crate::lease::now_ms),
        grace_ms: None,
    };
    let plan = ctl.plan_reap(&opts)?;
    let known = |id: &str| {
        leases
            .iter()
            .any(|l| l.lease_id == id)
            .then_some(())
            .ok_or_else(|| SimulateError::NoLease(id.to_string()))
    };
    let mut out = Simulation {
        verb: String::new(),
        lease_id: None,
        plan,
        reap: None,
        close: None,
        verify: None,
        timeline: Vec::new(),
        signalled: Vec::new(),
        exits: Vec::new(),
        expect: None,
    };
    match verb {
        SimVerb::Reap => {
            out.verb = "reap".into();
            out.reap = Some(
                ctl.reap(&opts)
                    .map_err(|e| SimulateError::Verb(e.to_string()))?,
            );
        }
        SimVerb::Close(id) => {
            known(id)?;
            out.verb = "close".into();
            out.lease_id = Some(id.clone());
            let r = ctl
                .close(&[LeaseRef::Id(id.clone())], None)
                .map_err(|e| SimulateError::Verb(e.to_string()))?;
            out.close = Some(r);
        }
        SimVerb::Verify(id) => {
            known(id)?;
            out.verb = "verify".into();
            out.lease_id = Some(id.clone());
            let r = ctl
                .verify(&LeaseRef::Id(id.clone()))
                .map_err(|e| SimulateError::Verb(e.to_string()))?;
            out.verify = Some(r);
        }
    }
    out.timeline = sim.timeline();
    out.signalled = signalled(&out.timeline);
    out.exits = doc
        .table
        .processes
        .iter()
        .filter_map(|p| sim.exited_at(p.pid).map(|at| (p.pid, at)))
        .collect();
    if let Some(e) = expect {
        out.expect = Some(ExpectResult {
            expected: e.clone(),
            diff: check(e, &out.signalled),
        });
    }
    drop(ctl);
    let state = root.dir().display().to_string();
    let mut pairs = vec![(to, from)];
    if let Some(gw) = real_gw {
        pairs.push((stand_in.display().to_string(), gw));
    }
    pairs.push((state, "<state>".into()));
    unmap(out, &pairs)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exp(signalled: Option<Vec<i32>>, not: Vec<i32>) -> Expectation {
        Expectation {
            signalled,
            not_signalled: not,
        }
    }

    /// An agreeing plan has no diff; a forbidden pid, a missing one, an extra one and a
    /// different order each get their line.
    #[test]
    fn expectation_diff_names_each_disagreement() {
        assert!(check(&exp(Some(vec![3, 2, 1]), vec![9]), &[3, 2, 1]).is_empty());
        assert!(check(&exp(None, vec![9]), &[3, 2]).is_empty());
        assert_eq!(
            check(&exp(None, vec![9]), &[3, 9]),
            vec!["- pid 9 is signalled but must not be"]
        );
        assert_eq!(
            check(&exp(Some(vec![3, 2]), vec![]), &[3, 4]),
            vec![
                "- pid 2 must be signalled but is not",
                "+ pid 4 is signalled but not expected"
            ]
        );
        assert_eq!(
            check(&exp(Some(vec![3, 2]), vec![]), &[2, 3]),
            vec!["~ order: expected [3, 2], got [2, 3]"]
        );
    }

    /// Paths equal to the root or below it move; a longer name sharing the prefix does not.
    #[test]
    fn rebase_moves_only_paths_below_the_root() {
        let mut v = serde_json::json!(["/a/w", "/a/w/x", "/a/wx", ["/a/w/y/z"]]);
        rebase(&mut v, "/a/w", "/t");
        assert_eq!(v, serde_json::json!(["/t", "/t/x", "/a/wx", ["/t/y/z"]]));
    }
}
