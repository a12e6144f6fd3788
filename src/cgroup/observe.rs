//! Reading a cgroup: its members (`cgroup.procs`), whether it is populated (`cgroup.events`),
//! its id, its usage (`cpu.stat`, `memory.current`), and the lease cgroups under a gateway.

use super::files::{at, open_dir};
use super::lifecycle::Verified;
use leash_core::model::Observation;
use serde::{Deserialize, Serialize};
use std::fs::{self, File};
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::{Duration, Instant};

/// Reads a cgroup directory without following symlinks. Never fails: absence and read errors
/// are part of the observation.
pub fn observe(path: &Path) -> Observation {
    let mut o = Observation {
        path: path.to_path_buf(),
        ..Observation::default()
    };
    let dir = match open_dir(path) {
        Ok(d) => d,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return o,
        Err(e) => {
            o.error = Some(e.to_string());
            return o;
        }
    };
    match dir.metadata() {
        Ok(m) => o.id = Some(m.ino()),
        Err(e) => {
            o.error = Some(e.to_string());
            return o;
        }
    }
    match read_procs(&dir) {
        Ok(p) => o.procs = p,
        Err(e) => o.error = Some(format!("cgroup.procs: {e}")),
    }
    o.populated = populated(&dir).unwrap_or(!o.procs.is_empty());
    o
}

fn read_procs(dir: &File) -> io::Result<Vec<i32>> {
    let text = fs::read_to_string(at(dir, "cgroup.procs"))?;
    Ok(text
        .split_whitespace()
        .filter_map(|s| s.parse().ok())
        .filter(|&p: &i32| p > 0)
        .collect())
}

fn populated(dir: &File) -> Option<bool> {
    let text = fs::read_to_string(at(dir, "cgroup.events")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("populated "))
        .map(|v| v.trim() == "1")
}

/// Totals read from a cgroup (`cpu.stat`, `memory.current`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Usage {
    pub cpu_usec: Option<u64>,
    /// `None` where the memory controller is not enabled for the cgroup.
    pub memory_bytes: Option<u64>,
}

fn usage_of(dir: &File) -> Usage {
    let cpu_usec = fs::read_to_string(at(dir, "cpu.stat")).ok().and_then(|t| {
        t.lines()
            .find_map(|l| l.strip_prefix("usage_usec "))
            .and_then(|v| v.trim().parse().ok())
    });
    let memory_bytes = fs::read_to_string(at(dir, "memory.current"))
        .ok()
        .and_then(|t| t.trim().parse().ok());
    Usage {
        cpu_usec,
        memory_bytes,
    }
}

/// The directories directly under a gateway's cgroup directory: (name, id).
pub fn children(gateway_root: &Path) -> Vec<(String, u64)> {
    let Ok(rd) = fs::read_dir(gateway_root) else {
        return Vec::new();
    };
    let mut out: Vec<(String, u64)> = rd
        .flatten()
        .filter_map(|e| {
            let meta = e.metadata().ok()?; // does not follow symlinks
            if !meta.is_dir() {
                return None;
            }
            Some((e.file_name().to_str()?.to_string(), meta.ino()))
        })
        .collect();
    out.sort();
    out
}

impl Verified {
    pub fn procs(&self) -> Vec<i32> {
        read_procs(&self.dir).unwrap_or_default()
    }

    pub fn populated(&self) -> bool {
        populated(&self.dir).unwrap_or_else(|| !self.procs().is_empty())
    }
    /// Polls `cgroup.events` until `populated 0` or the deadline.
    pub fn wait_empty(&self, deadline: Instant) -> bool {
        loop {
            if !self.populated() {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// CPU time and memory of the whole cgroup.
    pub fn usage(&self) -> Usage {
        usage_of(&self.dir)
    }
}
