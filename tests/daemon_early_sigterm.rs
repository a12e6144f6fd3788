//! A SIGTERM that reaches `leash serve` the moment it is ready (its socket answers and
//! `daemon.lock` names it) shuts it down cleanly, exit 0, socket removed: the signal handlers are
//! installed before the socket is bound. Handlers installed after the lock is written would leave
//! a window in which a supervisor's (or a test's) SIGTERM ends the daemon by the signal itself
//! (exit status None). The window is narrow, so the test stops the daemon at once, many times
//! over.
mod common;
mod daemon_support;
use common::*;
use daemon_support::*;

#[test]
fn sigterm_right_after_ready_is_a_clean_shutdown() {
    let tmp = TempDir::new("early-term");
    for i in 0..25 {
        let state = tmp.join(&format!("state-{i}"));
        let mut d = Daemon::start(&state, &[]);
        let status = d.terminate();
        assert_eq!(
            status.code(),
            Some(0),
            "round {i}: the daemon did not shut down cleanly ({status:?}):\n{}",
            d.log_text()
        );
        assert!(
            !state.join("leash.sock").exists(),
            "round {i}: the socket was left behind"
        );
    }
}
