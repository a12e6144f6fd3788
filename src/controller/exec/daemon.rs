//! The daemon path of `leash exec`: the [`ExecDaemon`] the front door passes in, the `exec`
//! request ([`ExecAsk`], its ownership fields shared with `ensure` through
//! [`with_ownership_fields!`]) and the answer ([`ExecAnswer`]), and what this process does with
//! each answer (exec the wrapper of the lease the daemon committed, commit directly, or look the
//! lease up when the answer was lost).

use super::commit::check_limits_enforceable;
use super::launch::{lease_report, Launch};
use super::request::{ExecError, ExecRequest};
use crate::cgroup::{Containment, Limits};
use crate::install::install_wrapper;
use crate::lease;
use crate::proc;
use crate::state::StateRoot;
use crate::store::Store;
use leash_core::kind::Kind;
use leash_core::model::{Lease, LeaseState};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

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
pub(super) fn through_daemon(
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
pub(super) fn after_lost_answer(
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
pub(super) fn rooted_here(
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
