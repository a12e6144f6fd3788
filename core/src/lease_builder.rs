//! One way to write down a [`Lease`] for a test, a benchmark or a fuzz target: start from
//! [`Lease::builder`] (a lease id and a gateway) and name only the fields the case is about; the
//! rest take the plain values below, and the command's hash is always the hash of its command.
//! The store, `exec` and the wire build their leases from what they read and decide, not from
//! here.
//!
//! The values a field takes unless set: session `s`, no agent, the wrapper `/w/leash-wrap` under
//! `/w`, the root pid 100 started at tick 1000, no pidfs inode, no process group and no adapter
//! yet, the command `adapter`, the owner pid 50 started at tick 10, started at 0 with a grace of
//! 100 ms, `open`, no cgroup, no report directory, and nothing of a lease that has ended
//! (reason, close time, exit status, claimant).

use crate::model::{command_hash, Lease, LeaseState};

/// A [`Lease`] being written down; [`LeaseBuilder::build`] gives it.
#[derive(Debug, Clone)]
#[must_use]
pub struct LeaseBuilder(Lease);

impl Lease {
    /// A lease of `gateway_instance_id` with the id `lease_id` and the values of
    /// [`crate::lease_builder`]'s table for everything else.
    pub fn builder(
        lease_id: impl Into<String>,
        gateway_instance_id: impl Into<String>,
    ) -> LeaseBuilder {
        let command = vec!["adapter".to_string()];
        LeaseBuilder(Lease {
            lease_id: lease_id.into(),
            gateway_instance_id: gateway_instance_id.into(),
            session_key: "s".into(),
            agent_id: None,
            wrapper_root: "/w".into(),
            wrapper_path: "/w/leash-wrap".into(),
            root_pid: 100,
            root_start_time: 1000,
            root_pidfs_ino: None,
            cgroup_path: None,
            cgroup_id: None,
            report_dir: None,
            process_group_id: None,
            adapter_pid: None,
            adapter_start_time: None,
            command_hash: command_hash(&command),
            command,
            owner_pid: 50,
            owner_start_time: 10,
            started_at: 0,
            grace_ms: 100,
            state: LeaseState::Open,
            state_reason: None,
            closed_at: None,
            exit_status: None,
            claimed_by: None,
        })
    }
}

impl LeaseBuilder {
    pub fn session(mut self, key: impl Into<String>) -> Self {
        self.0.session_key = key.into();
        self
    }

    pub fn agent(mut self, agent_id: impl Into<String>) -> Self {
        self.0.agent_id = Some(agent_id.into());
        self
    }

    /// The directory the wrapper lies in and the wrapper binary itself.
    pub fn wrapper(mut self, root: impl Into<String>, path: impl Into<String>) -> Self {
        self.0.wrapper_root = root.into();
        self.0.wrapper_path = path.into();
        self
    }

    /// The wrapper's pid and start time.
    pub fn root(mut self, pid: i32, start_time: u64) -> Self {
        self.0.root_pid = pid;
        self.0.root_start_time = start_time;
        self
    }

    pub fn root_pidfs_ino(mut self, ino: impl Into<Option<u64>>) -> Self {
        self.0.root_pidfs_ino = ino.into();
        self
    }

    /// The adapter's process group, as the wrapper reported it.
    pub fn process_group(mut self, pgid: impl Into<Option<i32>>) -> Self {
        self.0.process_group_id = pgid.into();
        self
    }

    /// The adapter's pid and start time, as the wrapper reported them.
    pub fn adapter(mut self, pid_and_start: impl Into<Option<(i32, u64)>>) -> Self {
        let adapter = pid_and_start.into();
        self.0.adapter_pid = adapter.map(|a| a.0);
        self.0.adapter_start_time = adapter.map(|a| a.1);
        self
    }

    /// The adapter's argv, and with it its [`command_hash`].
    pub fn command<S: Into<String>>(mut self, argv: impl IntoIterator<Item = S>) -> Self {
        self.0.command = argv.into_iter().map(Into::into).collect();
        self.0.command_hash = command_hash(&self.0.command);
        self
    }

    /// The process the wrapper treats as its parent: pid and start time.
    pub fn owner(mut self, pid: i32, start_time: u64) -> Self {
        self.0.owner_pid = pid;
        self.0.owner_start_time = start_time;
        self
    }

    /// Unix time in milliseconds.
    pub fn started_at(mut self, ms: i64) -> Self {
        self.0.started_at = ms;
        self
    }

    pub fn grace_ms(mut self, ms: u64) -> Self {
        self.0.grace_ms = ms;
        self
    }

    pub fn state(mut self, state: LeaseState) -> Self {
        self.0.state = state;
        self
    }

    /// Unix time in milliseconds.
    pub fn closed_at(mut self, ms: impl Into<Option<i64>>) -> Self {
        self.0.closed_at = ms.into();
        self
    }

    /// The lease's cgroup: its path and its id (the directory's inode).
    pub fn cgroup(mut self, path_and_id: impl Into<Option<(String, u64)>>) -> Self {
        let cgroup = path_and_id.into();
        self.0.cgroup_id = cgroup.as_ref().map(|c| c.1);
        self.0.cgroup_path = cgroup.map(|c| c.0);
        self
    }

    pub fn build(self) -> Lease {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hash_follows_the_command() {
        let l = Lease::builder("L", "G").command(["a", "b c"]).build();
        assert_eq!(l.command, ["a", "b c"]);
        assert_eq!(l.command_hash, command_hash(&["a", "b c"]));
        assert_eq!(
            Lease::builder("L", "G").build().command_hash,
            command_hash(&["adapter"])
        );
    }

    #[test]
    fn optional_evidence_is_set_and_cleared_as_a_whole() {
        let l = Lease::builder("L", "G")
            .adapter((101, 1001))
            .cgroup(("/cg/L".to_string(), 7))
            .build();
        assert_eq!(
            (l.adapter_pid, l.adapter_start_time),
            (Some(101), Some(1001))
        );
        assert_eq!(
            (l.cgroup_path.as_deref(), l.cgroup_id),
            (Some("/cg/L"), Some(7))
        );
        let l = Lease::builder("L", "G").adapter(None).cgroup(None).build();
        assert_eq!((l.adapter_pid, l.adapter_start_time), (None, None));
        assert_eq!((l.cgroup_path, l.cgroup_id), (None, None));
    }
}
