//! What `leash exec` is asked and how it fails: the [`ExecRequest`], the [`ExecError`] with its
//! kind and its words ([`cli_message`]), and the checks at the edge, before anything is stored
//! (the command, the keys, the grace, the owner, the environment policy, a canonical
//! `--lease-id`).

use crate::cgroup::{CgroupError, Limits, Settings};
use crate::install::InstallError;
use crate::proc;
use crate::state::StateError;
use crate::store::StoreError;
use leash_core::kind::{HasKind, Kind};
use std::ffi::OsString;
use std::path::PathBuf;

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
    BadInput(#[from] leash_core::limits::ValueError),
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

/// The edge: a command, the same key rule and grace range as the CLI and the daemon, the owner
/// (our parent), the environment policy and a canonical `--lease-id`, before anything is stored.
pub(super) fn check_request(req: &ExecRequest) -> Result<(), ExecError> {
    if req.command.is_empty() {
        return Err(ExecError::NoCommand);
    }
    leash_core::limits::check_grace_ms("the grace", req.grace_ms)?;
    for (what, v) in [
        ("--session", &req.session_key),
        ("--agent", &req.agent_id),
        ("--owner", &req.owner_session_key),
        ("--spawned-by", &req.spawned_by),
        ("--parent", &req.parent_session_key),
    ] {
        if let Some(v) = v {
            leash_core::limits::check_key(what, v)?;
        }
    }
    check_owner(req.owner_pid)?;
    req.env.validate(crate::envpolicy::CLI)?;
    if let Some(id) = &req.lease_id {
        if !is_canonical_uuid(id) {
            return Err(ExecError::BadLeaseId(id.clone()));
        }
    }
    Ok(())
}
