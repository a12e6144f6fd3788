//! An upgrade asked for (the `upgrade` op or SIGHUP), on its way from the connection or the
//! signal to `serve`'s loop, which carries the handoff out (`upgrade.rs`).

use std::os::fd::RawFd;
use std::sync::Mutex;

/// How the asking connection gets its answer when the handoff does not happen (refused before
/// the exec): the error's message. A handoff that happens is answered by the next program, on
/// the connection's descriptor.
pub type Refuse = Box<dyn FnOnce(String) + Send>;

pub struct Ask {
    /// `CLOCK_MONOTONIC` (ns) when it was asked.
    pub at_ns: u64,
    /// The asking connection's descriptor and the request's id (none for SIGHUP).
    pub requester: Option<(RawFd, serde_json::Value)>,
    pub refuse: Option<Refuse>,
}

/// At most one upgrade is asked for at a time.
#[derive(Default)]
pub struct Asks {
    pending: Mutex<Option<Ask>>,
}

impl Asks {
    /// Queues `ask`; gives it back when another one is pending.
    pub fn put(&self, ask: Ask) -> Result<(), Ask> {
        let mut p = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        if p.is_some() {
            return Err(ask);
        }
        *p = Some(ask);
        Ok(())
    }

    pub fn take(&self) -> Option<Ask> {
        self.pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
    }
}
