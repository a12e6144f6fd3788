//! A lease's cgroup from birth to removal: made under the gateway's directory, opened and
//! proven to be the recorded one ([`Verified`]), removed with the cgroups an adapter nested in it.

use super::files::{at, open_dir, write_file, CgroupError};
use std::fs::{self, File};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};

/// Creates the cgroup of a new lease, `<gateway_root>/<lease_id>`, and returns its path and id
/// (the directory's inode). The gateway's directory is created on first use.
pub fn create_lease_cgroup(
    gateway_root: &Path,
    lease_id: &str,
) -> Result<(PathBuf, u64), CgroupError> {
    let path = gateway_root.join(lease_id);
    let create_err = |p: &Path, source| CgroupError::Create {
        path: p.to_path_buf(),
        source,
    };
    // First lease of this gateway (or of the root): make the directories above it. A daemon that
    // stops removes the gateway's directory when it is empty (`remove_gateway_dir_if_empty`), so
    // it can vanish between our mkdir of it and of the lease's: try again, a bounded number of
    // times.
    let mut attempts = 0;
    loop {
        match fs::DirBuilder::new().mode(0o755).create(&path) {
            Ok(()) => break,
            Err(e) if e.kind() == io::ErrorKind::NotFound && attempts < 3 => {
                attempts += 1;
                make_gateway_dir(gateway_root)?;
            }
            Err(e) => return Err(create_err(&path, e)),
        }
    }
    let id = fs::symlink_metadata(&path)
        .map_err(|e| create_err(&path, e))?
        .ino();
    Ok((path, id))
}

/// Makes `dir` unless it is there already as a directory (not through a symlink).
fn make_dir(dir: &Path) -> Result<(), CgroupError> {
    match fs::DirBuilder::new().mode(0o755).create(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists && !dir.is_symlink() => Ok(()),
        Err(source) => Err(CgroupError::Create {
            path: dir.to_path_buf(),
            source,
        }),
    }
}

/// Makes the gateway's directory and the root above it, where missing.
fn make_gateway_dir(gateway_root: &Path) -> Result<(), CgroupError> {
    for dir in [gateway_root.parent(), Some(gateway_root)]
        .into_iter()
        .flatten()
    {
        make_dir(dir)?;
    }
    Ok(())
}

/// Makes the gateway's directory (and the root above it) if needed, and the daemon's hold in it
/// ([`leash_core::model::GATEWAY_HOLD`]), which keeps it from being removed while the daemon
/// serves.
pub fn hold_gateway_dir(gateway_root: &Path) -> Result<(), CgroupError> {
    make_gateway_dir(gateway_root)?;
    make_dir(&gateway_root.join(leash_core::model::GATEWAY_HOLD))
}

/// Removes the daemon's hold (the gateway's directory may then go with its last lease).
pub fn release_gateway_dir(gateway_root: &Path) {
    let _ = fs::remove_dir(gateway_root.join(leash_core::model::GATEWAY_HOLD));
}

/// Removes this gateway's cgroup directory if nothing is left in it (no lease cgroup, no
/// process): what a stopping daemon does, so state roots that come and go (tests, examples, one
/// gateway after another) leave no empty directories behind in the hierarchy. `rmdir` of a cgroup
/// fails while it has children or members, which is then left as it is; a symlink is never
/// followed. Returns whether it was removed.
pub fn remove_gateway_dir_if_empty(gateway_root: &Path) -> bool {
    if gateway_root.is_symlink() || !gateway_root.is_dir() {
        return false;
    }
    fs::remove_dir(gateway_root).is_ok()
}

/// A lease's cgroup, opened and proven to be the one recorded (same path, same id).
#[derive(Debug)]
pub struct Verified {
    pub(super) dir: File,
    pub(super) path: PathBuf,
    pub(super) id: u64,
}

impl Verified {
    /// Opens `path` (no symlinks followed) and checks that its inode is `id`.
    pub fn open(path: &Path, id: u64) -> Result<Verified, CgroupError> {
        let not = |reason: String| CgroupError::NotVerified {
            path: path.to_path_buf(),
            reason,
        };
        let dir = open_dir(path).map_err(|e| not(format!("cannot open it: {e}")))?;
        let got = dir
            .metadata()
            .map_err(|e| not(format!("cannot stat it: {e}")))?
            .ino();
        if got != id {
            return Err(not(format!(
                "its id is {got}, the lease recorded {id}: it was removed and made again"
            )));
        }
        Ok(Verified {
            dir,
            path: path.to_path_buf(),
            id,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn id(&self) -> u64 {
        self.id
    }

    /// Writes `value` to the control file `file` of this cgroup (the cgroup kill in `signal/`
    /// writes its files through this handle, so it reaches exactly the verified cgroup).
    pub(crate) fn write(&self, file: &str, value: &str) -> io::Result<()> {
        write_file(&at(&self.dir, file), value)
    }

    /// The error of an operation `what` on this cgroup.
    pub(crate) fn io_error(&self, what: &'static str, source: io::Error) -> CgroupError {
        CgroupError::Io {
            what,
            path: self.path.clone(),
            source,
        }
    }

    /// Removes the (empty) cgroup, after checking once more that the name still holds our id.
    pub fn remove(self) -> Result<(), CgroupError> {
        let io = |source| CgroupError::Io {
            what: "remove",
            path: self.path.clone(),
            source,
        };
        let (Some(parent), Some(name)) = (self.path.parent(), self.path.file_name()) else {
            return Err(io(io::Error::from_raw_os_error(libc::EINVAL)));
        };
        let parent_dir = open_dir(parent).map_err(io)?;
        let now = match nix::sys::stat::fstatat(
            Some(parent_dir.as_raw_fd()),
            name,
            nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
        ) {
            Ok(st) => st,
            // Already removed (the wrapper removes its cgroup as it exits): the goal is met.
            Err(nix::errno::Errno::ENOENT) => return Ok(()),
            Err(e) => return Err(io(io::Error::from(e))),
        };
        if now.st_ino != self.id {
            return Err(CgroupError::NotVerified {
                path: self.path.clone(),
                reason: format!(
                    "its id changed to {} before removal (recorded {})",
                    now.st_ino, self.id
                ),
            });
        }
        // An adapter may have made cgroups of its own inside its lease's (a nested service
        // manager, a sandbox): the lease's cgroup cannot be removed while they exist (EBUSY, on
        // every close, reap and reconcile, for ever). They are removed first, deepest first,
        // through the directory this handle verified; rmdir removes only empty cgroups, so
        // nothing that still runs is touched.
        remove_nested(&self.dir, 0).map_err(io)?;
        match nix::unistd::unlinkat(
            Some(parent_dir.as_raw_fd()),
            name,
            nix::unistd::UnlinkatFlags::RemoveDir,
        ) {
            Ok(()) => Ok(()),
            Err(nix::errno::Errno::ENOENT) => Ok(()),
            Err(e) => Err(io(io::Error::from(e))),
        }
    }
}

/// How deep the cgroups an adapter made inside its lease's may nest before removal gives up
/// (the kernel's own `cgroup.max.depth` is unlimited by default; a loop cannot occur in
/// cgroupfs, this only bounds the recursion).
const MAX_NESTED_DEPTH: usize = 64;

/// Removes every cgroup below the directory `dir` holds, deepest first, each through its
/// parent's descriptor (a name renamed meanwhile cannot redirect the removal outside `dir`).
/// Only empty cgroups can be removed: a populated one fails with EBUSY, reported to the caller.
fn remove_nested(dir: &File, depth: usize) -> io::Result<()> {
    if depth >= MAX_NESTED_DEPTH {
        return Err(io::Error::other(format!(
            "cgroups nested more than {MAX_NESTED_DEPTH} deep"
        )));
    }
    for entry in fs::read_dir(at(dir, ""))? {
        let entry = entry?;
        if !entry.file_type()?.is_dir() {
            continue;
        }
        let name = entry.file_name();
        let child = match open_dir(&at(dir, "").join(&name)) {
            Ok(c) => c,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        remove_nested(&child, depth + 1)?;
        match nix::unistd::unlinkat(
            Some(dir.as_raw_fd()),
            name.as_os_str(),
            nix::unistd::UnlinkatFlags::RemoveDir,
        ) {
            Ok(()) | Err(nix::errno::Errno::ENOENT) => {}
            Err(e) => return Err(io::Error::from(e)),
        }
    }
    Ok(())
}
