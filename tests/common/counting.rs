//! A `ProcessTable` that counts what is read through it: every process entry, and every
//! host-wide pass (`snapshot`, `scan`). Tests of host-scale costs (exec, close, reap, reconcile)
//! assert on those counts over the live table.
#![allow(dead_code)]

use leash::proc::{LiveTable, Liveness, ProcessTable};
use leash_core::model::ProcessId;
use leash_core::model::TableError;
use leash_core::model::{ProcessInfo, Snapshot};
use std::sync::atomic::{AtomicUsize, Ordering};

/// The live table, counting what is read through it.
#[derive(Default)]
pub struct Counting {
    /// Host-wide passes (`snapshot`, `scan`).
    host_scans: AtomicUsize,
    /// Process entries read, by any method.
    entries: AtomicUsize,
    /// Processes of another uid than this process's whose costly fields (exe, cmdline,
    /// environ) a host-wide `scan` read.
    others_in_full: AtomicUsize,
}

impl Counting {
    pub fn scans(&self) -> usize {
        self.host_scans.load(Ordering::SeqCst)
    }
    pub fn entries(&self) -> usize {
        self.entries.load(Ordering::SeqCst)
    }
    pub fn others_in_full(&self) -> usize {
        self.others_in_full.load(Ordering::SeqCst)
    }
    pub fn count(&self, n: usize) {
        self.entries.fetch_add(n, Ordering::SeqCst);
    }
}

impl ProcessTable for Counting {
    fn snapshot(&self) -> Result<Snapshot, TableError> {
        self.host_scans.fetch_add(1, Ordering::SeqCst);
        let s = LiveTable.snapshot()?;
        self.count(s.len());
        Ok(s)
    }
    fn scan(&self, wants: &dyn Fn(&ProcessInfo) -> bool) -> Result<Snapshot, TableError> {
        self.host_scans.fetch_add(1, Ordering::SeqCst);
        let me = nix::unistd::geteuid().as_raw();
        let s = LiveTable.scan(&|p: &ProcessInfo| {
            let w = wants(p);
            if w && p.uid != me {
                self.others_in_full.fetch_add(1, Ordering::SeqCst);
            }
            w
        })?;
        self.count(s.len());
        Ok(s)
    }
    fn process(&self, pid: i32) -> Result<Option<ProcessInfo>, TableError> {
        self.count(1);
        LiveTable.process(pid)
    }
    fn process_stat(&self, pid: i32) -> Result<Option<ProcessInfo>, TableError> {
        self.count(1);
        LiveTable.process_stat(pid)
    }
    fn subtree(&self, root: i32) -> Result<Snapshot, TableError> {
        let s = LiveTable.subtree(root)?;
        self.count(s.len().max(1));
        Ok(s)
    }
    fn liveness(&self, id: ProcessId, ino: Option<u64>) -> Result<Liveness, TableError> {
        self.count(1);
        LiveTable.liveness(id, ino)
    }
}
