//! The few syscalls the `nix` crate does not wrap (pidfds) and the process-wide settings leash
//! needs. All `unsafe` of the leash library lives here.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

/// Takes ownership of a descriptor this process was handed when it started (socket activation:
/// systemd's `LISTEN_FDS`). Call it once per such descriptor, and for nothing else: whatever
/// owns a descriptor closes it.
pub fn adopt_inherited_fd(fd: RawFd) -> OwnedFd {
    // SAFETY: the caller passes a descriptor inherited at exec, which nothing else in the
    // process owns or closes (see above).
    unsafe { OwnedFd::from_raw_fd(fd) }
}

/// Ends the process as SIGPIPE's default action would: what a command does when its reader went
/// away (`leash close … | head -2`), quietly, like every other tool in a pipeline. Only the CLI's
/// stdout path calls it: the process keeps SIGPIPE ignored otherwise (the daemon and `leash exec`
/// must never die of a peer that went away, and children get the default back at exec anyway).
pub fn die_of_sigpipe() -> ! {
    // SAFETY: resets one signal's disposition to its default and raises it in this process.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        libc::raise(libc::SIGPIPE);
    }
    // Not reached unless the signal is blocked; exit with the status a shell would report.
    std::process::exit(128 + libc::SIGPIPE)
}

/// `pidfd_open(2)` (Linux >= 5.3): a handle on one process instance. Signals sent through it
/// reach that instance or nobody, even if its pid number is recycled meanwhile.
pub fn pidfd_open(pid: i32) -> io::Result<OwnedFd> {
    if pid <= 0 {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    // SAFETY: raw syscall with integer arguments; it returns a new fd or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this fd and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) })
}

/// `pidfd_send_signal(2)`; `group` adds PIDFD_SIGNAL_PROCESS_GROUP (Linux >= 6.9), which signals
/// the process group whose id is the pidfd's process.
pub fn pidfd_send_signal(fd: BorrowedFd<'_>, sig: i32, group: bool) -> io::Result<()> {
    let flags: libc::c_uint = if group {
        libc::PIDFD_SIGNAL_PROCESS_GROUP
    } else {
        0
    };
    // SAFETY: raw syscall; a null siginfo makes the kernel fill it in as kill(2) would.
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
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Waits until any of the pidfds is readable (its process exited) or the timeout passes.
/// Returns the indices that are readable.
pub fn poll_exited(fds: &[BorrowedFd<'_>], timeout: Duration) -> Vec<usize> {
    let mut pfds: Vec<libc::pollfd> = fds
        .iter()
        .map(|fd| libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    let ms = timeout.as_millis().min(i32::MAX as u128) as libc::c_int;
    // SAFETY: pfds is a live, correctly sized array of pollfd.
    let rc = unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, ms) };
    if rc <= 0 {
        return Vec::new();
    }
    pfds.iter()
        .enumerate()
        .filter(|(_, p)| p.revents != 0)
        .map(|(i, _)| i)
        .collect()
}

/// Raises the soft open-files limit to the hard limit: closing hundreds of trees at once holds
/// one pidfd per process.
pub fn raise_nofile_limit() {
    // SAFETY: getrlimit/setrlimit with a pointer to a live local.
    unsafe {
        let mut lim: libc::rlimit = std::mem::zeroed();
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && lim.rlim_cur < lim.rlim_max {
            lim.rlim_cur = lim.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
    }
}

/// The pidfs magic (`statfs(2)` on a pidfd, Linux >= 6.9).
const PIDFS_MAGIC: i64 = 0x5049_4446;

/// The process's pidfs inode number: on Linux >= 6.9 every process gets one for the life of the
/// system and it is never reused, unlike a pid, and unlike a start time that only has clock-tick
/// resolution (a pid recycled within the same tick keeps the same `(pid, start time)`). `None`
/// on older kernels, where all pidfds share one anonymous inode, or when the process is gone.
pub fn pidfs_ino(pid: i32) -> Option<u64> {
    let fd = pidfd_open(pid).ok()?;
    pidfd_ino(fd.as_fd())
}

/// The pidfs inode of the process a pidfd refers to (`None` before Linux 6.9).
fn pidfd_ino(fd: BorrowedFd<'_>) -> Option<u64> {
    // SAFETY: fstatfs/fstat fill locals we own; the fd is live for the duration.
    unsafe {
        let mut sfs: libc::statfs = std::mem::zeroed();
        if libc::fstatfs(fd.as_raw_fd(), &mut sfs) != 0 || sfs.f_type as i64 != PIDFS_MAGIC {
            return None;
        }
        let mut st: libc::stat = std::mem::zeroed();
        if libc::fstat(fd.as_raw_fd(), &mut st) != 0 {
            return None;
        }
        Some(st.st_ino)
    }
}

/// The pidfs inode of the process at the other end of a connected Unix socket, as the kernel
/// recorded it when that process connected (`SO_PEERPIDFD`, Linux >= 6.5; the inode needs
/// pidfs, >= 6.9): unlike the peer's pid, it names that process instance and no other, even
/// once the pid is recycled. `None` where the kernel cannot say.
pub fn peer_pidfs_ino(sock: BorrowedFd<'_>) -> Option<u64> {
    let mut fd: libc::c_int = -1;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into the local `fd`.
    let rc = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERPIDFD,
            (&mut fd as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    if rc != 0 || fd < 0 {
        return None;
    }
    // SAFETY: the kernel just returned this fd and nothing else owns it.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    pidfd_ino(fd.as_fd())
}

/// The calling thread's nice value.
pub fn thread_nice() -> io::Result<i32> {
    // SAFETY: as for `set_thread_nice`; errno is cleared first because -1 is a valid result.
    let (rc, errno) = unsafe {
        *libc::__errno_location() = 0;
        let tid = libc::gettid();
        let rc = libc::getpriority(libc::PRIO_PROCESS, tid as libc::id_t);
        (rc, *libc::__errno_location())
    };
    if rc == -1 && errno != 0 {
        return Err(io::Error::from_raw_os_error(errno));
    }
    Ok(rc)
}

/// Sets the calling *thread's* nice value (Linux: `setpriority(PRIO_PROCESS, tid)` applies to
/// that thread alone). Raising one's own nice value (a lower priority) needs no privilege;
/// threads and processes this thread starts afterwards inherit it.
pub fn set_thread_nice(nice: i32) -> io::Result<()> {
    // SAFETY: gettid and setpriority take plain integers and touch no memory of ours.
    let rc = unsafe {
        let tid = libc::gettid();
        libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, nice)
    };
    if rc == -1 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Gives the heap's free memory back to the kernel (glibc's `malloc_trim`: every arena, and free
/// pages inside them, not only the top). A long-running daemon otherwise keeps the peak of a
/// burst of large, short-lived allocations resident for good. No-op on other C libraries.
pub fn release_free_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks the allocator's own structures under its locks.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// A small `/proc` file (`stat`, `cgroup`, `cmdline`), read whole. procfs reports a size of 0,
/// so `fs::read` would read it in 32-byte steps after a `statx` (eight system calls for a `stat`
/// line); one `read` into a 4 KiB buffer takes what a `stat` line is, and the loop the rest.
pub fn read_proc(path: impl AsRef<std::path::Path>) -> std::io::Result<Vec<u8>> {
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
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    buf.truncate(len);
    Ok(buf)
}

/// An epoll instance that waits for the first of a few descriptors to become readable.
pub struct Readable {
    ep: OwnedFd,
}

impl Readable {
    /// Watches `fds`, each with its token; an `exclusive` one wakes one waiter of all the epoll
    /// instances that watch it, not every one (`EPOLLEXCLUSIVE`: the connection threads waiting
    /// on the one listening socket).
    pub fn new(fds: &[(BorrowedFd<'_>, u64, bool)]) -> io::Result<Readable> {
        // SAFETY: epoll_create1 takes no pointer; the fd it returns is ours alone.
        let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if ep < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: just created, owned by nothing else.
        let ep = unsafe { OwnedFd::from_raw_fd(ep) };
        for &(fd, token, exclusive) in fds {
            let mut ev = libc::epoll_event {
                events: (libc::EPOLLIN | if exclusive { libc::EPOLLEXCLUSIVE } else { 0 }) as u32,
                u64: token,
            };
            // SAFETY: ev is a live local; both fds are open.
            let rc = unsafe {
                libc::epoll_ctl(ep.as_raw_fd(), libc::EPOLL_CTL_ADD, fd.as_raw_fd(), &mut ev)
            };
            if rc != 0 {
                return Err(io::Error::last_os_error());
            }
        }
        Ok(Readable { ep })
    }

    /// Waits until one is readable and returns its token (an interrupted wait is retried).
    pub fn wait(&self) -> io::Result<u64> {
        loop {
            let mut ev = libc::epoll_event { events: 0, u64: 0 };
            // SAFETY: room for one event in a live local.
            let n = unsafe { libc::epoll_wait(self.ep.as_raw_fd(), &mut ev, 1, -1) };
            match n {
                1 => return Ok(ev.u64),
                0 => continue,
                _ => {
                    let e = io::Error::last_os_error();
                    if e.kind() != io::ErrorKind::Interrupted {
                        return Err(e);
                    }
                }
            }
        }
    }
}

/// An eventfd that, once [`Latch::set`], stays readable: wakes every waiter that watches it.
pub struct Latch {
    fd: OwnedFd,
}

impl Latch {
    pub fn new() -> io::Result<Latch> {
        // SAFETY: eventfd takes no pointer; the fd is ours alone.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: just created.
        Ok(Latch {
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }

    pub fn set(&self) {
        let one: u64 = 1;
        // SAFETY: writes the 8 bytes of a live local.
        unsafe { libc::write(self.fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }

    pub fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// Lets `fd` survive `execve` (clears `FD_CLOEXEC`): the daemon's handoff keeps its listening
/// socket, its lock and its sessions' pipes open across the exec of the new program.
pub fn keep_across_exec(fd: RawFd, keep: bool) -> io::Result<()> {
    use nix::fcntl::{fcntl, FcntlArg, FdFlag};
    let flags = if keep {
        FdFlag::empty()
    } else {
        FdFlag::FD_CLOEXEC
    };
    fcntl(fd, FcntlArg::F_SETFD(flags))
        .map(drop)
        .map_err(io::Error::from)
}

/// An anonymous memory file (`memfd_create(2)`), close-on-exec: the handoff's state is written
/// here and read back by the program the daemon execs.
pub fn memfd(name: &std::ffi::CStr) -> io::Result<std::fs::File> {
    use nix::sys::memfd::{memfd_create, MemFdCreateFlag};
    Ok(memfd_create(name, MemFdCreateFlag::MFD_CLOEXEC)?.into())
}

/// Makes `fd` non-blocking (`O_NONBLOCK`), its other status flags kept.
pub fn set_nonblocking(fd: BorrowedFd<'_>) -> io::Result<()> {
    use nix::fcntl::{fcntl, FcntlArg, OFlag};
    let flags = OFlag::from_bits_truncate(fcntl(fd.as_raw_fd(), FcntlArg::F_GETFL)?);
    fcntl(fd.as_raw_fd(), FcntlArg::F_SETFL(flags | OFlag::O_NONBLOCK))?;
    Ok(())
}

/// Takes ownership of a descriptor named by a handoff this process was exec'd with. Call it
/// once per such descriptor: whatever owns it closes it.
pub fn adopt_handed_fd(fd: RawFd) -> io::Result<OwnedFd> {
    use nix::fcntl::{fcntl, FcntlArg};
    fcntl(fd, FcntlArg::F_GETFD).map_err(io::Error::from)?;
    // Open (checked just above), kept across exec for this process alone; the handoff names
    // each one once (see above).
    let owned = adopt_inherited_fd(fd);
    keep_across_exec(owned.as_raw_fd(), false)?;
    Ok(owned)
}

/// Waits until child `pid` has exited without reaping it (`waitid(WEXITED | WNOWAIT)`): the
/// zombie stays, so that a daemon handing over before it reaps leaves the exit to its successor.
pub fn wait_exited_unreaped(pid: i32) -> io::Result<()> {
    use nix::sys::wait::{waitid, Id, WaitPidFlag};
    loop {
        match waitid(
            Id::Pid(nix::unistd::Pid::from_raw(pid)),
            WaitPidFlag::WEXITED | WaitPidFlag::WNOWAIT,
        ) {
            Ok(_) => return Ok(()),
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// Reaps child `pid` (`waitpid`), with its status as `std` reports it: for a child this process
/// did not spawn itself (one a previous program of the same pid spawned before an exec).
pub fn reap(pid: i32) -> io::Result<std::process::ExitStatus> {
    use std::os::unix::process::ExitStatusExt;
    let mut status: libc::c_int = 0;
    loop {
        // SAFETY: `status` is a live local the kernel writes an int into.
        let r = unsafe { libc::waitpid(pid, &mut status, 0) };
        if r == pid {
            return Ok(std::process::ExitStatus::from_raw(status));
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Blocks or unblocks the termination and reload signals for the calling thread: blocked over an
/// `execve`, they stay pending (the mask survives the exec) until the new program has its
/// handlers, instead of their default action ending the daemon in between.
pub fn block_stop_signals(block: bool) {
    use nix::sys::signal::{pthread_sigmask, SigSet, SigmaskHow, Signal};
    let mut set = SigSet::empty();
    for s in [Signal::SIGTERM, Signal::SIGINT, Signal::SIGHUP] {
        set.add(s);
    }
    let how = if block {
        SigmaskHow::SIG_BLOCK
    } else {
        SigmaskHow::SIG_UNBLOCK
    };
    let _ = pthread_sigmask(how, Some(&set), None);
}

impl Latch {
    /// Makes the latch unreadable again (the eventfd's counter read back to zero).
    pub fn clear(&self) {
        let mut v: u64 = 0;
        // SAFETY: reads at most 8 bytes into a live local; non-blocking, so an unset latch
        // returns EAGAIN at once.
        unsafe { libc::read(self.fd.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
    }
}

/// Waits until `fd` is readable (or hung up) or `latch` is set; EINTR is a wake-up too.
pub fn wait_readable_or(fd: BorrowedFd<'_>, latch: &Latch) {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    let mut fds = [
        PollFd::new(fd, PollFlags::POLLIN),
        PollFd::new(latch.as_fd(), PollFlags::POLLIN),
    ];
    let _ = poll(&mut fds, PollTimeout::NONE);
}

/// `CLOCK_MONOTONIC` in nanoseconds: one clock for both programs of a daemon's handoff (an
/// `Instant` does not cross an exec).
pub fn monotonic_ns() -> u64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: writes one timespec into a live local.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut t) };
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}
