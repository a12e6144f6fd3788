//! A small filesystem of the test's own, for what a full disk does: a tmpfs mounted where the
//! test says (root only), filled to the last byte on request, unmounted when the guard drops.

use super::wait_for_within;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A tmpfs mounted by this test; unmounted on drop (lazily if something still holds it).
pub struct Tmpfs(pub PathBuf);

impl Tmpfs {
    /// Mounts a tmpfs of `size` (mount's syntax: `8m`) at `at`, made if missing, mode 0700.
    /// `None` when the mount fails (not root, no tmpfs).
    pub fn mount(at: &Path, size: &str) -> Option<Tmpfs> {
        std::fs::create_dir_all(at).unwrap();
        let ok = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0700"),
                "tmpfs",
            ])
            .arg(at)
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        ok.then(|| Tmpfs(at.to_path_buf()))
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let umount = |lazy: bool| {
            let mut c = Command::new("umount");
            if lazy {
                c.arg("-l");
            }
            c.arg(&self.0)
                .status()
                .map(|s| s.success())
                .unwrap_or(false)
        };
        if !wait_for_within(std::time::Duration::from_secs(10), || umount(false)) {
            umount(true);
        }
    }
}

/// Fills the filesystem of `dir` with one file, `dir/filler`, until it takes no byte more
/// (smaller and smaller writes, down to one byte); returns the file, whose removal gives the
/// room back.
pub fn fill(dir: &Path) -> PathBuf {
    let p = dir.join("filler");
    let mut f = std::fs::File::create(&p).unwrap();
    for chunk in [1 << 16, 1 << 12, 512, 1] {
        let buf = vec![0u8; chunk];
        while f.write_all(&buf).is_ok() {}
    }
    let _ = f.flush();
    p
}
