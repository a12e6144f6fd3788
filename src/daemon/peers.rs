//! The cap on the connections one peer process holds ([`PeerConnections`]) and the rate-limited
//! log of refusals and failed accepts ([`RateLog`]): the accept loop's bookkeeping, kept in the
//! daemon's state.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The environment variable that caps how many connections one peer process may hold open at
/// once (at least 1; default [`PEER_CONNECTIONS`]).
pub const ENV_MAX_PEER_CONNECTIONS: &str = "LEASH_MAX_PEER_CONNECTIONS";

/// How many connections one process may hold open at once. A connection costs the daemon a
/// thread and two descriptors; a gateway needs one per concurrent caller of a key, far fewer.
pub const PEER_CONNECTIONS: usize = 256;

/// A refusal, or a failed accept, is logged at most once a period (with how many were not).
const LOG_PERIOD: Duration = Duration::from_secs(60);

/// The connections each peer process holds, and the cap on them: a process (any of the
/// daemon's own uid may connect) that opens connections and never closes them would otherwise
/// take every descriptor of the daemon, and every other client's connection with them.
pub(super) struct PeerConnections {
    cap: usize,
    held: Mutex<HashMap<i32, usize>>,
    refusals: RateLog,
}

impl Default for PeerConnections {
    fn default() -> Self {
        let cap = std::env::var(ENV_MAX_PEER_CONNECTIONS)
            .ok()
            .and_then(|v| v.trim().parse::<usize>().ok())
            .filter(|&n| n > 0)
            .unwrap_or(PEER_CONNECTIONS);
        PeerConnections {
            cap,
            held: Mutex::new(HashMap::new()),
            refusals: RateLog::default(),
        }
    }
}

/// One admitted connection of a peer, counted until it is dropped.
pub(super) struct PeerSlot<'a> {
    of: &'a PeerConnections,
    pid: i32,
}

impl Drop for PeerSlot<'_> {
    fn drop(&mut self) {
        let mut held = self.of.lock();
        if let Some(n) = held.get_mut(&self.pid) {
            *n -= 1;
            if *n == 0 {
                held.remove(&self.pid);
            }
        }
    }
}

impl PeerConnections {
    fn lock(&self) -> MutexGuard<'_, HashMap<i32, usize>> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Counts a new connection of `pid`, or refuses it (the message to answer with) when the
    /// peer holds the cap already. A refusal is logged once a period.
    pub(super) fn admit(&self, pid: i32) -> Result<PeerSlot<'_>, String> {
        {
            let mut held = self.lock();
            let n = held.entry(pid).or_insert(0);
            if *n < self.cap {
                *n += 1;
                return Ok(PeerSlot { of: self, pid });
            }
        }
        let msg = format!(
            "connection refused: process {pid} already holds {} connections to this leash serve, the most one process may ({ENV_MAX_PEER_CONNECTIONS}); close the ones it does not use",
            self.cap
        );
        if let Some(unlogged) = self.refusals.due() {
            tracing::warn!(
                pid,
                cap = self.cap,
                "{msg} (refusals are logged once a minute; {unlogged} more since the last line)"
            );
        }
        Err(msg)
    }
}

/// Logs a repeated event once a period: [`RateLog::due`] says when a line is due, and how many
/// events since the last line went unlogged.
#[derive(Default)]
pub(super) struct RateLog {
    state: Mutex<(Option<Instant>, u64)>,
}

impl RateLog {
    pub(super) fn due(&self) -> Option<u64> {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        if st.0.is_some_and(|at| now.duration_since(at) < LOG_PERIOD) {
            st.1 += 1;
            return None;
        }
        let unlogged = st.1;
        *st = (Some(now), 0);
        Some(unlogged)
    }
}
