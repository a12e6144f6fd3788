//! `leash`: the front door of every leash command.
//!
//! A session start runs `leash exec`, and on a virtual machine the C library's start-up alone
//! costs more than everything else the front door does: glibc probes the CPU's caches with
//! dozens of `cpuid` instructions before `main`, and each one traps to the hypervisor (0.8–0.9 ms
//! a process on the benchmark VM; docs/benchmarks.md). So this program has no C library: it
//! starts at `_start`, makes its system calls itself (`sys.rs`) and does one thing.
//!
//! For `leash exec` on a state root a `leash serve` serves, it connects to the daemon (found and
//! trusted the way every leash client finds it: the lock file is held and names the socket and
//! the pid, the socket is no symlink, the peer is that pid), sends `execArgv` with a lease id of
//! its choosing, and the daemon reads this process's command line and environment from `/proc`,
//! parses them with leash's own parser, decides and commits exactly as `leash exec` would, and
//! answers with the wrapper's command line and the edits to this environment. The front door
//! applies them and execs the wrapper in place: the lease's root is this process, committed
//! before the wrapper's first instruction, as always.
//!
//! Everything else — another command, `--no-daemon`, no daemon, an answer of `direct` or an
//! error, anything unexpected — execs `leash-main` (the whole program, installed next to this
//! one) with the same argv and environment, and it does what it always did. Once the request is
//! sent, the lease may be committed whatever happens next, so the fallback then carries the
//! lease id in `LEASH_EXEC_ASKED`: `leash-main` looks it up first and, when it is this process's,
//! execs the wrapper for it (or records it lost, if the wrapper cannot run).

#![no_std]
#![no_main]

extern crate alloc;

mod sys;

use alloc::vec::Vec;
use core::cell::UnsafeCell;
use leash_front::json::{self, Json};
use leash_front::{getenv, scan, state_dir, uuid7, wrapper_env, EnvEdits, Scan};

/// The whole program, next to this one.
const MAIN: &[u8] = b"leash-main";
/// The lease id a fallback after a sent request hands `leash-main` (see the module doc).
const ENV_ASKED: &[u8] = b"LEASH_EXEC_ASKED";
/// Exit status when not even `leash-main` can be run: leash exec's own failure status, and
/// every other command's for an error.
const EXIT_EXEC_FAILED: i32 = 125;
const EXIT_ERROR: i32 = 1;
/// The longest lock file and answer read.
const MAX_LOCK: usize = 64 * 1024;
/// The first read of the lock file (it is about 100 bytes).
const LOCK_READ: usize = 4096;
const MAX_ANSWER: usize = 1 << 20;

core::arch::global_asm!(
    ".globl _start",
    "_start:",
    // The kernel leaves argc, argv[], NULL, envp[], NULL at the stack pointer.
    #[cfg(target_arch = "x86_64")]
    "xor ebp, ebp",
    #[cfg(target_arch = "x86_64")]
    "mov rdi, rsp",
    #[cfg(target_arch = "x86_64")]
    "and rsp, -16",
    #[cfg(target_arch = "x86_64")]
    "call {entry}",
    #[cfg(target_arch = "x86_64")]
    "ud2",
    #[cfg(target_arch = "aarch64")]
    "mov x29, xzr",
    #[cfg(target_arch = "aarch64")]
    "mov x30, xzr",
    #[cfg(target_arch = "aarch64")]
    "mov x0, sp",
    #[cfg(target_arch = "aarch64")]
    "bl {entry}",
    #[cfg(target_arch = "aarch64")]
    "udf #0",
    entry = sym entry,
);

const AT_NULL: usize = 0;
const AT_EXECFN: usize = 31;

/// What a fallback needs, whenever it happens (a panic included).
struct Process {
    argv: *const *const u8,
    envp: *const *const u8,
    /// The path this program was exec'd by (`AT_EXECFN`), for when `/proc` cannot say.
    exec_fn: *const u8,
    /// The lease id sent to the daemon, once it was.
    asked: Option<[u8; 36]>,
}

struct Once(UnsafeCell<Process>);
// SAFETY: the front door has one thread.
unsafe impl Sync for Once {}
static PROCESS: Once = Once(UnsafeCell::new(Process {
    argv: core::ptr::null(),
    envp: core::ptr::null(),
    exec_fn: core::ptr::null(),
    asked: None,
}));

fn process() -> &'static mut Process {
    // SAFETY: one thread, and no reference to it is held across another call of this.
    unsafe { &mut *PROCESS.0.get() }
}

/// # Safety
/// Called once, by `_start`, with the stack pointer the kernel left.
unsafe extern "C" fn entry(sp: *const usize) -> ! {
    // SAFETY: the kernel's layout: argc, then argc pointers and a NULL, then envp's, NULL-ended.
    let (argv, envp) = unsafe {
        let argc = *sp;
        let argv = sp.add(1) as *const *const u8;
        (argv, argv.add(argc + 1))
    };
    let p = process();
    p.argv = argv;
    p.envp = envp;
    // SAFETY: after envp's NULL the kernel leaves the auxiliary vector: (type, value) pairs up
    // to AT_NULL.
    unsafe {
        let mut e = envp;
        while !(*e).is_null() {
            e = e.add(1);
        }
        let mut aux = e.add(1) as *const usize;
        while *aux != AT_NULL {
            if *aux == AT_EXECFN {
                p.exec_fn = *aux.add(1) as *const u8;
            }
            aux = aux.add(2);
        }
    }
    // SAFETY: both arrays are the kernel's, alive for the whole process.
    let (args, env) = unsafe { (strings(argv), strings(envp)) };
    front(&args, &env);
    run_main()
}

/// One C string.
///
/// # Safety
/// `s` points at a NUL-terminated string alive for the process.
unsafe fn strings_one(s: *const u8) -> &'static [u8] {
    let mut n = 0;
    // SAFETY: the caller's. (Volatile: a plain loop is made a call of `strlen`, which nothing
    // here provides.)
    while unsafe { s.add(n).read_volatile() } != 0 {
        n += 1;
    }
    // SAFETY: n bytes readable.
    unsafe { core::slice::from_raw_parts(s, n) }
}

/// The strings of a NULL-terminated array of C strings.
///
/// # Safety
/// `list` is such an array, alive as long as the result.
unsafe fn strings(list: *const *const u8) -> Vec<&'static [u8]> {
    let mut out = Vec::new();
    let mut i = 0;
    loop {
        // SAFETY: the caller's: every element up to the NULL is a C string.
        let s = unsafe { *list.add(i) };
        if s.is_null() {
            return out;
        }
        // SAFETY: the caller's: a C string alive as long as the array.
        out.push(unsafe { strings_one(s) });
        i += 1;
    }
}

/// The daemon's way, when it applies; returns when `leash-main` should take over.
fn front(args: &[&'static [u8]], env: &[&'static [u8]]) {
    let Scan::Exec {
        state_dir: flag,
        no_daemon: false,
    } = scan(args)
    else {
        return;
    };
    let Some(dir) = state_dir(flag, |k| getenv(env, k), sys::getcwd) else {
        return;
    };
    let Some((socket, pids)) = daemon_of(&dir) else {
        return;
    };
    if sys::is_symlink(&socket) {
        return;
    }
    let fd = sys::connect_unix(&socket);
    if fd < 0 {
        return;
    }
    let fd = fd as i32;
    if !sys::peer_pid(fd).is_some_and(|p| pids.contains(&p)) {
        sys::close(fd);
        return;
    }
    let mut random = [0u8; 10];
    if !sys::random(&mut random) {
        sys::close(fd);
        return;
    }
    let lease_id = uuid7(sys::unix_ms(), random);
    let mut request = Vec::with_capacity(96);
    request.extend_from_slice(br#"{"id":1,"op":"execArgv","leaseId":""#);
    request.extend_from_slice(&lease_id);
    request.extend_from_slice(b"\"}\n");
    if !send_all(fd, &request) {
        // The newline never went out: the daemon did not take the request.
        sys::close(fd);
        return;
    }
    process().asked = Some(lease_id);
    let answer = read_line(fd);
    sys::close(fd);
    let Some(answer) = answer.as_deref().and_then(json::parse) else {
        return;
    };
    if answer.get("ok").and_then(Json::as_bool) != Some(true) {
        // Refused (nothing was committed): leash-main asks again and says why.
        process().asked = None;
        return;
    }
    let Some(result) = answer.get("result") else {
        return;
    };
    match result.get("outcome").and_then(Json::as_bytes) {
        Some(b"committed") => exec_wrapper(args, env, result),
        Some(b"direct") => process().asked = None,
        _ => {}
    }
}

/// The socket and the pids to trust on it, from the state root's lock file, when a daemon holds
/// the lock (a shared lock of ours is refused). The lock is probed after the read, as leash's
/// own clients do: a daemon that starts in between holds it and names itself after.
fn daemon_of(dir: &[u8]) -> Option<(Vec<u8>, Vec<i32>)> {
    let fd = sys::open_nofollow(&leash_front::join(dir, b"daemon.lock"));
    if fd < 0 {
        return None;
    }
    let fd = fd as i32;
    let mut text = alloc::vec![0u8; LOCK_READ];
    let mut len = 0;
    loop {
        if len == text.len() {
            if len >= MAX_LOCK {
                break;
            }
            text.resize(len * 2, 0);
        }
        let n = sys::read(fd, &mut text[len..]);
        if n <= 0 {
            break;
        }
        len += n as usize;
        // A regular file's short read is its end: no second read to see 0.
        if len < text.len() {
            break;
        }
    }
    let held = sys::flock_shared_nonblock(fd) == -sys::EAGAIN;
    sys::close(fd);
    if !held || len == MAX_LOCK {
        return None;
    }
    let info = json::parse(&text[..len])?;
    let pid = info.get("pid").and_then(Json::as_i64).filter(|&p| p > 0)?;
    let socket = info.get("socket").and_then(Json::as_bytes)?.to_vec();
    let mut pids = alloc::vec![i32::try_from(pid).ok()?];
    if let Some(l) = info.get("listenerPid").and_then(Json::as_i64) {
        pids.push(i32::try_from(l).ok()?);
    }
    Some((socket, pids))
}

fn send_all(fd: i32, mut bytes: &[u8]) -> bool {
    while !bytes.is_empty() {
        let n = sys::send(fd, bytes);
        if n <= 0 {
            return false;
        }
        bytes = &bytes[n as usize..];
    }
    true
}

/// One line (without its newline), or `None` when the connection ends before one is whole.
fn read_line(fd: i32) -> Option<Vec<u8>> {
    let mut buf = alloc::vec![0u8; 4096];
    let mut len = 0;
    loop {
        if let Some(end) = buf[..len].iter().position(|&c| c == b'\n') {
            buf.truncate(end);
            return Some(buf);
        }
        if len == buf.len() {
            if buf.len() >= MAX_ANSWER {
                return None;
            }
            buf.resize(buf.len() * 2, 0);
        }
        let n = sys::read(fd, &mut buf[len..]);
        if n <= 0 {
            return None;
        }
        len += n as usize;
    }
}

/// Execs the wrapper the daemon committed the lease for; returns when that cannot be done.
fn exec_wrapper(args: &[&[u8]], env: &[&[u8]], result: &Json) {
    let Some(line) = wrapper_line(args, env, result) else {
        return;
    };
    let (path, argv, envp) = line;
    let argv_c: Vec<Vec<u8>> = argv.iter().map(|a| sys::cstring(a)).collect();
    let envp_c: Vec<Vec<u8>> = envp.iter().map(|e| sys::cstring(e)).collect();
    let path_c = sys::cstring(path);
    exec(&path_c, &argv_c, &envp_c);
}

/// The wrapper's path, argv and environment from the daemon's answer, checked: the lease is
/// rooted at this process, the command starts where the daemon says it does.
#[allow(clippy::type_complexity)]
fn wrapper_line<'a>(
    args: &[&'a [u8]],
    env: &[&'a [u8]],
    result: &'a Json,
) -> Option<(&'a [u8], Vec<&'a [u8]>, Vec<Vec<u8>>)> {
    if result.get("rootPid").and_then(Json::as_i64) != Some(i64::from(sys::getpid())) {
        return None;
    }
    let path = result.get("wrapper").and_then(Json::as_bytes)?;
    let at = usize::try_from(result.get("commandAt").and_then(Json::as_i64)?).ok()?;
    if at == 0 || at >= args.len() || args[at - 1] != b"--" {
        return None;
    }
    let mut argv = alloc::vec![path];
    argv.extend(result.get("args")?.as_strings()?);
    argv.extend_from_slice(&args[at..]);
    let e = result.get("env")?;
    let edits = EnvEdits {
        base: e
            .get("base")?
            .as_array()?
            .iter()
            .map(|kv| match kv.as_array()? {
                [k, Json::Null] => Some((k.as_bytes()?, None)),
                [k, v] => Some((k.as_bytes()?, Some(v.as_bytes()?))),
                _ => None,
            })
            .collect::<Option<Vec<_>>>()?,
        clear: e.get("clear").and_then(Json::as_bool)?,
        keep: e.get("keep")?.as_strings()?,
        unset: e.get("unset")?.as_strings()?,
        set: e
            .get("set")?
            .as_array()?
            .iter()
            .map(|kv| match kv.as_strings()?.as_slice() {
                [k, v] => Some((*k, *v)),
                _ => None,
            })
            .collect::<Option<Vec<_>>>()?,
    };
    Some((path, argv, wrapper_env(env, &edits)))
}

/// `execve` with owned strings (each NUL-terminated); returns only on failure.
fn exec(path: &[u8], argv: &[Vec<u8>], envp: &[Vec<u8>]) -> isize {
    let mut av: Vec<*const u8> = argv.iter().map(|a| a.as_ptr()).collect();
    av.push(core::ptr::null());
    let mut ev: Vec<*const u8> = envp.iter().map(|e| e.as_ptr()).collect();
    ev.push(core::ptr::null());
    // SAFETY: every string is NUL-terminated (sys::cstring) and both lists end with NULL; all
    // are alive for the call.
    unsafe { sys::execve(path.as_ptr(), av.as_ptr(), ev.as_ptr()) }
}

/// Execs `leash-main` with this process's argv and environment (and, after a sent request, the
/// lease id asked for); says why and exits 125 when it cannot.
fn run_main() -> ! {
    let p = process();
    // Where this binary is: `/proc/self/exe` (canonical), else the path it was exec'd by (in a
    // mount namespace without `/proc`).
    let me = sys::readlink(b"/proc/self/exe").or_else(|| {
        // SAFETY: AT_EXECFN points at a C string the kernel copied onto the stack.
        (!p.exec_fn.is_null()).then(|| unsafe { strings_one(p.exec_fn) }.to_vec())
    });
    let path = match &me {
        Some(exe) => match exe.iter().rposition(|&c| c == b'/') {
            Some(slash) => {
                let mut p = exe[..=slash].to_vec();
                p.extend_from_slice(MAIN);
                p
            }
            None => MAIN.to_vec(),
        },
        None => MAIN.to_vec(),
    };
    // SAFETY: the kernel's arrays, alive for the whole process.
    let (args, env) = unsafe { (strings(p.argv), strings(p.envp)) };
    let argv: Vec<Vec<u8>> = args.iter().map(|a| sys::cstring(a)).collect();
    let mut envp: Vec<Vec<u8>> = env
        .iter()
        .filter(|e| !(e.starts_with(ENV_ASKED) && e.get(ENV_ASKED.len()) == Some(&b'=')))
        .map(|e| sys::cstring(e))
        .collect();
    if let Some(id) = p.asked {
        let mut e = ENV_ASKED.to_vec();
        e.push(b'=');
        e.extend_from_slice(&id);
        envp.push(sys::cstring(&e));
    }
    let err = exec(&sys::cstring(&path), &argv, &envp);
    let mut msg = b"leash: cannot run ".to_vec();
    msg.extend_from_slice(&path);
    msg.extend_from_slice(b" (errno ");
    push_decimal(&mut msg, err.unsigned_abs());
    msg.extend_from_slice(
        b"): leash-main is installed next to leash (cargo install --path . installs both)\n",
    );
    sys::write(2, &msg);
    sys::exit(match scan(&args) {
        Scan::Exec { .. } => EXIT_EXEC_FAILED,
        Scan::Other => EXIT_ERROR,
    })
}

fn push_decimal(out: &mut Vec<u8>, mut n: usize) {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[i..]);
}

#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    // A broken assumption (the heap ran out, say): leash-main takes over, as for any surprise.
    run_main()
}

/// The heap: a bump allocator over a static area (untouched pages cost nothing). The front door
/// lives for a few hundred microseconds and frees nothing worth reusing.
struct Bump {
    area: UnsafeCell<[u8; HEAP]>,
    next: UnsafeCell<usize>,
}

const HEAP: usize = 16 << 20;

// SAFETY: the front door has one thread.
unsafe impl Sync for Bump {}

#[global_allocator]
static ALLOC: Bump = Bump {
    area: UnsafeCell::new([0; HEAP]),
    next: UnsafeCell::new(0),
};

// SAFETY: blocks never overlap (the cursor only moves forward) and are aligned as asked.
unsafe impl core::alloc::GlobalAlloc for Bump {
    unsafe fn alloc(&self, layout: core::alloc::Layout) -> *mut u8 {
        // SAFETY: one thread: nothing else touches the cursor.
        let next = unsafe { &mut *self.next.get() };
        let start = (*next + layout.align() - 1) & !(layout.align() - 1);
        match start.checked_add(layout.size()) {
            Some(end) if end <= HEAP => {
                *next = end;
                // SAFETY: start..end lies within the area.
                unsafe { (self.area.get() as *mut u8).add(start) }
            }
            _ => core::ptr::null_mut(),
        }
    }

    /// The area starts zeroed (it is `.bss`) and no block is handed out twice: nothing to clear.
    unsafe fn alloc_zeroed(&self, layout: core::alloc::Layout) -> *mut u8 {
        // SAFETY: the caller's, as for `alloc`.
        unsafe { self.alloc(layout) }
    }

    unsafe fn dealloc(&self, _: *mut u8, _: core::alloc::Layout) {}

    /// In place when the block is the last one handed out (a buffer that grows), else a copy.
    unsafe fn realloc(
        &self,
        ptr: *mut u8,
        layout: core::alloc::Layout,
        new_size: usize,
    ) -> *mut u8 {
        // SAFETY: one thread; ptr came from this allocator with `layout`.
        unsafe {
            let next = &mut *self.next.get();
            let base = self.area.get() as *mut u8;
            let start = ptr.offset_from(base) as usize;
            if start + layout.size() == *next && start + new_size <= HEAP {
                *next = start + new_size;
                return ptr;
            }
            let new = self.alloc(core::alloc::Layout::from_size_align_unchecked(
                new_size,
                layout.align(),
            ));
            if !new.is_null() {
                core::ptr::copy_nonoverlapping(ptr, new, layout.size().min(new_size));
            }
            new
        }
    }
}

// What the compiler may call that a C library would provide. `rep movsb` and `rep stosb` are
// what glibc uses for mid-sized blocks on current x86 CPUs; on aarch64 a plain loop (through
// volatile accesses, so that it is not turned back into a call of itself).

/// # Safety
/// As C's `memcpy`.
#[no_mangle]
pub unsafe extern "C" fn memcpy(dest: *mut u8, src: *const u8, n: usize) -> *mut u8 {
    // SAFETY: the caller's.
    unsafe { copy_forward(dest, src, n) };
    dest
}

/// # Safety
/// As C's `memmove`.
#[no_mangle]
pub unsafe extern "C" fn memmove(dest: *mut u8, src: *const u8, n: usize) -> *mut u8 {
    if (dest as usize) <= (src as usize) || (dest as usize) >= (src as usize) + n {
        // SAFETY: the caller's; copying forward is right when dest is not ahead inside src.
        unsafe { copy_forward(dest, src, n) };
    } else {
        let mut i = n;
        while i > 0 {
            i -= 1;
            // SAFETY: the caller's.
            unsafe { dest.add(i).write_volatile(src.add(i).read_volatile()) };
        }
    }
    dest
}

/// # Safety
/// As C's `memset`.
#[no_mangle]
pub unsafe extern "C" fn memset(dest: *mut u8, c: i32, n: usize) -> *mut u8 {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: the caller's: dest is writable for n bytes.
    unsafe {
        core::arch::asm!("rep stosb", inout("rcx") n => _, inout("rdi") dest => _,
                         in("al") c as u8, options(nostack, preserves_flags));
    }
    #[cfg(not(target_arch = "x86_64"))]
    for i in 0..n {
        // SAFETY: the caller's.
        unsafe { dest.add(i).write_volatile(c as u8) };
    }
    dest
}

/// # Safety
/// As C's `memcmp`.
#[no_mangle]
pub unsafe extern "C" fn memcmp(a: *const u8, b: *const u8, n: usize) -> i32 {
    for i in 0..n {
        // SAFETY: the caller's.
        let (x, y) = unsafe { (a.add(i).read_volatile(), b.add(i).read_volatile()) };
        if x != y {
            return i32::from(x) - i32::from(y);
        }
    }
    0
}

/// # Safety
/// As C's `bcmp`.
#[no_mangle]
pub unsafe extern "C" fn bcmp(a: *const u8, b: *const u8, n: usize) -> i32 {
    // SAFETY: the caller's.
    unsafe { memcmp(a, b, n) }
}

/// # Safety
/// `dest` and `src` valid for `n` bytes; `dest` not ahead of `src` within it.
unsafe fn copy_forward(dest: *mut u8, src: *const u8, n: usize) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: the caller's; `rep movsb` copies forward, byte by byte as far as overlap goes.
    unsafe {
        core::arch::asm!("rep movsb", inout("rcx") n => _, inout("rdi") dest => _,
                         inout("rsi") src => _, options(nostack, preserves_flags));
    }
    #[cfg(not(target_arch = "x86_64"))]
    for i in 0..n {
        // SAFETY: the caller's.
        unsafe { dest.add(i).write_volatile(src.add(i).read_volatile()) };
    }
}

/// Unwinding never happens here (the panic handler execs `leash-main`), but code built for it
/// (the test profile builds `core` and `leash-front` that way) names these.
#[no_mangle]
pub extern "C" fn rust_eh_personality() {}

#[no_mangle]
pub extern "C" fn _Unwind_Resume() -> ! {
    sys::exit(EXIT_EXEC_FAILED)
}
