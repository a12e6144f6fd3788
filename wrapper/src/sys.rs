//! Every syscall the wrapper makes, each behind a small safe function. All `unsafe` of the wrapper
//! lives here; each block states what it relies on.

use std::ffi::{CString, OsString};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::time::Duration;

pub type Fd = OwnedFd;

/// The process entry point (the crate is `#![no_main]`). std's own start-up would install a
/// stack-overflow handler: an alternate signal stack, plus `pthread_getattr_np`, which opens and
/// parses `/proc/self/maps` with scanf. That is ~15 syscalls on every session start, and in the
/// static build it links glibc's stdio and scanf, ~140 kB that end up resident. The wrapper
/// needs two things of that start-up, done here: fds 0-2 open (so nothing it opens lands on
/// them) and SIGPIPE ignored (a vanished stderr reader must not kill it). `std::env::args_os`
/// works as before: glibc hands argv to std through `.init_array`, not through `main`.
#[cfg(not(test))]
#[export_name = "main"]
extern "C" fn c_main(_argc: libc::c_int, _argv: *const *const libc::c_char) -> libc::c_int {
    open_standard_fds();
    // SAFETY: setting a disposition to SIG_IGN runs no code of ours. `spawn` gives the adapter
    // SIGPIPE's default back before its exec.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) };
    crate::main()
}

/// Opens /dev/null on each of fds 0-2 that is closed, as std's start-up would.
#[cfg(not(test))]
fn open_standard_fds() {
    let mut fds = [0, 1, 2].map(|fd| libc::pollfd {
        fd,
        events: 0,
        revents: 0,
    });
    // SAFETY: fds is a live array of three pollfd; open gets a NUL-terminated literal. Opening
    // in fd order fills the lowest closed fd first, which is the one POLLNVAL named.
    unsafe {
        if libc::poll(fds.as_mut_ptr(), 3, 0) == -1 {
            return;
        }
        for p in &fds {
            if p.revents & libc::POLLNVAL != 0 {
                libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
            }
        }
    }
}

fn last_err() -> io::Error {
    io::Error::last_os_error()
}

fn cvt(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret == -1 {
        Err(last_err())
    } else {
        Ok(ret)
    }
}

const FORWARDED: [libc::c_int; 4] = [libc::SIGTERM, libc::SIGINT, libc::SIGHUP, libc::SIGQUIT];

/// Blocks the signals we handle and returns a `signalfd` that delivers them. Blocked signals are
/// unblocked again in the adapter by std's spawn, which resets the child's mask before exec.
pub fn configure_signals() -> io::Result<Fd> {
    // SAFETY: `set` is initialised by sigemptyset before any other use; all pointers are to
    // locals that outlive the calls.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        cvt(libc::sigemptyset(&mut set))?;
        for sig in FORWARDED.iter().chain(&[libc::SIGCHLD]) {
            cvt(libc::sigaddset(&mut set, *sig))?;
        }
        let rc = libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        if rc != 0 {
            return Err(io::Error::from_raw_os_error(rc));
        }
        let fd = cvt(libc::signalfd(
            -1,
            &set,
            libc::SFD_CLOEXEC | libc::SFD_NONBLOCK,
        ))?;
        Ok(OwnedFd::from_raw_fd(fd))
    }
}

/// Reads every pending signal from the signalfd.
pub fn read_signals(fd: &Fd) -> Vec<i32> {
    let mut out = Vec::new();
    loop {
        // SAFETY: signalfd_siginfo is plain old data; zeroed is a valid value.
        let mut info: libc::signalfd_siginfo = unsafe { std::mem::zeroed() };
        let size = std::mem::size_of::<libc::signalfd_siginfo>();
        // SAFETY: we pass a pointer to `info` and exactly its size.
        let n = unsafe {
            libc::read(
                fd.as_raw_fd(),
                (&mut info as *mut libc::signalfd_siginfo).cast(),
                size,
            )
        };
        if n as usize != size {
            break; // EAGAIN: drained (or EINTR: the next poll comes back here)
        }
        out.push(info.ssi_signo as i32);
    }
    out
}

/// Makes orphaned descendants re-parent to this process instead of init, so they can be found,
/// signalled and reaped here (prctl(2), PR_SET_CHILD_SUBREAPER).
pub fn set_child_subreaper() -> io::Result<()> {
    // SAFETY: plain prctl with integer arguments.
    cvt(unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) }).map(|_| ())
}

/// Gives the CPU to whatever else is runnable on it (sched_yield(2)); returns at once when
/// nothing is.
pub fn yield_cpu() {
    // SAFETY: sched_yield takes no arguments and cannot fail on Linux.
    unsafe { libc::sched_yield() };
}

pub fn getppid() -> i32 {
    // SAFETY: getppid cannot fail.
    unsafe { libc::getppid() }
}

fn getpid() -> i32 {
    // SAFETY: getpid cannot fail.
    unsafe { libc::getpid() }
}

/// `pidfd_open(2)`: a handle on one process instance that a recycled pid cannot alias.
pub fn pidfd_open(pid: i32) -> io::Result<Fd> {
    // SAFETY: raw syscall with integer arguments; on success it returns a new fd that we own.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(last_err());
    }
    // SAFETY: the kernel just gave us this fd; nobody else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) })
}

fn pidfd_send(fd: &Fd, sig: i32, flags: libc::c_uint) -> io::Result<()> {
    // SAFETY: raw syscall; a null siginfo means "as kill(2) would send it".
    let rc = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            fd.as_raw_fd(),
            sig,
            std::ptr::null::<libc::siginfo_t>(),
            flags,
        )
    };
    if rc < 0 {
        Err(last_err())
    } else {
        Ok(())
    }
}

/// Signals the process behind the pidfd. ESRCH (already exited) is not an error worth telling.
pub fn pidfd_signal(fd: &Fd, sig: i32) {
    let _ = pidfd_send(fd, sig, 0);
}

/// Signals the whole process group led by the process behind the pidfd (Linux >= 6.9).
pub fn pidfd_signal_group(fd: &Fd, sig: i32) -> io::Result<()> {
    pidfd_send(fd, sig, libc::PIDFD_SIGNAL_PROCESS_GROUP)
}

/// `killpg`, refusing the ids that would hit everything or ourselves.
pub fn killpg(pgid: i32, sig: i32) {
    // SAFETY: getpgrp cannot fail.
    let own = unsafe { libc::getpgrp() };
    if pgid <= 1 || pgid == own {
        return;
    }
    // SAFETY: plain kill(2) on a negative id (a group); the guard above excludes -1 and 0.
    unsafe {
        libc::kill(-pgid, sig);
    }
}

/// True when stdin is a terminal whose foreground group is ours.
pub fn owns_foreground_tty() -> bool {
    // SAFETY: isatty/tcgetpgrp/getpgrp only read process and fd state.
    unsafe { libc::isatty(0) == 1 && libc::tcgetpgrp(0) == libc::getpgrp() }
}

/// Starts `cmd` (searched on PATH like `execvp`) as the adapter and returns its pid. Before its
/// exec the child leads a new process group, gets the default signal mask and SIGPIPE
/// disposition, takes the terminal's foreground when `hand_tty`, and arms PR_SET_PDEATHSIG:
/// the kernel SIGKILLs it if the wrapper dies, even by SIGKILL. That signal is never sent if the
/// wrapper died before the call, so `getppid()` is re-checked right after it (ESRCH when it
/// changed): that closes the race.
///
/// The child shares our memory until it execs (`clone(CLONE_VM | CLONE_VFORK)`, as glibc's
/// posix_spawn does, which itself cannot arm PR_SET_PDEATHSIG): no page tables are copied and no
/// copy-on-write faults follow. Against std's fork (what std takes once a `pre_exec` hook is set)
/// that is ~0.1 ms per start on a quiet machine, and std's spawn machinery is not linked
/// (~50 kB of the static binary); see docs/benchmarks.md. While the child runs we are suspended,
/// so it may use our memory: it runs on its own stack, makes only async-signal-safe calls that
/// neither allocate nor lock, and reports a failure by storing its errno in `ChildArgs` before
/// `_exit`.
pub fn spawn(
    cmd: &[OsString],
    wrapper_pid: i32,
    hand_tty: bool,
    cgroup: Option<&Cgroup>,
) -> Result<i32, SpawnError> {
    spawn_steps(cmd, wrapper_pid, hand_tty, cgroup).map_err(|e| match e.raw_os_error() {
        Some(n) if n & CGROUP_STEP != 0 => {
            SpawnError::Cgroup(io::Error::from_raw_os_error(n & !CGROUP_STEP))
        }
        _ => SpawnError::Start(e),
    })
}

/// Why [`spawn`] started no adapter: the step that failed, with its error.
#[derive(Debug)]
pub enum SpawnError {
    /// Placing the child in the lease's cgroup (clone3's CLONE_INTO_CGROUP, or the child's write
    /// of `cgroup.procs`): the kernel refused the move (EACCES: no write access to
    /// `cgroup.procs` of the common ancestor of the two cgroups), or the cgroup is gone or full.
    Cgroup(io::Error),
    /// Anything else: the clone, the child's set-up, the exec.
    Start(io::Error),
}

/// Marks an errno as one of the cgroup step, where [`spawn_steps`] and the child pass errnos
/// (errnos are below 4096).
const CGROUP_STEP: i32 = 0x1_0000;

fn spawn_steps(
    cmd: &[OsString],
    wrapper_pid: i32,
    hand_tty: bool,
    cgroup: Option<&Cgroup>,
) -> io::Result<i32> {
    let args = cmd
        .iter()
        .map(|a| CString::new(a.as_bytes()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                "an argument contains a NUL byte",
            )
        })?;
    if args.is_empty() {
        return Err(io::Error::from_raw_os_error(libc::ENOENT));
    }
    let mut argv: Vec<*const libc::c_char> = args.iter().map(|a| a.as_ptr()).collect();
    argv.push(std::ptr::null());
    let mut errno_cell: i32 = 0;
    let mut child = ChildArgs {
        file: args[0].as_ptr(),
        argv: argv.as_ptr(),
        wrapper_pid,
        hand_tty,
        procs_path: std::ptr::null(),
        errno: &mut errno_cell,
    };
    if let Some(cg) = cgroup {
        if !cg.force_procs_write {
            match spawn_into_cgroup(&mut child, cg) {
                // clone3 or CLONE_INTO_CGROUP unknown (Linux < 5.7): the fallback below.
                Err(e) if clone3_unknown(e.raw_os_error()) => {}
                r => return r,
            }
        }
        // The child joins the cgroup itself (cgroup.procs) before it execs.
        child.procs_path = cg.procs_path.as_ptr();
        child.errno = &mut errno_cell;
    }
    // execvp may copy argv onto the stack (a script without #!), so size the stack like glibc's
    // posix_spawn does: room for argv plus a margin for the calls themselves.
    let stack_len = (64 * 1024 + argv.len() * std::mem::size_of::<*const libc::c_char>())
        .next_multiple_of(4096);
    // SAFETY: an anonymous private mapping, unmapped below once the child has exec'd or exited.
    let stack = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            stack_len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK,
            -1,
            0,
        )
    };
    if stack == libc::MAP_FAILED {
        return Err(last_err());
    }
    // SAFETY: the stack grows down from its end (x86-64, aarch64); `child` and everything it
    // points to outlive the child's use of them, because CLONE_VFORK returns only after the
    // child has exec'd or exited. `child_main` is async-signal-safe (see there).
    let pid = unsafe {
        libc::clone(
            child_main,
            stack.cast::<u8>().add(stack_len).cast(),
            libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
            (&mut child as *mut ChildArgs).cast(),
        )
    };
    let clone_err = last_err();
    // SAFETY: the mapping made above; the child no longer runs on it.
    unsafe { libc::munmap(stack, stack_len) };
    if pid == -1 {
        return Err(clone_err);
    }
    // SAFETY: the child wrote this cell (if at all) before it exited; it is gone now.
    let errno = unsafe { std::ptr::read_volatile(child.errno) };
    if errno != 0 {
        // It exited without exec'ing: reap it here, so the supervision loop never sees it.
        let mut status = 0;
        // SAFETY: waiting for our own child; status is a live local.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        return Err(io::Error::from_raw_os_error(errno));
    }
    Ok(pid)
}

/// `struct clone_args` of clone3(2), up to `cgroup` (Linux >= 5.7).
#[repr(C)]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
    set_tid: u64,
    set_tid_size: u64,
    cgroup: u64,
}

const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;

/// The errnos of a kernel without clone3 or CLONE_INTO_CGROUP (Linux < 5.7): the spawn falls
/// back on the child's own write to `cgroup.procs`.
fn clone3_unknown(errno: Option<i32>) -> bool {
    matches!(errno, Some(libc::ENOSYS | libc::E2BIG | libc::EINVAL))
}

/// Starts the adapter directly inside the lease's cgroup: clone3 with CLONE_INTO_CGROUP, so there
/// is no moment at which it runs outside it. Without CLONE_VM (clone3 has no function-pointer
/// form; a child sharing our memory would return into our stack frames), so this is fork's
/// copy-on-write, with CLONE_VFORK so we still resume only after its exec; the child reports a
/// failure through a shared anonymous page, since it no longer shares our memory.
fn spawn_into_cgroup(child: &mut ChildArgs, cg: &Cgroup) -> io::Result<i32> {
    // SAFETY: a fresh anonymous shared mapping of one int, unmapped below.
    let page = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            4096,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if page == libc::MAP_FAILED {
        return Err(last_err());
    }
    child.errno = page.cast::<i32>();
    let args = CloneArgs {
        flags: libc::CLONE_VFORK as u64 | CLONE_INTO_CGROUP,
        exit_signal: libc::SIGCHLD as u64,
        cgroup: cg.dir.as_raw_fd() as u64,
        ..CloneArgs::default()
    };
    // SAFETY: clone3 with a live, correctly sized clone_args. The child gets a copy of our
    // memory (no CLONE_VM) and runs only `child_main`, which execs or `_exit`s; our one thread
    // is the only thread, so no lock can be held in the copy.
    let pid = unsafe {
        libc::syscall(
            libc::SYS_clone3,
            &args as *const CloneArgs,
            std::mem::size_of::<CloneArgs>(),
        )
    };
    if pid == 0 {
        child_main((child as *mut ChildArgs).cast());
        // SAFETY: unreachable in practice (child_main execs or exits); never return into the
        // parent's frames.
        unsafe { libc::_exit(127) };
    }
    let clone_err = last_err();
    // SAFETY: the child has exec'd or exited (CLONE_VFORK); read its report, then unmap.
    let errno = unsafe { std::ptr::read_volatile(page.cast::<i32>()) };
    // SAFETY: the mapping made above.
    unsafe { libc::munmap(page, 4096) };
    if pid < 0 {
        // clone3 itself failed with CLONE_INTO_CGROUP: the move into the cgroup, save for the
        // errnos of a kernel without it (the caller falls back on those).
        return Err(match clone_err.raw_os_error() {
            Some(n) if !clone3_unknown(Some(n)) => io::Error::from_raw_os_error(n | CGROUP_STEP),
            _ => clone_err,
        });
    }
    let pid = pid as i32;
    if errno != 0 {
        let mut status = 0;
        // SAFETY: waiting for our own child; status is a live local.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        return Err(io::Error::from_raw_os_error(errno));
    }
    Ok(pid)
}

/// What the adapter's side of `spawn` reads, and where it reports a failure.
#[repr(C)]
struct ChildArgs {
    file: *const libc::c_char,
    argv: *const *const libc::c_char,
    wrapper_pid: i32,
    hand_tty: bool,
    /// `<cgroup>/cgroup.procs` when the child must join the cgroup itself (no clone3), else null.
    procs_path: *const libc::c_char,
    /// Where the child stores its errno (memory the parent reads after the child is gone).
    errno: *mut i32,
}

/// The adapter's side of `spawn`, between clone and exec.
extern "C" fn child_main(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` is the parent's `ChildArgs`, alive while the parent is suspended
    // (CLONE_VFORK). Only async-signal-safe calls follow, on integers, a local sigset and the
    // NUL-terminated strings and array of `ChildArgs`; nothing allocates, locks or unwinds.
    unsafe {
        let a = arg.cast::<ChildArgs>();
        if !(*a).procs_path.is_null() {
            // "0": the writing process. Before anything else, so nothing runs outside it.
            let fd = libc::open((*a).procs_path, libc::O_WRONLY | libc::O_CLOEXEC);
            if fd < 0 || libc::write(fd, b"0".as_ptr().cast(), 1) != 1 {
                child_fail(a, errno() | CGROUP_STEP);
            }
            libc::close(fd);
        }
        if libc::setpgid(0, 0) != 0 {
            child_fail(a, errno());
        }
        // Signal dispositions are per process here (no CLONE_SIGHAND): this changes only ours.
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        let mut empty: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut empty);
        libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
        if libc::prctl(
            libc::PR_SET_PDEATHSIG,
            libc::SIGKILL as libc::c_ulong,
            0,
            0,
            0,
        ) != 0
        {
            child_fail(a, errno());
        }
        if libc::getppid() != (*a).wrapper_pid {
            child_fail(a, libc::ESRCH);
        }
        if (*a).hand_tty {
            // We are a background group now: tcsetpgrp would stop us with SIGTTOU.
            libc::signal(libc::SIGTTOU, libc::SIG_IGN);
            libc::tcsetpgrp(0, libc::getpid());
            libc::signal(libc::SIGTTOU, libc::SIG_DFL);
        }
        libc::execvp((*a).file, (*a).argv);
        child_fail(a, errno())
    }
}

/// Reports `e` to the suspended parent and exits without running any of its exit code.
///
/// # Safety
/// `a` must be the `ChildArgs` of a `spawn` whose parent is suspended in `clone`.
unsafe fn child_fail(a: *mut ChildArgs, e: i32) -> ! {
    // SAFETY: as the caller guarantees; `_exit` runs no atexit handlers or destructors, which
    // belong to the parent whose memory we share.
    unsafe {
        std::ptr::write_volatile((*a).errno, if e == 0 { libc::EIO } else { e });
        libc::_exit(127)
    }
}

fn errno() -> i32 {
    last_err().raw_os_error().unwrap_or(libc::EIO)
}

/// The lease's cgroup, held open: the adapter is started inside it, the wrapper itself stays
/// outside (so it outlives what it drains), and at the end every member is killed at once.
pub struct Cgroup {
    dir: Fd,
    path: std::path::PathBuf,
    procs_path: CString,
    ino: u64,
    /// Join through cgroup.procs even where clone3 works (tests exercise the fallback).
    force_procs_write: bool,
}

impl Cgroup {
    pub fn open(path: &std::path::Path, force_procs_write: bool) -> io::Result<Cgroup> {
        let c = CString::new(path.as_os_str().as_bytes())
            .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        // SAFETY: open with a NUL-terminated path; the fd is ours.
        let fd = cvt(unsafe {
            libc::open(
                c.as_ptr(),
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            )
        })?;
        // SAFETY: the kernel just returned this fd.
        let dir = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: fstat fills a local we own.
        let ino = unsafe {
            let mut st: libc::stat = std::mem::zeroed();
            cvt(libc::fstat(dir.as_raw_fd(), &mut st))?;
            st.st_ino
        };
        let mut procs = path.as_os_str().as_bytes().to_vec();
        procs.extend_from_slice(b"/cgroup.procs");
        Ok(Cgroup {
            dir,
            path: path.to_path_buf(),
            procs_path: CString::new(procs)
                .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?,
            ino,
            force_procs_write,
        })
    }

    pub fn path(&self) -> &std::path::Path {
        &self.path
    }

    /// A file in the held directory (the magic link pins the very directory we opened).
    fn file(&self, name: &str) -> String {
        format!("/proc/self/fd/{}/{name}", self.dir.as_raw_fd())
    }

    /// `populated 1` in cgroup.events (an unreadable file counts as populated: keep draining).
    pub fn populated(&self) -> bool {
        match read_small(&self.file("cgroup.events")) {
            Ok(t) => !t.lines().any(|l| l.trim() == "populated 0"),
            // Removed under us (a close or reap emptied it with cgroup.kill, then rmdir'ed it):
            // the kernel refuses to remove a populated cgroup, so it has no member left. Counting
            // this as populated kept a wrapper sweeping an empty, deleted cgroup for ever.
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => false,
            Err(_) => true,
        }
    }

    /// The pids `cgroup.procs` lists now.
    fn listed(&self) -> Vec<i32> {
        read_small(&self.file("cgroup.procs"))
            .map(|t| {
                t.split_whitespace()
                    .filter_map(|s| s.parse().ok())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// True while a process that passes the member check is in the cgroup (a bystander moved
    /// in does not keep the wrapper waiting for it).
    pub fn has_members(&self) -> bool {
        self.populated() && self.listed().into_iter().any(is_lease_member)
    }

    /// Calls `f` with a pidfd for every member that passes the member check ([`is_lease_member`]),
    /// each confirmed still listed after it was pinned
    /// (a pid recycled between the read and the pidfd is then not a member). Returns the count.
    pub fn for_each_member(&self, mut f: impl FnMut(&Fd)) -> usize {
        let read = || self.listed();
        let listed = read();
        let pinned: Vec<(i32, Fd)> = listed
            .into_iter()
            .filter(|&p| p > 1 && is_lease_member(p))
            .filter_map(|p| pidfd_open(p).ok().map(|fd| (p, fd)))
            .collect();
        let still = read();
        let mut n = 0;
        for (pid, fd) in &pinned {
            if still.contains(pid) {
                f(fd);
                n += 1;
            }
        }
        n
    }

    /// SIGKILLs every member at once: cgroup.kill (Linux >= 5.14); older kernels: freeze, kill
    /// each member, thaw.
    pub fn kill(&self) {
        // cgroup.kill takes every process in the cgroup: only when each one passes the member
        // check (a bystander moved in from outside is not the lease's); otherwise each member is
        // killed on its own and the bystander is left.
        let all_ours = self.listed().into_iter().all(is_lease_member);
        if all_ours && std::fs::write(self.file("cgroup.kill"), b"1").is_ok() {
            return;
        }
        if !all_ours {
            self.for_each_member(|fd| pidfd_signal(fd, libc::SIGKILL));
            return;
        }
        let _ = std::fs::write(self.file("cgroup.freeze"), b"1");
        self.for_each_member(|fd| pidfd_signal(fd, libc::SIGKILL));
        let _ = std::fs::write(self.file("cgroup.freeze"), b"0");
    }

    /// Removes the (empty) cgroup if the name still holds the directory we opened.
    pub fn remove(&self) -> io::Result<()> {
        let c = CString::new(self.path.as_os_str().as_bytes())
            .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        // SAFETY: lstat fills a local; rmdir takes a NUL-terminated path.
        unsafe {
            let mut st: libc::stat = std::mem::zeroed();
            if libc::lstat(c.as_ptr(), &mut st) != 0 {
                let e = last_err();
                // Already removed (by `leash close` or `reap`): nothing to do, nothing to say.
                return if e.raw_os_error() == Some(libc::ENOENT) {
                    Ok(())
                } else {
                    Err(e)
                };
            }
            if st.st_ino != self.ino {
                return Err(io::Error::from_raw_os_error(libc::ESTALE));
            }
            // Most adapters make no cgroup of their own: the rmdir alone does it, without
            // listing the directory first.
            if libc::rmdir(c.as_ptr()) == 0 {
                return Ok(());
            }
            let e = last_err();
            if e.raw_os_error() == Some(libc::ENOENT) {
                return Ok(());
            }
            // Cgroups the adapter made inside ours keep it from being removed (EBUSY): they go
            // first, deepest first, through the directory we hold, then ours.
            remove_nested(self.dir.as_raw_fd(), 0)?;
            if libc::rmdir(c.as_ptr()) == 0 {
                return Ok(());
            }
            let e = last_err();
            if e.raw_os_error() == Some(libc::ENOENT) {
                Ok(())
            } else {
                Err(e)
            }
        }
    }
}

/// How deep nested cgroups may be before removal gives up (bounds the recursion only).
const MAX_NESTED_DEPTH: usize = 64;

/// Removes every cgroup below the directory `dir` (an open descriptor), deepest first, each with
/// `unlinkat(dir, name, AT_REMOVEDIR)`: only empty cgroups can be removed, and a name renamed
/// meanwhile cannot redirect a removal outside `dir`.
fn remove_nested(dir: RawFd, depth: usize) -> io::Result<()> {
    if depth >= MAX_NESTED_DEPTH {
        return Err(io::Error::from_raw_os_error(libc::ELOOP));
    }
    for entry in std::fs::read_dir(format!("/proc/self/fd/{dir}"))? {
        let entry = entry?;
        if !entry.file_type()?.is_dir() {
            continue;
        }
        let name = CString::new(entry.file_name().as_bytes())
            .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        // SAFETY: openat with a directory fd we hold and a NUL-terminated name; the fd is ours.
        let fd = unsafe {
            libc::openat(
                dir,
                name.as_ptr(),
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            let e = last_err();
            if e.raw_os_error() == Some(libc::ENOENT) {
                continue;
            }
            return Err(e);
        }
        // SAFETY: the kernel just returned this fd; OwnedFd closes it.
        let child = unsafe { OwnedFd::from_raw_fd(fd) };
        remove_nested(child.as_raw_fd(), depth + 1)?;
        drop(child);
        // SAFETY: unlinkat with a directory fd we hold and a NUL-terminated name.
        if unsafe { libc::unlinkat(dir, name.as_ptr(), libc::AT_REMOVEDIR) } != 0 {
            let e = last_err();
            if e.raw_os_error() != Some(libc::ENOENT) {
                return Err(e);
            }
        }
    }
    Ok(())
}

/// Unmaps, from this process only, the pages of its own executable that are read-only (code and
/// constants), once start-up is over (the loop calls it when it first finds itself idle; see
/// `TRIM_AFTER_IDLE`). They stay in the page cache, shared with every other
/// wrapper; the next instruction or constant used is mapped again by an ordinary minor fault.
///
/// Why: a page-cache fault maps not one page but the cached pages around it (the kernel's
/// fault-around, 64 kB), so start-up — glibc's static init, argument parsing, spawn, the
/// report — leaves ~0.75 MB of the binary mapped, nearly all of its text, although the wait loop
/// that follows runs in a few kB of it. After this call, only what the loop touches is mapped
/// again (see docs/benchmarks.md, "Footprint").
///
/// Only whole pages inside a `PT_LOAD` segment without `PF_W` are dropped: those are file pages
/// nobody has written (a static-pie's relocated data, `.data.rel.ro` included, lies in writable
/// segments), so dropping one loses nothing. A failure changes nothing and is not worth telling.
pub fn trim_image() {
    // SAFETY: getauxval only reads the auxiliary vector the kernel gave us.
    let (at_phdr, phnum, page) = unsafe {
        (
            libc::getauxval(libc::AT_PHDR) as usize,
            libc::getauxval(libc::AT_PHNUM) as usize,
            libc::getauxval(libc::AT_PAGESZ) as usize,
        )
    };
    if at_phdr == 0 || phnum == 0 {
        return;
    }
    // SAFETY: AT_PHDR/AT_PHNUM describe the executable's program headers, mapped (read-only
    // segment) for the life of the process.
    let phdrs = unsafe { std::slice::from_raw_parts(at_phdr as *const Phdr, phnum) };
    // The ranges are collected first: the headers themselves lie in a read-only segment, and
    // reading the next one after dropping it would map its 64 kB back in.
    let (ranges, n) = read_only_pages(phdrs, at_phdr, page);
    for &(start, end) in &ranges[..n] {
        // SAFETY: whole pages of a read-only, never-written private file mapping of our own
        // executable: MADV_DONTNEED only drops our page-table entries, and the same bytes are
        // faulted in from the file on the next access.
        unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_DONTNEED) };
    }
}

#[cfg(target_pointer_width = "64")]
type Phdr = libc::Elf64_Phdr;
#[cfg(target_pointer_width = "32")]
type Phdr = libc::Elf32_Phdr;

/// The whole pages, as `[start, end)` addresses, of every loaded segment without `PF_W`, given
/// the program headers and the address they were found at (`AT_PHDR`). Rounded inward, so a
/// page shared with a writable neighbour is never among them. At most 8 ranges.
fn read_only_pages(phdrs: &[Phdr], at_phdr: usize, page: usize) -> ([(usize, usize); 8], usize) {
    let mut ranges = [(0usize, 0usize); 8];
    let mut n = 0;
    if !page.is_power_of_two() {
        return (ranges, 0);
    }
    // The load bias of a PIE: where PT_PHDR landed minus where it says it is.
    let Some(own) = phdrs.iter().find(|p| p.p_type == libc::PT_PHDR) else {
        return (ranges, 0);
    };
    let bias = at_phdr.wrapping_sub(own.p_vaddr as usize);
    for p in phdrs {
        if p.p_type != libc::PT_LOAD || p.p_flags & libc::PF_W != 0 || n == ranges.len() {
            continue;
        }
        let lo = bias.wrapping_add(p.p_vaddr as usize);
        let start = lo.next_multiple_of(page);
        let end = lo.wrapping_add(p.p_memsz as usize) & !(page - 1);
        if start < end {
            ranges[n] = (start, end);
            n += 1;
        }
    }
    (ranges, n)
}

/// Writes to stderr, ignoring every failure (a closed or broken stderr must not kill us; SIGPIPE
/// is ignored since `c_main`).
pub fn write_stderr(buf: &[u8]) {
    let mut rest = buf;
    while !rest.is_empty() {
        // SAFETY: pointer and length come from a live slice.
        let n = unsafe { libc::write(2, rest.as_ptr().cast(), rest.len()) };
        if n <= 0 {
            if n < 0 && last_err().kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return;
        }
        rest = &rest[n as usize..];
    }
}

pub struct Ready {
    pub signal: bool,
    pub parent: bool,
}

/// Waits until the signalfd or the parent's pidfd is readable, or the timeout passes.
pub fn poll2(sigfd: &Fd, parent: Option<&Fd>, timeout: Option<Duration>) -> Ready {
    let mut fds = [
        libc::pollfd {
            fd: sigfd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: parent.map_or(-1, |f| f.as_raw_fd()), // negative fds are ignored by poll
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    let ms = match timeout {
        None => -1,
        // Round up so a deadline is never polled for 0 ms in a busy loop before it is due.
        Some(d) => d.as_micros().div_ceil(1000).min(i32::MAX as u128) as libc::c_int,
    };
    // SAFETY: fds is a live array of two pollfd.
    let rc = unsafe { libc::poll(fds.as_mut_ptr(), 2, ms) };
    if rc <= 0 {
        return Ready {
            signal: false,
            parent: false,
        };
    }
    Ready {
        signal: fds[0].revents != 0,
        parent: fds[1].revents != 0,
    }
}

pub enum Reaped {
    Child { pid: i32, code: i32 },
    NoneReady,
    NoChildren,
}

/// One non-blocking `waitpid(-1)`. A signal death becomes 128 + the signal number.
pub fn reap_one() -> Reaped {
    loop {
        let mut status = 0;
        // SAFETY: status is a live local.
        let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
        if pid > 0 {
            let code = if libc::WIFEXITED(status) {
                libc::WEXITSTATUS(status)
            } else if libc::WIFSIGNALED(status) {
                128 + libc::WTERMSIG(status)
            } else {
                continue; // stopped/continued are not reported without WUNTRACED; be safe
            };
            return Reaped::Child { pid, code };
        }
        if pid == 0 {
            return Reaped::NoneReady;
        }
        match last_err().raw_os_error() {
            Some(libc::EINTR) => continue,
            _ => return Reaped::NoChildren, // ECHILD
        }
    }
}

/// A small `/proc` or cgroup file, read whole. Both report a size of 0, so `fs::read_to_string`
/// reads them in 32-byte steps after a `statx`: eight system calls for a `stat` line, on the
/// wrapper's start path (its own and the adapter's). One `read` into 4 KiB takes a `stat` line,
/// `cgroup.events` or a short `cgroup.procs`; the loop takes the rest.
fn read_small(path: &str) -> io::Result<String> {
    use std::io::Read;
    let mut f = std::fs::File::open(path)?;
    let mut buf = vec![0u8; 4096];
    let mut len = 0;
    loop {
        if len == buf.len() {
            buf.resize(buf.len() * 2, 0);
        }
        match f.read(&mut buf[len..]) {
            Ok(0) => break,
            Ok(n) => len += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    buf.truncate(len);
    String::from_utf8(buf).map_err(|_| io::Error::from(io::ErrorKind::InvalidData))
}

/// Splits `/proc/<pid>/stat` after the command name, which is parsed by the LAST `)` because the
/// name itself may contain parentheses and spaces.
fn stat_fields(pid: i32) -> Option<Vec<String>> {
    let text = read_small(&format!("/proc/{pid}/stat")).ok()?;
    let rest = &text[text.rfind(')')? + 1..];
    Some(rest.split_whitespace().map(str::to_owned).collect())
}

/// The member check leash applies to every process of a lease (see `member_problem` in the
/// leash crate), here for a process found in the wrapper's cgroup: it started no earlier than
/// the wrapper, runs as the wrapper's uid, and carries no other lease's id in its environment.
/// Only such a process is signalled through the cgroup; anything else was moved in by someone
/// else and is left alone. A process that exited meanwhile counts as a member (nothing to spare).
pub fn is_lease_member(pid: i32) -> bool {
    use std::os::unix::fs::MetadataExt;
    static OWN: std::sync::OnceLock<(u64, u32, Option<Vec<u8>>)> = std::sync::OnceLock::new();
    let (own_start, own_uid, own_lease) = OWN.get_or_init(|| {
        // SAFETY: getpid and geteuid cannot fail.
        let me = unsafe { libc::getpid() };
        let uid = unsafe { libc::geteuid() };
        let lease = std::env::var_os("OPENCLAW_ACPX_LEASE_ID").map(|v| v.as_bytes().to_vec());
        (start_time(me).unwrap_or(0), uid, lease)
    });
    let Some(start) = start_time(pid) else {
        return true;
    };
    if start < *own_start {
        return false;
    }
    match std::fs::metadata(format!("/proc/{pid}")) {
        Ok(m) if m.uid() != *own_uid => return false,
        Ok(_) => {}
        Err(_) => return true,
    }
    if let (Some(own), Ok(env)) = (own_lease, std::fs::read(format!("/proc/{pid}/environ"))) {
        let key = b"OPENCLAW_ACPX_LEASE_ID=";
        for var in env.split(|&b| b == 0) {
            if let Some(v) = var.strip_prefix(&key[..]) {
                if v != own.as_slice() {
                    return false;
                }
            }
        }
    }
    true
}

/// Field 22 of /proc/<pid>/stat: the start time in clock ticks since boot.
pub fn start_time(pid: i32) -> Option<u64> {
    stat_fields(pid)?.get(19)?.parse().ok()
}

fn ppid_of(pid: i32) -> Option<i32> {
    stat_fields(pid)?.get(1)?.parse().ok()
}

/// Children of `pid`, from `/proc/<pid>/task/<tid>/children` (children belong to the thread that
/// forked them, so every thread is read).
fn children_of(pid: i32) -> Vec<i32> {
    let mut out = Vec::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return out;
    };
    for task in tasks.flatten() {
        let mut path = task.path();
        path.push("children");
        if let Ok(text) = std::fs::read_to_string(&path) {
            out.extend(
                text.split_whitespace()
                    .filter_map(|s| s.parse::<i32>().ok()),
            );
        }
    }
    out
}

/// True when the process behind the pidfd has exited (its pidfd polls readable).
fn exited(fd: &Fd) -> bool {
    let mut p = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one live pollfd, zero timeout.
    unsafe { libc::poll(&mut p, 1, 0) == 1 }
}

/// Calls `f` with a pidfd for every live descendant of this process and returns how many there
/// were. Each pid read from a `children` file is pinned with a pidfd and then confirmed to still
/// be a child of the process it was listed under, whose own liveness is confirmed after the read;
/// so a pid that was recycled between the read and the signal is never touched.
pub fn for_each_descendant(mut f: impl FnMut(&Fd)) -> usize {
    let me = getpid();
    let mut stack: Vec<(i32, Option<Fd>)> = vec![(me, None)];
    let mut n = 0;
    while let Some((pid, pin)) = stack.pop() {
        let kids = children_of(pid);
        if let Some(fd) = &pin {
            if exited(fd) {
                continue; // the list may belong to a recycled pid
            }
        }
        for kid in kids {
            let Ok(fd) = pidfd_open(kid) else { continue };
            if ppid_of(kid) != Some(pid) {
                continue;
            }
            f(&fd);
            n += 1;
            stack.push((kid, Some(fd)));
        }
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seg(p_type: u32, p_flags: u32, vaddr: usize, memsz: usize) -> Phdr {
        // SAFETY: a program header is plain old data; zeroed is a valid value.
        let mut p: Phdr = unsafe { std::mem::zeroed() };
        p.p_type = p_type;
        p.p_flags = p_flags;
        p.p_vaddr = vaddr as _;
        p.p_memsz = memsz as _;
        p
    }

    /// The layout of the static-pie wrapper (`readelf -l`): headers + rodata, text, RELRO (its
    /// relocated data must never be dropped), data + bss.
    #[test]
    fn only_whole_read_only_pages_are_dropped() {
        const R: u32 = libc::PF_R;
        const RX: u32 = libc::PF_R | libc::PF_X;
        const RW: u32 = libc::PF_R | libc::PF_W;
        let base = 0x7f00_0000_0000usize;
        let phdrs = [
            seg(libc::PT_PHDR, R, 0x40, 0x268),
            seg(libc::PT_LOAD, R, 0, 0x3fa34),
            seg(libc::PT_LOAD, RX, 0x40a40, 0xb96b0),
            seg(libc::PT_LOAD, RW, 0xfb0f0, 0x5f10),
            seg(libc::PT_LOAD, RW, 0x101420, 0x8440),
            seg(libc::PT_GNU_RELRO, R, 0xfb0f0, 0x5f10),
        ];
        let (ranges, n) = read_only_pages(&phdrs, base + 0x40, 4096);
        assert_eq!(
            &ranges[..n],
            &[(base, base + 0x3f000), (base + 0x41000, base + 0xfa000)]
        );
        for &(start, end) in &ranges[..n] {
            for w in phdrs.iter().filter(|p| p.p_flags & libc::PF_W != 0) {
                let (lo, hi) = (
                    base + w.p_vaddr as usize,
                    base + (w.p_vaddr + w.p_memsz) as usize,
                );
                assert!(end <= lo & !4095 || start >= hi.next_multiple_of(4096));
            }
        }
        // No PT_PHDR (the load bias is unknown) or a bad page size: nothing.
        assert_eq!(read_only_pages(&phdrs[1..], base + 0x40, 4096).1, 0);
        assert_eq!(read_only_pages(&phdrs, base + 0x40, 4095).1, 0);
    }

    /// The trim on this very process: its code and constants still work afterwards (the test
    /// binary is linked dynamically, so only its own image is trimmed).
    #[test]
    fn the_process_runs_on_after_the_trim() {
        static TABLE: [&str; 3] = ["term", "int", "hup"];
        trim_image();
        assert_eq!(TABLE.iter().map(|s| s.len()).sum::<usize>(), 10);
        assert_eq!(format!("{}", 125), "125");
    }
}
