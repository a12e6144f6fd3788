//! Where leash's cgroups live: the cgroup2 mount, the leash cgroup root (flag, environment or
//! the caller's own cgroup), the gateway's directory under it, and the daemon's own leaf.

use super::files::write_file;
use serde::{Deserialize, Serialize};
use std::fs;
use std::io;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Component, Path, PathBuf};

/// `on` (the default: contain wherever cgroups can be created) or `off`.
pub const ENV_CONTAINMENT: &str = "LEASH_CONTAINMENT";
/// The leash cgroup root (a directory in the cgroup2 hierarchy the caller may write to).
pub const ENV_CGROUP_ROOT: &str = "LEASH_CGROUP_ROOT";
/// The leaf the daemon moves itself into, under the leash cgroup root (no-internal-processes
/// rule: the root's controllers can then be enabled for the session cgroups).
pub const DAEMON_LEAF: &str = "leash-daemon";

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

    /// What these settings make of a process's environment, so that what it runs sees them the
    /// same way: the mode set, the cgroup root set or removed. The CLI sets them into its own
    /// (`leash exec`'s wrapper and adapter inherit it).
    pub fn env(&self) -> [(&'static str, Option<std::ffi::OsString>); 2] {
        let mode = match self.requested {
            Requested::On => "on",
            Requested::Off => "off",
        };
        [
            (ENV_CONTAINMENT, Some(mode.into())),
            (ENV_CGROUP_ROOT, self.root.clone().map(Into::into)),
        ]
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

/// A containment mode and its cgroup root in the protocol's words (`containment.mode`,
/// `containment.root`), for messages: `containment on (cgroup root /sys/fs/cgroup/leash)`,
/// `containment off (no cgroup root)`.
pub fn describe(mode: &str, root: Option<&Path>) -> String {
    match root {
        Some(r) => format!("containment {mode} (cgroup root {})", r.display()),
        None => format!("containment {mode} (no cgroup root)"),
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
        let proc = Path::new("/proc/self");
        if settings.requested == Requested::Off {
            return Containment::off(
                "off",
                "turned off (--containment off or LEASH_CONTAINMENT=off)".into(),
            );
        }
        // Read up to the first cgroup2 line only: the kernel renders the whole table for a full
        // read (8 ms at 5,000 mounts, a container host's), where the cgroup2 mount comes early.
        let mount = fs::File::open(proc.join("mountinfo"))
            .ok()
            .and_then(|f| cgroup2_mount_in(std::io::BufReader::new(f)));
        let Some(mount) = mount else {
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
                let own = crate::sys::read_proc(proc.join("cgroup"))
                    .ok()
                    .and_then(|b| String::from_utf8(b).ok())
                    .unwrap_or_default();
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
    cgroup2_mount_in(mountinfo.as_bytes())
}

/// [`cgroup2_mount`] over a reader, which is read no further than the first `cgroup2` line: the
/// cost follows where the mount is listed, not how many mounts the host has. A line that is not
/// UTF-8 (mount points are bytes) is read lossily and does not stop the search.
pub fn cgroup2_mount_in(mut mountinfo: impl std::io::BufRead) -> Option<PathBuf> {
    let mut raw = Vec::new();
    loop {
        raw.clear();
        if mountinfo.read_until(b'\n', &mut raw).ok()? == 0 {
            return None;
        }
        let line = String::from_utf8_lossy(&raw);
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        if right.split_whitespace().next() != Some("cgroup2") {
            continue;
        }
        let mount = left.split_whitespace().nth(4)?;
        return Some(PathBuf::from(unescape_octal(mount)));
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mount_table_is_read_no_further_than_the_cgroup2_line() {
        use std::io::Read;
        let mut text = String::new();
        for i in 0..10 {
            text.push_str(&format!(
                "{i} 1 0:{i} / /sys/fs/cgroup/c{i} rw - cgroup cgroup rw\n"
            ));
        }
        text.push_str("60 50 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n");
        let head = text.len();
        for i in 0..5000 {
            text.push_str(&format!("{i} 1 0:99 / /var/lib/x/{i} rw - tmpfs none rw\n"));
        }
        /// Counts what was read from the text.
        struct Counted<'a>(&'a [u8], usize);
        impl Read for Counted<'_> {
            fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
                let n = self.0.read(buf)?;
                self.1 += n;
                Ok(n)
            }
        }
        let mut src = Counted(text.as_bytes(), 0);
        let reader = std::io::BufReader::with_capacity(4096, &mut src);
        assert_eq!(
            cgroup2_mount_in(reader),
            Some(PathBuf::from("/sys/fs/cgroup/unified"))
        );
        assert!(
            src.1 < head + 4096,
            "read {} of {} bytes",
            src.1,
            text.len()
        );
        // A line that is not UTF-8 before it does not hide it.
        let mut bytes = b"1 1 0:1 / /mnt/\xff rw - ext4 /dev/x rw\n".to_vec();
        bytes.extend_from_slice(b"2 1 0:2 / /cg rw - cgroup2 cgroup2 rw\n");
        assert_eq!(cgroup2_mount_in(&bytes[..]), Some(PathBuf::from("/cg")));
    }

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
}
