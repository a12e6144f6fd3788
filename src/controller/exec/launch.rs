//! The wrapper, once the lease is committed (here or by the daemon): its command line (the
//! grace, the owner it watches, its report file, its cgroup, the environment policy, the lease
//! markers, the adapter's command) and the exec; when the exec fails, the lease is recorded lost.

use super::commit::{discard_cgroup, MadeCgroup};
use super::request::{ExecError, ExecRequest};
use crate::state::StateRoot;
use crate::store::Store;
use leash_core::model::{Lease, LeaseState, ENV_GATEWAY_ID, ENV_LEASE_ID};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::Command;

/// What the wrapper is exec'd with once the lease is committed (here or by the daemon).
pub(super) struct Launch {
    pub(super) lease_id: String,
    /// The wrapper's report file: in the reports directory this process resolved, or the one a
    /// committed row names ([`lease_report`]).
    pub(super) report: PathBuf,
    pub(super) gateway_id: String,
    pub(super) wrapper_path: PathBuf,
    pub(super) owner_pid: i32,
    pub(super) cgroup: Option<PathBuf>,
    pub(super) cgroup_id: Option<u64>,
    /// The cgroup when this process made it (to remove it if the exec fails).
    pub(super) made: Option<MadeCgroup>,
}

/// Execs the wrapper; returns only when that failed (the lease is then recorded lost).
pub(super) fn launch_wrapper(root: &StateRoot, req: &ExecRequest, launch: Launch) -> ExecError {
    let err = wrapper_command(req, &launch, &root.report_path(&launch.lease_id)).exec();
    let made = match (launch.made, &launch.cgroup, launch.cgroup_id) {
        (Some(m), _, _) => Some(m),
        (None, Some(p), Some(id)) => Some(MadeCgroup {
            path: p.clone(),
            id,
        }),
        _ => None,
    };
    wrapper_exec_failed(root, &launch.lease_id, launch.wrapper_path, made, err)
}

/// Where the wrapper of a lease read back from its row writes its report: the file the row names
/// ([`StateRoot::report_file`]); `run/<lease>.json` when the row's claim is refused (a report
/// nobody then reads: the lease ends `lost` rather than `ended`, and nothing is written where
/// the claim pointed).
pub(super) fn lease_report(root: &StateRoot, lease: &Lease) -> PathBuf {
    root.report_file(&lease.lease_id, lease.report_dir.as_deref())
        .unwrap_or_else(|| root.report_path(&lease.lease_id))
}

/// The wrapper's command line: the grace, the owner it watches, its report file, the cgroup it
/// starts the adapter in, the error format; the environment policy, then the lease markers
/// (after it, so no policy can remove them), then the adapter's command.
///
/// `fallback` is where the wrapper puts the report records its reports directory cannot take
/// (`run/<lease>.json` of the state root): a full or missing directory on tmpfs is the
/// wrapper's problem alone, and the lease's end is still known.
pub(super) fn wrapper_command(
    req: &ExecRequest,
    launch: &Launch,
    fallback: &std::path::Path,
) -> Command {
    let mut cmd = Command::new(&launch.wrapper_path);
    cmd.arg("--grace-ms")
        .arg(req.grace_ms.to_string())
        .arg("--owner-pid")
        .arg(launch.owner_pid.to_string())
        .arg("--report")
        .arg(&launch.report);
    if let Some(path) = &launch.cgroup {
        // The gateway's directory goes with its last lease (no empty `leash/<gateway id>` left
        // behind by a gateway without a daemon; `create_lease_cgroup` makes it again).
        cmd.arg("--cgroup").arg(path).arg("--remove-empty-parent");
    }
    if req.json_errors {
        cmd.args(["--error-format", "json"]);
    }
    if launch.report != fallback {
        cmd.arg("--report-fallback").arg(fallback);
    }
    // The scrub, on the wrapper's own exec (no `env` process): the adapter inherits what the
    // wrapper got.
    req.env.apply(&mut cmd);
    cmd.arg("--").args(&req.command);
    // The lease markers, set after the environment policy (so no policy can remove them).
    cmd.env(ENV_LEASE_ID, &launch.lease_id)
        .env(ENV_GATEWAY_ID, &launch.gateway_id);
    cmd
}

/// Still here: the wrapper could not be exec'd, and nothing runs under this lease. Its cgroup
/// goes and the lease is recorded lost, with the reason.
pub(super) fn wrapper_exec_failed(
    root: &StateRoot,
    lease_id: &str,
    wrapper_path: PathBuf,
    made: Option<MadeCgroup>,
    err: std::io::Error,
) -> ExecError {
    let reason = format!("cannot exec wrapper {}: {err}", wrapper_path.display());
    discard_cgroup(made);
    // No wrapper ran, so none wrote a report; a stray file of that name goes all the same.
    let _ = std::fs::remove_file(root.report_path(lease_id));
    if let Ok(mut store) = Store::open(&root.db_path()) {
        let _ = store.transition(lease_id, LeaseState::Open, LeaseState::Lost, None, &reason);
    }
    ExecError::Exec {
        path: wrapper_path,
        lease_id: lease_id.to_string(),
        source: err,
    }
}
