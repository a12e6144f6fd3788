//! The control plane's priority: connection threads run raised above the adapters.
//!
//! `status` and `ping` must answer in milliseconds whatever the sessions do (p99
//! ≤ 50 ms with 100 sessions printing as fast as they can), and a `send` or a
//! `cancel` should not queue behind them either. On a host whose CPUs are taken by the adapters
//! themselves, a connection thread at the adapters' priority waits behind the whole run queue,
//! once to wake up and again for every further scheduler slice its answer needs (`status` of
//! 100 sessions renders some 45 KB). Measured with 100 sessions printing on 2 CPUs, load 15:
//! `status` p99 171 ms at the adapters' priority with no lock in its way, 18 ms raised.
//!
//! So each connection thread raises itself by [`BOOST`] nice steps for its life ([`raise`]);
//! the threads it starts (an op's worker, an attach's streamer) inherit that. Nothing raised
//! ever starts a process: [`lowered`] drops the calling thread back to the daemon's own
//! priority around `session::spawn`, so `leash exec`, the wrapper, the adapter and the session's
//! own threads start at the daemon's priority, as before (the output readers then lower
//! themselves further, see `session::stdio`). Raising needs `CAP_SYS_NICE` (or an
//! `RLIMIT_NICE` that allows it); a daemon without it runs everything at its own priority, as
//! before, and says so once in its log.

use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};

/// How many nice steps connection threads are raised by: −10 from a daemon at nice 0 (a
/// thread's weight is then ~9× an adapter's at 0, enough to take its slices back from a
/// hundred busy adapters on a small host).
pub const BOOST: i32 = 10;

/// Set once raising was refused: later connections do not try again.
static REFUSED: AtomicBool = AtomicBool::new(false);

/// A nice value no thread can have: "not raised".
const NONE: i32 = i32::MIN;

thread_local! {
    /// The nice value this thread had before [`raise`] (inherited by the threads it starts,
    /// which learn it again from [`DAEMON_NICE`]).
    static OWN: std::cell::Cell<i32> = const { std::cell::Cell::new(NONE) };
}

/// The daemon's own nice value, as the first raised thread read it.
static DAEMON_NICE: AtomicI32 = AtomicI32::new(NONE);

/// Raises the calling thread for the rest of its life (see the module docs). Returns whether
/// it is raised. Once per thread: a connection thread that serves its next connection (see
/// `socket::Pool`) is raised already and stays as it is.
pub fn raise() -> bool {
    if OWN.with(|o| o.get()) != NONE {
        return true;
    }
    if REFUSED.load(Ordering::Relaxed) {
        return false;
    }
    let Ok(own) = crate::sys::thread_nice() else {
        return false;
    };
    let raised = (own - BOOST).max(-20);
    if raised == own {
        return false;
    }
    match crate::sys::set_thread_nice(raised) {
        Ok(()) => {
            let _ = DAEMON_NICE.compare_exchange(NONE, own, Ordering::Relaxed, Ordering::Relaxed);
            OWN.with(|o| o.set(own));
            true
        }
        Err(e) => {
            if !REFUSED.swap(true, Ordering::Relaxed) {
                tracing::info!(error = %e, "cannot raise the connection threads above the adapters (needs CAP_SYS_NICE); requests are answered at the daemon's priority");
            }
            false
        }
    }
}

/// The calling thread at the daemon's own priority while this lives.
pub struct Lowered {
    restore: Option<i32>,
}

/// Drops the calling thread to the daemon's own priority until the guard is dropped, if it
/// runs above it (a raised connection thread, or a thread one started). Everything it starts
/// meanwhile (processes, threads) starts at the daemon's priority.
pub fn lowered() -> Lowered {
    let daemon = match OWN.with(|o| o.get()) {
        NONE => DAEMON_NICE.load(Ordering::Relaxed),
        own => own,
    };
    if daemon == NONE {
        return Lowered { restore: None };
    }
    match crate::sys::thread_nice() {
        Ok(now) if now < daemon => match crate::sys::set_thread_nice(daemon) {
            Ok(()) => Lowered { restore: Some(now) },
            Err(e) => {
                tracing::warn!(error = %e, "cannot drop to the daemon's priority before starting a session");
                Lowered { restore: None }
            }
        },
        _ => Lowered { restore: None },
    }
}

impl Drop for Lowered {
    fn drop(&mut self) {
        if let Some(raised) = self.restore {
            if let Err(e) = crate::sys::set_thread_nice(raised) {
                tracing::debug!(error = %e, "cannot raise the thread again after starting a session");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// In threads of their own (nice values are per thread): a raised thread, and a thread it
    /// starts, drop to the thread's first priority while lowered and come back after; without
    /// the privilege nothing changes.
    #[test]
    fn connection_threads_run_raised_and_start_nothing_raised() {
        std::thread::spawn(|| {
            let own = crate::sys::thread_nice().unwrap();
            if !raise() {
                assert_eq!(crate::sys::thread_nice().unwrap(), own);
                eprintln!("skipped: no CAP_SYS_NICE here, nothing is raised");
                return;
            }
            let raised = (own - BOOST).max(-20);
            assert_eq!(crate::sys::thread_nice().unwrap(), raised);
            {
                let _l = lowered();
                assert_eq!(crate::sys::thread_nice().unwrap(), own);
                // A thread started while lowered starts at the daemon's priority.
                let child = std::thread::spawn(crate::sys::thread_nice).join().unwrap();
                assert_eq!(child.unwrap(), own);
            }
            assert_eq!(crate::sys::thread_nice().unwrap(), raised);
            // A thread started raised inherits it, and lowers to the daemon's priority too.
            std::thread::spawn(move || {
                assert_eq!(crate::sys::thread_nice().unwrap(), raised);
                let _l = lowered();
                assert_eq!(crate::sys::thread_nice().unwrap(), own);
            })
            .join()
            .unwrap();
        })
        .join()
        .unwrap();
    }
}
