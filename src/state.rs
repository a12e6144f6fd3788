//! The state root: one directory per gateway installation, holding its database, its installed
//! wrapper binaries and the wrappers' reports. Everything under it is trusted as much as the
//! database is, so it is created mode 0700 and refused when another user owns it.

use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Environment variable naming the state root (the `--state-dir` flag wins over it).
pub const ENV_STATE_DIR: &str = "LEASH_STATE_DIR";

#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error(
        "cannot find a state directory: set --state-dir, LEASH_STATE_DIR, XDG_STATE_HOME or HOME"
    )]
    NoDefault,
    #[error("cannot create state directory {path}: {source}")]
    Create { path: PathBuf, source: io::Error },
    #[error(
        "state directory {path} is owned by uid {owner}, not by us (uid {us}); refusing to use it"
    )]
    Foreign { path: PathBuf, owner: u32, us: u32 },
    #[error("state path {0} exists but is not a directory")]
    NotADir(PathBuf),
}

#[derive(Debug, Clone)]
pub struct StateRoot {
    dir: PathBuf,
}

impl StateRoot {
    /// Picks the state directory: the flag, else `LEASH_STATE_DIR`, else
    /// `$XDG_STATE_HOME/leash`, else `~/.local/state/leash`.
    pub fn resolve(flag: Option<&Path>) -> Result<PathBuf, StateError> {
        if let Some(p) = flag {
            return Ok(p.to_path_buf());
        }
        let env = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
        if let Some(p) = env(ENV_STATE_DIR) {
            return Ok(PathBuf::from(p));
        }
        if let Some(p) = env("XDG_STATE_HOME") {
            return Ok(PathBuf::from(p).join("leash"));
        }
        if let Some(home) = env("HOME") {
            return Ok(PathBuf::from(home).join(".local/state/leash"));
        }
        Err(StateError::NoDefault)
    }

    /// Opens (creating when needed, mode 0700) the state root and its subdirectories.
    pub fn open(dir: &Path) -> Result<StateRoot, StateError> {
        ensure_private_dir(dir)?;
        // /proc/<pid>/exe shows canonical paths; keep ours canonical so they compare.
        let dir = fs::canonicalize(dir).map_err(|source| StateError::Create {
            path: dir.to_path_buf(),
            source,
        })?;
        let root = StateRoot { dir };
        ensure_private_dir(&root.wrapper_root())?;
        ensure_private_dir(&root.run_dir())?;
        Ok(root)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn db_path(&self) -> PathBuf {
        self.dir.join("leash.db")
    }

    /// Where this gateway's wrapper binaries are installed. A live wrapper's `/proc/<pid>/exe`
    /// lies under this directory and under no other gateway's.
    pub fn wrapper_root(&self) -> PathBuf {
        self.dir.join("wrappers")
    }

    /// Where wrappers write their reports (one file per lease).
    pub fn run_dir(&self) -> PathBuf {
        self.dir.join("run")
    }

    pub fn report_path(&self, lease_id: &str) -> PathBuf {
        self.run_dir().join(format!("{lease_id}.json"))
    }

    pub fn socket_path(&self) -> PathBuf {
        self.dir.join("leash.sock")
    }
}

fn ensure_private_dir(path: &Path) -> Result<(), StateError> {
    let create_err = |source| StateError::Create {
        path: path.to_path_buf(),
        source,
    };
    match fs::symlink_metadata(path) {
        Ok(meta) => {
            let meta = if meta.file_type().is_symlink() {
                fs::metadata(path).map_err(create_err)?
            } else {
                meta
            };
            if !meta.is_dir() {
                return Err(StateError::NotADir(path.to_path_buf()));
            }
            let us = nix::unistd::geteuid().as_raw();
            if meta.uid() != us {
                return Err(StateError::Foreign {
                    path: path.to_path_buf(),
                    owner: meta.uid(),
                    us,
                });
            }
            if meta.mode() & 0o077 != 0 {
                fs::set_permissions(path, fs::Permissions::from_mode(0o700)).map_err(create_err)?;
            }
            Ok(())
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(path)
            .map_err(create_err),
        Err(e) => Err(create_err(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn creates_private_dirs() {
        let tmp = tempdir();
        let root = StateRoot::open(&tmp.join("a/b")).unwrap();
        for d in [
            root.dir().to_path_buf(),
            root.wrapper_root(),
            root.run_dir(),
        ] {
            let mode = fs::metadata(&d).unwrap().mode() & 0o777;
            assert_eq!(mode, 0o700, "{}", d.display());
        }
        fs::remove_dir_all(&tmp).unwrap();
    }

    #[test]
    fn tightens_loose_permissions_and_rejects_files() {
        let tmp = tempdir();
        fs::set_permissions(&tmp, fs::Permissions::from_mode(0o755)).unwrap();
        StateRoot::open(&tmp).unwrap();
        assert_eq!(fs::metadata(&tmp).unwrap().mode() & 0o777, 0o700);
        let file = tmp.join("f");
        fs::write(&file, b"x").unwrap();
        assert!(matches!(
            StateRoot::open(&file),
            Err(StateError::NotADir(_))
        ));
        fs::remove_dir_all(&tmp).unwrap();
    }

    fn tempdir() -> PathBuf {
        let p = std::env::temp_dir().join(format!("leash-state-test-{}", uuid::Uuid::new_v4()));
        fs::create_dir_all(&p).unwrap();
        p
    }
}
