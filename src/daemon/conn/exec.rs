//! `exec`: the lease of a `leash exec` process, committed on the daemon's warm connection.
//! The lease's root is the socket's peer as the kernel recorded it (`SO_PEERCRED`
//! and `SO_PEERPIDFD`), never a pid from the request; its owner is that process's parent, read
//! from `/proc`; the decision is `leash exec`'s own ([`decide_and_commit`]), with its errors and
//! messages. Settings this daemon did not resolve are answered [`ExecAnswer::Direct`]: the
//! client commits the lease itself, as without a daemon.

use super::cx::*;
use crate::controller::exec::{
    check_owner_is, cli_message, decide_and_commit, ExecAnswer, ExecAsk, ExecError, ExecRequest,
    Origin, Spawner,
};
use leash_core::model::ProcessId;

/// The lease's root and owner: the peer, proven to be the process that connected.
fn peer_origin(peer: &Peer) -> Result<Origin, String> {
    let Some(ino) = peer.pidfs_ino else {
        return Err(
            "this kernel does not name the peer by a pidfd (SO_PEERPIDFD, pidfs: Linux >= 6.9)"
                .into(),
        );
    };
    let (ppid, start_time) = crate::proc::parent_and_start_of(peer.pid)
        .ok_or_else(|| format!("the peer pid {} is gone", peer.pid))?;
    // Read after the read: the pid still names the process that connected, so it was its.
    if crate::proc::pidfs_ino_of(peer.pid) != Some(ino) {
        return Err(format!(
            "the peer pid {} now names another process",
            peer.pid
        ));
    }
    if ppid <= 0 {
        return Err(ExecError::NoParent(ppid).to_string());
    }
    let origin = Origin {
        root: ProcessId {
            pid: peer.pid,
            start_time,
        },
        root_pidfs_ino: Some(ino),
        owner: Spawner {
            pid: ppid,
            start_time: crate::proc::start_time_of(ppid).unwrap_or(0),
        },
    };
    Ok(origin)
}

/// Whether the process of `proc` sees the mounts this one sees (the same mount namespace and
/// root): then a path the peer names (its reports directory) is the same file for the daemon.
fn same_mounts(proc: &std::path::Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    use std::path::Path;
    static OWN: std::sync::OnceLock<Option<(u64, u64)>> = std::sync::OnceLock::new();
    let ns = |p: &Path| {
        std::fs::metadata(p.join("ns/mnt"))
            .ok()
            .map(|m| (m.dev(), m.ino()))
    };
    let own = *OWN.get_or_init(|| ns(Path::new("/proc/self")));
    own.is_some()
        && ns(proc) == own
        && std::fs::read_link(proc.join("root")).is_ok_and(|r| r == Path::new("/"))
}

/// Why this daemon cannot commit the lease the way `leash exec` would (`None`: it can).
fn cannot_honour(d: &Daemon, ask: &ExecAsk) -> Option<String> {
    if d.is_shutting_down() {
        return Some("the daemon is shutting down".into());
    }
    if ask.state_dir != d.root.dir() {
        return Some(format!(
            "the daemon serves state root {}, not {}",
            d.root.dir().display(),
            ask.state_dir.display()
        ));
    }
    if ask.containment != d.containment.mode || ask.cgroup_root != d.containment.root {
        return Some(format!(
            "the client asked for {}; the daemon resolved {}",
            crate::cgroup::describe(&ask.containment, ask.cgroup_root.as_deref()),
            crate::cgroup::describe(&d.containment.mode, d.containment.root.as_deref())
        ));
    }
    // The client's reports directory: recorded in the row only when it is a private directory
    // of this user (the client made it so; one that is not now is not trusted for a lease).
    if let Some(dir) = &ask.report_dir {
        if !crate::state::reports_dir_usable(dir) {
            return Some(format!(
                "the reports directory {} is not a private directory of this user",
                dir.display()
            ));
        }
    }
    // The wrapper the client installed: a regular file directly under this root's wrapper root.
    let in_root = ask.wrapper.parent() == Some(d.root.wrapper_root().as_path())
        && ask
            .wrapper
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("leash-wrap-"))
        && std::fs::symlink_metadata(&ask.wrapper).is_ok_and(|m| m.file_type().is_file());
    if !in_root {
        return Some(format!(
            "the wrapper {} is not one installed under {}",
            ask.wrapper.display(),
            d.root.wrapper_root().display()
        ));
    }
    None
}

fn exec(d: &Daemon, peer: &Peer, ask: ExecAsk) -> Reply<ExecAnswer> {
    let direct = |why: String| -> Reply<ExecAnswer> {
        tracing::debug!(%why, "exec: the client commits directly");
        Ok(ExecAnswer::Direct { why })
    };
    if let Some(why) = cannot_honour(d, &ask) {
        return direct(why);
    }
    let origin = match peer_origin(peer) {
        Ok(o) => o,
        Err(why) => return direct(why),
    };
    // The client's reports directory is a path in the client's mounts: the daemon and every
    // reader of the lease must see the same directory under it (a unit's private `/dev/shm`
    // would not be).
    if ask.report_dir.is_some()
        && !same_mounts(std::path::Path::new(&format!("/proc/{}", peer.pid)))
    {
        return direct(
            "the client sees other mounts than the daemon, so its reports directory may not be \
             the daemon's"
                .into(),
        );
    }
    let refuse = |e: ExecError| fail(Code::of(e.kind()), cli_message(&e));
    check_owner_is(ask.owner_pid, origin.owner.pid).map_err(refuse)?;
    let req = ExecRequest {
        session_key: ask.session,
        agent_id: ask.agent,
        owner_session_key: ask.owner,
        spawned_by: ask.spawned_by,
        parent_session_key: ask.parent,
        grace_ms: ask.grace_ms,
        owner_pid: ask.owner_pid,
        lease_id: ask.lease_id_given.then(|| ask.lease_id.clone()),
        limits: ask.limits,
        command: ask.argv.into_iter().map(Into::into).collect(),
        report_dir: ask.report_dir,
        ..ExecRequest::default()
    };
    let wrapper = ask.wrapper;
    test_pause("before");
    let mut store = d.exec_store();
    let (lease, made) = decide_and_commit(
        &mut store,
        &d.root,
        &req,
        &origin,
        Some(&ask.lease_id),
        || Ok(wrapper),
        |_| d.containment.clone(),
    )
    .map_err(refuse)?;
    drop(store);
    d.checkpoints.committed();
    // The cgroup stays: the client's wrapper starts the adapter in it.
    drop(made);
    test_pause("after");
    tracing::debug!(lease_id = %lease.lease_id, root_pid = lease.root_pid, "exec: lease committed for the peer");
    Ok(ExecAnswer::Committed {
        lease_id: lease.lease_id,
        gateway_id: lease.gateway_instance_id,
        root_pid: lease.root_pid,
        root_start_time: lease.root_start_time,
        wrapper_path: lease.wrapper_path.into(),
        cgroup_path: lease.cgroup_path.map(Into::into),
        cgroup_id: lease.cgroup_id,
    })
}

/// Tests only: [`ENV_TEST_PAUSE`] `before:MS` or `after:MS` holds the op that long before the
/// commit, or between the commit and the answer, so a test can kill the daemon exactly there.
fn test_pause(at: &str) {
    static PAUSE: std::sync::OnceLock<Option<(String, u64)>> = std::sync::OnceLock::new();
    let pause = PAUSE.get_or_init(|| {
        let v = std::env::var(ENV_TEST_PAUSE).ok()?;
        let (at, ms) = v.split_once(':')?;
        Some((at.to_string(), ms.parse().ok()?))
    });
    if let Some((when, ms)) = pause {
        if when == at {
            tracing::info!(at, ms, "exec: pausing ({ENV_TEST_PAUSE})");
            std::thread::sleep(Duration::from_millis(*ms));
        }
    }
}

/// See [`test_pause`].
pub const ENV_TEST_PAUSE: &str = "LEASH_TEST_EXEC_PAUSE";

impl Handles<Box<ExecAsk>> for Cx<'_> {
    type Done = Timed;

    fn handle(self, ask: Box<ExecAsk>) -> Timed {
        let r = exec(self.d, self.peer, *ask);
        self.answer::<Box<ExecAsk>>(r)
    }
}
