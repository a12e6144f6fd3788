//! Seqs never repeat or go back when the database cannot be written. The state root lives on a
//! small tmpfs the test mounts; the disk is filled while a session streams, so no block of seqs can
//! be reserved. The daemon holds the adapter's output instead of numbering it with seqs the store
//! never reserved (`status` says `outputHeld`), and once space returns: every line arrives once, in
//! order; the close's `closing`/`closed` and the `exit` are in the stream at the seqs the database
//! has (never on seqs already given to output lines); and the next lease of the same key starts
//! above every seq the client saw. Needs root (mount); skips with the reason otherwise.
mod common;
mod daemon_support;
use common::tmpfs::{fill, Tmpfs};
use common::*;
use daemon_support::*;
use serde_json::{json, Value};
use std::sync::{Arc, Mutex};

#[test]
fn seqs_never_repeat_or_go_back_when_the_disk_is_full() {
    if !is_root() {
        common::skip("mounting a tmpfs needs root");
        return;
    }
    let tmp = TempDir::new("d-fulldisk");
    let Some(mnt) = Tmpfs::mount(&tmp.join("state"), "24m") else {
        common::skip("cannot mount a tmpfs here");
        return;
    };
    let state = mnt.0.clone();
    let printer = script(
        tmp.path(),
        "printer.sh",
        r#"echo $$ > "$1"
while IFS= read -r n; do i=0; while [ "$i" -lt "$n" ]; do i=$((i+1)); echo "line $i"; done; done"#,
    );
    let daemon = Daemon::start(&state, &[]);
    let mut c = daemon.connect();
    let pidfile = tmp.join("printer.pid");
    c.call(
        "ensure",
        json!({"session": "s", "argv": [printer.to_str().unwrap(), pidfile.to_str().unwrap()], "graceMs": 500}),
    );

    // Everything the stream delivers, collected until it ends.
    let seen: Arc<Mutex<Vec<Value>>> = Arc::default();
    let collector = {
        let seen = seen.clone();
        let mut a = daemon.connect();
        std::thread::spawn(move || {
            let (id, reply) = a.attach("s", 0);
            assert_eq!(reply["ok"], true, "{reply}");
            loop {
                let item = a.next_item(&id);
                let end = item["type"] == "end";
                seen.lock().unwrap().push(item);
                if end {
                    return;
                }
            }
        })
    };
    let outputs = |seen: &Arc<Mutex<Vec<Value>>>| {
        seen.lock()
            .unwrap()
            .iter()
            .filter(|i| i["type"] == "output")
            .count()
    };
    c.call("send", json!({"session": "s", "line": "1500"}));
    assert!(wait_for(|| outputs(&seen) == 1500));

    // Disk full: an empty WAL (checkpointed and truncated) and not one free byte.
    let db = rusqlite::Connection::open(state.join("leash.db")).unwrap();
    db.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
        .unwrap();
    drop(db);
    let filler = fill(&state);

    c.call("send", json!({"session": "s", "line": "3000"}));
    let held = wait_daemon(&mut c, |c| {
        session_status(c, "s").is_some_and(|s| s["outputHeld"].is_string())
    });
    assert!(
        held,
        "the daemon never reported held output: {:?}",
        session_status(&mut c, "s")
    );
    let while_full = outputs(&seen);
    assert!(
        while_full < 4500,
        "all output went out while no seq could be reserved"
    );

    std::fs::remove_file(&filler).unwrap();
    assert!(
        wait_for(|| outputs(&seen) == 4500),
        "{} lines",
        outputs(&seen)
    );
    let st = session_status(&mut c, "s").unwrap();
    assert!(st.get("outputHeld").is_none(), "{st}");
    let closed = c.call("close", json!({"session": "s"}));
    assert_eq!(closed[0]["result"], "closed", "{closed}");
    collector.join().unwrap();

    let items = seen.lock().unwrap().clone();
    let seqs: Vec<i64> = items
        .iter()
        .filter(|i| i["type"] != "end")
        .map(|i| i["seq"].as_i64().unwrap())
        .collect();
    assert!(
        seqs.windows(2).all(|w| w[0] < w[1]),
        "seqs repeat or go back"
    );
    let max_seen = *seqs.last().unwrap();
    // Every persisted event is in the stream, at its stored seq.
    let events = c.call("events", json!({"session": "s"}));
    for e in events.as_array().unwrap() {
        let found = items
            .iter()
            .any(|i| i["type"] == "event" && i["seq"] == e["seq"] && i["kind"] == e["kind"]);
        assert!(found, "event {e} is missing from the stream");
    }
    let kinds: Vec<&str> = items
        .iter()
        .filter(|i| i["type"] == "event")
        .map(|i| i["kind"].as_str().unwrap())
        .collect();
    for k in ["spawned", "closing", "closed", "exit"] {
        assert!(kinds.contains(&k), "no {k} event in the stream: {kinds:?}");
    }

    // The next lease of the key starts above everything the client saw.
    wait_daemon(&mut c, |c| {
        session_status(c, "s").is_some_and(|s| s["phase"] == "ended")
    });
    c.call(
        "ensure",
        json!({"session": "s", "argv": [printer.to_str().unwrap(), pidfile.to_str().unwrap()], "graceMs": 500}),
    );
    let (id, reply) = c.attach("s", max_seen);
    assert_eq!(reply["ok"], true, "{reply}");
    let first = c.next_item(&id);
    assert_eq!(first["kind"], "spawned", "{first}");
    assert!(
        first["seq"].as_i64().unwrap() > max_seen,
        "{first} after {max_seen}"
    );
    c.call("close", json!({"session": "s"}));
    drop(c);
    drop(daemon);
}
