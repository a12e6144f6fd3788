//! Ownership verification: does the live process tree still belong to this lease?
//!
//! [`verify_owned_tree`] is pure: it reads a lease, the expectations of the state root it was
//! found in, and a process snapshot, and returns a [`Verdict`] with the evidence for it. Nothing
//! here signals; the planner turns verdicts into actions and the signalling module re-checks each
//! process right before it is signalled.
//!
//! The root (the wrapper) is ours only when all of these hold: it is alive with the recorded start
//! time; its live exe lies under this gateway's wrapper root; the lease row names this gateway and
//! this wrapper root; its environment, when readable, carries this lease id and gateway id; and
//! the adapter argv in its live command line hashes to the recorded hash, or its exe is exactly
//! the recorded wrapper path. Its tree is then the root, its descendants, the members of the
//! recorded process group, and processes that carry this lease's markers and started after the
//! lease — each checked on its own (started after the root, same uid, no other lease's marker).
//!
//! When the root is gone (absent, a zombie, or its pid now names another process), processes that
//! carry this lease's markers are still ours: they are the escapees the wrapper could not take
//! with it when it was SIGKILLed. When nothing carries the markers either, the lease is `Gone`.

use crate::model::{command_hash, Lease};
use crate::model::{ProcessInfo, Snapshot};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashSet};
use std::path::Path;

/// What the state root the lease was read from expects of it.
#[derive(Debug, Clone)]
pub struct Expect<'a> {
    pub gateway_instance_id: &'a str,
    pub wrapper_root: &'a Path,
    /// This gateway's cgroup directory when containment is on: a lease's cgroup is used as
    /// evidence, killed or removed only if it is exactly `<cgroup_root>/<lease id>`.
    pub cgroup_root: Option<&'a Path>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "verdict", rename_all = "camelCase")]
pub enum Verdict {
    /// Live processes proven to belong to the lease.
    Owned(OwnedTree),
    /// Nothing alive belongs to the lease any more.
    Gone { reason: String },
    /// The evidence contradicts the lease: a live process matches some of it but not all.
    /// Nothing is signalled.
    NotOwned { reason: String },
    /// The evidence could not be read. Nothing is signalled.
    Unverifiable { reason: String },
}

impl Verdict {
    /// The verdict's word, the same in `verify`, `reap --dry-run`, `ps` and the daemon: `owned`
    /// only with a verified root; `escaped` when the root is gone and only processes proven by
    /// the lease's markers or its verified cgroup remain (they are the lease's, and reap takes
    /// them, but there is no session left to resume).
    pub fn name(&self) -> &'static str {
        match self {
            Verdict::Owned(t) if t.root.is_none() => "escaped",
            Verdict::Owned(_) => "owned",
            Verdict::Gone { .. } => "gone",
            Verdict::NotOwned { .. } => "not-owned",
            Verdict::Unverifiable { .. } => "unverifiable",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Role {
    /// The wrapper.
    Root,
    /// The adapter the wrapper started (leader of the recorded group).
    Adapter,
    /// A descendant of a verified member, by parent links.
    Descendant,
    /// A member of the recorded process group.
    GroupMember,
    /// Carries this lease's environment markers (an escapee that left the group).
    Marked,
    /// A member of the lease's verified cgroup (whatever its parent, group or environment).
    CgroupMember,
}

impl Role {
    /// The protocol's name of the role (`role` in `verify`'s members).
    pub fn name(self) -> &'static str {
        match self {
            Role::Root => "root",
            Role::Adapter => "adapter",
            Role::Descendant => "descendant",
            Role::GroupMember => "groupMember",
            Role::Marked => "marked",
            Role::CgroupMember => "cgroupMember",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Member {
    pub pid: i32,
    pub start_time: u64,
    pub ppid: i32,
    pub pgid: i32,
    pub uid: u32,
    pub role: Role,
    /// Members between this one and its topmost member ancestor; signalled deepest first.
    pub depth: usize,
    pub argv0: Option<String>,
    pub evidence: String,
}

impl Member {
    /// A process as a member of the tree, in its role, `depth` members below its topmost member
    /// ancestor, with the evidence that admitted it.
    pub fn of(p: &ProcessInfo, role: Role, depth: usize, evidence: String) -> Member {
        Member {
            pid: p.pid,
            start_time: p.start_time,
            ppid: p.ppid,
            pgid: p.pgid,
            uid: p.uid,
            role,
            depth,
            argv0: p.argv.as_ref().and_then(|a| a.first().cloned()),
            evidence,
        }
    }
}

/// A process that looked related but failed its own check; it is never signalled.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Excluded {
    pub pid: i32,
    pub start_time: u64,
    pub reason: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct OwnedTree {
    /// The verified wrapper, or `None` when only escapees remain.
    pub root: Option<Member>,
    /// Every other member, deepest first (children before their parents).
    pub members: Vec<Member>,
    pub excluded: Vec<Excluded>,
    pub evidence: Vec<String>,
    /// The uid members were checked against (the root's, or the first member's).
    #[serde(skip)]
    pub member_uid: Option<u32>,
}

impl OwnedTree {
    /// The per-member check this tree's members passed, for re-checking later.
    pub fn rule(&self, lease: &Lease, expect: &Expect<'_>) -> MemberRule {
        MemberRule {
            lease_id: lease.lease_id.clone(),
            gateway_instance_id: expect.gateway_instance_id.to_string(),
            root_start_time: lease.root_start_time,
            uid: self.member_uid,
        }
    }

    /// Is this pid a proven member (root included)?
    pub fn contains(&self, pid: i32) -> bool {
        self.children_first().any(|m| m.pid == pid)
    }

    /// All members, children first and the root last: the order to signal them in.
    pub fn children_first(&self) -> impl Iterator<Item = &Member> {
        self.members.iter().chain(self.root.iter())
    }

    pub fn len(&self) -> usize {
        self.members.len() + usize::from(self.root.is_some())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The adapter argv inside a wrapper's live argv: everything after the first `--`.
pub fn adapter_argv(wrapper_argv: &[String]) -> Option<&[String]> {
    let i = wrapper_argv.iter().skip(1).position(|a| a == "--")? + 1;
    Some(&wrapper_argv[i + 1..])
}

/// What the lease's recorded cgroup turned out to be.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "cgroup", rename_all = "camelCase")]
pub enum CgroupState {
    /// The recorded path, under this gateway's root, with the recorded id.
    Verified { populated: bool, procs: Vec<i32> },
    /// No directory there any more (the wrapper or an earlier close removed it).
    Missing,
    /// Not the lease's, or not readable: never killed nor removed.
    NotVerified { reason: String },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CgroupCheck {
    pub path: String,
    pub id: u64,
    pub state: CgroupState,
    pub evidence: String,
}

/// Why a lease's cgroup is not checked where no cgroup root is given (containment off or
/// unavailable; `leash verify` words it its own way, see `Controller::verify`).
pub const NO_CGROUP_ROOT: &str =
    "containment is off or unavailable here, so no cgroup root to check it against";
/// Checks the lease's recorded cgroup against this gateway's root and what the snapshot observed
/// of it. `None` when the lease has no cgroup. Pure: the observation was read with the snapshot.
pub fn check_cgroup(lease: &Lease, expect: &Expect<'_>, snap: &Snapshot) -> Option<CgroupCheck> {
    let path = lease.cgroup_path.as_ref()?;
    let id = lease.cgroup_id.unwrap_or(0);
    let not = |reason: String| CgroupCheck {
        path: path.clone(),
        id,
        evidence: format!("cgroup {path} not used: {reason}"),
        state: CgroupState::NotVerified { reason },
    };
    if lease.cgroup_id.is_none() {
        return Some(not("the lease records no cgroup id".into()));
    }
    let Some(root) = expect.cgroup_root else {
        return Some(not(NO_CGROUP_ROOT.into()));
    };
    if Path::new(path) != root.join(&lease.lease_id) {
        return Some(not(format!(
            "it is not this gateway's cgroup for the lease ({})",
            root.join(&lease.lease_id).display()
        )));
    }
    let Some(obs) = snap.cgroup(Path::new(path)) else {
        return Some(not("it was not observed".into()));
    };
    if let Some(e) = &obs.error {
        return Some(not(format!("unreadable: {e}")));
    }
    match obs.id {
        None => Some(CgroupCheck {
            path: path.clone(),
            id,
            state: CgroupState::Missing,
            evidence: format!("cgroup {path} no longer exists"),
        }),
        Some(got) if got != id => Some(not(format!(
            "its id is {got}, the lease recorded {id}: a directory made again under the same name"
        ))),
        Some(_) => Some(CgroupCheck {
            path: path.clone(),
            id,
            evidence: format!(
                "cgroup {path} verified (path under this gateway's root, id {id}): {} member(s){}",
                obs.procs.len(),
                if obs.populated { "" } else { ", not populated" }
            ),
            state: CgroupState::Verified {
                populated: obs.populated,
                procs: obs.procs.clone(),
            },
        }),
    }
}

/// Does the live tree still belong to this lease? The checks, in order; each step is a function
/// below, and the first that decides returns the verdict.
pub fn verify_owned_tree(lease: &Lease, expect: &Expect<'_>, snap: &Snapshot) -> Verdict {
    if let Err(reason) = row_names_this_gateway(lease, expect) {
        return Verdict::NotOwned { reason };
    }
    let mut evidence = Vec::new();
    let root = match live_root(lease, expect, snap, &mut evidence) {
        Ok(root) => root,
        Err(problem) => return problem.verdict(),
    };
    let mut tree = TreeBuilder::new(lease, expect, snap);
    tree.admit_root_and_descendants(root);
    tree.admit_cgroup_members(check_cgroup(lease, expect, snap), &mut evidence);
    tree.admit_marker_carriers();
    tree.look_at_recorded_group();
    verdict_of(tree.finish(), evidence)
}

/// The row itself must name this gateway and this wrapper root: a row copied from (or rewritten
/// to point at) another gateway is not ours to act on, whatever is alive.
fn row_names_this_gateway(lease: &Lease, expect: &Expect<'_>) -> Result<(), String> {
    if lease.gateway_instance_id != expect.gateway_instance_id {
        return Err(format!(
            "lease names gateway {}, but this state root is gateway {}",
            lease.gateway_instance_id, expect.gateway_instance_id
        ));
    }
    if Path::new(&lease.wrapper_root) != expect.wrapper_root {
        return Err(format!(
            "lease names wrapper root {}, but this gateway's is {}",
            lease.wrapper_root,
            expect.wrapper_root.display()
        ));
    }
    if !Path::new(&lease.wrapper_path).starts_with(expect.wrapper_root) {
        return Err(format!(
            "lease names wrapper {}, outside this gateway's wrapper root {}",
            lease.wrapper_path,
            expect.wrapper_root.display()
        ));
    }
    Ok(())
}

/// The recorded root as it runs now: `Ok(Some)` when it is alive with the recorded start time
/// (and pidfs inode) and passes [`check_root`]; `Ok(None)` when it is gone (absent, its pid
/// reused, a zombie), which leaves only the lease's escapees to find; `Err` when a live root
/// contradicts the lease or cannot be read.
fn live_root<'s>(
    lease: &Lease,
    expect: &Expect<'_>,
    snap: &'s Snapshot,
    evidence: &mut Vec<String>,
) -> Result<Option<&'s ProcessInfo>, RootProblem> {
    let gone = |evidence: &mut Vec<String>, why: String| {
        evidence.push(why);
        Ok(None)
    };
    match snap.get(lease.root_pid) {
        None => gone(
            evidence,
            format!("root pid {} is not running", lease.root_pid),
        ),
        Some(p) if p.start_time != lease.root_start_time => gone(
            evidence,
            format!(
                "root pid {} now belongs to another process (start time {} ≠ recorded {}): \
                 the pid was reused",
                p.pid, p.start_time, lease.root_start_time
            ),
        ),
        Some(p)
            if lease
                .root_pidfs_ino
                .zip(p.pidfs_ino)
                .is_some_and(|(want, got)| want != got) =>
        {
            gone(
                evidence,
                format!(
                    "root pid {} now belongs to another process (same start time {}, but pidfs \
                     inode {} ≠ recorded {}): the pid was reused within one clock tick",
                    p.pid,
                    p.start_time,
                    p.pidfs_ino.unwrap_or_default(),
                    lease.root_pidfs_ino.unwrap_or_default()
                ),
            )
        }
        Some(p) if p.state == 'Z' => gone(
            evidence,
            format!(
                "root pid {} has exited (zombie, not yet reaped by its parent)",
                p.pid
            ),
        ),
        Some(p) => {
            evidence.extend(check_root(lease, expect, p)?);
            Ok(Some(p))
        }
    }
}

/// The verdict on a built tree: `Gone` when nothing alive belongs to the lease, else `Owned`
/// (escapees only when the root is gone), with the root's and the cgroup's evidence first.
fn verdict_of(mut built: OwnedTree, evidence: Vec<String>) -> Verdict {
    built.evidence.splice(0..0, evidence);
    if built.is_empty() {
        let reason = built.evidence.join("; ");
        let reason = if reason.is_empty() {
            "nothing alive belongs to the lease".to_string()
        } else {
            format!("{reason}; no live process carries the lease's markers")
        };
        return Verdict::Gone { reason };
    }
    if built.root.is_none() {
        built.evidence.push(format!(
            "{} escaped process(es) carry this lease's markers",
            built.members.len()
        ));
    }
    Verdict::Owned(built)
}

enum RootProblem {
    NotOwned { reason: String },
    Unverifiable { reason: String },
}

impl RootProblem {
    fn verdict(self) -> Verdict {
        match self {
            RootProblem::NotOwned { reason } => Verdict::NotOwned { reason },
            RootProblem::Unverifiable { reason } => Verdict::Unverifiable { reason },
        }
    }
}

/// A marker a process's environment carries, in a reason: `lease id L`, or that it carries none.
fn carried(what: &str, value: Option<&str>) -> String {
    match value {
        Some(v) => format!("{what} {v}"),
        None => format!("no {what}"),
    }
}

/// Checks a live root whose pid and start time match. `Err` is the verdict to return.
fn check_root(
    lease: &Lease,
    expect: &Expect<'_>,
    p: &ProcessInfo,
) -> Result<Vec<String>, RootProblem> {
    let mut ev = vec![format!(
        "root pid {} alive with recorded start time {}",
        p.pid, p.start_time
    )];
    let Some(exe) = p.exe_path() else {
        return Err(RootProblem::Unverifiable {
            reason: format!(
                "root pid {} is alive with the recorded start time, but its exe is unreadable",
                p.pid
            ),
        });
    };
    if !Path::new(exe).starts_with(expect.wrapper_root) {
        return Err(RootProblem::NotOwned {
            reason: format!(
                "root pid {} runs {exe}, which is not under this gateway's wrapper root {} \
                 (if it is a `leash exec` still starting, retry)",
                p.pid,
                expect.wrapper_root.display()
            ),
        });
    }
    ev.push(format!("exe {exe} lies under the wrapper root"));
    match &p.env {
        Some(env) => {
            if env.lease_id.as_deref() != Some(lease.lease_id.as_str()) {
                return Err(RootProblem::NotOwned {
                    reason: format!(
                        "root pid {} carries {}, not lease id {}",
                        p.pid,
                        carried("lease id", env.lease_id.as_deref()),
                        lease.lease_id
                    ),
                });
            }
            if env.gateway_instance_id.as_deref() != Some(expect.gateway_instance_id) {
                return Err(RootProblem::NotOwned {
                    reason: format!(
                        "root pid {} carries {}, not gateway id {}",
                        p.pid,
                        carried("gateway id", env.gateway_instance_id.as_deref()),
                        expect.gateway_instance_id
                    ),
                });
            }
            ev.push("environment carries the lease id and gateway id".into());
        }
        None => ev.push("environment unreadable; relying on exe, start time and command".into()),
    }
    let hash_ok = p
        .argv
        .as_deref()
        .and_then(adapter_argv)
        .is_some_and(|a| command_hash(a) == lease.command_hash);
    let path_ok = exe == lease.wrapper_path;
    if !hash_ok && !path_ok {
        return Err(RootProblem::NotOwned {
            reason: format!(
                "root pid {}: neither the command hash nor the exe path ({exe}) matches the lease",
                p.pid
            ),
        });
    }
    if hash_ok {
        ev.push("adapter command hash matches".into());
    }
    if path_ok {
        ev.push("exe is exactly the recorded wrapper path".into());
    }
    Ok(ev)
}

/// The per-member check every member passes, whatever admitted it: a process belongs to the
/// lease only if it is not pid 0 or 1, started no earlier than the lease's root, runs as the
/// lease's uid (the root's, or with no root the first member's), is not a zombie, and carries no
/// other lease's or gateway's marker. `None` when it passes, else why not.
pub fn member_problem(
    lease_id: &str,
    gateway_instance_id: &str,
    root_start_time: u64,
    uid: Option<u32>,
    p: &ProcessInfo,
) -> Option<String> {
    if p.pid <= 1 {
        Some(format!("pid {} can never be a lease member", p.pid))
    } else if p.start_time < root_start_time {
        Some(format!(
            "started at {} before the lease's root ({}): cannot be its member",
            p.start_time, root_start_time
        ))
    } else if uid.is_some_and(|u| u != p.uid) {
        Some(format!(
            "runs as uid {}, the lease's root as uid {}",
            p.uid,
            uid.unwrap_or_default()
        ))
    } else if let Some(other) = p.env.as_ref().and_then(|e| {
        e.lease_id
            .as_deref()
            .filter(|id| *id != lease_id)
            .map(|id| (id.to_string(), e.gateway_instance_id.clone()))
    }) {
        Some(format!(
            "carries another lease's marker ({} of gateway {})",
            other.0,
            other.1.unwrap_or_else(|| "?".into())
        ))
    } else if p
        .env
        .as_ref()
        .and_then(|e| e.gateway_instance_id.as_deref())
        .is_some_and(|g| g != gateway_instance_id)
    {
        Some("carries another gateway's instance id".to_string())
    } else if p.state == 'Z' {
        Some("zombie: already dead, its parent reaps it".to_string())
    } else {
        None
    }
}

/// [`member_problem`] with its parameters owned: what the engine re-applies to every member of
/// a lease's cgroup right before it writes `cgroup.kill` (a bystander moved in during the grace
/// must not be taken with the lease's tree).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberRule {
    pub lease_id: String,
    pub gateway_instance_id: String,
    pub root_start_time: u64,
    pub uid: Option<u32>,
}

impl MemberRule {
    pub fn problem(&self, p: &ProcessInfo) -> Option<String> {
        member_problem(
            &self.lease_id,
            &self.gateway_instance_id,
            self.root_start_time,
            self.uid,
            p,
        )
    }
}

struct TreeBuilder<'a> {
    lease: &'a Lease,
    expect: &'a Expect<'a>,
    snap: &'a Snapshot,
    members: BTreeMap<i32, Member>,
    excluded: BTreeMap<i32, Excluded>,
    root_uid: Option<u32>,
    /// Members proven by their markers alone: their descendants are not followed through them.
    no_descent: HashSet<i32>,
}

impl<'a> TreeBuilder<'a> {
    fn new(lease: &'a Lease, expect: &'a Expect<'a>, snap: &'a Snapshot) -> Self {
        TreeBuilder {
            lease,
            expect,
            snap,
            members: BTreeMap::new(),
            excluded: BTreeMap::new(),
            root_uid: None,
            no_descent: HashSet::new(),
        }
    }

    // Seeds, strongest evidence first, so that a weak look at a process (the recorded group)
    // can never shadow a proof found later: the verified root and its descendants; the members
    // of the lease's verified cgroup; the carriers of the lease's markers; each time with their
    // descendants. The recorded process group and the recorded adapter pid/start time are
    // claims of the row, not evidence: they admit nobody (the adapter is only *labelled* among
    // proven members, in `add`), and the group is looked at last, to report its unproven
    // members as excluded.

    /// The verified root, then its descendants (each passing the per-member check).
    fn admit_root_and_descendants(&mut self, root: Option<&'a ProcessInfo>) {
        if let Some(r) = root {
            self.add(
                r,
                Role::Root,
                "wrapper: pid, start time, exe, environment and command verified".into(),
            );
            self.close_over_descendants();
        }
    }

    /// The members of the lease's verified cgroup, then their descendants. Its evidence, verified
    /// or not, joins the verdict's.
    fn admit_cgroup_members(&mut self, cgroup: Option<CgroupCheck>, evidence: &mut Vec<String>) {
        let Some(c) = cgroup else { return };
        evidence.push(c.evidence.clone());
        let CgroupState::Verified { procs, .. } = &c.state else {
            return;
        };
        // Parents before children, so that a child born in the cgroup to a process moved in
        // from outside (which fails its own check) is seen to descend from it.
        let snap = self.snap;
        let mut listed: Vec<&ProcessInfo> = procs.iter().filter_map(|&p| snap.get(p)).collect();
        listed.sort_by_key(|p| (p.start_time, p.pid));
        for p in listed {
            if let Some(from) = self.excluded_ancestor(p) {
                self.exclude(
                    p,
                    format!(
                        "in the lease's cgroup, but a descendant of pid {from}, which is not \
                         the lease's (moved in from outside)"
                    ),
                );
                continue;
            }
            self.consider(
                p,
                Role::CgroupMember,
                format!("member of the lease's cgroup {} (id {})", c.path, c.id),
                false,
            );
        }
        self.close_over_descendants();
    }

    /// The processes that carry this lease's markers and this gateway's id. A marker proves the
    /// process that carries it, not its descendants: markers can be set by anyone for the
    /// processes they start, so a descendant is the lease's only through the verified root or
    /// the verified cgroup (or its own markers).
    fn admit_marker_carriers(&mut self) {
        let (snap, lease, gateway) = (self.snap, self.lease, self.expect.gateway_instance_id);
        let marked = snap.marked(&lease.lease_id).filter(|p| {
            p.env
                .as_ref()
                .is_some_and(|e| e.gateway_instance_id.as_deref() == Some(gateway))
        });
        for p in marked {
            let fresh = !self.members.contains_key(&p.pid);
            self.consider(
                p,
                Role::Marked,
                "environment carries this lease id and gateway id".into(),
                true,
            );
            if fresh {
                self.no_descent.insert(p.pid);
            }
        }
    }

    /// The recorded process group, last: whoever in it is not already a member (or excluded) by
    /// the evidence above is not proven (its id may have been recycled, or the row may name a
    /// stranger's group), and is reported as excluded unless it carries the markers.
    fn look_at_recorded_group(&mut self) {
        let Some(pgid) = self.lease.process_group_id.filter(|&g| g > 1) else {
            return;
        };
        let snap = self.snap;
        for p in snap.group(pgid) {
            self.consider(
                p,
                Role::GroupMember,
                format!("member of the lease's process group {pgid} and carries its markers"),
                true,
            );
        }
    }

    fn add(&mut self, p: &ProcessInfo, role: Role, evidence: String) {
        if role == Role::Root {
            self.root_uid = Some(p.uid);
        }
        // The recorded adapter pid and start time only label a member already proven by other
        // evidence; they never admit one.
        let role = if role != Role::Root
            && Some(p.pid) == self.lease.adapter_pid
            && Some(p.start_time) == self.lease.adapter_start_time
        {
            Role::Adapter
        } else {
            role
        };
        self.members.insert(p.pid, Member::of(p, role, 0, evidence));
    }

    /// The per-member check: a process joins the tree only if it started no earlier than the
    /// lease's root, runs as the root's uid (or, with no root, as the uid of the first member),
    /// is not a zombie, and does not carry another lease's marker.
    fn consider(&mut self, p: &ProcessInfo, role: Role, evidence: String, require_marker: bool) {
        if self.members.contains_key(&p.pid) || self.excluded.contains_key(&p.pid) {
            return;
        }
        let marked = p.env.as_ref().is_some_and(|e| {
            e.lease_id.as_deref() == Some(self.lease.lease_id.as_str())
                && e.gateway_instance_id.as_deref() == Some(self.expect.gateway_instance_id)
        });
        let reason = if let Some(problem) = member_problem(
            &self.lease.lease_id,
            self.expect.gateway_instance_id,
            self.lease.root_start_time,
            self.root_uid,
            p,
        ) {
            Some(problem)
        } else if require_marker && !marked {
            Some(match &p.env {
                Some(_) => "in the lease's process group but not a descendant of its root and \
                     without its marker: the group id may have been recycled"
                    .to_string(),
                None => "in the lease's process group but not a descendant of its root, and its \
                     environment is unreadable"
                    .to_string(),
            })
        } else {
            None
        };
        match reason {
            Some(reason) => {
                self.excluded.insert(
                    p.pid,
                    Excluded {
                        pid: p.pid,
                        start_time: p.start_time,
                        reason,
                    },
                );
            }
            None => {
                if self.root_uid.is_none() {
                    self.root_uid = Some(p.uid);
                }
                self.add(p, role, evidence);
            }
        }
    }

    /// The nearest excluded ancestor of `p` by parent links, unless a member comes first.
    fn excluded_ancestor(&self, p: &ProcessInfo) -> Option<i32> {
        let mut cur = p.ppid;
        for _ in 0..self.snap.len() {
            if self.members.contains_key(&cur) {
                return None;
            }
            if self.excluded.contains_key(&cur) {
                return Some(cur);
            }
            cur = self.snap.get(cur)?.ppid;
        }
        None
    }

    fn exclude(&mut self, p: &ProcessInfo, reason: String) {
        if self.members.contains_key(&p.pid) {
            return;
        }
        self.excluded.insert(
            p.pid,
            Excluded {
                pid: p.pid,
                start_time: p.start_time,
                reason,
            },
        );
    }

    fn close_over_descendants(&mut self) {
        let mut stack: Vec<i32> = self
            .members
            .keys()
            .copied()
            .filter(|p| !self.no_descent.contains(p))
            .collect();
        let mut seen: HashSet<i32> = stack.iter().copied().collect();
        while let Some(pid) = stack.pop() {
            if !self.members.contains_key(&pid) {
                continue; // excluded: its subtree is not followed through it
            }
            for &kid in self.snap.children_of(pid) {
                if !seen.insert(kid) {
                    continue;
                }
                if let Some(p) = self.snap.get(kid) {
                    self.consider(p, Role::Descendant, format!("child of member {pid}"), false);
                    stack.push(kid);
                }
            }
        }
    }

    fn finish(mut self) -> OwnedTree {
        // Depth: how many member ancestors a member has. Signalling deepest first means children
        // before parents, whatever seed they were found from.
        let parents: BTreeMap<i32, i32> = self.members.values().map(|m| (m.pid, m.ppid)).collect();
        for m in self.members.values_mut() {
            let mut d = 0;
            let mut cur = m.ppid;
            while let Some(&pp) = parents.get(&cur) {
                d += 1;
                if d > parents.len() {
                    break; // a cycle can only come from a corrupt fixture
                }
                cur = pp;
            }
            m.depth = d;
        }
        let mut root = None;
        let mut members = Vec::new();
        for (_, m) in self.members {
            if m.role == Role::Root {
                root = Some(m);
            } else {
                members.push(m);
            }
        }
        members.sort_by(|a, b| b.depth.cmp(&a.depth).then(a.pid.cmp(&b.pid)));
        OwnedTree {
            root,
            members,
            excluded: self.excluded.into_values().collect(),
            evidence: Vec::new(),
            member_uid: self.root_uid,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::LeaseEnv;

    const GW: &str = "5f0c2b1e-8d3a-4c6e-9b7f-1a2b3c4d5e6f";
    const ROOT: &str = "/s/wrappers";
    const LID: &str = "01936b2a-7c4e-7d10-9a51-3b2c1d0e9f8a";

    fn lease() -> Lease {
        Lease::builder(LID, GW)
            .wrapper(ROOT, format!("{ROOT}/leash-wrap-1-2"))
            .root(100, 1000)
            .process_group(101)
            .adapter((101, 1001))
            .command(["adapter"])
            .owner(50, 10)
            .build()
    }

    fn wrapper() -> ProcessInfo {
        ProcessInfo {
            pid: 100,
            ppid: 50,
            pgid: 50,
            sid: 50,
            uid: 1000,
            start_time: 1000,
            state: 'S',
            exe: Some(format!("{ROOT}/leash-wrap-1-2")),
            argv: Some(vec![
                format!("{ROOT}/leash-wrap-1-2"),
                "--".into(),
                "adapter".into(),
            ]),
            env: Some(LeaseEnv {
                lease_id: Some(LID.into()),
                gateway_instance_id: Some(GW.into()),
            }),
            pidfs_ino: None,
        }
    }

    fn verdict(l: &Lease, procs: Vec<ProcessInfo>) -> Verdict {
        let root = std::path::PathBuf::from(ROOT);
        let e = Expect {
            gateway_instance_id: GW,
            wrapper_root: &root,
            cgroup_root: None,
        };
        verify_owned_tree(l, &e, &Snapshot::new(procs))
    }

    #[test]
    fn a_verified_wrapper_is_owned() {
        assert!(
            matches!(verdict(&lease(), vec![wrapper()]), Verdict::Owned(t) if t.root.is_some())
        );
    }

    #[test]
    fn each_piece_of_evidence_is_required() {
        let not_owned = |l: Lease, p: ProcessInfo, why: &str| match verdict(&l, vec![p]) {
            Verdict::NotOwned { reason } => assert!(reason.contains(why), "{reason} lacks {why}"),
            v => panic!("expected not-owned ({why}), got {v:?}"),
        };
        let mut l = lease();
        l.gateway_instance_id = "other".into();
        not_owned(l, wrapper(), "names gateway other");
        let mut l = lease();
        l.wrapper_root = "/".into();
        not_owned(l, wrapper(), "names wrapper root /");
        let mut p = wrapper();
        p.exe = Some("/usr/bin/leash".into());
        not_owned(lease(), p, "not under this gateway's wrapper root");
        let mut p = wrapper();
        p.env.as_mut().unwrap().lease_id = Some("another".into());
        not_owned(lease(), p, "carries lease id another, not lease id");
        let mut p = wrapper();
        p.env.as_mut().unwrap().gateway_instance_id = None;
        not_owned(lease(), p, "carries no gateway id, not gateway id");
        let mut p = wrapper();
        p.exe = Some(format!("{ROOT}/leash-wrap-9-9"));
        p.argv = Some(vec!["x".into(), "--".into(), "not-the-adapter".into()]);
        not_owned(lease(), p, "neither the command hash nor the exe path");
    }

    #[test]
    fn role_names_are_the_protocols() {
        for r in [
            Role::Root,
            Role::Adapter,
            Role::Descendant,
            Role::GroupMember,
            Role::Marked,
            Role::CgroupMember,
        ] {
            assert_eq!(serde_json::to_value(r).unwrap(), r.name());
        }
    }

    #[test]
    fn unreadable_exe_is_unverifiable_and_unreadable_env_is_tolerated() {
        let mut p = wrapper();
        p.exe = None;
        assert!(matches!(
            verdict(&lease(), vec![p]),
            Verdict::Unverifiable { .. }
        ));
        let mut p = wrapper();
        p.env = None;
        assert!(matches!(verdict(&lease(), vec![p]), Verdict::Owned(_)));
    }

    #[test]
    fn a_deleted_wrapper_binary_still_verifies() {
        let mut p = wrapper();
        p.exe = Some(format!("{ROOT}/leash-wrap-1-2 (deleted)"));
        assert!(matches!(verdict(&lease(), vec![p]), Verdict::Owned(_)));
    }

    #[test]
    fn a_zombie_root_counts_as_gone() {
        let mut p = wrapper();
        p.state = 'Z';
        assert!(matches!(verdict(&lease(), vec![p]), Verdict::Gone { .. }));
    }
}
