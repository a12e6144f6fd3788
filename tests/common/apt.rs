//! Debian tools some tests need (`systemd-socket-activate`, `systemd-analyze`, `promtool`): found
//! on PATH, or installed with apt-get on first use (`apt-get update` first), one installer at a
//! time across test threads and test binaries (an exclusive flock on a file under the target
//! directory). A machine where the tool cannot be installed (not root, no apt) gets `Err` and
//! the test says why it skipped; where it can, a failed install fails the test.

use std::path::PathBuf;
use std::process::Command;

fn on_path(binary: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(binary))
            .find(|p| p.is_file())
    })
}

/// The path of `binary`, installing Debian `package` if it is missing. `Err` says why not.
pub fn tool(binary: &str, package: &str) -> Result<PathBuf, String> {
    if let Some(p) = on_path(binary) {
        return Ok(p);
    }
    if !super::is_root() {
        return Err(format!(
            "{binary} is missing and installing {package} needs root"
        ));
    }
    if on_path("apt-get").is_none() {
        return Err(format!(
            "{binary} is missing and there is no apt-get to install {package}"
        ));
    }
    let lock_path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("apt-install.lock");
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(|e| format!("cannot open {}: {e}", lock_path.display()))?;
    let _held = nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockExclusive)
        .map_err(|(_, e)| format!("cannot lock {}: {e}", lock_path.display()))?;
    // Another test may have installed it while we waited for the lock.
    if let Some(p) = on_path(binary) {
        return Ok(p);
    }
    eprintln!("installing Debian package {package} for {binary} (once per machine)");
    let apt = |args: &[&str]| {
        Command::new("apt-get")
            .args(args)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .output()
            .map_err(|e| format!("apt-get: {e}"))
            .and_then(|o| {
                if o.status.success() {
                    Ok(())
                } else {
                    Err(format!(
                        "apt-get {args:?} failed: {}",
                        String::from_utf8_lossy(&o.stderr)
                    ))
                }
            })
    };
    // From here on we can install, so a failure fails the test (a skip would hide a broken
    // install step on a fresh machine).
    let must = |r: Result<(), String>| r.unwrap_or_else(|e| panic!("installing {package}: {e}"));
    must(apt(&["update", "-q"]));
    must(apt(&[
        "install",
        "-y",
        "-q",
        "--no-install-recommends",
        package,
    ]));
    Ok(
        on_path(binary)
            .unwrap_or_else(|| panic!("{package} installed but {binary} is not on PATH")),
    )
}

/// The path of `binary` from Debian `package`, unpacked (not installed) under the target
/// directory on first use: for tools like promtool whose package would also install and start
/// a service. Needs `apt-get` and `dpkg-deb`, not root for the unpacking itself.
pub fn unpacked(binary: &str, package: &str) -> Result<PathBuf, String> {
    if let Some(p) = on_path(binary) {
        return Ok(p);
    }
    let base = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("debian-tools");
    let want = base.join(package).join("usr/bin").join(binary);
    if want.is_file() {
        return Ok(want);
    }
    if on_path("apt-get").is_none() || on_path("dpkg-deb").is_none() {
        return Err(format!(
            "{binary} is missing and there is no apt-get/dpkg-deb to fetch {package}"
        ));
    }
    std::fs::create_dir_all(&base).map_err(|e| format!("{}: {e}", base.display()))?;
    let lock_path = base.join("fetch.lock");
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(|e| format!("cannot open {}: {e}", lock_path.display()))?;
    let _held = nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockExclusive)
        .map_err(|(_, e)| format!("cannot lock {}: {e}", lock_path.display()))?;
    if want.is_file() {
        return Ok(want);
    }
    eprintln!("fetching Debian package {package} for {binary} (once per target directory)");
    let run = |cmd: &mut Command| {
        let o = cmd.output().map_err(|e| format!("{cmd:?}: {e}"))?;
        if o.status.success() {
            Ok(())
        } else {
            Err(format!(
                "{cmd:?} failed: {}",
                String::from_utf8_lossy(&o.stderr)
            ))
        }
    };
    let download = || {
        run(Command::new("apt-get")
            .args(["download", "-q", package])
            .current_dir(&base))
    };
    if download().is_err() {
        if !super::is_root() {
            return Err(format!(
                "apt-get download {package} failed and apt-get update needs root"
            ));
        }
        run(Command::new("apt-get").args(["update", "-q"]))
            .unwrap_or_else(|e| panic!("fetching {package}: {e}"));
        download().unwrap_or_else(|e| panic!("fetching {package}: {e}"));
    }
    let deb = std::fs::read_dir(&base)
        .map_err(|e| e.to_string())?
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(&format!("{package}_")) && n.ends_with(".deb"))
        })
        .ok_or_else(|| {
            format!(
                "apt-get download {package} left no .deb in {}",
                base.display()
            )
        })
        .unwrap_or_else(|e| panic!("{e}"));
    run(Command::new("dpkg-deb")
        .arg("-x")
        .arg(&deb)
        .arg(base.join(package)))
    .unwrap_or_else(|e| panic!("unpacking {package}: {e}"));
    let _ = std::fs::remove_file(&deb);
    assert!(want.is_file(), "{package} has no usr/bin/{binary}");
    Ok(want)
}
