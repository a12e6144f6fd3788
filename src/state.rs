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

/// Environment variable naming the directory the wrappers' reports go in (see
/// [`resolve_reports_dir`]).
pub const ENV_RUNTIME_DIR: &str = "LEASH_RUNTIME_DIR";

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
        "state directory {0} holds no state database (leash.db) yet: no `leash exec`, `leash \
             serve` or `leash legacy import` has run on it; to reach a daemon that serves it \
             (or one that socket activation starts), name its socket with --socket"
    )]
    NoDatabase(PathBuf),
    #[error(
        "cannot make {0} an absolute path (is the current directory gone?); give an absolute \
             path"
    )]
    Relative(PathBuf),
    #[error(
        "LEASH_RUNTIME_DIR {path} cannot be the reports directory (where the wrappers write \
             their reports): {why}; nothing started (unset it, and leash picks a reports \
             directory itself)"
    )]
    RuntimeDir { path: PathBuf, why: String },
}

impl HasKind for StateError {
    fn kind(&self) -> Kind {
        match self {
            StateError::Missing(_) | StateError::NoDatabase(_) => Kind::NotFound,
            StateError::Relative(_) | StateError::RuntimeDir { .. } => Kind::Usage,
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
        let env = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
        let relative = if let Some(p) = flag {
            p.to_path_buf()
        } else if let Some(p) = env(ENV_STATE_DIR) {
            PathBuf::from(p)
        } else if let Some(p) = env("XDG_STATE_HOME") {
            PathBuf::from(p).join("leash")
        } else if let Some(home) = env("HOME") {
            PathBuf::from(home).join(".local/state/leash")
        } else {
            return Err(StateError::NoDefault);
        };
        absolute(&relative)
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
        let root = Self::open_existing_dir(dir)?;
        if fs::symlink_metadata(root.db_path()).is_err() {
            return Err(StateError::NoDatabase(dir.to_path_buf()));
        }
        Ok(root)
    }

    /// Opens a state directory that must exist, with or without its database: what a client of
    /// a named daemon socket uses (the daemon makes the database; under socket activation the
    /// client's connection is what starts it, in the empty directory systemd's
    /// `StateDirectory=` made). Creates nothing.
    pub fn open_existing_dir(dir: &Path) -> Result<StateRoot, StateError> {
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

    /// The report of a lease whose row names no reports directory: `run/<lease>.json`.
    pub fn report_path(&self, lease_id: &str) -> PathBuf {
        self.report_path_at(None, lease_id)
    }

    /// The report of lease `lease_id` in reports directory `dir` (`None`: `run/`), unchecked:
    /// for a directory this process resolved itself ([`resolve_reports_dir`]). A row's claim of
    /// one goes through [`StateRoot::report_file`].
    pub fn report_path_at(&self, dir: Option<&Path>, lease_id: &str) -> PathBuf {
        match dir {
            Some(dir) => dir.join(format!("{lease_id}.json")),
            None => self.run_dir().join(format!("{lease_id}.json")),
        }
    }

    /// Where the wrapper of a lease writes its report: `<dir>/<lease>.json` in the reports
    /// directory its row names (`report_dir`, see [`resolve_reports_dir`]), else in `run/`.
    ///
    /// The row is a claim: `None` when the lease id is not a plain file name, or when the
    /// directory it names is not one leash would have picked (an absolute path to a directory,
    /// not a symlink, owned by this user and private to it: mode `0700`). Then no report is read
    /// or removed there.
    pub fn report_file(&self, lease_id: &str, report_dir: Option<&str>) -> Option<PathBuf> {
        self.report_file_with(lease_id, report_dir, &mut reports_dir_usable)
    }

    /// [`StateRoot::report_file`] with the directory's check given (`usable`): a reader of many
    /// leases checks each directory once (`report::ingest_reports`).
    pub fn report_file_with(
        &self,
        lease_id: &str,
        report_dir: Option<&str>,
        usable: &mut dyn FnMut(&Path) -> bool,
    ) -> Option<PathBuf> {
        if lease_id.is_empty() || lease_id.contains('/') || lease_id.starts_with('.') {
            return None;
        }
        let dir = report_dir.map(Path::new);
        if let Some(dir) = dir.filter(|d| !usable(d)) {
            tracing::warn!(lease_id, dir = %dir.display(), "the lease's reports directory is not a private directory of this user; its report is not read");
            return None;
        }
        Some(self.report_path_at(dir, lease_id))
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

/// Whether `dir` is a directory the wrappers' reports may be read from and written in: an
/// absolute path, a directory (not a symlink), owned by this user, mode `0700` or tighter. Reads
/// one `lstat`; changes nothing.
pub fn reports_dir_usable(dir: &Path) -> bool {
    dir.is_absolute()
        && fs::symlink_metadata(dir).is_ok_and(|m| {
            m.is_dir() && m.uid() == nix::unistd::geteuid().as_raw() && m.mode() & 0o077 == 0
        })
}

/// Where the wrappers of the leases this process commits write their reports: `Some(dir)`, a
/// private directory of this user on a memory-backed filesystem, recorded in each lease's row
/// (`report_dir`); `None`, the state root's `run/`, as before 2026-12-04.
///
/// Why: a report is one file created per `leash exec`. On a disk filesystem (ext4 here) that
/// create takes 20–60 µs in quiet minutes and 0.5–0.7 ms in busy ones, the largest swing in
/// `leash exec`'s time (docs/benchmarks.md). A report is needed only while its lease's
/// processes may be alive: for this boot, like everything in `/run`.
///
/// The choice, first that holds:
/// 1. `LEASH_RUNTIME_DIR` (not empty): that directory, made `0700` if missing (its parent must
///    exist), whatever its filesystem. An operator's explicit choice: one that cannot be used
///    (relative, a symlink, a file, another user's) is an error, and nothing starts.
/// 2. `$XDG_RUNTIME_DIR/leash`, 3. `/run/leash` (root only), 4. `/dev/shm/leash-<uid>`: each
///    only when its parent is a directory on tmpfs, owned by this user or root, and not
///    writable by others unless sticky (so nobody else can swap our directory for a link), and
///    the directory is ours and `0700` (made so if missing; another user's, a squatter's, a
///    symlink, or one of ours with another mode, say a unit's socket directory, is passed over
///    and left as it is).
/// 5. Otherwise `None`: `run/` in the state root.
///
/// `env` is the environment of the `leash exec` whose lease it is (the daemon passes its peer's).
pub fn resolve_reports_dir(
    env: &dyn Fn(&str) -> Option<std::ffi::OsString>,
) -> Result<Option<PathBuf>, StateError> {
    let us = nix::unistd::geteuid().as_raw();
    let mut system = Vec::with_capacity(2);
    if us == 0 {
        system.push(PathBuf::from("/run/leash"));
    }
    system.push(PathBuf::from(format!("/dev/shm/leash-{us}")));
    resolve_reports_dir_among(env, us, system)
}

/// [`resolve_reports_dir`] for user `us` with the system's defaults (after
/// `$XDG_RUNTIME_DIR/leash`) given.
fn resolve_reports_dir_among(
    env: &dyn Fn(&str) -> Option<std::ffi::OsString>,
    us: u32,
    system: Vec<PathBuf>,
) -> Result<Option<PathBuf>, StateError> {
    let env = |k: &str| env(k).filter(|v| !v.is_empty());
    if let Some(dir) = env(ENV_RUNTIME_DIR) {
        let path = PathBuf::from(dir);
        let refuse = |why: String| StateError::RuntimeDir {
            path: path.clone(),
            why,
        };
        if !path.is_absolute() {
            return Err(refuse("not an absolute path".into()));
        }
        if path.to_str().is_none() {
            return Err(refuse(
                "not UTF-8 (the lease's row records it as text)".into(),
            ));
        }
        return match make_private_dir(&path, true) {
            Ok(()) => Ok(Some(path)),
            Err(e) => Err(refuse(reports_dir_refusal(e))),
        };
    }
    let mut candidates: Vec<PathBuf> = Vec::with_capacity(3);
    if let Some(xdg) = env("XDG_RUNTIME_DIR").map(PathBuf::from) {
        if xdg.is_absolute() && xdg.to_str().is_some() {
            candidates.push(xdg.join("leash"));
        }
    }
    candidates.extend(system);
    for dir in candidates {
        let Some(parent) = dir.parent() else { continue };
        if !memory_backed_and_safe(parent, us) {
            continue;
        }
        match make_private_dir(&dir, false) {
            Ok(()) => return Ok(Some(dir)),
            Err(e) => {
                tracing::debug!(dir = %dir.display(), error = %e, "not a reports directory")
            }
        }
    }
    Ok(None)
}

/// Why a directory cannot be the reports directory, said of that directory (the state root's
/// own errors name a "state directory").
fn reports_dir_refusal(e: StateError) -> String {
    match e {
        StateError::Create { source, .. } => format!("cannot create it: {source}"),
        StateError::Foreign { owner, us, .. } => {
            format!("it is owned by uid {owner}, not by us (uid {us})")
        }
        StateError::NotADir(_) => "it exists but is not a directory".into(),
        StateError::Symlink(_) => "it is a symbolic link (leash does not follow one: it would \
             trust whatever the link points to)"
            .into(),
        other => other.to_string(),
    }
}

/// `dir`'s parent as [`resolve_reports_dir`] requires it: tmpfs, a directory owned by
/// `us` or root, not writable by group or others unless sticky.
fn memory_backed_and_safe(parent: &Path, us: u32) -> bool {
    let Ok(meta) = fs::metadata(parent) else {
        return false;
    };
    let owner_ok = meta.uid() == us || meta.uid() == 0;
    let sticky = meta.mode() & 0o1000 != 0;
    if !meta.is_dir() || !owner_ok || (meta.mode() & 0o022 != 0 && !sticky) {
        return false;
    }
    use nix::sys::statfs::{statfs, TMPFS_MAGIC};
    statfs(parent).is_ok_and(|f| f.filesystem_type() == TMPFS_MAGIC)
}

/// Makes `dir` (only its last component; the parent must exist) mode `0700`, or accepts it when
/// it is already a directory of ours that is not a symlink: tightened to `0700` when `tighten`
/// (an operator named it), else only when it is `0700` already (a default that somebody, say a
/// unit's socket directory, made with another mode is left as it is, and passed over).
fn make_private_dir(dir: &Path, tighten: bool) -> Result<(), StateError> {
    match fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => return check_private_dir(dir, false),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(source) => {
            return Err(StateError::Create {
                path: dir.to_path_buf(),
                source,
            })
        }
    }
    if tighten {
        check_private_dir(dir, false)
    } else if reports_dir_usable(dir) {
        Ok(())
    } else {
        Err(StateError::Create {
            path: dir.to_path_buf(),
            source: io::Error::other("not a private directory of this user (mode 0700)"),
        })
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

    /// An explicit `LEASH_RUNTIME_DIR` of ours is tightened as the state root is; a default
    /// that exists with a looser mode is passed over and left as it was.
    #[test]
    fn an_explicit_reports_dir_is_tightened_and_a_loose_default_passed_over() {
        let shm = Path::new("/dev/shm");
        if !shm.is_dir() {
            eprintln!("skipped: no /dev/shm");
            return;
        }
        let us = nix::unistd::geteuid().as_raw();
        let base = shm.join(format!("leash-state-unit-{}", uuid::Uuid::new_v4()));
        fs::create_dir(&base).unwrap();
        fs::set_permissions(&base, fs::Permissions::from_mode(0o700)).unwrap();
        let explicit = base.join("explicit");
        fs::create_dir(&explicit).unwrap();
        fs::set_permissions(&explicit, fs::Permissions::from_mode(0o755)).unwrap();
        let env = |k: &str| (k == ENV_RUNTIME_DIR).then(|| explicit.clone().into_os_string());
        assert_eq!(
            resolve_reports_dir_among(&env, us, vec![]).unwrap(),
            Some(explicit.clone())
        );
        assert_eq!(fs::metadata(&explicit).unwrap().mode() & 0o777, 0o700);

        let loose = base.join("leash");
        fs::create_dir(&loose).unwrap();
        fs::set_permissions(&loose, fs::Permissions::from_mode(0o755)).unwrap();
        let env = |k: &str| (k == "XDG_RUNTIME_DIR").then(|| base.clone().into_os_string());
        assert_eq!(
            resolve_reports_dir_among(&env, us, vec![]).unwrap(),
            None,
            "passed over, to run/"
        );
        assert_eq!(fs::metadata(&loose).unwrap().mode() & 0o777, 0o755);
        fs::remove_dir(&loose).unwrap();
        assert_eq!(
            resolve_reports_dir_among(&env, us, vec![]).unwrap(),
            Some(loose.clone()),
            "made when missing"
        );
        assert_eq!(fs::metadata(&loose).unwrap().mode() & 0o777, 0o700);
        let relative = |k: &str| (k == ENV_RUNTIME_DIR).then(|| "rel".into());
        assert!(matches!(
            resolve_reports_dir_among(&relative, us, vec![]),
            Err(StateError::RuntimeDir { .. })
        ));
        fs::remove_dir_all(&base).unwrap();
    }

    fn tempdir() -> PathBuf {
        let p = std::env::temp_dir().join(format!("leash-state-test-{}", uuid::Uuid::new_v4()));
        fs::create_dir_all(&p).unwrap();
        p
    }
}
