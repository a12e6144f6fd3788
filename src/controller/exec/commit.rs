//! The decision and the lease commit, one function for both front doors
//! ([`decide_and_commit`]): the lease id free, the limits enforceable, the new lease and its
//! session row, its cgroup made before the commit, and the commit that supersedes a session's
//! previous lease only when nothing of it is alive.

use super::request::{ExecError, ExecRequest};
use super::supersede::{supersede_reason, superseded_by_report};
use crate::cgroup::{self, CgroupError, Containment, Limits, Verified};
use crate::lease;
use crate::proc::{self, LiveTable};
use crate::state::StateRoot;
use crate::store::{Store, StoreError};
use leash_core::model::SessionRow;
use leash_core::model::{command_hash, Lease, LeaseState};
use leash_core::verify::Expect;
use std::path::PathBuf;

/// The decision between "the store is open" and "the wrapper's command line", one function for
/// both front doors: `leash exec` on its own connection, and the daemon's `exec` op on its warm
/// one (`daemon/conn/exec.rs`), so the errors, their messages and the rows are the same either
/// way. `origin` is the lease's root and owner as the kernel says (this process and its parent;
/// or, in the daemon, the peer of the socket); `fresh_id` is the lease id the client drew when
/// the command line gives none (a fresh UUIDv7: checked by the insert's key alone, where a
/// `--lease-id` is first looked up to be refused in words); `wrapper` installs (or checks) the
/// wrapper; `containment` resolves the containment for the gateway id. Returns the committed
/// lease and its cgroup.
pub fn decide_and_commit(
    store: &mut Store,
    root: &StateRoot,
    req: &ExecRequest,
    origin: &Origin,
    fresh_id: Option<&str>,
    wrapper: impl FnOnce() -> Result<PathBuf, ExecError>,
    containment: impl FnOnce(&str) -> Containment,
) -> Result<(Lease, Option<MadeCgroup>), ExecError> {
    check_lease_id_free(store, req.lease_id.as_deref())?;
    let wrapper_path = wrapper()?;
    let gateway = store.gateway_instance_id().to_string();
    let containment = containment(&gateway);
    check_limits_enforceable(&req.limits, &containment)?;
    let mut new = new_lease(root, req, &gateway, &wrapper_path, origin, fresh_id);
    let session = session_row(req, &new);
    let made = make_cgroup(&containment, &req.limits, &mut new)?;
    let made = commit(store, root, &containment, &new, &session, made)?;
    Ok((new, made))
}

/// The lease's root (the process that becomes the wrapper) and its owner (that process's
/// parent), as the kernel says.
#[derive(Debug, Clone, Copy)]
pub struct Origin {
    pub root: leash_core::model::ProcessId,
    pub root_pidfs_ino: Option<u64>,
    pub owner: Spawner,
}

impl Origin {
    /// This process and its parent.
    pub(super) fn of_self() -> Result<Origin, ExecError> {
        let me = proc::self_id();
        Ok(Origin {
            root: me,
            root_pidfs_ino: proc::pidfs_ino_of(me.pid),
            owner: spawner()?,
        })
    }
}

/// The process that spawned `leash exec` (our parent, the lease's owner) and its start time.
#[derive(Debug, Clone, Copy)]
pub struct Spawner {
    pub pid: i32,
    pub start_time: u64,
}

pub(super) fn spawner() -> Result<Spawner, ExecError> {
    let pid = nix::unistd::getppid().as_raw();
    if pid <= 0 {
        return Err(ExecError::NoParent(pid));
    }
    Ok(Spawner {
        pid,
        start_time: proc::start_time_of(pid).unwrap_or(0),
    })
}

/// A chosen lease id is unique over every row, open or settled: a gateway that records its
/// launch under this id must never find another lease's history under it. Checked before the
/// cgroup (named by the lease id) is made; two racing execs of one id are told apart by the
/// insert (primary key).
pub(super) fn check_lease_id_free(store: &Store, lease_id: Option<&str>) -> Result<(), ExecError> {
    match lease_id {
        Some(id) if store.lease(id)?.is_some() => Err(ExecError::LeaseIdTaken(id.to_string())),
        _ => Ok(()),
    }
}

/// Limits are refused, before anything is made, where there is no cgroup to enforce them.
pub(super) fn check_limits_enforceable(
    limits: &Limits,
    containment: &Containment,
) -> Result<(), ExecError> {
    if limits.is_empty() || containment.is_on() {
        return Ok(());
    }
    let (_, limit) = limits.needs()[0];
    Err(CgroupError::LimitWithoutContainment {
        mode: if containment.mode == "off" {
            "off"
        } else {
            "unavailable"
        },
        reason: containment.reason.clone().unwrap_or_default(),
        limit,
    }
    .into())
}

/// The lease this process roots: its own pid, start time and pidfs inode (the wrapper keeps them
/// across the exec), the command and its hash, the owner; open, no cgroup yet.
pub(super) fn new_lease(
    root: &StateRoot,
    req: &ExecRequest,
    gateway: &str,
    wrapper_path: &std::path::Path,
    origin: &Origin,
    fresh_id: Option<&str>,
) -> Lease {
    let (me, owner) = (origin.root, &origin.owner);
    let lease_id = match (&req.lease_id, fresh_id) {
        (Some(given), _) => given.clone(),
        (None, Some(fresh)) => fresh.to_string(),
        (None, None) => lease::new_lease_id(),
    };
    let argv: Vec<String> = req
        .command
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let session_key = req
        .session_key
        .clone()
        .unwrap_or_else(|| format!("lease:{lease_id}"));
    Lease {
        lease_id,
        gateway_instance_id: gateway.to_string(),
        session_key,
        agent_id: req.agent_id.clone(),
        wrapper_root: root.wrapper_root().display().to_string(),
        wrapper_path: wrapper_path.display().to_string(),
        root_pid: me.pid,
        root_start_time: me.start_time,
        process_group_id: None,
        adapter_pid: None,
        adapter_start_time: None,
        command_hash: command_hash(&argv),
        command: argv,
        owner_pid: req.owner_pid.unwrap_or(owner.pid),
        owner_start_time: owner.start_time,
        started_at: lease::now_ms(),
        grace_ms: req.grace_ms,
        state: LeaseState::Open,
        state_reason: None,
        closed_at: None,
        exit_status: None,
        claimed_by: None,
        root_pidfs_ino: origin.root_pidfs_ino,
        cgroup_path: None,
        cgroup_id: None,
        report_dir: req
            .report_dir
            .as_deref()
            .and_then(std::path::Path::to_str)
            .map(str::to_owned),
    }
}

/// The session row committed with the lease (its ownership, for the visibility rules).
pub(super) fn session_row(req: &ExecRequest, new: &Lease) -> SessionRow {
    SessionRow {
        session_key: new.session_key.clone(),
        agent_id: req.agent_id.clone(),
        owner_session_key: req.owner_session_key.clone(),
        spawned_by: req.spawned_by.clone(),
        parent_session_key: req.parent_session_key.clone(),
        backend: "acpx".into(),
        gateway_instance_id: new.gateway_instance_id.clone(),
        created_at: new.started_at,
        lease_id: Some(new.lease_id.clone()),
    }
}

/// The lease's cgroup exists, with its limits, before the lease is committed: a crash in
/// between leaves a stray directory that `reap` sweeps, never a lease without its cgroup. Its
/// path and id go into the lease. `None` without containment.
pub(super) fn make_cgroup(
    containment: &Containment,
    limits: &Limits,
    new: &mut Lease,
) -> Result<Option<MadeCgroup>, ExecError> {
    let (true, LeaseState::Open, Some(gw_root), Some(cg_root)) = (
        containment.is_on(),
        new.state,
        containment.gateway_root.as_deref(),
        containment.root.as_deref(),
    ) else {
        return Ok(None);
    };
    let (path, id) = cgroup::create_lease_cgroup(gw_root, &new.lease_id)?;
    let made = MadeCgroup { path, id };
    let path = &made.path;
    if !limits.is_empty() {
        cgroup::enable_controllers(cg_root, gw_root, limits);
        let available: Vec<String> = std::fs::read_to_string(path.join("cgroup.controllers"))
            .unwrap_or_default()
            .split_whitespace()
            .map(str::to_owned)
            .collect();
        let applied = limits
            .check(&available, gw_root)
            .and_then(|()| limits.apply(path));
        if let Err(e) = applied {
            made.remove();
            return Err(e.into());
        }
    }
    new.cgroup_path = Some(made.path.display().to_string());
    new.cgroup_id = Some(made.id);
    Ok(Some(made))
}

/// A lease's cgroup this process made: its path and the id (inode) it got. Nothing of it is held
/// open (an `open` and an `fstat` on every session start): a removal proves it first
/// ([`Verified::open`]: the same path, the same id), so it never removes a directory someone made
/// again under the name.
#[derive(Debug)]
pub struct MadeCgroup {
    pub path: PathBuf,
    pub id: u64,
}

impl MadeCgroup {
    /// Removes it, if it is still the one made (and empty: the kernel refuses otherwise).
    fn remove(self) {
        if let Ok(h) = Verified::open(&self.path, self.id) {
            let _ = h.remove();
        }
    }
}

/// Removes a cgroup [`make_cgroup`] made, when nothing will run in it.
pub(super) fn discard_cgroup(made: Option<MadeCgroup>) {
    if let Some(m) = made {
        m.remove();
    }
}

/// Commits the lease (and its session row) in one transaction. A second exec for a session
/// whose lease is still active proceeds only if nothing of the old lease is alive; the old lease
/// is then marked lost. Decided from the old root's `stat`, its cgroup and its group, never from
/// a scan of the host (see [`supersede_reason`]). On failure the cgroup is removed again.
pub(super) fn commit(
    store: &mut Store,
    root: &StateRoot,
    containment: &Containment,
    new: &Lease,
    session: &SessionRow,
    made: Option<MadeCgroup>,
) -> Result<Option<MadeCgroup>, ExecError> {
    let wrapper_root = root.wrapper_root();
    let expect = Expect {
        gateway_instance_id: &new.gateway_instance_id,
        wrapper_root: &wrapper_root,
        cgroup_root: containment.gateway_root.as_deref(),
    };
    let mut superseded: Option<Lease> = None;
    let supersede = |old: &Lease| {
        let reason = supersede_reason(old, &expect, &LiveTable, root, &new.lease_id)?;
        superseded = Some(old.clone());
        Some(superseded_by_report(root, old, &new.lease_id, reason))
    };
    match store.insert_lease(new, Some(session), supersede) {
        Ok(()) => {
            if let Some(old) = &superseded {
                crate::report::remove_report(root, old);
            }
        }
        Err(e) => {
            discard_cgroup(made);
            return Err(match e {
                StoreError::SessionBusy {
                    session_key,
                    lease_id,
                } => ExecError::SessionLive {
                    session_key,
                    lease_id,
                },
                e => e.into(),
            });
        }
    }
    tracing::debug!(lease_id = %new.lease_id, session = %new.session_key, root_pid = new.root_pid, "lease committed; exec'ing wrapper");
    Ok(made)
}
