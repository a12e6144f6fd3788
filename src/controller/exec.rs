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

use crate::cgroup::{self, CgroupError, Containment, Limits, Settings, Verified};
use crate::install::{install_wrapper, InstallError};
use crate::lease::{self};
use crate::proc::{self, LiveTable, ProcessTable};
use crate::state::{StateError, StateRoot};
use crate::store::{Store, StoreError};
use leash_core::kind::{HasKind, Kind};
use leash_core::model::SessionRow;
use leash_core::model::{command_hash, Lease, LeaseState, ENV_GATEWAY_ID, ENV_LEASE_ID};
use leash_core::verify::Expect;
use serde::{Deserialize, Serialize};
use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::Command;

/// What to run, and the session it belongs to.
#[derive(Debug, Clone, Default)]
pub struct ExecRequest {
    pub session_key: Option<String>,
    pub agent_id: Option<String>,
    pub owner_session_key: Option<String>,
    pub spawned_by: Option<String>,
    pub parent_session_key: Option<String>,
    pub grace_ms: u64,
    /// The pid the caller says is our parent; if it is not, nothing is started.
    pub owner_pid: Option<i32>,
    /// A lease id the caller chose (`--lease-id`), so a gateway can record its launch before
    /// the spawn; a canonical UUID no lease row has. `None`: a fresh UUIDv7.
    pub lease_id: Option<String>,
    /// Containment settings (`--containment`, `--cgroup-root`).
    pub containment: Settings,
    /// Resource limits for the session's cgroup; refused when they cannot be enforced.
    pub limits: Limits,
    /// `--error-format json`: the wrapper tells a command it cannot start (exit 127 or 126) as
    /// leash's JSON error line, like every other failure of `leash exec`.
    pub json_errors: bool,
    /// What the adapter's environment keeps of this process's (`--unset-env`, `--clear-env`,
    /// `--keep-env`); the lease markers are set after it and always survive.
    pub env: crate::envpolicy::EnvPolicy,
    pub command: Vec<OsString>,
    /// The directory the wrapper writes its report in, as [`crate::state::resolve_reports_dir`]
    /// picked it from the environment of the `leash exec` (the daemon: its peer's); `None`: the
    /// state root's `run/`. Recorded in the lease's row (`report_dir`).
    pub report_dir: Option<PathBuf>,
}

#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    #[error(transparent)]
    State(#[from] StateError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Install(#[from] InstallError),
    #[error(transparent)]
    Cgroup(#[from] CgroupError),
    #[error("no command given")]
    NoCommand,
    #[error("{0}; nothing started")]
    BadInput(#[from] crate::limits::ValueError),
    #[error("{0}; nothing started")]
    BadEnv(#[from] crate::envpolicy::EnvNameError),
    #[error("leash exec has no visible parent process (parent pid {0}); cannot record an owner")]
    NoParent(i32),
    #[error("--lease-id {0} is not a UUID in canonical form (lowercase, hyphenated, not nil, e.g. 0190b1f2-7c3a-7d4e-8f00-1234567890ab); nothing started")]
    BadLeaseId(String),
    #[error(
        "lease id {0} is already taken (a lease row has it); nothing started (choose a fresh UUID)"
    )]
    LeaseIdTaken(String),
    #[error("session {session_key} already has a live lease {lease_id}; nothing started (close it first: leash close --session {session_key})")]
    SessionLive {
        session_key: String,
        lease_id: String,
    },
    #[error("--owner-pid {expected} is not our parent (parent is {actual}): {why}; nothing started, nothing recorded")]
    OwnerGone {
        expected: i32,
        actual: i32,
        why: &'static str,
    },
    /// The daemon's refusal of its `exec` op: the decision's error as [`cli_message`] says it.
    #[error("{message}")]
    Daemon { kind: Kind, message: String },
    #[error("cannot exec the wrapper {path}: {source}; lease {lease_id} recorded lost")]
    Exec {
        path: PathBuf,
        lease_id: String,
        #[source]
        source: std::io::Error,
    },
}

impl HasKind for ExecError {
    /// The cause of a failed `leash exec` (it exits 125 whatever the kind).
    fn kind(&self) -> Kind {
        use crate::store::StoreError;
        match self {
            ExecError::SessionLive { .. } => Kind::Conflict,
            ExecError::BadInput(_)
            | ExecError::BadEnv(_)
            | ExecError::NoCommand
            | ExecError::BadLeaseId(_) => Kind::Usage,
            ExecError::LeaseIdTaken(_) => Kind::Conflict,
            ExecError::Daemon { kind, .. } => *kind,
            ExecError::Store(StoreError::Unstorable { .. }) => Kind::Usage,
            ExecError::Store(_) | ExecError::State(_) => Kind::Internal,
            ExecError::Install(_)
            | ExecError::NoParent(_)
            | ExecError::OwnerGone { .. }
            | ExecError::Exec { .. }
            | ExecError::Cgroup(_) => Kind::SpawnFailed,
        }
    }
}

/// How `leash exec` words a failure (the daemon's `exec` op sends the same text): said once
/// that nothing started, where the error does not say it itself.
pub fn cli_message(e: &ExecError) -> String {
    match e {
        ExecError::Store(_)
        | ExecError::State(_)
        | ExecError::Install(_)
        | ExecError::Cgroup(_)
            if !e.to_string().contains("nothing started") =>
        {
            format!("{e}; nothing started")
        }
        _ => e.to_string(),
    }
}

/// Whether a session's previous active lease is over, so that a new one may take its place;
/// `Some(reason)` when it is. The cost does not grow with the host: the answer comes
/// from the old root's `/proc/<pid>/stat` (pid, start time, pidfs inode), and only when that
/// root is gone from the lease's cgroup (`cgroup.procs`) and its process group (one `kill(-pgid,
/// 0)`). Only when the group still has members — something of the session may still run — is the
/// old lease verified the full way, against the whole process table, as before.
///
/// What this leaves to `leash reap`: a process that carries the old lease's markers but left its
/// wrapper's tree, its group and (without containment) any cgroup — a `setsid` escapee of a
/// wrapper that was SIGKILLed. Finding it needs a look at every process, which only `reap` takes
/// (its escapee sweep covers lost leases too).
pub fn supersede_reason(
    old: &Lease,
    expect: &Expect<'_>,
    table: &dyn ProcessTable,
    root: &StateRoot,
    new_lease_id: &str,
) -> Option<String> {
    leash_core::plan::supersede(old, expect, new_lease_id, &LiveReads { table, root })
}

/// The live reads of [`supersede_reason`]: the process table, the wrapper's report, the group's
/// `kill(-pgid, 0)` and the lease's cgroup. The decision is the core's
/// ([`leash_core::plan::supersede`]).
struct LiveReads<'a> {
    table: &'a dyn ProcessTable,
    root: &'a StateRoot,
}

impl leash_core::plan::SupersedeReads for LiveReads<'_> {
    fn root_may_run(&self, old: &Lease) -> bool {
        use crate::proc::Liveness;
        !matches!(
            self.table.liveness(old.root(), old.root_pidfs_ino),
            Ok(Liveness::Gone) | Ok(Liveness::Zombie)
        )
    }

    fn reported(&self, old: &Lease) -> (Option<i32>, Option<leash_core::model::ProcessId>) {
        let Some(r) = crate::report::WrapperReport::read_for(self.root, old) else {
            return (None, None);
        };
        let adapter = r
            .adapter_pid
            .zip(r.adapter_start_time)
            .map(|(pid, start_time)| leash_core::model::ProcessId { pid, start_time });
        (r.process_group_id, adapter)
    }

    fn group_alive(&self, pgid: i32) -> bool {
        crate::signal::group_alive(pgid)
    }

    fn adapter_may_run(&self, adapter: leash_core::model::ProcessId) -> bool {
        !matches!(
            self.table.liveness(adapter, None),
            Ok(crate::proc::Liveness::Gone)
        )
    }

    fn snapshot(&self) -> Option<leash_core::model::Snapshot> {
        self.table.snapshot().ok()
    }

    fn observe(&self, path: &std::path::Path) -> leash_core::model::Observation {
        cgroup::observe(path)
    }

    fn process(&self, pid: i32) -> Option<leash_core::model::ProcessInfo> {
        self.table.process(pid).ok().flatten()
    }
}

/// `--owner-pid` must be our parent (the spawner that is waiting for us): when it is not, the
/// spawner exited before `leash exec` ran (or the pid is wrong), and nothing may start, since
/// its owner could never be watched. Refused before anything is stored: no lease row, no
/// cgroup. Checked again by the wrapper (it watches the parent it was given).
pub fn check_owner(owner_pid: Option<i32>) -> Result<(), ExecError> {
    check_owner_is(owner_pid, nix::unistd::getppid().as_raw())
}

/// [`check_owner`] against a parent read elsewhere (the daemon reads its peer's).
pub fn check_owner_is(owner_pid: Option<i32>, parent: i32) -> Result<(), ExecError> {
    let Some(expected) = owner_pid else {
        return Ok(());
    };
    if expected == parent {
        return Ok(());
    }
    let why = if proc::start_time_of(expected).is_none() {
        "no process has that pid: the spawner exited before leash exec ran, or the pid is wrong"
    } else {
        "it names another process: the spawner exited before leash exec ran (and its pid was \
         reused), or the pid is wrong"
    };
    Err(ExecError::OwnerGone {
        expected,
        actual: parent,
        why,
    })
}

/// Whether `id` is a UUID written the one way leash writes them (lowercase, hyphenated), and
/// not the nil UUID: a lease id names a cgroup directory and is matched as text against
/// wrappers' argv and environment, so two spellings of one UUID would be two ids.
pub fn is_canonical_uuid(id: &str) -> bool {
    uuid::Uuid::try_parse(id).is_ok_and(|u| !u.is_nil() && u.hyphenated().to_string() == id)
}

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

/// What the wrapper is exec'd with once the lease is committed (here or by the daemon).
struct Launch {
    lease_id: String,
    /// The wrapper's report file: in the reports directory this process resolved, or the one a
    /// committed row names ([`lease_report`]).
    report: PathBuf,
    gateway_id: String,
    wrapper_path: PathBuf,
    owner_pid: i32,
    cgroup: Option<PathBuf>,
    cgroup_id: Option<u64>,
    /// The cgroup when this process made it (to remove it if the exec fails).
    made: Option<MadeCgroup>,
}

/// Execs the wrapper; returns only when that failed (the lease is then recorded lost).
fn launch_wrapper(root: &StateRoot, req: &ExecRequest, launch: Launch) -> ExecError {
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
    fn of_self() -> Result<Origin, ExecError> {
        let me = proc::self_id();
        Ok(Origin {
            root: me,
            root_pidfs_ino: proc::pidfs_ino_of(me.pid),
            owner: spawner()?,
        })
    }
}

/// The way to the daemon serving the state root, for [`exec`]: the front door passes it in
/// (`client::exec`), so this verb names no client type.
pub trait ExecDaemon {
    /// Asks the daemon to commit the lease rooted at the calling process. `ask` is called only
    /// once a daemon is reached (so `leash exec` without one does the request's work once, on
    /// the direct path); `None` from it: not asked.
    fn commit(&self, ask: &dyn Fn() -> Option<ExecAsk>) -> DaemonAnswer;
}

/// What the daemon said to an [`ExecAsk`].
#[derive(Debug)]
pub enum DaemonAnswer {
    /// No daemon was asked (none runs, another state root's, an old one): the direct path.
    NotAsked(String),
    /// The daemon answered: committed, or it cannot honour these settings.
    Answered(ExecAnswer),
    /// The daemon refused: the decision's error, as the direct path would have said it.
    Refused { kind: Kind, message: String },
    /// The request was sent but no answer came (the daemon died, or closed the connection):
    /// the lease may or may not be committed; [`exec`] looks its id up.
    Lost(String),
}

/// Declares a struct with the fields that say whose a session is (`agent`, `owner`,
/// `spawnedBy`, `parent`: optional, absent by default), in the place of `..ownership`. The
/// `exec` request ([`ExecAsk`]), `ensure` and a stored spec (both through
/// `protocol::with_launch_fields!`) are declared through it, so the list is written once.
macro_rules! with_ownership_fields {
    (
        $(#[$meta:meta])*
        pub struct $name:ident {
            $($(#[$head_meta:meta])* pub $head:ident: $head_ty:ty,)*
            ..ownership,
            $($(#[$tail_meta:meta])* pub $tail:ident: $tail_ty:ty,)*
        }
    ) => {
        $(#[$meta])*
        pub struct $name {
            $($(#[$head_meta])* pub $head: $head_ty,)*
            #[serde(default)]
            pub agent: Option<String>,
            #[serde(default)]
            pub owner: Option<String>,
            #[serde(default)]
            pub spawned_by: Option<String>,
            #[serde(default)]
            pub parent: Option<String>,
            $($(#[$tail_meta])* pub $tail: $tail_ty,)*
        }
    };
}
pub(crate) use with_ownership_fields;

with_ownership_fields! {
    /// The daemon's `exec` request: what [`decide_and_commit`] needs that only the client knows.
    /// The root and the owner are not in it: the daemon takes them from the socket's peer.
    #[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
    #[serde(rename_all = "camelCase", deny_unknown_fields)]
    pub struct ExecAsk {
        /// The state root the client means (the daemon serves one).
        pub state_dir: PathBuf,
        /// Chosen by the client (a fresh UUIDv7, or `--lease-id`): a lost answer is looked up by it.
        pub lease_id: String,
        /// Whether `lease_id` came from `--lease-id` (so a fresh one may not replace it).
        #[serde(default)]
        pub lease_id_given: bool,
        #[serde(default)]
        pub session: Option<String>,
        ..ownership,
        pub grace_ms: u64,
        /// `--owner-pid`: checked against the peer's parent as the kernel says.
        #[serde(default)]
        pub owner_pid: Option<i32>,
        #[serde(default)]
        pub limits: Limits,
        /// The adapter's argv (as the lease records it: lossy UTF-8).
        pub argv: Vec<String>,
        /// The wrapper the client installed (under the state root's wrapper root).
        pub wrapper: PathBuf,
        /// The containment the client resolved: the daemon commits only when it resolved the same.
        pub containment: String,
        #[serde(default)]
        pub cgroup_root: Option<PathBuf>,
        /// Where the client's wrapper writes its report ([`ExecRequest::report_dir`]): the
        /// daemon records it in the row when it is a private directory of its user, and
        /// answers `direct` otherwise. Absent: the state root's `run/`.
        #[serde(default)]
        pub report_dir: Option<PathBuf>,
    }
}

/// The daemon's answer to [`ExecAsk`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "camelCase")]
pub enum ExecAnswer {
    /// The lease is committed (and its cgroup made): exec the wrapper.
    #[serde(rename_all = "camelCase")]
    Committed {
        lease_id: String,
        gateway_id: String,
        root_pid: i32,
        root_start_time: u64,
        wrapper_path: PathBuf,
        #[serde(default)]
        cgroup_path: Option<PathBuf>,
        #[serde(default)]
        cgroup_id: Option<u64>,
    },
    /// The daemon cannot honour the request (another containment, another state root, a
    /// kernel without the peer's pidfd): nothing was made; commit directly.
    Direct { why: String },
}

/// The daemon path of [`exec`]: `Some` when the daemon committed the lease (or committed it
/// and died before answering), `None` for the direct path; an error when it refused.
fn through_daemon(
    root: &StateRoot,
    req: &mut ExecRequest,
    d: &dyn ExecDaemon,
) -> Result<Option<Launch>, ExecError> {
    let given = req.lease_id.is_some();
    let lease_id = req.lease_id.clone().unwrap_or_else(lease::new_lease_id);
    let ask = || -> Option<ExecAsk> {
        // The containment this process would resolve (the gateway's directory aside, which
        // needs the store): the daemon honours only the same. A refusal it would give (limits
        // without containment) is the direct path's, word for word.
        let mine = Containment::resolve_lean(&req.containment, "");
        check_limits_enforceable(&req.limits, &mine).ok()?;
        // Any failure here is the direct path's to report, in its order.
        let wrapper_path = install_wrapper(root).ok()?;
        Some(ExecAsk {
            state_dir: root.dir().to_path_buf(),
            lease_id: lease_id.clone(),
            lease_id_given: given,
            session: req.session_key.clone(),
            agent: req.agent_id.clone(),
            owner: req.owner_session_key.clone(),
            spawned_by: req.spawned_by.clone(),
            parent: req.parent_session_key.clone(),
            grace_ms: req.grace_ms,
            owner_pid: req.owner_pid,
            limits: req.limits.clone(),
            argv: req
                .command
                .iter()
                .map(|a| a.to_string_lossy().into_owned())
                .collect(),
            wrapper: wrapper_path,
            containment: mine.mode.clone(),
            cgroup_root: mine.root.clone(),
            report_dir: req.report_dir.clone(),
        })
    };
    let me = proc::self_id();
    let owner_pid = nix::unistd::getppid().as_raw();
    match d.commit(&ask) {
        DaemonAnswer::NotAsked(why) | DaemonAnswer::Answered(ExecAnswer::Direct { why }) => {
            tracing::debug!(%why, "committing the lease directly");
            Ok(None)
        }
        DaemonAnswer::Refused { kind, message } => Err(ExecError::Daemon { kind, message }),
        DaemonAnswer::Answered(ExecAnswer::Committed {
            lease_id: got,
            gateway_id,
            root_pid,
            root_start_time,
            wrapper_path,
            cgroup_path,
            cgroup_id,
        }) => {
            if got != lease_id || root_pid != me.pid || root_start_time != me.start_time {
                return Err(ExecError::Daemon {
                    kind: Kind::Internal,
                    message: format!(
                        "the daemon committed lease {got} rooted at pid {root_pid} (start time \
                         {root_start_time}), not lease {lease_id} at this process (pid {}, start \
                         time {}); nothing started",
                        me.pid, me.start_time
                    ),
                });
            }
            Ok(Some(Launch {
                report: root.report_path_at(req.report_dir.as_deref(), &lease_id),
                lease_id,
                gateway_id,
                wrapper_path,
                owner_pid,
                cgroup: cgroup_path,
                cgroup_id,
                made: None,
            }))
        }
        DaemonAnswer::Lost(why) => {
            tracing::debug!(%why, %lease_id, "the daemon did not answer; looking the lease up");
            after_lost_answer(root, req, &lease_id, given, me, owner_pid)
        }
    }
}

/// The daemon took the request and did not answer: the row decides. Present with this
/// process as its root (pid and start time): the daemon committed it, exec the wrapper.
/// Absent: nothing was committed, the direct path (with a fresh id unless `--lease-id` chose
/// it: a cgroup the daemon may have made for the first id is a stray `reap` sweeps).
fn after_lost_answer(
    root: &StateRoot,
    req: &mut ExecRequest,
    lease_id: &str,
    given: bool,
    me: leash_core::model::ProcessId,
    owner_pid: i32,
) -> Result<Option<Launch>, ExecError> {
    let store = Store::open(&root.db_path())?;
    match store.lease(lease_id)? {
        Some(l) => match rooted_here(root, l, me, owner_pid) {
            Some(launch) => Ok(Some(launch)),
            None => Err(ExecError::LeaseIdTaken(lease_id.to_string())),
        },
        None => {
            if !given {
                req.lease_id = None;
            }
            Ok(None)
        }
    }
}

/// The launch of lease `l` when it is open and rooted at this process (`me`: its pid and start
/// time), i.e. committed for it by a daemon that did not get to say so.
fn rooted_here(
    root: &StateRoot,
    l: Lease,
    me: leash_core::model::ProcessId,
    owner_pid: i32,
) -> Option<Launch> {
    (l.root_pid == me.pid && l.root_start_time == me.start_time && l.state == LeaseState::Open)
        .then(|| Launch {
            report: lease_report(root, &l),
            lease_id: l.lease_id,
            gateway_id: l.gateway_instance_id,
            wrapper_path: PathBuf::from(l.wrapper_path),
            owner_pid,
            cgroup: l.cgroup_path.map(PathBuf::from),
            cgroup_id: l.cgroup_id,
            made: None,
        })
}

/// The edge: a command, the same key rule and grace range as the CLI and the daemon, the owner
/// (our parent), the environment policy and a canonical `--lease-id`, before anything is stored.
fn check_request(req: &ExecRequest) -> Result<(), ExecError> {
    let parent = nix::unistd::getppid().as_raw();
    if req.command.is_empty() {
        return Err(ExecError::NoCommand);
    }
    crate::limits::check_grace_ms("the grace", req.grace_ms)?;
    for (what, v) in [
        ("--session", &req.session_key),
        ("--agent", &req.agent_id),
        ("--owner", &req.owner_session_key),
        ("--spawned-by", &req.spawned_by),
        ("--parent", &req.parent_session_key),
    ] {
        if let Some(v) = v {
            crate::limits::check_key(what, v)?;
        }
    }
    check_owner_is(req.owner_pid, parent)?;
    req.env.validate(crate::envpolicy::CLI)?;
    if let Some(id) = &req.lease_id {
        if !is_canonical_uuid(id) {
            return Err(ExecError::BadLeaseId(id.clone()));
        }
    }
    Ok(())
}

/// A chosen lease id is unique over every row, open or settled: a gateway that records its
/// launch under this id must never find another lease's history under it. Checked before the
/// cgroup (named by the lease id) is made; two racing execs of one id are told apart by the
/// insert (primary key).
fn check_lease_id_free(store: &Store, lease_id: Option<&str>) -> Result<(), ExecError> {
    match lease_id {
        Some(id) if store.lease(id)?.is_some() => Err(ExecError::LeaseIdTaken(id.to_string())),
        _ => Ok(()),
    }
}

/// Limits are refused, before anything is made, where there is no cgroup to enforce them.
fn check_limits_enforceable(limits: &Limits, containment: &Containment) -> Result<(), ExecError> {
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

/// The process that spawned `leash exec` (our parent, the lease's owner) and its start time.
#[derive(Debug, Clone, Copy)]
pub struct Spawner {
    pub pid: i32,
    pub start_time: u64,
}

fn spawner() -> Result<Spawner, ExecError> {
    let pid = nix::unistd::getppid().as_raw();
    if pid <= 0 {
        return Err(ExecError::NoParent(pid));
    }
    Ok(Spawner {
        pid,
        start_time: proc::start_time_of(pid).unwrap_or(0),
    })
}

/// The lease this process roots: its own pid, start time and pidfs inode (the wrapper keeps them
/// across the exec), the command and its hash, the owner; open, no cgroup yet.
fn new_lease(
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

/// Where the wrapper of a lease read back from its row writes its report: the file the row names
/// ([`StateRoot::report_file`]); `run/<lease>.json` when the row's claim is refused (a report
/// nobody then reads: the lease ends `lost` rather than `ended`, and nothing is written where
/// the claim pointed).
fn lease_report(root: &StateRoot, lease: &Lease) -> PathBuf {
    root.report_file(&lease.lease_id, lease.report_dir.as_deref())
        .unwrap_or_else(|| root.report_path(&lease.lease_id))
}

/// The session row committed with the lease (its ownership, for the visibility rules).
fn session_row(req: &ExecRequest, new: &Lease) -> SessionRow {
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
fn make_cgroup(
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
fn discard_cgroup(made: Option<MadeCgroup>) {
    if let Some(m) = made {
        m.remove();
    }
}

/// Commits the lease (and its session row) in one transaction. A second exec for a session
/// whose lease is still active proceeds only if nothing of the old lease is alive; the old lease
/// is then marked lost. Decided from the old root's `stat`, its cgroup and its group, never from
/// a scan of the host (see [`supersede_reason`]). On failure the cgroup is removed again.
fn commit(
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

/// How a session's previous lease, whose processes are verifiably gone, ends as `new_lease_id`
/// takes its place: `ended` with the exit status its wrapper reported (its root is gone, so the
/// report's end record is the wrapper's last word), else `lost` for `gone` (the verdict's
/// reason).
fn superseded_by_report(
    root: &StateRoot,
    old: &Lease,
    new_lease_id: &str,
    gone: String,
) -> crate::store::Superseded {
    let report = crate::report::WrapperReport::read_for(root, old);
    match report.as_ref().and_then(|r| Some((r, r.exit_status?))) {
        Some((r, code)) => crate::store::Superseded {
            reason: format!("{}; superseded by lease {new_lease_id}", r.end_words(code)),
            exit_status: Some(code),
        },
        None => crate::store::Superseded::lost(gone),
    }
}

/// The wrapper's command line: the grace, the owner it watches, its report file, the cgroup it
/// starts the adapter in, the error format; the environment policy, then the lease markers
/// (after it, so no policy can remove them), then the adapter's command.
///
/// `fallback` is where the wrapper puts the report records its reports directory cannot take
/// (`run/<lease>.json` of the state root): a full or missing directory on tmpfs is the
/// wrapper's problem alone, and the lease's end is still known.
fn wrapper_command(req: &ExecRequest, launch: &Launch, fallback: &std::path::Path) -> Command {
    let mut cmd = Command::new(&launch.wrapper_path);
    cmd.args(wrapper_options(
        req,
        &launch.report,
        launch.owner_pid,
        launch.cgroup.as_deref(),
    ));
    if launch.report != fallback {
        cmd.arg("--report-fallback").arg(fallback);
    }
    // The scrub, on the wrapper's own exec (no `env` process): the adapter inherits what the
    // wrapper got.
    req.env.apply(&mut cmd);
    cmd.arg("--").args(&req.command);
    for (k, v) in lease_markers(&launch.lease_id, &launch.gateway_id) {
        cmd.env(k, v);
    }
    cmd
}

/// The wrapper's options, before its `--` and the adapter's command: the grace, the owner it
/// watches, its report file, the cgroup it starts the adapter in, the error format.
fn wrapper_options(
    req: &ExecRequest,
    report: &std::path::Path,
    owner_pid: i32,
    cgroup: Option<&std::path::Path>,
) -> Vec<OsString> {
    let mut args: Vec<OsString> = vec![
        "--grace-ms".into(),
        req.grace_ms.to_string().into(),
        "--owner-pid".into(),
        owner_pid.to_string().into(),
        "--report".into(),
        report.into(),
    ];
    if let Some(path) = cgroup {
        // The gateway's directory goes with its last lease (no empty `leash/<gateway id>` left
        // behind by a gateway without a daemon; `create_lease_cgroup` makes it again).
        args.extend([
            "--cgroup".into(),
            path.into(),
            "--remove-empty-parent".into(),
        ]);
    }
    if req.json_errors {
        args.extend(["--error-format".into(), "json".into()]);
    }
    args
}

/// The lease markers the adapter's environment carries, set after the environment policy (so no
/// policy can remove them).
fn lease_markers<'a>(lease_id: &'a str, gateway_id: &'a str) -> [(&'static str, &'a str); 2] {
    [(ENV_LEASE_ID, lease_id), (ENV_GATEWAY_ID, gateway_id)]
}

/// Still here: the wrapper could not be exec'd, and nothing runs under this lease. Its cgroup
/// goes and the lease is recorded lost, with the reason.
fn wrapper_exec_failed(
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The `exec` request on the wire, every field set: pinned, so a change in how the struct is
    /// declared (the ownership fields are shared with `ensure` and the stored spec) cannot move,
    /// rename or drop a field.
    #[test]
    fn the_exec_request_is_pinned_on_the_wire() {
        let ask = ExecAsk {
            state_dir: "/s".into(),
            lease_id: "01a2376c-fe0f-72d8-9e81-df0983079ff7".into(),
            lease_id_given: true,
            session: Some("k".into()),
            agent: Some("a".into()),
            owner: Some("o".into()),
            spawned_by: Some("b".into()),
            parent: Some("p".into()),
            grace_ms: 3000,
            owner_pid: Some(7),
            limits: Limits {
                memory_max: Some(1 << 20),
                ..Limits::default()
            },
            argv: vec!["/bin/true".into()],
            wrapper: "/s/wrappers/leash-wrap-1".into(),
            containment: "on".into(),
            cgroup_root: Some("/sys/fs/cgroup/x".into()),
            report_dir: Some("/dev/shm/leash-0".into()),
        };
        let json = serde_json::to_string(&ask).unwrap();
        assert_eq!(
            json,
            r#"{"stateDir":"/s","leaseId":"01a2376c-fe0f-72d8-9e81-df0983079ff7","leaseIdGiven":true,"session":"k","agent":"a","owner":"o","spawnedBy":"b","parent":"p","graceMs":3000,"ownerPid":7,"limits":{"memoryMax":1048576},"argv":["/bin/true"],"wrapper":"/s/wrappers/leash-wrap-1","containment":"on","cgroupRoot":"/sys/fs/cgroup/x","reportDir":"/dev/shm/leash-0"}"#
        );
        assert_eq!(serde_json::from_str::<ExecAsk>(&json).unwrap(), ask);
        // Left out, the optional ones read as absent.
        let bare: ExecAsk = serde_json::from_str(
            r#"{"stateDir":"/s","leaseId":"x","graceMs":1,"argv":["t"],"wrapper":"/w","containment":"off"}"#,
        )
        .unwrap();
        assert_eq!(
            (
                bare.session,
                bare.agent,
                bare.owner,
                bare.spawned_by,
                bare.parent,
                bare.report_dir
            ),
            (None, None, None, None, None, None)
        );
    }
}
