//! Process plumbing for the benchmarks: guards that clean up everything a benchmark started (and
//! only that: by pid *and* start time, through leash's own pidfd-checked signalling), polling
//! with deadlines, the few `/proc` reads the measurements need (RSS, children, exe), and the
//! environment that gives a `leash` command its containment settings.

use leash::proc::{LiveTable, ProcessTable};
use leash::signal::{self, CurrentCaller};
use leash_core::guard::{Caller, Sig};
use leash_core::model::ProcessId;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

/// Polls `cond` until it holds or `patience` passes. Returns whether it held.
pub fn wait_for(patience: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + patience;
    let mut nap = Duration::from_micros(200);
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(nap);
        nap = (nap * 2).min(Duration::from_millis(20));
    }
}

pub fn start_time(pid: i32) -> Option<u64> {
    LiveTable.process(pid).ok().flatten().map(|p| p.start_time)
}

pub fn id_of(pid: i32) -> Option<ProcessId> {
    start_time(pid).map(|start_time| ProcessId { pid, start_time })
}

/// Children of `pid` (every thread's `children` file).
pub fn children_of(pid: i32) -> Vec<i32> {
    let mut out = Vec::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return out;
    };
    for t in tasks.flatten() {
        if let Ok(text) = std::fs::read_to_string(t.path().join("children")) {
            out.extend(
                text.split_whitespace()
                    .filter_map(|s| s.parse::<i32>().ok()),
            );
        }
    }
    out
}

pub fn exe_of(pid: i32) -> Option<PathBuf> {
    std::fs::read_link(format!("/proc/{pid}/exe")).ok()
}

/// The single-letter state of a process (`S`, `R`, `Z`, ...).
pub fn state_of(pid: i32) -> Option<char> {
    LiveTable.process(pid).ok().flatten().map(|p| p.state)
}

/// Resident memory of one process, in KiB.
#[derive(Debug, Clone, Copy, Default)]
pub struct Rss {
    /// `VmRSS`: every page mapped, shared ones (libc, the binary) counted in full.
    pub rss: f64,
    pub anon: f64,
    pub file: f64,
    /// `Pss` from `smaps_rollup`: shared pages divided among the processes that map them.
    pub pss: f64,
}

pub fn rss_of(pid: i32) -> Option<Rss> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let rollup = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).ok()?;
    let field = |text: &str, key: &str| -> Option<f64> {
        text.lines()
            .find(|l| l.starts_with(key))?
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()
    };
    Some(Rss {
        rss: field(&status, "VmRSS:")?,
        anon: field(&status, "RssAnon:")?,
        file: field(&status, "RssFile:")?,
        pss: field(&rollup, "Pss:")?,
    })
}

/// How an ELF executable is linked: `Some(true)` when it asks for a program interpreter
/// (dynamic), `Some(false)` for a static executable, `None` when it is not a 64-bit ELF.
pub fn elf_is_dynamic(path: &Path) -> Option<bool> {
    let data = std::fs::read(path).ok()?;
    if data.len() < 64 || &data[..4] != b"\x7fELF" || data[4] != 2 {
        return None;
    }
    let u16_at = |o: usize| u16::from_le_bytes([data[o], data[o + 1]]) as usize;
    let phoff = u64::from_le_bytes(data[0x20..0x28].try_into().ok()?) as usize;
    let phentsize = u16_at(0x36);
    let phnum = u16_at(0x38);
    for i in 0..phnum {
        let o = phoff + i * phentsize;
        let ty = u32::from_le_bytes(data.get(o..o + 4)?.try_into().ok()?);
        if ty == 3 {
            return Some(true); // PT_INTERP
        }
    }
    Some(false)
}

/// A program on `PATH`, resolved to a real file.
pub fn which(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .and_then(|p| std::fs::canonicalize(p).ok())
}

/// Processes a benchmark started, pinned by pid and start time. Whatever of them is still alive
/// when the guard drops gets SIGKILL through leash's signalling module, which re-checks the start
/// time through a pidfd first: a recycled pid is never touched.
#[derive(Default)]
pub struct Tracked {
    ids: Vec<ProcessId>,
}

impl Tracked {
    pub fn new() -> Tracked {
        Tracked::default()
    }

    pub fn add(&mut self, id: ProcessId) {
        self.ids.push(id);
    }

    /// Tracks `pid` if it is alive now.
    pub fn add_pid(&mut self, pid: i32) {
        if let Some(id) = id_of(pid) {
            self.add(id);
        }
    }

    /// Tracks `root` and everything below it right now.
    pub fn add_tree(&mut self, root: i32) {
        if let Ok(snap) = LiveTable.subtree(root) {
            for p in snap.iter() {
                self.add(p.id());
            }
        }
    }

    /// SIGKILLs what is still alive and forgets everything.
    pub fn kill_all(&mut self) -> usize {
        let caller = Caller::current();
        let mut n = 0;
        // Deepest (newest) first, so parents are not left to re-spawn.
        for id in self.ids.drain(..).rev() {
            if let Ok(Some(p)) = signal::pin(&LiveTable, &caller, id) {
                if signal::send(&p, Sig::Kill).is_ok() {
                    n += 1;
                }
            }
        }
        n
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        let n = self.kill_all();
        if n > 0 {
            eprintln!("leash-bench: cleanup killed {n} leftover process(es) of this benchmark");
        }
    }
}

/// Our own children: killed (SIGKILL to an unreaped child, whose pid cannot have been recycled)
/// and reaped when the guard drops.
#[derive(Default)]
pub struct Children {
    pub list: Vec<Child>,
}

impl Children {
    pub fn new() -> Children {
        Children::default()
    }

    pub fn push(&mut self, c: Child) {
        self.list.push(c);
    }

    pub fn len(&self) -> usize {
        self.list.len()
    }

    /// Starts `sleep 3600`s (unrelated processes for the busy-host rounds) until `n` children
    /// are held.
    pub fn grow_sleepers(&mut self, sleep: &Path, n: usize) -> Result<(), String> {
        while self.len() < n {
            let c = std::process::Command::new(sleep)
                .arg("3600")
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .map_err(|e| format!("starting unrelated process {}: {e}", self.len() + 1))?;
            self.push(c);
        }
        Ok(())
    }

    /// Reaps every child, waiting up to `patience` for each to exit by itself, then kills the
    /// rest. Returns how many had to be killed.
    pub fn finish(&mut self, patience: Duration) -> usize {
        let deadline = Instant::now() + patience;
        let mut killed = 0;
        for mut c in self.list.drain(..) {
            let done = wait_for(deadline.saturating_duration_since(Instant::now()), || {
                matches!(c.try_wait(), Ok(Some(_)))
            });
            if !done {
                let _ = c.kill();
                killed += 1;
            }
            let _ = c.wait();
        }
        killed
    }
}

impl Drop for Children {
    fn drop(&mut self) {
        for c in &mut self.list {
            let _ = c.kill();
        }
        for mut c in self.list.drain(..) {
            let _ = c.wait();
        }
    }
}

/// Sends SIGTERM to our own unreaped child.
pub fn term_child(c: &Child) {
    // The child is unreaped while we hold it without waiting, so its pid is still its own.
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(c.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
}

/// A scratch directory removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        let p = std::env::temp_dir().join(format!(
            "leash-bench-{tag}-{}-{}",
            std::process::id(),
            uuid::Uuid::new_v4().simple()
        ));
        std::fs::create_dir_all(&p).expect("create a scratch directory");
        TempDir(p)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The environment that gives a `leash` command these settings.
pub fn env_of(s: &leash::cgroup::Settings) -> Vec<(&'static str, std::ffi::OsString)> {
    let mut v = vec![(
        "LEASH_CONTAINMENT",
        match s.requested {
            leash::cgroup::Requested::On => "on".into(),
            leash::cgroup::Requested::Off => "off".into(),
        },
    )];
    if let Some(r) = &s.root {
        v.push(("LEASH_CGROUP_ROOT", r.clone().into_os_string()));
    }
    v
}
