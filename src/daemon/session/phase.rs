//! Where a session is in its life, with what belongs to each stage: a close in flight only while
//! closing, the exit status and the time of the end only once ended. The wire's [`Phase`] is the
//! stage's name ([`Life::phase`]). Every transition is a method here that says whether it
//! applied, so the rules of "who may close, and when is it running again" are in one place and
//! tested on their own; the session calls them under its lock.

use super::base::*;

#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Life {
    /// Spawned; the lease or the adapter's start is not confirmed yet.
    Starting,
    Running,
    /// Closing: by a close of this daemon (`in_flight`), or — `in_flight` false — because a close
    /// that terminated nothing found the lease no longer open (someone else is closing it).
    Closing {
        in_flight: bool,
    },
    /// The wrapper exited and was reaped.
    Ended {
        exit_status: Option<i32>,
        at: Instant,
    },
}

impl Life {
    /// The stage's name on the wire.
    pub(super) fn phase(&self) -> Phase {
        match self {
            Life::Starting => Phase::Starting,
            Life::Running => Phase::Running,
            Life::Closing { .. } => Phase::Closing,
            Life::Ended { .. } => Phase::Ended,
        }
    }

    /// The wrapper reported the adapter's start.
    pub(super) fn started(&mut self) {
        if *self == Life::Starting {
            *self = Life::Running;
        }
    }

    /// A requested close: from starting or running only.
    pub(super) fn begin_close(&mut self) -> bool {
        if matches!(self, Life::Starting | Life::Running) {
            *self = Life::Closing { in_flight: true };
            true
        } else {
            false
        }
    }

    /// An idle close: from running only (the caller checks quiet, busy and the lease).
    pub(super) fn begin_idle_close(&mut self) -> bool {
        if *self == Life::Running {
            *self = Life::Closing { in_flight: true };
            true
        } else {
            false
        }
    }

    /// The daemon takes over a close for a lease changed underneath it: from any stage but
    /// ended, unless a close of its own is in flight.
    pub(super) fn begin_takeover(&mut self) -> bool {
        if self.watchable() {
            *self = Life::Closing { in_flight: true };
            true
        } else {
            false
        }
    }

    /// Neither ended nor closing by this daemon: the lease row is worth watching.
    pub(super) fn watchable(&self) -> bool {
        !matches!(self, Life::Ended { .. } | Life::Closing { in_flight: true })
    }

    /// A close of this daemon is running.
    pub(super) fn close_in_flight(&self) -> bool {
        matches!(self, Life::Closing { in_flight: true })
    }

    /// The close is over. `running_again`: it terminated nothing and the lease is still open,
    /// so the session runs on; otherwise it stays closing (until the exit).
    pub(super) fn end_close(&mut self, running_again: bool) {
        if let Life::Closing { .. } = self {
            *self = if running_again {
                Life::Running
            } else {
                Life::Closing { in_flight: false }
            };
        }
    }

    /// The wrapper was reaped.
    pub(super) fn end(&mut self, exit_status: Option<i32>) {
        *self = Life::Ended {
            exit_status,
            at: Instant::now(),
        };
    }

    pub(super) fn is_ended(&self) -> bool {
        matches!(self, Life::Ended { .. })
    }

    pub(super) fn exit_status(&self) -> Option<i32> {
        match self {
            Life::Ended { exit_status, .. } => *exit_status,
            _ => None,
        }
    }

    pub(super) fn ended_at(&self) -> Option<Instant> {
        match self {
            Life::Ended { at, .. } => Some(*at),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_starts_runs_and_ends() {
        let mut l = Life::Starting;
        l.started();
        assert_eq!(l.phase(), Phase::Running);
        l.started();
        assert_eq!(l, Life::Running, "starting again changes nothing");
        assert!(l.watchable() && !l.close_in_flight());
        l.end(Some(3));
        assert_eq!((l.phase(), l.exit_status()), (Phase::Ended, Some(3)));
        assert!(l.ended_at().is_some() && l.is_ended());
    }

    #[test]
    fn one_close_at_a_time_and_never_after_the_end() {
        for start in [Life::Starting, Life::Running] {
            let mut l = start;
            assert!(l.begin_close());
            assert!(l.close_in_flight() && !l.watchable());
            assert!(!l.begin_close(), "a second close is refused");
            assert!(!l.begin_takeover() && !l.begin_idle_close());
        }
        let mut l = Life::Starting;
        assert!(
            !l.begin_idle_close(),
            "an idle close needs a running session"
        );
        l.end(None);
        assert!(!l.begin_close() && !l.begin_takeover() && !l.watchable());
        assert_eq!(l.exit_status(), None);
    }

    #[test]
    fn a_close_that_terminated_nothing_runs_again_unless_the_lease_moved_on() {
        let mut l = Life::Running;
        assert!(l.begin_idle_close());
        l.end_close(true);
        assert_eq!(l, Life::Running);
        assert!(l.begin_close());
        l.end_close(false);
        assert_eq!(l, Life::Closing { in_flight: false });
        assert_eq!(l.phase(), Phase::Closing);
        assert!(!l.begin_close(), "closing: no requested close");
        assert!(
            l.watchable(),
            "but the daemon watches the lease and may take over"
        );
        assert!(l.begin_takeover());
        assert!(l.close_in_flight());
        // The end may come while a close is in flight; ending the close then changes nothing.
        l.end(Some(0));
        l.end_close(true);
        assert!(l.is_ended());
    }
}
