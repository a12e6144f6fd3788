//! `leash exec`: commit the lease, then become the wrapper.
//!
//! The one verb that runs without a [`Controller`](super::Controller): it runs once per session
//! start, on the hot path, in the process that becomes the lease's root, and needs none of what
//! a controller sets up (the signaller, the caller, the descriptor limit): it opens the store,
//! decides (the supersede check), commits and execs. The daemon runs it as its child (`ensure`
//! spawns `leash exec`), so both front doors reach this one function.
//!
//! The process that runs `leash exec` is the lease's root: its pid and start time are recorded,
//! the lease is committed, and then the process execs the installed wrapper in place, keeping its
//! pid and start time. So the lease is in the database before the wrapper's first instruction,
//! always, and the gateway that spawned `leash exec` is the wrapper's parent (the lease's owner).
//! Nothing is printed on stdout: it is the adapter's.
//!
//! With a `leash serve` of the state root running, the commit is the daemon's: this
//! process resolves what only it can (its containment, the installed wrapper, a lease id of its
//! choosing), sends one `exec` request and waits for the answer, and opens no database; the
//! daemon runs [`decide_and_commit`] — the same steps, errors and messages — with the socket's
//! peer (this process, as the kernel names it) as the root. Whatever the daemon cannot honour
//! is decided here as without a daemon.
//!
//! By concern: this file holds [`exec`], the verb as a checklist; `request.rs` the request, its
//! errors and the checks at the edge; `commit.rs` the decision and the lease commit
//! ([`decide_and_commit`]); `supersede.rs` the supersede check's live reads; `launch.rs` the
//! wrapper's command line and its exec; `daemon.rs` the daemon path ([`ExecDaemon`], the `exec`
//! request and answer).

mod commit;
mod daemon;
mod launch;
mod request;
mod supersede;

pub use commit::{decide_and_commit, MadeCgroup, Origin, Spawner};
pub(crate) use daemon::with_ownership_fields;
pub use daemon::{DaemonAnswer, ExecAnswer, ExecAsk, ExecDaemon};
pub use request::{check_owner, check_owner_is, cli_message, is_canonical_uuid};
pub use request::{ExecError, ExecRequest};
pub use supersede::supersede_reason;

use crate::cgroup::Containment;
use crate::install::install_wrapper;
use crate::state::StateRoot;
use crate::store::Store;
use daemon::through_daemon;
use launch::{launch_wrapper, Launch};
use request::check_request;
use std::path::PathBuf;

/// Commits the lease and execs the wrapper. Returns only on failure. One step per line; each
/// step's rules are in its own function below.
///
/// `daemon`: the way to a `leash serve` of this state root, if one may be asked.
/// When one answers and can honour the request, it runs the same decision
/// ([`decide_and_commit`]) on its warm connection and this process opens no database at all;
/// otherwise (no daemon, another state root, settings the daemon did not resolve) the lease is
/// committed here, as it always was.
pub fn exec(
    root: &StateRoot,
    mut req: ExecRequest,
    daemon: Option<&dyn ExecDaemon>,
) -> Result<std::convert::Infallible, ExecError> {
    check_request(&req)?;
    if let Some(d) = daemon {
        if let Some(launch) = through_daemon(root, &mut req, d)? {
            return Err(launch_wrapper(root, &req, launch));
        }
    }
    let mut store = Store::open(&root.db_path())?;
    let origin = Origin::of_self()?;
    let wrapper = || install_wrapper(root).map_err(ExecError::from);
    let resolve = |gateway: &str| Containment::resolve_lean(&req.containment, gateway);
    let (new, made) = decide_and_commit(&mut store, root, &req, &origin, None, wrapper, resolve)?;
    drop(store);
    let launch = Launch {
        report: root.report_path_at(req.report_dir.as_deref(), &new.lease_id),
        wrapper_path: PathBuf::from(&new.wrapper_path),
        owner_pid: origin.owner.pid,
        cgroup: made.as_ref().map(|m| m.path.clone()),
        made,
        cgroup_id: new.cgroup_id,
        lease_id: new.lease_id,
        gateway_id: new.gateway_instance_id,
    };
    Err(launch_wrapper(root, &req, launch))
}
