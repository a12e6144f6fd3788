//! Everything leash reads about processes goes through the [`ProcessTable`] trait: the live
//! implementation reads `/proc` (via the `procfs` crate), the fixture implementation replays a
//! JSON snapshot from `fixtures/`. Verification and planning take a table as a parameter, so the
//! same code runs against the live host and against staged cases that cannot be staged live.
//!
//! Unreadable fields are normal, not errors: a process of another user hides its `exe` and
//! `environ` (`None` here), and a process that vanishes mid-read is simply not in the snapshot.

use leash_core::model::{LeaseEnv, ProcessInfo, Snapshot, TableError};
use leash_core::model::{ProcessId, ENV_GATEWAY_ID, ENV_LEASE_ID};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// One source of process facts.
pub trait ProcessTable {
    /// Every process on the host.
    fn snapshot(&self) -> Result<Snapshot, TableError>;

    /// One process, or `None` if no process has this pid.
    fn process(&self, pid: i32) -> Result<Option<ProcessInfo>, TableError>;

    /// `root` and its descendants (by parent links). Cheaper than a full snapshot on a busy host:
    /// it reads only the tree. The default filters a full snapshot.
    fn subtree(&self, root: i32) -> Result<Snapshot, TableError> {
        Ok(self.snapshot()?.subtree(root))
    }

    /// One process's `stat` fields and uid only (exe, argv, env and pidfs inode `None`): what
    /// re-checking a pinned process right before its signal needs. The default reads everything.
    fn process_stat(&self, pid: i32) -> Result<Option<ProcessInfo>, TableError> {
        self.process(pid)
    }

    /// True when the process instance is alive (a zombie counts as gone).
    fn alive(&self, id: ProcessId) -> Result<bool, TableError> {
        Ok(self.liveness(id, None)? == Liveness::Alive)
    }

    /// Whether this instance (pid, start time and, when recorded, pidfs inode) still runs, from
    /// the cheapest read there is: the live table reads `/proc/<pid>/stat` and nothing else (no
    /// exe, cmdline or environ), so `leash exec` can decide a previous lease's fate without
    /// looking at any other process. The default reads the full entry.
    fn liveness(&self, id: ProcessId, pidfs_ino: Option<u64>) -> Result<Liveness, TableError> {
        Ok(match self.process(id.pid)? {
            None => Liveness::Gone,
            Some(p) if p.start_time != id.start_time => Liveness::Gone,
            Some(p) if pidfs_ino.zip(p.pidfs_ino).is_some_and(|(a, b)| a != b) => Liveness::Gone,
            Some(p) if p.state == 'Z' => Liveness::Zombie,
            Some(_) => Liveness::Alive,
        })
    }

    /// Every process on the host, but the costly fields (exe, cmdline, environ, pidfs inode)
    /// only for those `wants` picks from their `stat` and uid; the others carry `None` there,
    /// exactly like a process whose fields are unreadable. `reap`'s one host-wide pass uses it to
    /// read `environ` only where a marker could matter. The default reads everything.
    fn scan(&self, wants: &dyn Fn(&ProcessInfo) -> bool) -> Result<Snapshot, TableError> {
        let _ = wants;
        self.snapshot()
    }

    /// What is in the cgroup directory at `path` now: its id, `populated` and `cgroup.procs`
    /// ([`crate::cgroup::observe`] on the live host; a fixture host answers from its own
    /// cgroups, so the simulator covers contained leases).
    fn cgroup(&self, path: &Path) -> leash_core::model::Observation {
        crate::cgroup::observe(path)
    }

    /// The members of a verified lease cgroup now (its `cgroup.procs`).
    fn cgroup_procs(&self, cg: &crate::cgroup::Verified) -> Vec<i32> {
        cg.procs()
    }

    /// Whether a verified lease cgroup still has members (`populated` in its `cgroup.events`).
    fn cgroup_populated(&self, cg: &crate::cgroup::Verified) -> bool {
        cg.populated()
    }
}

/// What [`ProcessTable::liveness`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Liveness {
    Alive,
    /// Exited, not yet reaped by its parent: gone for every purpose but the pid.
    Zombie,
    /// No such process, or the pid now names another one.
    Gone,
}

// ---------------------------------------------------------------------------------------------
// Live table

/// The host's `/proc`.
#[derive(Debug, Clone, Default)]
pub struct LiveTable;

impl LiveTable {
    pub fn new() -> LiveTable {
        LiveTable
    }
}

fn read_live(pid: i32) -> Result<Option<ProcessInfo>, TableError> {
    read_live_with(pid, &|_| true)
}

/// One process's `stat` and uid, plus the costly fields when `details` picks it from those;
/// all through one handle on `/proc/<pid>`.
fn read_live_with(
    pid: i32,
    details: &dyn Fn(&ProcessInfo) -> bool,
) -> Result<Option<ProcessInfo>, TableError> {
    use procfs::ProcError;
    let proc = match procfs::process::Process::new(pid) {
        Ok(p) => p,
        // "No such pid" only means something if /proc itself is there.
        Err(ProcError::NotFound(_)) if !Path::new("/proc/self/stat").exists() => {
            return Err(TableError::Unavailable("/proc is not mounted".into()))
        }
        Err(ProcError::NotFound(_)) => return Ok(None),
        Err(e) => return Err(TableError::Unavailable(format!("/proc/{pid}: {e}"))),
    };
    let stat = match proc.stat() {
        Ok(s) => s,
        // Vanished between listing and reading: not part of the snapshot.
        Err(ProcError::NotFound(_)) | Err(ProcError::Incomplete(_)) => return Ok(None),
        Err(ProcError::Io(e, _)) if e.raw_os_error() == Some(libc::ESRCH) => return Ok(None),
        Err(e) => return Err(TableError::Unavailable(format!("/proc/{pid}/stat: {e}"))),
    };
    let uid = match proc.uid() {
        Ok(u) => u,
        Err(_) => return Ok(None),
    };
    let mut info = ProcessInfo {
        pid,
        ppid: stat.ppid,
        pgid: stat.pgrp,
        sid: stat.session,
        uid,
        start_time: stat.starttime,
        state: stat.state,
        exe: None,
        argv: None,
        env: None,
        pidfs_ino: None,
    };
    if details(&info) {
        fill_details(&proc, &mut info);
    }
    Ok(Some(info))
}

/// The costly fields of one process: exe, cmdline, the lease markers in environ, pidfs inode.
fn fill_details(proc: &procfs::process::Process, info: &mut ProcessInfo) {
    let exe = proc.exe().ok().map(|p| p.to_string_lossy().into_owned());
    let argv = proc.cmdline().ok();
    // A process in the middle of execve shows an empty environ (and cmdline) for a moment, after
    // its exe already names the new program: it then simply carries no markers. That can only
    // hide a process from verification, never make a stranger look like ours.
    let env = proc.environ().ok().map(|env| {
        let get = |k: &str| {
            env.get(std::ffi::OsStr::new(k))
                .map(|v| v.to_string_lossy().into_owned())
        };
        LeaseEnv {
            lease_id: get(ENV_LEASE_ID),
            gateway_instance_id: get(ENV_GATEWAY_ID),
        }
    });
    info.exe = exe;
    info.argv = argv;
    info.env = env;
    info.pidfs_ino = crate::sys::pidfs_ino(info.pid);
}

/// Children of `pid` from `/proc/<pid>/task/<tid>/children` (per thread: a child belongs to the
/// thread that forked it). `None` when the kernel lacks the file (CONFIG_PROC_CHILDREN).
fn live_children(pid: i32) -> Option<Vec<i32>> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    let mut out = Vec::new();
    let mut any = false;
    for t in tasks.flatten() {
        if let Ok(text) = std::fs::read_to_string(t.path().join("children")) {
            any = true;
            out.extend(
                text.split_whitespace()
                    .filter_map(|s| s.parse::<i32>().ok()),
            );
        }
    }
    any.then_some(out)
}

/// The pids `/proc` lists.
fn live_pids() -> Result<Vec<i32>, TableError> {
    let entries = std::fs::read_dir("/proc")
        .map_err(|e| TableError::Unavailable(format!("cannot list /proc: {e}")))?;
    let mut pids = Vec::new();
    for entry in entries {
        let entry =
            entry.map_err(|e| TableError::Unavailable(format!("cannot list /proc: {e}")))?;
        if let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<i32>().ok())
        {
            pids.push(pid);
        }
    }
    Ok(pids)
}

impl ProcessTable for LiveTable {
    fn liveness(&self, id: ProcessId, pidfs_ino: Option<u64>) -> Result<Liveness, TableError> {
        if id.pid <= 0 {
            return Ok(Liveness::Gone);
        }
        let Some((start, state)) = stat_start_and_state(id.pid) else {
            if !Path::new("/proc/self/stat").exists() {
                return Err(TableError::Unavailable("/proc is not mounted".into()));
            }
            return Ok(Liveness::Gone);
        };
        if start != id.start_time {
            return Ok(Liveness::Gone);
        }
        // The pidfs inode is read only when the lease recorded one to compare with.
        if let Some(want) = pidfs_ino {
            if crate::sys::pidfs_ino(id.pid).is_some_and(|got| got != want) {
                return Ok(Liveness::Gone);
            }
        }
        Ok(if state == 'Z' {
            Liveness::Zombie
        } else {
            Liveness::Alive
        })
    }

    fn scan(&self, wants: &dyn Fn(&ProcessInfo) -> bool) -> Result<Snapshot, TableError> {
        let mut list = Vec::new();
        for pid in live_pids()? {
            list.extend(read_live_with(pid, wants)?);
        }
        if list.is_empty() {
            return Err(TableError::Unavailable(
                "/proc lists no processes (is procfs mounted?)".into(),
            ));
        }
        Ok(Snapshot::new(list))
    }

    fn snapshot(&self) -> Result<Snapshot, TableError> {
        self.scan(&|_| true)
    }

    fn process(&self, pid: i32) -> Result<Option<ProcessInfo>, TableError> {
        if pid <= 0 {
            return Ok(None);
        }
        read_live(pid)
    }

    fn process_stat(&self, pid: i32) -> Result<Option<ProcessInfo>, TableError> {
        if pid <= 0 {
            return Ok(None);
        }
        read_live_with(pid, &|_| false)
    }

    fn subtree(&self, root: i32) -> Result<Snapshot, TableError> {
        let mut out = Vec::new();
        let mut stack = vec![(root, None::<i32>)];
        // Pids recycled between two reads can make the links a cycle: never visit a pid twice.
        let mut seen = std::collections::HashSet::new();
        while let Some((pid, parent)) = stack.pop() {
            if !seen.insert(pid) {
                continue;
            }
            let Some(p) = read_live(pid)? else { continue };
            // A pid listed under `parent` that has since been recycled is not a descendant.
            if parent.is_some_and(|pp| pp != p.ppid) {
                continue;
            }
            let Some(kids) = live_children(pid) else {
                // No children files on this kernel: fall back to a full scan.
                return Ok(self.snapshot()?.subtree(root));
            };
            stack.extend(kids.into_iter().map(|k| (k, Some(pid))));
            out.push(p);
        }
        Ok(Snapshot::new(out))
    }
}

/// Reads only field 22 of `/proc/<pid>/stat`, for the hot path of `leash exec` (a full
/// [`ProcessInfo`] also reads exe, cmdline and environ).
pub fn start_time_of(pid: i32) -> Option<u64> {
    stat_start_and_state(pid).map(|(start, _)| start)
}

pub use crate::sys::read_proc;

/// [`read_proc`] as text (`None`: unreadable or not UTF-8).
fn read_proc_text(path: impl AsRef<Path>) -> Option<String> {
    String::from_utf8(read_proc(path).ok()?).ok()
}

/// Fields 22 (start time) and 3 (state) of `/proc/<pid>/stat`, and nothing else.
fn stat_start_and_state(pid: i32) -> Option<(u64, char)> {
    let text = read_proc_text(format!("/proc/{pid}/stat"))?;
    // The command name may contain spaces and parentheses: split after the LAST ')'.
    let rest = &text[text.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let start = fields.nth(18)?.parse().ok()?;
    Some((start, state))
}

/// Fields 4 (the parent's pid) and 22 (start time) of `/proc/<pid>/stat`.
pub fn parent_and_start_of(pid: i32) -> Option<(i32, u64)> {
    let text = read_proc_text(format!("/proc/{pid}/stat"))?;
    let rest = &text[text.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    let ppid = fields.nth(1)?.parse().ok()?;
    let start = fields.nth(17)?.parse().ok()?;
    Some((ppid, start))
}

/// The pidfs inode of the process at the other end of a connected Unix socket (see
/// `sys::peer_pidfs_ino`).
pub fn peer_pidfs_ino(sock: std::os::fd::BorrowedFd<'_>) -> Option<u64> {
    crate::sys::peer_pidfs_ino(sock)
}

/// The pidfs inode of a process (see [`ProcessInfo::pidfs_ino`]).
pub fn pidfs_ino_of(pid: i32) -> Option<u64> {
    crate::sys::pidfs_ino(pid)
}

/// The calling process as an instance (its start time never changes across exec).
pub fn self_id() -> ProcessId {
    let pid = std::process::id() as i32;
    ProcessId {
        pid,
        start_time: start_time_of(pid).unwrap_or(0),
    }
}

// ---------------------------------------------------------------------------------------------
// Fixture table

/// A process table replayed from a JSON snapshot: `{"processes": [...]}`, or
/// `{"unavailable": "why"}` to stage a host whose `/proc` cannot be read.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FixtureTable {
    #[serde(default)]
    pub processes: Vec<ProcessInfo>,
    #[serde(default)]
    pub unavailable: Option<String>,
}

impl FixtureTable {
    pub fn from_json(text: &str) -> Result<FixtureTable, serde_json::Error> {
        serde_json::from_str(text)
    }

    pub fn load(path: &Path) -> Result<FixtureTable, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read fixture {}: {e}", path.display()))?;
        Self::from_json(&text).map_err(|e| format!("fixture {}: {e}", path.display()))
    }
}

impl ProcessTable for FixtureTable {
    fn snapshot(&self) -> Result<Snapshot, TableError> {
        if let Some(why) = &self.unavailable {
            return Err(TableError::Unavailable(why.clone()));
        }
        Ok(Snapshot::new(self.processes.iter().cloned()))
    }

    fn process(&self, pid: i32) -> Result<Option<ProcessInfo>, TableError> {
        if let Some(why) = &self.unavailable {
            return Err(TableError::Unavailable(why.clone()));
        }
        Ok(self.processes.iter().find(|p| p.pid == pid).cloned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn live_table_sees_this_process_and_its_markers_absent() {
        let me = std::process::id() as i32;
        let p = LiveTable.process(me).unwrap().expect("self is alive");
        assert_eq!(p.pid, me);
        assert!(p.start_time > 0);
        assert!(p.exe.is_some());
        assert!(p.argv.as_ref().is_some_and(|a| !a.is_empty()));
        assert_eq!(self_id().start_time, p.start_time);
        let snap = LiveTable.snapshot().unwrap();
        assert!(snap.get(me).is_some());
        assert!(snap.get(1).is_some());
    }

    #[test]
    fn live_subtree_finds_a_child() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let me = std::process::id() as i32;
        let sub = LiveTable.subtree(me).unwrap();
        let found = sub.get(child.id() as i32).is_some();
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(found);
    }

    #[test]
    fn missing_pid_is_none_not_error() {
        assert_eq!(LiveTable.process(i32::MAX).unwrap(), None);
        assert_eq!(LiveTable.process(0).unwrap(), None);
    }

    #[test]
    fn fixture_unavailable_is_an_error() {
        let t = FixtureTable::from_json(r#"{"unavailable":"proc not mounted"}"#).unwrap();
        assert!(t.snapshot().is_err());
        assert!(t.process(1).is_err());
    }

    #[test]
    fn a_cycle_in_the_parent_links_ends_the_subtree_walk() {
        // 10 names 11 as its parent and 11 names 10: without a visited set the walk never ends.
        let t = FixtureTable::from_json(
            r#"{"processes":[
            {"pid":10,"ppid":11,"pgid":10,"sid":10,"uid":0,"startTime":5},
            {"pid":11,"ppid":10,"pgid":10,"sid":10,"uid":0,"startTime":6}]}"#,
        )
        .unwrap();
        let mut pids: Vec<i32> = t.subtree(10).unwrap().iter().map(|p| p.pid).collect();
        pids.sort();
        assert_eq!(pids, vec![10, 11]);
    }

    #[test]
    fn liveness_reads_the_instance_from_stat() {
        let me = self_id();
        assert_eq!(LiveTable.liveness(me, None).unwrap(), Liveness::Alive);
        let ino = pidfs_ino_of(me.pid);
        assert_eq!(LiveTable.liveness(me, ino).unwrap(), Liveness::Alive);
        let older = ProcessId {
            pid: me.pid,
            start_time: me.start_time + 1,
        };
        assert_eq!(LiveTable.liveness(older, None).unwrap(), Liveness::Gone);
        if let Some(ino) = ino {
            assert_eq!(
                LiveTable.liveness(me, Some(ino + 1)).unwrap(),
                Liveness::Gone,
                "another pidfs inode is another process"
            );
        }
        let none = ProcessId {
            pid: i32::MAX,
            start_time: 1,
        };
        assert_eq!(LiveTable.liveness(none, None).unwrap(), Liveness::Gone);
    }

    #[test]
    fn a_scan_reads_details_only_where_asked() {
        let me = std::process::id() as i32;
        let snap = LiveTable.scan(&|p| p.pid == me).unwrap();
        assert!(snap.get(me).unwrap().exe.is_some());
        let init = snap.get(1).expect("pid 1 is listed");
        assert!(init.exe.is_none() && init.env.is_none() && init.argv.is_none());
    }

    #[test]
    fn fixture_subtree_follows_ppid() {
        let t = FixtureTable::from_json(
            r#"{"processes":[
            {"pid":10,"ppid":1,"pgid":10,"sid":10,"uid":0,"startTime":5},
            {"pid":11,"ppid":10,"pgid":11,"sid":10,"uid":0,"startTime":6},
            {"pid":12,"ppid":11,"pgid":11,"sid":10,"uid":0,"startTime":7},
            {"pid":13,"ppid":1,"pgid":13,"sid":13,"uid":0,"startTime":8}]}"#,
        )
        .unwrap();
        let s = t.subtree(10).unwrap();
        let mut pids: Vec<i32> = s.iter().map(|p| p.pid).collect();
        pids.sort();
        assert_eq!(pids, vec![10, 11, 12]);
    }
}
