//! What the files of `cgroup/` share, below all of them: the error, opening a cgroup directory
//! without following symlinks, naming a file in a directory held open, writing a file.

use leash_core::kind::{HasKind, Kind};
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

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

pub(super) fn write_file(path: &Path, value: &str) -> io::Result<()> {
    // O_TRUNC as a shell's `>` does: cgroupfs ignores it, a regular file needs it.
    let mut f = OpenOptions::new().write(true).truncate(true).open(path)?;
    f.write_all(value.as_bytes())
}

pub(super) fn open_dir(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
}

/// A file in the directory held open by `dir` (the magic link pins the very directory).
pub(super) fn at(dir: &File, name: &str) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{}/{name}", dir.as_raw_fd()))
}
