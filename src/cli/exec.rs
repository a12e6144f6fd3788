//! `leash exec` from its command line: the request, then the verb (through a daemon of the
//! state root when one serves it); every failure of exec itself exits 125.

use super::args::ExecArgs;
use super::exit::Failure;
use crate::controller::exec::ExecRequest;
use crate::state::StateRoot;
use leash_core::kind::{HasKind, Kind};
use leash_core::limits::DEFAULT_GRACE_MS;

/// `leash exec`'s request from its command line.
pub(super) fn exec_request(
    a: ExecArgs,
    containment: crate::cgroup::Settings,
    json_errors: bool,
) -> ExecRequest {
    ExecRequest {
        containment,
        limits: crate::cgroup::Limits {
            memory_max: a.memory_max,
            pids_max: a.pids_max,
            cpu_max: a.cpu_max,
        },
        session_key: a.session,
        agent_id: a.agent,
        owner_session_key: a.owner,
        spawned_by: a.spawned_by,
        parent_session_key: a.parent,
        grace_ms: a.grace.ms().unwrap_or(DEFAULT_GRACE_MS),
        owner_pid: a.owner_pid,
        json_errors,
        env: crate::envpolicy::EnvPolicy {
            unset: a.unset_env,
            clear: a.clear_env,
            keep: a.keep_env,
        },
        lease_id: a.lease_id,
        command: a.command,
        report_dir: None,
    }
}

pub(super) fn run_exec(
    dir: &std::path::Path,
    mut req: ExecRequest,
    no_daemon: bool,
) -> Result<u8, Failure> {
    // Before the state root is made: a refused exec changes nothing.
    crate::controller::exec::check_owner(req.owner_pid).map_err(|e| {
        let kind = e.kind();
        Failure::new(kind, e.to_string()).of_exec()
    })?;
    req.report_dir = crate::state::resolve_reports_dir(&|k| std::env::var_os(k))
        .map_err(|e| Failure::new(e.kind(), e.to_string()).of_exec())?;
    let root = StateRoot::open(dir)
        .map_err(|e| Failure::new(Kind::Internal, format!("{e}; nothing started")).of_exec())?;
    // A daemon of this state root commits the lease on its warm connection; without
    // one (or with --no-daemon) the lease is committed here.
    let through = crate::client::exec::ExecThroughDaemon { root: &root };
    let through: &dyn crate::controller::exec::ExecDaemon = &through;
    let daemon = (!no_daemon).then_some(through);
    match crate::controller::exec::exec(&root, req, daemon) {
        Ok(never) => match never {},
        Err(e) => {
            let kind = e.kind();
            let msg = crate::controller::exec::cli_message(&e);
            Err(Failure::new(kind, msg).of_exec())
        }
    }
}
