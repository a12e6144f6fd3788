//! `status` needs no lock that is held across a database write. Another process holds the
//! database's write lock (the daemon's busy timeout is 20 s) while a session streams past the end
//! of its block of seqs, so the session's reservation waits on the lock. `status` keeps answering
//! all the while. The output thread never waits for the database while holding the session's lock,
//! which `status` takes.
mod common;
mod daemon_support;
use common::*;
use daemon_support::*;
use serde_json::json;
use std::time::{Duration, Instant};

#[test]
fn status_answers_while_a_session_waits_for_the_database() {
    let tmp = TempDir::new("d-statuslock");
    let state = tmp.join("state");
    // Only this test runs in this binary: the daemon inherits the variable.
    std::env::set_var("LEASH_BUSY_TIMEOUT_MS", "20000");
    let daemon = Daemon::start(&state, &[]);
    let mut c = daemon.connect();
    let printer = script(
        tmp.path(),
        "printer.sh",
        r#"while IFS= read -r n; do i=0; while [ "$i" -lt "$n" ]; do i=$((i+1)); echo "line $i"; done; done"#,
    );
    c.call(
        "ensure",
        json!({"session": "s", "argv": [printer.to_str().unwrap()], "graceMs": 200}),
    );

    // The first block of seqs is reserved by the first line.
    c.call("send", json!({"session": "s", "line": "10"}));
    assert!(wait_daemon(&mut c, |c| {
        session_status(c, "s").is_some_and(|s| s["outputLines"] == 10)
    }));
    let db = rusqlite::Connection::open(state.join("leash.db")).unwrap();
    db.execute_batch("BEGIN IMMEDIATE").unwrap();
    let locked_at = Instant::now();
    // More lines than one block of seqs: the output thread must reserve the next block.
    c.call("send", json!({"session": "s", "line": "3000"}));

    // A poller: status after status until the output has visibly stopped at the block's end
    // (the reservation is waiting on the lock), then a few more.
    let poller = {
        let mut p = daemon.connect();
        std::thread::spawn(move || {
            let mut last = (0, Instant::now());
            let mut after_stall = 0;
            loop {
                let st = session_status(&mut p, "s").unwrap();
                let lines = st["outputLines"].as_u64().unwrap();
                if lines != last.0 {
                    last = (lines, Instant::now());
                } else if lines > 10 && last.1.elapsed() > Duration::from_millis(500) {
                    after_stall += 1;
                    if after_stall == 5 {
                        return lines;
                    }
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };
    let answered = wait_for_within(Duration::from_secs(15), || poller.is_finished());
    let held_for = locked_at.elapsed();
    db.execute_batch("COMMIT").unwrap();
    assert!(
        answered,
        "status stalled while the database was locked ({held_for:?})"
    );
    let stalled_at = poller.join().unwrap();
    assert!(
        stalled_at < 3010,
        "the output never waited for the database"
    );
    // Once the lock is gone the rest arrives.
    assert!(wait_daemon(&mut c, |c| {
        session_status(c, "s").is_some_and(|s| s["outputLines"] == 3010)
    }));
    c.call("close", json!({"session": "s"}));
}
