//! The state root: one directory per gateway installation, holding its database, its installed
//! wrapper binaries and the wrappers' reports. Everything under it is trusted as much as the
//! database is, so it is created mode 0700 and refused when another user owns it.

use leash_core::kind::{HasKind, Kind};
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
    #[error(
        "{0} is a symbolic link; leash does not follow links inside its state directory (it \
             would trust whatever the link points to): remove the link, and leash creates the \
             directory itself"
    )]
    Symlink(PathBuf),
    #[error(
        "state directory {0} does not exist (only `leash exec`, `leash serve` and `leash \
             legacy import` create one); check --state-dir / LEASH_STATE_DIR"
    )]
    Missing(PathBuf),
    #[error(
        "cannot make {0} an absolute path (is the current directory gone?); give an absolute \
             path"
    )]
    Relative(PathBuf),
}

impl HasKind for StateError {
    fn kind(&self) -> Kind {
        match self {
            StateError::Missing(_) => Kind::NotFound,
            StateError::Relative(_) => Kind::Usage,
            _ => Kind::Internal,
        }
    }
}

/// `p` made absolute against the current directory (lexically: `..` is kept, symlinks are not
/// resolved). A relative state directory would name another root from every other directory.
pub fn absolute(p: &Path) -> Result<PathBuf, StateError> {
    if p.is_absolute() {
        return Ok(p.to_path_buf());
    }
    std::path::absolute(p).map_err(|_| StateError::Relative(p.to_path_buf()))
}

#[derive(Debug, Clone)]
pub struct StateRoot {
    dir: PathBuf,
}

impl StateRoot {
    /// Picks the state directory: the flag, else `LEASH_STATE_DIR`, else
    /// `$XDG_STATE_HOME/leash`, else `~/.local/state/leash`.
    /// Relative paths are made absolute against the current directory.
    pub fn resolve(flag: Option<&Path>) -> Result<PathBuf, StateError> {
        Self::resolve_relative(flag, &|k| std::env::var_os(k)).and_then(|p| absolute(&p))
    }

    /// [`StateRoot::resolve`] as another process would resolve it, from its environment (`env`)
    /// and its current directory (`cwd`, asked only for a relative path; `None` when it cannot be
    /// read): what the daemon does for the front door's `execArgv`.
    pub fn resolve_for(
        flag: Option<&Path>,
        env: &dyn Fn(&str) -> Option<std::ffi::OsString>,
        cwd: &dyn Fn() -> Option<PathBuf>,
    ) -> Result<PathBuf, StateError> {
        let p = Self::resolve_relative(flag, env)?;
        if p.is_absolute() {
            return Ok(p);
        }
        match cwd() {
            Some(cwd) => Ok(cwd.join(p)),
            None => Err(StateError::Relative(p)),
        }
    }

    fn resolve_relative(
        flag: Option<&Path>,
        env: &dyn Fn(&str) -> Option<std::ffi::OsString>,
    ) -> Result<PathBuf, StateError> {
        if let Some(p) = flag {
            return Ok(p.to_path_buf());
        }
        let env = |k: &str| env(k).filter(|v| !v.is_empty());
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

    /// Opens (creating when needed, mode 0700) the state root and its subdirectories. The root
    /// itself may be a symlink (it is canonicalised); `wrappers/` and `run/` may not.
    pub fn open(dir: &Path) -> Result<StateRoot, StateError> {
        ensure_private_dir(dir, true)?;
        // /proc/<pid>/exe shows canonical paths; keep ours canonical so they compare.
        let dir = fs::canonicalize(dir).map_err(|source| StateError::Create {
            path: dir.to_path_buf(),
            source,
        })?;
        let root = StateRoot { dir };
        ensure_private_dir(&root.wrapper_root(), false)?;
        ensure_private_dir(&root.run_dir(), false)?;
        Ok(root)
    }

    /// Opens a state root that must already exist, with its database: what every command but
    /// `exec`, `serve` and `legacy import` uses, so that none of them creates a state root (and
    /// a new gateway id) by accident. Creates nothing.
    pub fn open_existing(dir: &Path) -> Result<StateRoot, StateError> {
        let missing = || StateError::Missing(dir.to_path_buf());
        match fs::metadata(dir) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => return Err(StateError::NotADir(dir.to_path_buf())),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(missing()),
            Err(source) => {
                return Err(StateError::Create {
                    path: dir.to_path_buf(),
                    source,
                })
            }
        }
        let canonical = fs::canonicalize(dir).map_err(|source| StateError::Create {
            path: dir.to_path_buf(),
            source,
        })?;
        let root = StateRoot { dir: canonical };
        if fs::symlink_metadata(root.db_path()).is_err() {
            return Err(missing());
        }
        check_private_dir(root.dir(), true)?;
        for sub in [root.wrapper_root(), root.run_dir()] {
            if fs::symlink_metadata(&sub).is_ok() {
                check_private_dir(&sub, false)?;
            }
        }
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

    /// The daemon's lock file: one daemon per state root holds it exclusively while it serves,
    /// and it names the daemon's pid and socket (`daemon::LockInfo`).
    pub fn daemon_lock_path(&self) -> PathBuf {
        self.dir.join(DAEMON_LOCK_FILE)
    }

    /// Whether a daemon serves this state root now (see [`daemon_lock_held`]).
    pub fn daemon_serves(&self) -> bool {
        daemon_lock_held(&self.daemon_lock_path())
    }
}

/// The name of the daemon's lock file in a state root.
const DAEMON_LOCK_FILE: &str = "daemon.lock";

/// Whether a daemon holds the lock file `lock`: it is not a symlink and a shared lock on it
/// cannot be taken (the daemon's exclusive lock is held; the probe's shared lock, when it can be
/// taken, is dropped at once). A daemon probing its own lock counts: its exclusive lock is on
/// another open file description.
pub fn daemon_lock_held(lock: &Path) -> bool {
    use std::os::unix::fs::OpenOptionsExt;
    let Ok(file) = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(lock)
    else {
        return false;
    };
    matches!(
        nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockSharedNonblock),
        Err((_, nix::errno::Errno::EWOULDBLOCK))
    )
}

fn ensure_private_dir(path: &Path, follow: bool) -> Result<(), StateError> {
    match fs::symlink_metadata(path) {
        Ok(_) => check_private_dir(path, follow),
        Err(e) if e.kind() == io::ErrorKind::NotFound => fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(path)
            .map_err(|source| StateError::Create {
                path: path.to_path_buf(),
                source,
            }),
        Err(source) => Err(StateError::Create {
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// An existing directory of ours: ours (uid), a directory, tightened to 0700; a symlink only when
/// `follow` (the state root itself, which is canonicalised; never a directory inside it).
fn check_private_dir(path: &Path, follow: bool) -> Result<(), StateError> {
    let create_err = |source| StateError::Create {
        path: path.to_path_buf(),
        source,
    };
    let meta = fs::symlink_metadata(path).map_err(create_err)?;
    let meta = if meta.file_type().is_symlink() {
        if !follow {
            return Err(StateError::Symlink(path.to_path_buf()));
        }
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

    #[test]
    fn refuses_symlinked_subdirectories_and_creates_nothing_when_asked_not_to() {
        let tmp = tempdir();
        let elsewhere = tmp.join("elsewhere");
        fs::create_dir_all(&elsewhere).unwrap();
        fs::set_permissions(&elsewhere, fs::Permissions::from_mode(0o755)).unwrap();
        let root = tmp.join("root");
        fs::create_dir_all(&root).unwrap();
        std::os::unix::fs::symlink(&elsewhere, root.join("wrappers")).unwrap();
        assert!(matches!(
            StateRoot::open(&root),
            Err(StateError::Symlink(_))
        ));
        assert_eq!(
            fs::metadata(&elsewhere).unwrap().mode() & 0o777,
            0o755,
            "the link's target is left as it was"
        );
        let missing = tmp.join("nope");
        assert!(matches!(
            StateRoot::open_existing(&missing),
            Err(StateError::Missing(_))
        ));
        assert!(!missing.exists());
        fs::remove_dir_all(&tmp).unwrap();
    }

    fn tempdir() -> PathBuf {
        let p = std::env::temp_dir().join(format!("leash-state-test-{}", uuid::Uuid::new_v4()));
        fs::create_dir_all(&p).unwrap();
        p
    }
}
