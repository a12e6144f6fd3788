//! The cgroup kill, the one signal that reaches a whole cgroup: [`Signaller::kill_cgroup`]'s
//! live half and the check both signallers run first. `cgroup.kill` takes every process in the
//! cgroup at once, whoever its parent is, so it is written only when each live process in it
//! passes the per-member check its lease's members passed ([`cgroup_kill_allowed`], read right
//! before the write). Kernels before 5.14 have no `cgroup.kill`: the cgroup is frozen (so nothing
//! in it can fork meanwhile), each member that passes the member check is pinned and re-checked
//! like every other signal (start time, hard refusals) and gets SIGKILL through its pidfd, and
//! the cgroup is thawed.

use super::seam::{CgroupKillError, Signaller};
use crate::cgroup::Verified;
use crate::proc::ProcessTable;
use leash_core::guard::{Caller, Sig};
use leash_core::verify::MemberRule;
use std::io;

/// Whether `cgroup.kill` may be written to a lease's verified cgroup whose members are `listed`
/// now: it takes every process in it, so each live one must pass the per-member check its lease's
/// members passed (started no earlier than the root, the lease's uid, no other lease's or
/// gateway's marker). A process moved in from outside fails it, and then nobody is killed as a
/// group: the proven members get their own signals. Without a rule (no member was proven) the
/// answer is no. `Err` says why not.
pub fn cgroup_kill_allowed(
    table: &dyn ProcessTable,
    caller: &Caller,
    listed: &[i32],
    rule: Option<&MemberRule>,
) -> Result<(), String> {
    let Some(rule) = rule else {
        return Err("no process in it was proven the lease's".into());
    };
    let mut strangers = Vec::new();
    for &pid in listed {
        match table.process(pid) {
            Ok(Some(p)) if p.state == 'Z' => {}
            Ok(Some(p)) => {
                // The guards too: `cgroup.kill` takes every member at once, so it must not take
                // one a per-process signal would be refused (another uid: with the root gone,
                // the rule's uid is the first member's, and a bystander of another uid alone in
                // the cgroup would set it).
                let why = rule
                    .problem(&p)
                    .or_else(|| super::seam::check(&p, caller).err().map(|r| r.to_string()));
                if let Some(why) = why {
                    strangers.push(format!("pid {pid} ({why})"));
                }
            }
            Ok(None) => {} // exited since it was listed
            Err(e) => return Err(format!("pid {pid} could not be read: {e}")),
        }
    }
    if strangers.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "not every process in it is the lease's: {}",
            strangers.join(", ")
        ))
    }
}

/// The live cgroup kill (see the module header). Returns the members listed when it was killed.
pub(super) fn kill_live(
    sg: &dyn Signaller,
    table: &dyn ProcessTable,
    caller: &Caller,
    cg: &Verified,
    rule: Option<&MemberRule>,
) -> Result<Vec<i32>, CgroupKillError> {
    let listed = cg.procs();
    cgroup_kill_allowed(table, caller, &listed, rule).map_err(CgroupKillError::Refused)?;
    match cg.write("cgroup.kill", "1") {
        Ok(()) => {
            tracing::info!(cgroup = %cg.path().display(), members = listed.len(), "cgroup.kill");
            return Ok(listed);
        }
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(cg.io_error("kill", e).into()),
        Err(_) => {}
    }
    cg.write("cgroup.freeze", "1")
        .map_err(|e| cg.io_error("freeze", e))?;
    for pid in cg.procs() {
        // Frozen: the list cannot grow behind us; each member is checked as the write would have
        // required, then pinned and re-checked like every signal.
        let Ok(Some(info)) = table.process(pid) else {
            continue;
        };
        if info.state == 'Z' || rule.is_some_and(|r| r.problem(&info).is_some()) {
            continue;
        }
        let sent = sg
            .pin(table, caller, info.id())
            .and_then(|p| p.map(|p| sg.send(&p, Sig::Kill)).transpose());
        if let Err(e) = sent {
            tracing::warn!(pid, cgroup = %cg.path().display(), error = %e, "cgroup member not signalled");
        }
    }
    cg.write("cgroup.freeze", "0")
        .map_err(|e| cg.io_error("thaw", e))?;
    Ok(listed)
}
