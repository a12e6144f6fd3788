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

use leash_core::kind::{HasKind, Kind};
use leash_core::model::Observation;
use serde::{Deserialize, Serialize};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Component, Path, PathBuf};
use std::time::{Duration, Instant};

/// `on` (the default: contain wherever cgroups can be created) or `off`.
pub const ENV_CONTAINMENT: &str = "LEASH_CONTAINMENT";
/// The leash cgroup root (a directory in the cgroup2 hierarchy the caller may write to).
pub const ENV_CGROUP_ROOT: &str = "LEASH_CGROUP_ROOT";
/// The leaf the daemon moves itself into, under the leash cgroup root (no-internal-processes
/// rule: the root's controllers can then be enabled for the session cgroups).
pub const DAEMON_LEAF: &str = "leash-daemon";

/// How long to wait for `populated 0` after `cgroup.kill` before reporting the cgroup as stuck.
pub const KILL_WAIT: Duration = Duration::from_secs(5);

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

/// What the operator asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Requested {
    /// Contain wherever leash can create cgroups; fall back to today's behaviour elsewhere.
    #[default]
    On,
    Off,
}

impl std::str::FromStr for Requested {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "on" | "auto" | "" => Ok(Requested::On),
            "off" => Ok(Requested::Off),
            other => Err(format!(
                "unknown containment mode '{other}' (expected on or off)"
            )),
        }
    }
}

/// The settings as given (flag, else environment).
#[derive(Debug, Clone, Default)]
pub struct Settings {
    pub requested: Requested,
    pub root: Option<PathBuf>,
}

impl Settings {
    /// Containment off.
    pub fn default_off() -> Settings {
        Settings {
            requested: Requested::Off,
            root: None,
        }
    }

    /// Reads `LEASH_CONTAINMENT` and `LEASH_CGROUP_ROOT`; an unreadable mode is an error.
    pub fn from_env() -> Result<Settings, String> {
        let requested = match std::env::var(ENV_CONTAINMENT) {
            Ok(v) => v.parse()?,
            Err(_) => Requested::On,
        };
        let root = std::env::var_os(ENV_CGROUP_ROOT)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from);
        Ok(Settings { requested, root })
    }
}

/// Whether containment is in effect here, where, and if not, why not. `leash status` prints it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Containment {
    /// `on`, `off` (turned off) or `unavailable` (asked for, but this host or user cannot).
    pub mode: String,
    /// The leash cgroup root.
    pub root: Option<PathBuf>,
    /// This gateway's directory under it: every lease cgroup is a direct child of it.
    pub gateway_root: Option<PathBuf>,
    /// The cgroup2 mount point.
    pub mount: Option<PathBuf>,
    /// Controllers available to the session cgroups (`cgroup.subtree_control` of the gateway's
    /// directory, else of the root).
    #[serde(default)]
    pub controllers: Vec<String>,
    pub reason: Option<String>,
}

impl Containment {
    pub fn is_on(&self) -> bool {
        self.mode == "on"
    }

    /// Not decided yet / not in use.
    pub fn default_off() -> Containment {
        Containment::off("off", "not resolved".into())
    }

    fn off(mode: &str, reason: String) -> Containment {
        Containment {
            mode: mode.into(),
            root: None,
            gateway_root: None,
            mount: None,
            controllers: Vec::new(),
            reason: Some(reason),
        }
    }

    /// Decides containment for this process: never fails; an unusable setup is reported as
    /// `unavailable` with the reason, and leash then behaves as it does without cgroups.
    pub fn resolve(settings: &Settings, gateway_id: &str) -> Containment {
        Containment::resolve_lean(settings, gateway_id).with_controllers()
    }

    /// The controllers available for limits, read now (one or two `cgroup.subtree_control`
    /// files): what a long-lived process that resolved the rest once re-reads for each report.
    pub fn with_controllers(mut self) -> Containment {
        if let (Some(root), Some(gw)) = (&self.root, &self.gateway_root) {
            self.controllers = read_list(&gw.join("cgroup.subtree_control"))
                .or_else(|| read_list(&root.join("cgroup.subtree_control")))
                .unwrap_or_default();
        }
        self
    }

    /// [`Containment::resolve`] without reading the controllers (what `leash exec` needs on
    /// every session start).
    pub fn resolve_lean(settings: &Settings, gateway_id: &str) -> Containment {
        if settings.requested == Requested::Off {
            return Containment::off(
                "off",
                "turned off (--containment off or LEASH_CONTAINMENT=off)".into(),
            );
        }
        let mountinfo = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let Some(mount) = cgroup2_mount(&mountinfo) else {
            return Containment::off(
                "unavailable",
                "no cgroup2 hierarchy is mounted (see /proc/self/mountinfo): cgroup v1 only".into(),
            );
        };
        let root = match &settings.root {
            Some(r) => {
                if !r.is_absolute() || !r.starts_with(&mount) || has_dots(r) {
                    let mut c = Containment::off(
                        "unavailable",
                        format!(
                            "{ENV_CGROUP_ROOT} {} is not an absolute path under the cgroup2 mount {}",
                            r.display(),
                            mount.display()
                        ),
                    );
                    c.mount = Some(mount);
                    return c;
                }
                r.clone()
            }
            None => {
                let own = fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
                match own_cgroup(&own) {
                    Some(rel) => default_root(&mount, &rel),
                    None => {
                        let mut c = Containment::off(
                            "unavailable",
                            "this process has no cgroup v2 membership (/proc/self/cgroup has no \
                             0:: line)"
                                .into(),
                        );
                        c.mount = Some(mount);
                        return c;
                    }
                }
            }
        };
        // Writable where the first directory would be made: the root itself, or its parent.
        let probe = if root.is_dir() {
            root.clone()
        } else {
            root.parent().map(Path::to_path_buf).unwrap_or(root.clone())
        };
        if let Err(e) = nix::unistd::access(&probe, nix::unistd::AccessFlags::W_OK) {
            let mut c = Containment::off(
                "unavailable",
                format!(
                    "cannot create cgroups in {} ({e}): run as root, or in a delegated subtree \
                     (systemd Delegate=yes), or set {ENV_CGROUP_ROOT}",
                    probe.display()
                ),
            );
            c.mount = Some(mount);
            c.root = Some(root);
            return c;
        }
        Containment {
            mode: "on".into(),
            gateway_root: Some(root.join(gateway_id)),
            root: Some(root),
            mount: Some(mount),
            controllers: Vec::new(),
            reason: None,
        }
    }
}

fn has_dots(p: &Path) -> bool {
    p.components()
        .any(|c| matches!(c, Component::ParentDir | Component::CurDir))
}

fn read_list(path: &Path) -> Option<Vec<String>> {
    let text = fs::read_to_string(path).ok()?;
    Some(text.split_whitespace().map(str::to_owned).collect())
}

/// The cgroup2 mount point in a `/proc/self/mountinfo` text: the first line whose filesystem type
/// (after the ` - ` separator) is `cgroup2`. Octal escapes in the mount point (`\040`) decoded.
pub fn cgroup2_mount(mountinfo: &str) -> Option<PathBuf> {
    for line in mountinfo.lines() {
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        if right.split_whitespace().next() != Some("cgroup2") {
            continue;
        }
        let mount = left.split_whitespace().nth(4)?;
        return Some(PathBuf::from(unescape_octal(mount)));
    }
    None
}

fn unescape_octal(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let oct = b.get(i + 1..i + 4);
        if b[i] == b'\\' && oct.is_some_and(|o| o.iter().all(|c| (b'0'..=b'7').contains(c))) {
            let o = oct.unwrap_or_default();
            let v =
                u32::from(o[0] - b'0') * 64 + u32::from(o[1] - b'0') * 8 + u32::from(o[2] - b'0');
            out.push(v as u8);
            i += 4;
            continue;
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The v2 path (`0::/a/b`) in a `/proc/<pid>/cgroup` text, relative to the mount.
pub fn own_cgroup(proc_cgroup: &str) -> Option<String> {
    proc_cgroup
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .map(|p| p.trim_end_matches(" (deleted)").to_string())
}

/// The default leash cgroup root for a process in cgroup `rel` (relative to `mount`).
pub fn default_root(mount: &Path, rel: &str) -> PathBuf {
    let rel = rel.trim_start_matches('/');
    let rel = rel
        .strip_suffix(DAEMON_LEAF)
        .map(|r| r.trim_end_matches('/'))
        .unwrap_or(rel);
    if rel.is_empty() {
        mount.join("leash")
    } else {
        mount.join(rel)
    }
}

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
    let mkdir = |p: &Path| fs::DirBuilder::new().mode(0o755).create(p);
    // First lease of this gateway (or of the root): make the directories above it. A daemon that
    // stops removes the gateway's directory when it is empty (`remove_gateway_dir_if_empty`), so
    // it can vanish between our mkdir of it and of the lease's: try again, a bounded number of
    // times.
    let mut attempts = 0;
    loop {
        match mkdir(&path) {
            Ok(()) => break,
            Err(e) if e.kind() == io::ErrorKind::NotFound && attempts < 3 => {
                attempts += 1;
                for dir in [gateway_root.parent(), Some(gateway_root)]
                    .into_iter()
                    .flatten()
                {
                    match mkdir(dir) {
                        Ok(()) => {}
                        Err(e) if e.kind() == io::ErrorKind::AlreadyExists && !dir.is_symlink() => {
                        }
                        Err(e) => return Err(create_err(dir, e)),
                    }
                }
            }
            Err(e) => return Err(create_err(&path, e)),
        }
    }
    let id = fs::symlink_metadata(&path)
        .map_err(|e| create_err(&path, e))?
        .ino();
    Ok((path, id))
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

fn open_dir(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
}

/// A file in the directory held open by `dir` (the magic link pins the very directory).
fn at(dir: &File, name: &str) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{}/{name}", dir.as_raw_fd()))
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

/// A lease's cgroup, opened and proven to be the one recorded (same path, same id).
#[derive(Debug)]
pub struct Verified {
    dir: File,
    path: PathBuf,
    id: u64,
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

    pub fn procs(&self) -> Vec<i32> {
        read_procs(&self.dir).unwrap_or_default()
    }

    pub fn populated(&self) -> bool {
        populated(&self.dir).unwrap_or_else(|| !self.procs().is_empty())
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

    /// CPU time and memory of the whole cgroup.
    pub fn usage(&self) -> Usage {
        usage_of(&self.dir)
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

fn write_file(path: &Path, value: &str) -> io::Result<()> {
    // O_TRUNC as a shell's `>` does: cgroupfs ignores it, a regular file needs it.
    let mut f = OpenOptions::new().write(true).truncate(true).open(path)?;
    f.write_all(value.as_bytes())
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

/// Per-session resource limits (`leash exec --memory-max … --pids-max … --cpu-max …`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Limits {
    /// Bytes (`memory.max`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_max: Option<u64>,
    /// `pids.max`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pids_max: Option<u64>,
    /// `cpu.max` as written: `"QUOTA PERIOD"` in microseconds, or `"max PERIOD"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_max: Option<String>,
}

impl Limits {
    pub fn is_empty(&self) -> bool {
        self.memory_max.is_none() && self.pids_max.is_none() && self.cpu_max.is_none()
    }

    /// (controller, flag) for each limit that is set.
    pub fn needs(&self) -> Vec<(&'static str, &'static str)> {
        let mut v = Vec::new();
        if self.memory_max.is_some() {
            v.push(("memory", "memory-max"));
        }
        if self.pids_max.is_some() {
            v.push(("pids", "pids-max"));
        }
        if self.cpu_max.is_some() {
            v.push(("cpu", "cpu-max"));
        }
        v
    }

    /// Refuses the limits that the controllers available here cannot enforce.
    pub fn check(&self, available: &[String], root: &Path) -> Result<(), CgroupError> {
        for (controller, limit) in self.needs() {
            if !available.iter().any(|c| c == controller) {
                return Err(CgroupError::ControllerMissing {
                    controller,
                    limit,
                    root: root.to_path_buf(),
                });
            }
        }
        Ok(())
    }

    /// Writes the limits into the cgroup directory `dir` (its `memory.max`, `pids.max`,
    /// `cpu.max`). Called on the fresh lease cgroup before anything runs in it.
    pub fn apply(&self, dir: &Path) -> Result<(), CgroupError> {
        let put = |file: &'static str, v: String| {
            write_file(&dir.join(file), &v).map_err(|source| CgroupError::Io {
                what: "set a limit on",
                path: dir.join(file),
                source,
            })
        };
        if let Some(m) = self.memory_max {
            put("memory.max", m.to_string())?;
        }
        if let Some(p) = self.pids_max {
            put("pids.max", p.to_string())?;
        }
        if let Some(c) = &self.cpu_max {
            put("cpu.max", c.clone())?;
        }
        Ok(())
    }
}

/// Parses a size: bytes, or with a K/M/G/T suffix (powers of 1024), e.g. `512M`; with a unit
/// the number may have a fraction (`1.5G` is 1536M; the bytes are rounded down).
pub fn parse_size(s: &str) -> Result<u64, CgroupError> {
    let bad = |why| CgroupError::BadLimit {
        flag: "--memory-max",
        value: s.to_string(),
        why,
    };
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let mul: u64 = match unit
        .to_ascii_uppercase()
        .trim_end_matches('B')
        .trim_end_matches('I')
    {
        "" => 1,
        "K" => 1 << 10,
        "M" => 1 << 20,
        "G" => 1 << 30,
        "T" => 1 << 40,
        _ => return Err(bad("unknown unit (use K, M, G or T)")),
    };
    let too_large = || bad("too large (at most 16383T)");
    let v = if num.contains('.') {
        if mul == 1 {
            return Err(bad(
                "a fraction of a byte: give whole bytes, or a unit (e.g. 1.5G)",
            ));
        }
        let n: f64 = num
            .parse()
            .map_err(|_| bad("expected a size such as 512M, 1.5G or 2G"))?;
        let bytes = n * mul as f64;
        // 2^64 itself is not a u64; every f64 below it converts exactly (rounded down).
        if !bytes.is_finite() || bytes >= 18_446_744_073_709_551_616.0 {
            return Err(too_large());
        }
        bytes as u64
    } else {
        let n: u64 = num.parse().map_err(|e: std::num::ParseIntError| {
            if matches!(e.kind(), std::num::IntErrorKind::PosOverflow) {
                too_large()
            } else {
                bad("expected a size such as 512M, 1.5G or 2G")
            }
        })?;
        n.checked_mul(mul).ok_or_else(too_large)?
    };
    if v == 0 {
        return Err(bad("must be more than 0"));
    }
    Ok(v)
}

/// The most CPUs `--cpu-max` takes (a quota of 4096 CPUs per 100 ms period).
const MAX_CPUS: f64 = 4096.0;

/// Parses `--cpu-max`: a number of CPUs (`0.5`, `2`), written as quota and a 100 ms period, or
/// the kernel's own form `QUOTA PERIOD` / `max PERIOD` in microseconds.
pub fn parse_cpu_max(s: &str) -> Result<String, CgroupError> {
    let bad = |why| CgroupError::BadLimit {
        flag: "--cpu-max",
        value: s.to_string(),
        why,
    };
    let t = s.trim();
    let parts: Vec<&str> = t.split_whitespace().collect();
    match parts.as_slice() {
        [cpus] => {
            let c: f64 = cpus
                .parse()
                .map_err(|_| bad("expected CPUs (e.g. 0.5) or 'QUOTA PERIOD' in microseconds"))?;
            if !(c.is_finite() && c > 0.0) {
                return Err(bad("CPUs must be more than 0"));
            }
            if c > MAX_CPUS {
                return Err(bad("at most 4096 CPUs"));
            }
            let quota = (c * 100_000.0).round().max(1_000.0) as u64;
            Ok(format!("{quota} 100000"))
        }
        [quota, period] => {
            let p: u64 = period
                .parse()
                .map_err(|_| bad("the period must be microseconds"))?;
            if !(1_000..=1_000_000).contains(&p) {
                return Err(bad("the period must be 1000..=1000000 microseconds"));
            }
            if *quota != "max" {
                let q: u64 = quota
                    .parse()
                    .map_err(|_| bad("the quota must be microseconds or max"))?;
                if q < 1_000 {
                    return Err(bad("the quota must be at least 1000 microseconds"));
                }
            }
            Ok(format!("{quota} {p}"))
        }
        _ => Err(bad("expected CPUs (e.g. 0.5) or 'QUOTA PERIOD'")),
    }
}

/// Moves the calling process into `<root>/leash-daemon` (created when needed), so that `root`
/// holds no process itself and controllers can be enabled for the session cgroups below it.
pub fn move_self_to_leaf(root: &Path) -> io::Result<PathBuf> {
    let leaf = root.join(DAEMON_LEAF);
    match fs::DirBuilder::new().mode(0o755).create(&leaf) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    write_file(&leaf.join("cgroup.procs"), "0")?;
    Ok(leaf)
}

/// Tries to enable the controllers the limits need for the session cgroups: in the root's and
/// the gateway directory's `cgroup.subtree_control`. Failures are left for [`Limits::check`] to
/// report with the fix.
pub fn enable_controllers(root: &Path, gateway_root: &Path, limits: &Limits) {
    for (controller, _) in limits.needs() {
        for dir in [root, gateway_root] {
            let _ = write_file(
                &dir.join("cgroup.subtree_control"),
                &format!("+{controller}"),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_cgroup2_mount_on_a_hybrid_host() {
        let text = "25 30 0:22 / /sys rw,nosuid shared:7 - sysfs sysfs rw\n\
                    31 25 0:26 / /sys/fs/cgroup ro shared:9 - tmpfs tmpfs ro,mode=755\n\
                    32 31 0:27 / /sys/fs/cgroup/unified rw shared:10 - cgroup2 cgroup2 rw\n\
                    33 31 0:28 / /sys/fs/cgroup/memory rw shared:11 - cgroup cgroup rw,memory\n";
        assert_eq!(
            cgroup2_mount(text),
            Some(PathBuf::from("/sys/fs/cgroup/unified"))
        );
        assert_eq!(
            cgroup2_mount("33 31 0:28 / /x rw - cgroup cgroup rw\n"),
            None
        );
        let spaced = "1 2 0:3 / /mnt/cg\\040two rw - cgroup2 cgroup2 rw\n";
        assert_eq!(cgroup2_mount(spaced), Some(PathBuf::from("/mnt/cg two")));
    }

    #[test]
    fn default_root_strips_the_daemon_leaf_and_avoids_the_root_cgroup() {
        let m = Path::new("/sys/fs/cgroup");
        assert_eq!(default_root(m, "/"), PathBuf::from("/sys/fs/cgroup/leash"));
        assert_eq!(
            default_root(m, "/system.slice/gw.service"),
            PathBuf::from("/sys/fs/cgroup/system.slice/gw.service")
        );
        assert_eq!(
            default_root(m, "/system.slice/gw.service/leash-daemon"),
            PathBuf::from("/sys/fs/cgroup/system.slice/gw.service")
        );
        assert_eq!(own_cgroup("1:cpu:/\n0::/a/b\n").as_deref(), Some("/a/b"));
        assert_eq!(own_cgroup("1:cpu:/\n"), None);
    }

    #[test]
    fn modes_parse() {
        assert_eq!("off".parse::<Requested>().unwrap(), Requested::Off);
        assert_eq!("ON".parse::<Requested>().unwrap(), Requested::On);
        assert!("maybe".parse::<Requested>().is_err());
    }

    #[test]
    fn sizes_and_cpu_parse_and_bad_ones_are_refused() {
        assert_eq!(parse_size("512M").unwrap(), 512 << 20);
        assert_eq!(parse_size("2G").unwrap(), 2 << 30);
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("1GiB").unwrap(), 1 << 30);
        for bad in ["", "0", "-1", "12Q", "99999999999999T"] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
        assert_eq!(parse_cpu_max("0.5").unwrap(), "50000 100000");
        assert_eq!(parse_cpu_max("max 100000").unwrap(), "max 100000");
        assert_eq!(parse_cpu_max("20000 100000").unwrap(), "20000 100000");
        for bad in [
            "0",
            "-1",
            "nan",
            "x 100000",
            "100 100000",
            "1 2 3",
            "50000 10",
        ] {
            assert!(parse_cpu_max(bad).is_err(), "{bad}");
        }
    }

    /// Decimal sizes with a unit are sizes, and each refusal says what is wrong with the value:
    /// `1.5G` once said "unknown unit", `--cpu-max 1000000000000` "CPUs must be more than 0".
    #[test]
    fn decimal_sizes_parse_and_refusals_name_the_real_problem() {
        assert_eq!(parse_size("1.5G").unwrap(), 1536 << 20);
        assert_eq!(parse_size("0.5M").unwrap(), 512 << 10);
        assert_eq!(parse_size("2.25GiB").unwrap(), (9 << 30) / 4);
        assert_eq!(parse_size("1.0001K").unwrap(), 1024);
        let why = |s: &str| parse_size(s).unwrap_err().to_string();
        assert!(why("1.5").contains("fraction of a byte"), "{}", why("1.5"));
        assert!(why("99999999999999T").contains("too large"));
        assert!(why("99999999999999999999999").contains("too large"));
        assert!(why("99999999.5T").contains("too large"));
        assert!(why("1.2.3G").contains("expected a size"));
        assert!(why("12Q").contains("unknown unit"));
        let cpu = |s: &str| parse_cpu_max(s).unwrap_err().to_string();
        assert!(
            cpu("1000000000000").contains("at most 4096 CPUs"),
            "{}",
            cpu("1000000000000")
        );
        assert!(cpu("0").contains("more than 0"));
        assert_eq!(parse_cpu_max("4096").unwrap(), "409600000 100000");
    }

    #[test]
    fn limits_write_memory_max_into_a_cgroup_directory() {
        // A fake cgroup directory: on this host the v2 hierarchy has no memory controller, so
        // the write path is exercised against plain files with the kernel's names.
        let dir = std::env::temp_dir().join(format!("leash-fake-cg-{}", uuid::Uuid::new_v4()));
        fs::create_dir_all(&dir).unwrap();
        for f in ["memory.max", "pids.max", "cpu.max"] {
            fs::write(dir.join(f), "max\n").unwrap();
        }
        let limits = Limits {
            memory_max: Some(parse_size("256M").unwrap()),
            pids_max: Some(64),
            cpu_max: Some(parse_cpu_max("1.5").unwrap()),
        };
        limits.apply(&dir).unwrap();
        assert_eq!(
            fs::read_to_string(dir.join("memory.max")).unwrap(),
            "268435456"
        );
        assert_eq!(fs::read_to_string(dir.join("pids.max")).unwrap(), "64");
        assert_eq!(
            fs::read_to_string(dir.join("cpu.max")).unwrap(),
            "150000 100000"
        );
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_missing_controller_is_refused_with_the_fix() {
        let limits = Limits {
            memory_max: Some(1 << 20),
            ..Limits::default()
        };
        let err = limits
            .check(&["cpu".into()], Path::new("/sys/fs/cgroup/x"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("memory controller"), "{err}");
        assert!(err.contains("Delegate=yes"), "{err}");
        assert!(limits.check(&["memory".into()], Path::new("/x")).is_ok());
    }
}
