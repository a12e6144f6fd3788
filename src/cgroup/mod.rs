//! Containment: one cgroup v2 directory per lease, so that no process a lease started can leave
//! it. A process cannot move itself out of its cgroup without write access to the hierarchy, and
//! `cgroup.kill` takes every member at once, whoever its parent is and whatever its environment
//! says; that closes the one gap pids, groups and markers leave (a double-forked, `setsid`,
//! `env -i`, TERM-ignoring descendant of a SIGKILLed wrapper).
//!
//! Layout: `<leash cgroup root>/<gateway id>/<lease id>`. The leash cgroup root comes from
//! `--cgroup-root` / `LEASH_CGROUP_ROOT`, else from the caller's own cgroup (`/proc/self/cgroup`,
//! a delegated subtree under systemd `Delegate=yes`; the daemon's own leaf [`DAEMON_LEAF`] is
//! stripped so the daemon and the `leash exec` it spawns agree); a caller in the root cgroup uses
//! `<mount>/leash`. The cgroup2 mount is found in `/proc/self/mountinfo` (hybrid hosts mount it
//! at `/sys/fs/cgroup/unified`).
//!
//! This module is the only place in the library that writes to cgroupfs. Every write that acts
//! on a lease's cgroup goes through a [`Verified`] handle: the directory opened without following
//! symlinks, and its inode (the cgroup id) compared with the one recorded in the lease. Files in
//! it are then reached through `/proc/self/fd/<fd>/…`, so a directory removed and recreated under
//! the same name after the check is never the one written to.
//!
//! The module is split by concern: [`root`] resolves where leash's cgroups live (the cgroup2
//! mount, the leash root, the daemon's leaf), [`lifecycle`] makes and removes a lease's cgroup
//! (and holds the [`Verified`] handle), [`observe`] reads a cgroup's members, `populated` and
//! usage, and [`limits`] parses and applies the per-session limits.

use leash_core::kind::{HasKind, Kind};
use std::fs::OpenOptions;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

mod lifecycle;
mod limits;
mod observe;
mod root;

pub use lifecycle::{
    create_lease_cgroup, hold_gateway_dir, release_gateway_dir, remove_gateway_dir_if_empty,
    Verified,
};
pub use limits::{enable_controllers, parse_cpu_max, parse_size, Limits};
pub use observe::{children, observe, Usage};
pub use root::{
    cgroup2_mount, default_root, describe, move_self_to_leaf, own_cgroup, Containment, Requested,
    Settings, DAEMON_LEAF, ENV_CGROUP_ROOT, ENV_CONTAINMENT,
};

#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error("cannot create cgroup {path}: {source} (turn containment off with --containment off or LEASH_CONTAINMENT=off)")]
    Create { path: PathBuf, source: io::Error },
    #[error("cgroup {path} is not the lease's: {reason}; nothing written to it")]
    NotVerified { path: PathBuf, reason: String },
    #[error("cannot {what} cgroup {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        source: io::Error,
    },
    #[error("cgroup {path} still has members {waited_ms} ms after cgroup.kill")]
    Stuck { path: PathBuf, waited_ms: u128 },
    #[error("the {controller} controller is not enabled for the session cgroups under {root}, so {limit} cannot be applied (nothing started). Enable it for leash's subtree: under systemd run leash in a unit with Delegate=yes (or Delegate={controller} and DelegateSubgroup=), so that the controller is listed in {root}/cgroup.subtree_control")]
    ControllerMissing {
        controller: &'static str,
        limit: &'static str,
        root: PathBuf,
    },
    #[error("containment is {mode} ({reason}), so --{limit} cannot be applied; nothing started")]
    LimitWithoutContainment {
        mode: &'static str,
        reason: String,
        limit: &'static str,
    },
    #[error("invalid {flag} '{value}': {why}")]
    BadLimit {
        flag: &'static str,
        value: String,
        why: &'static str,
    },
}

impl HasKind for CgroupError {
    /// A limit asked for without containment, or one the kernel does not take, is bad usage; a
    /// cgroup that is not the lease's is unverified; the rest is the machine's.
    fn kind(&self) -> Kind {
        match self {
            CgroupError::LimitWithoutContainment { .. } | CgroupError::BadLimit { .. } => {
                Kind::Usage
            }
            CgroupError::NotVerified { .. } => Kind::Unverified,
            _ => Kind::Internal,
        }
    }
}

pub(crate) fn write_file(path: &Path, value: &str) -> io::Result<()> {
    // O_TRUNC as a shell's `>` does: cgroupfs ignores it, a regular file needs it.
    let mut f = OpenOptions::new().write(true).truncate(true).open(path)?;
    f.write_all(value.as_bytes())
}
