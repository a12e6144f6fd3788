//! The front door's system calls, made directly (there is no C library to make them): the
//! numbers and constants of x86_64 and aarch64, one small function per call, each returning the
//! kernel's answer (`< 0`: `-errno`). All `unsafe` of the front door but its entry point, the
//! memory functions and the heap lives here.

use core::arch::asm;

#[cfg(target_arch = "x86_64")]
mod nr {
    pub const READ: usize = 0;
    pub const WRITE: usize = 1;
    pub const CLOSE: usize = 3;
    pub const GETPID: usize = 39;
    pub const SOCKET: usize = 41;
    pub const CONNECT: usize = 42;
    pub const SENDTO: usize = 44;
    pub const GETSOCKOPT: usize = 55;
    pub const EXECVE: usize = 59;
    pub const FLOCK: usize = 73;
    pub const GETCWD: usize = 79;
    pub const CLOCK_GETTIME: usize = 228;
    pub const EXIT_GROUP: usize = 231;
    pub const OPENAT: usize = 257;
    pub const READLINKAT: usize = 267;
    pub const GETRANDOM: usize = 318;
    pub const STATX: usize = 332;
    pub const O_NOFOLLOW: usize = 0o400000;
}

#[cfg(target_arch = "aarch64")]
mod nr {
    pub const READ: usize = 63;
    pub const WRITE: usize = 64;
    pub const CLOSE: usize = 57;
    pub const GETPID: usize = 172;
    pub const SOCKET: usize = 198;
    pub const CONNECT: usize = 203;
    pub const SENDTO: usize = 206;
    pub const GETSOCKOPT: usize = 209;
    pub const EXECVE: usize = 221;
    pub const FLOCK: usize = 32;
    pub const GETCWD: usize = 17;
    pub const CLOCK_GETTIME: usize = 113;
    pub const EXIT_GROUP: usize = 94;
    pub const OPENAT: usize = 56;
    pub const READLINKAT: usize = 78;
    pub const GETRANDOM: usize = 278;
    pub const STATX: usize = 291;
    pub const O_NOFOLLOW: usize = 0o100000;
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
compile_error!("leash's front door makes its system calls itself, for x86_64 and aarch64 only");

pub const EAGAIN: isize = 11;
const AT_FDCWD: isize = -100;
const AT_SYMLINK_NOFOLLOW: usize = 0x100;
const O_CLOEXEC: usize = 0o2000000;
const LOCK_SH: usize = 1;
const LOCK_NB: usize = 4;
const AF_UNIX: usize = 1;
const SOCK_STREAM: usize = 1;
const SOCK_CLOEXEC: usize = 0o2000000;
const SOL_SOCKET: usize = 1;
const SO_PEERCRED: usize = 17;
const MSG_NOSIGNAL: usize = 0x4000;
const CLOCK_REALTIME: usize = 0;
const STATX_TYPE: usize = 1;
const S_IFMT: u16 = 0o170000;
const S_IFLNK: u16 = 0o120000;

/// One system call with up to six arguments.
///
/// # Safety
/// The arguments must be what call `n` expects: pointers valid for what it reads and writes.
#[cfg(target_arch = "x86_64")]
pub unsafe fn syscall(n: usize, a: [usize; 6]) -> isize {
    let ret: isize;
    // SAFETY: the caller's; the kernel clobbers rcx and r11 only.
    unsafe {
        asm!("syscall", inlateout("rax") n as isize => ret,
             in("rdi") a[0], in("rsi") a[1], in("rdx") a[2], in("r10") a[3], in("r8") a[4],
             in("r9") a[5], lateout("rcx") _, lateout("r11") _, options(nostack));
    }
    ret
}

/// One system call with up to six arguments.
///
/// # Safety
/// The arguments must be what call `n` expects: pointers valid for what it reads and writes.
#[cfg(target_arch = "aarch64")]
pub unsafe fn syscall(n: usize, a: [usize; 6]) -> isize {
    let ret: isize;
    // SAFETY: the caller's.
    unsafe {
        asm!("svc 0", in("x8") n, inlateout("x0") a[0] as isize => ret, in("x1") a[1],
             in("x2") a[2], in("x3") a[3], in("x4") a[4], in("x5") a[5], options(nostack));
    }
    ret
}

/// A NUL-terminated copy of `s` (a path or an argument for the kernel).
pub fn cstring(s: &[u8]) -> alloc::vec::Vec<u8> {
    let mut v = alloc::vec::Vec::with_capacity(s.len() + 1);
    v.extend_from_slice(s);
    v.push(0);
    v
}

pub fn read(fd: i32, buf: &mut [u8]) -> isize {
    // SAFETY: buf is writable for its length.
    unsafe {
        syscall(
            nr::READ,
            [fd as usize, buf.as_mut_ptr() as usize, buf.len(), 0, 0, 0],
        )
    }
}

pub fn write(fd: i32, buf: &[u8]) -> isize {
    // SAFETY: buf is readable for its length.
    unsafe {
        syscall(
            nr::WRITE,
            [fd as usize, buf.as_ptr() as usize, buf.len(), 0, 0, 0],
        )
    }
}

/// `send(fd, buf, MSG_NOSIGNAL)`: a daemon that hung up is an error, not a SIGPIPE.
pub fn send(fd: i32, buf: &[u8]) -> isize {
    // SAFETY: buf is readable for its length; no address.
    unsafe {
        syscall(
            nr::SENDTO,
            [
                fd as usize,
                buf.as_ptr() as usize,
                buf.len(),
                MSG_NOSIGNAL,
                0,
                0,
            ],
        )
    }
}

pub fn close(fd: i32) {
    // SAFETY: closing a descriptor of ours.
    unsafe { syscall(nr::CLOSE, [fd as usize, 0, 0, 0, 0, 0]) };
}

/// Opens `path` read-only, close-on-exec, never through a symbolic link at its last component.
pub fn open_nofollow(path: &[u8]) -> isize {
    let p = cstring(path);
    // SAFETY: p is NUL-terminated.
    unsafe {
        syscall(
            nr::OPENAT,
            [
                AT_FDCWD as usize,
                p.as_ptr() as usize,
                nr::O_NOFOLLOW | O_CLOEXEC,
                0,
                0,
                0,
            ],
        )
    }
}

/// `flock(fd, LOCK_SH | LOCK_NB)`.
pub fn flock_shared_nonblock(fd: i32) -> isize {
    // SAFETY: no memory.
    unsafe { syscall(nr::FLOCK, [fd as usize, LOCK_SH | LOCK_NB, 0, 0, 0, 0]) }
}

/// Whether `path` is a symbolic link (`false` when it cannot be looked at).
pub fn is_symlink(path: &[u8]) -> bool {
    let p = cstring(path);
    let mut statx = [0u8; 256];
    // SAFETY: p is NUL-terminated; statx's buffer is 256 bytes, the size of struct statx.
    let r = unsafe {
        syscall(
            nr::STATX,
            [
                AT_FDCWD as usize,
                p.as_ptr() as usize,
                AT_SYMLINK_NOFOLLOW,
                STATX_TYPE,
                statx.as_mut_ptr() as usize,
                0,
            ],
        )
    };
    // stx_mode: a u16 at offset 28.
    r == 0 && u16::from_ne_bytes([statx[28], statx[29]]) & S_IFMT == S_IFLNK
}

/// A connected Unix stream socket to `path`, close-on-exec (`< 0`: `-errno`).
pub fn connect_unix(path: &[u8]) -> isize {
    // struct sockaddr_un: sa_family_t (2 bytes), then up to 108 bytes of path.
    if path.len() >= 108 || path.contains(&0) {
        return -36; // ENAMETOOLONG (or a NUL the kernel would cut at)
    }
    let mut addr = [0u8; 110];
    addr[..2].copy_from_slice(&(AF_UNIX as u16).to_ne_bytes());
    addr[2..2 + path.len()].copy_from_slice(path);
    // SAFETY: no memory.
    let fd = unsafe {
        syscall(
            nr::SOCKET,
            [AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, 0, 0, 0],
        )
    };
    if fd < 0 {
        return fd;
    }
    // SAFETY: addr is readable for the length given (family, path and its NUL).
    let r = unsafe {
        syscall(
            nr::CONNECT,
            [
                fd as usize,
                addr.as_ptr() as usize,
                2 + path.len() + 1,
                0,
                0,
                0,
            ],
        )
    };
    if r < 0 {
        close(fd as i32);
        return r;
    }
    fd
}

/// The pid of the socket's peer as the kernel recorded it at `connect` (`SO_PEERCRED`).
pub fn peer_pid(fd: i32) -> Option<i32> {
    // struct ucred { pid_t pid; uid_t uid; gid_t gid; }
    let mut cred = [0i32; 3];
    let mut len: u32 = 12;
    // SAFETY: cred is 12 writable bytes; len says so.
    let r = unsafe {
        syscall(
            nr::GETSOCKOPT,
            [
                fd as usize,
                SOL_SOCKET,
                SO_PEERCRED,
                cred.as_mut_ptr() as usize,
                &mut len as *mut u32 as usize,
                0,
            ],
        )
    };
    (r == 0 && len == 12).then_some(cred[0])
}

pub fn getpid() -> i32 {
    // SAFETY: no memory.
    unsafe { syscall(nr::GETPID, [0; 6]) as i32 }
}

/// The current directory (`None`: it cannot be named, e.g. it was removed).
pub fn getcwd() -> Option<alloc::vec::Vec<u8>> {
    let mut buf = alloc::vec![0u8; 4096];
    // SAFETY: buf is writable for its length.
    let r = unsafe {
        syscall(
            nr::GETCWD,
            [buf.as_mut_ptr() as usize, buf.len(), 0, 0, 0, 0],
        )
    };
    if r <= 0 || buf[0] != b'/' {
        return None;
    }
    // The kernel's length counts the NUL.
    buf.truncate(r as usize - 1);
    Some(buf)
}

/// What the symbolic link `path` points to.
pub fn readlink(path: &[u8]) -> Option<alloc::vec::Vec<u8>> {
    let p = cstring(path);
    let mut buf = alloc::vec![0u8; 4096];
    // SAFETY: p is NUL-terminated, buf writable for its length.
    let r = unsafe {
        syscall(
            nr::READLINKAT,
            [
                AT_FDCWD as usize,
                p.as_ptr() as usize,
                buf.as_mut_ptr() as usize,
                buf.len(),
                0,
                0,
            ],
        )
    };
    if r <= 0 || r as usize >= buf.len() {
        return None;
    }
    buf.truncate(r as usize);
    Some(buf)
}

/// Milliseconds since the Unix epoch.
pub fn unix_ms() -> u64 {
    let mut ts = [0i64; 2];
    // SAFETY: ts is a struct timespec (two 64-bit fields on both architectures).
    unsafe {
        syscall(
            nr::CLOCK_GETTIME,
            [CLOCK_REALTIME, ts.as_mut_ptr() as usize, 0, 0, 0, 0],
        )
    };
    (ts[0] as u64) * 1000 + (ts[1] as u64) / 1_000_000
}

/// Random bytes from the kernel (`getrandom`, which blocks only until the pool is first ready).
pub fn random(buf: &mut [u8]) -> bool {
    // SAFETY: buf is writable for its length.
    let r = unsafe {
        syscall(
            nr::GETRANDOM,
            [buf.as_mut_ptr() as usize, buf.len(), 0, 0, 0, 0],
        )
    };
    r == buf.len() as isize
}

/// `execve`; returns only on failure (`-errno`).
///
/// # Safety
/// `path` is NUL-terminated; `argv` and `envp` are null-terminated arrays of pointers to
/// NUL-terminated strings, all alive for the call.
pub unsafe fn execve(path: *const u8, argv: *const *const u8, envp: *const *const u8) -> isize {
    // SAFETY: the caller's.
    unsafe {
        syscall(
            nr::EXECVE,
            [path as usize, argv as usize, envp as usize, 0, 0, 0],
        )
    }
}

pub fn exit(code: i32) -> ! {
    loop {
        // SAFETY: no memory; exit_group does not return.
        unsafe { syscall(nr::EXIT_GROUP, [code as usize, 0, 0, 0, 0, 0]) };
    }
}
