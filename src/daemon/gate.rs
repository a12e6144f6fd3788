//! The gate the ops that change something pass (ensure, send, cancel, close, reap, exec): a
//! handoff (`upgrade.rs`) closes it and waits, within a deadline, until the ops in flight are
//! done, so that nothing is half done when the daemon's state is written out. While it is
//! closed such an op is answered at once with a retryable error (nothing was done); the ops that
//! only read (status, sessions, attach, …) are not gated and keep answering.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

#[derive(Default)]
pub struct Gate {
    state: Mutex<State>,
    changed: Condvar,
}

#[derive(Default)]
struct State {
    closed: bool,
    in_flight: usize,
}

/// An op that passed the gate, until it is dropped (moved along to the thread that replies, for
/// the ops that reply off the connection's thread).
pub struct Passed {
    gate: Arc<Gate>,
}

impl Drop for Passed {
    fn drop(&mut self) {
        self.gate.state().in_flight -= 1;
        self.gate.changed.notify_all();
    }
}

/// The ops the gate holds back: those that change a session, a lease or a process.
pub const GATED: &[&str] = &["ensure", "send", "cancel", "close", "reap", "exec"];

impl Gate {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Lets an op in, unless the gate is closed.
    pub fn pass(self: &Arc<Self>) -> Option<Passed> {
        let mut st = self.state();
        if st.closed {
            return None;
        }
        st.in_flight += 1;
        Some(Passed { gate: self.clone() })
    }

    /// Closes the gate and waits, up to `within`, for the ops in flight. On failure (the ops in
    /// flight, counted) the gate is open again.
    pub fn close(&self, within: Duration) -> Result<(), usize> {
        let mut st = self.state();
        st.closed = true;
        let (mut st, _) = self
            .changed
            .wait_timeout_while(st, within, |s| s.in_flight > 0)
            .unwrap_or_else(|p| p.into_inner());
        if st.in_flight > 0 {
            st.closed = false;
            return Err(st.in_flight);
        }
        Ok(())
    }

    pub fn open(&self) {
        self.state().closed = false;
    }
}
