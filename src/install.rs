//! Installs the wrapper binary into the state root's wrapper root, so the live `/proc/<pid>/exe`
//! of every wrapper of this gateway lies under its own root and under no other gateway's.
//!
//! The installed name carries the source's size and modification time: a new build gets a new
//! name (wrappers still running keep theirs), and the common case costs one `stat` of the source
//! and one of the destination. The copy is atomic: a temporary file in the same directory,
//! renamed into place, so no wrapper is ever exec'd half-written.

use crate::state::StateRoot;
use leash_core::kind::{HasKind, Kind};
use std::fs;
use std::io;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Environment variable naming the wrapper binary to install (default: `leash-wrap` next to the
/// running `leash` binary, or in `../libexec/leash/`).
pub const ENV_WRAP_BIN: &str = "LEASH_WRAP_BIN";

#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    #[error("cannot find the leash-wrap binary (looked in {looked}); install it next to leash with `cargo install --locked --path wrapper` (from the leash source tree), build both with `cargo build --release --workspace`, or set LEASH_WRAP_BIN")]
    NotFound { looked: String },
    #[error(
        "{0} is a symbolic link; leash trusts an installed wrapper by its path and never \
             through a link: remove it, and leash installs the wrapper again"
    )]
    Symlink(PathBuf),
    #[error("cannot install the wrapper {src} into {dest}: {source}")]
    Copy {
        src: PathBuf,
        dest: PathBuf,
        #[source]
        source: io::Error,
    },
}

impl HasKind for InstallError {
    fn kind(&self) -> Kind {
        Kind::Internal
    }
}

/// Finds the wrapper binary to install.
pub fn locate_wrapper() -> Result<PathBuf, InstallError> {
    if let Some(p) = std::env::var_os(ENV_WRAP_BIN).filter(|v| !v.is_empty()) {
        let p = PathBuf::from(p);
        return if p.is_file() {
            Ok(p)
        } else {
            Err(InstallError::NotFound {
                looked: format!("{} (from {ENV_WRAP_BIN})", p.display()),
            })
        };
    }
    let mut looked = Vec::new();
    if let Ok(exe) = std::env::current_exe() {
        if let Some(dir) = exe.parent() {
            let mut candidates = vec![dir.join("leash-wrap")];
            // Test harness binaries live in target/<profile>/deps/.
            if dir.ends_with("deps") {
                if let Some(up) = dir.parent() {
                    candidates.push(up.join("leash-wrap"));
                }
            }
            candidates.push(dir.join("../libexec/leash/leash-wrap"));
            for c in candidates {
                if c.is_file() {
                    return Ok(c);
                }
                looked.push(c.display().to_string());
            }
        }
    }
    Err(InstallError::NotFound {
        looked: looked.join(", "),
    })
}

/// Installs (when needed) the wrapper and returns its path under the wrapper root.
pub fn install_wrapper(root: &StateRoot) -> Result<PathBuf, InstallError> {
    let src = locate_wrapper()?;
    install_from(&src, &root.wrapper_root())
}

pub fn install_from(src: &Path, wrapper_root: &Path) -> Result<PathBuf, InstallError> {
    let err = |dest: &Path, source| InstallError::Copy {
        src: src.to_path_buf(),
        dest: dest.to_path_buf(),
        source,
    };
    let meta = fs::metadata(src).map_err(|e| err(wrapper_root, e))?;
    let stamp = meta.mtime() as i128 * 1_000_000_000 + meta.mtime_nsec() as i128;
    let dest = wrapper_root.join(format!("leash-wrap-{:x}-{:x}", meta.len(), stamp));
    match fs::symlink_metadata(&dest) {
        // An installed wrapper is trusted by its path: never through a link.
        Ok(d) if d.file_type().is_symlink() => return Err(InstallError::Symlink(dest)),
        Ok(d) if d.is_file() && d.len() == meta.len() => return Ok(dest),
        _ => {}
    }
    let tmp = wrapper_root.join(format!(
        ".leash-wrap.{}.{}.tmp",
        std::process::id(),
        uuid::Uuid::new_v4().simple()
    ));
    // Created 0700 (never the source's mode, nor anything the umask lets through), filled, then
    // made 0755 and renamed into place: inside the 0700 wrapper directory.
    let res = copy_new(src, &tmp)
        .and_then(|()| fs::set_permissions(&tmp, fs::Permissions::from_mode(0o755)))
        .and_then(|()| fs::rename(&tmp, &dest));
    if let Err(e) = res {
        let _ = fs::remove_file(&tmp);
        return Err(err(&dest, e));
    }
    Ok(dest)
}

/// Copies `src` into a new file `dest` created mode 0700 (`fs::copy` would create it with the
/// source's mode, and a world-writable source would make a world-writable copy until chmod).
fn copy_new(src: &Path, dest: &Path) -> io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut from = fs::File::open(src)?;
    let mut to = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o700)
        .custom_flags(libc::O_NOFOLLOW)
        .open(dest)?;
    io::copy(&mut from, &mut to)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn installs_once_and_again_when_the_source_changes() {
        let dir = std::env::temp_dir().join(format!("leash-install-{}", uuid::Uuid::new_v4()));
        fs::create_dir_all(dir.join("root")).unwrap();
        let src = dir.join("leash-wrap");
        fs::write(&src, b"#!/bin/sh\nexit 0\n").unwrap();
        let a = install_from(&src, &dir.join("root")).unwrap();
        let b = install_from(&src, &dir.join("root")).unwrap();
        assert_eq!(a, b);
        assert!(a.starts_with(dir.join("root")));
        assert_eq!(fs::read(&a).unwrap(), fs::read(&src).unwrap());
        fs::write(&src, b"#!/bin/sh\nexit 1 # a new build\n").unwrap();
        let c = install_from(&src, &dir.join("root")).unwrap();
        assert_ne!(a, c);
        assert!(a.exists(), "a running wrapper keeps its binary");
        let leftovers: Vec<_> = fs::read_dir(dir.join("root"))
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
            .collect();
        assert!(leftovers.is_empty());
        fs::remove_dir_all(&dir).unwrap();
    }
}
