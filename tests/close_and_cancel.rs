//! The intents are distinct. `cancel` records the intent and signals nothing (every process stays
//! alive, the lease stays open); a later `close` verifies and terminates children first, SIGKILLing
//! what ignores SIGTERM after the grace.
mod common;
use common::*;
use serde_json::Value;

fn close_json(state: &std::path::Path, args: &[&str]) -> (Option<i32>, Vec<Value>) {
    let out = run(state, &[&["close", "--json"], args].concat());
    let v: Value = serde_json::from_str(&out.stdout)
        .unwrap_or_else(|e| panic!("close output ({e}): {} / {}", out.stdout, out.stderr));
    (out.code, v.as_array().unwrap().clone())
}

#[test]
fn cancel_signals_nothing_then_close_terminates_children_first() {
    let tmp = TempDir::new("cancel");
    let state = tmp.join("state");
    let trap = trap_script(tmp.path());
    let d = tmp.path().display().to_string();
    // The adapter and its child both log and otherwise ignore SIGTERM.
    let adapter = script(
        tmp.path(),
        "adapter.sh",
        &format!(
            "'{}' '{d}/child.log' &\nexec '{}' '{d}/adapter.log'",
            trap.display(),
            trap.display()
        ),
    );
    let mut guard = Guard::new();
    let child = guard.child(
        leash(&state)
            .args(["exec", "--session", "c", "--"])
            .arg(&adapter)
            .spawn()
            .unwrap(),
    );
    let wrapper = Pid::of(child.id() as i32).unwrap();
    let a = Logged::wait_started(tmp.join("adapter.log"));
    let c = Logged::wait_started(tmp.join("child.log"));
    let mut g2 = Guard::new();
    g2.add(a.pid);
    g2.add(c.pid);

    let out = run(&state, &["cancel", "--session", "c", "--json"]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let v: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(v["sessionKey"], "c");
    assert!(
        wrapper.alive() && a.pid.alive() && c.pid.alive(),
        "cancel must not end anything"
    );
    assert_eq!(a.signals() + &c.signals(), "", "cancel must not signal");
    assert_eq!(lease_of(&state, "c")["state"], "open");

    let (code, outcomes) = close_json(&state, &["--session", "c", "--grace-ms", "300"]);
    assert_eq!(code, Some(0), "{outcomes:?}");
    let o = &outcomes[0];
    assert_eq!(o["result"], "closed", "{o}");
    let terms: Vec<i64> = o["signals"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["signal"] == "SIGTERM")
        .map(|s| s["pid"].as_i64().unwrap())
        .collect();
    let pos = |p: Pid| {
        terms
            .iter()
            .position(|&x| x == p.pid as i64)
            .unwrap_or_else(|| panic!("pid {} not signalled: {terms:?}", p.pid))
    };
    assert!(pos(c.pid) < pos(a.pid), "child before adapter: {terms:?}");
    assert!(
        pos(a.pid) < pos(wrapper),
        "adapter before wrapper: {terms:?}"
    );
    assert!(
        o["signals"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["signal"] == "SIGKILL"),
        "TERM was ignored, so SIGKILL followed"
    );
    assert!(!a.pid.alive() && !c.pid.alive(), "tree gone after close");
    assert!(c.signals().contains("TERM"));
    child.wait().unwrap();
    assert_eq!(lease_of(&state, "c")["state"], "closed");
}

#[test]
fn descendants_left_in_the_group_after_the_adapter_exits_are_closed() {
    let tmp = TempDir::new("leftover");
    let state = tmp.join("state");
    let trap = trap_script(tmp.path());
    let d = tmp.path().display().to_string();
    let mut guard = Guard::new();
    // The adapter starts a TERM-ignoring child and exits at once; the wrapper starts its own
    // drain with a long grace, and close must not wait for that.
    let child = guard.child(
        leash(&state)
            .args(["exec", "--grace-ms", "600000", "--session", "l", "--", "sh", "-c"])
            .arg(format!(
                "'{}' '{d}/member.log' & while [ ! -s '{d}/member.log.pid' ]; do sleep 0.01; done; exit 0",
                trap.display()
            ))
            .spawn()
            .unwrap(),
    );
    let member = Logged::wait_started(tmp.join("member.log"));
    let mut g2 = Guard::new();
    g2.add(member.pid);
    // The wrapper saw its adapter exit and sent SIGTERM to what was left (logged and ignored).
    assert!(wait_for(|| member.signals().contains("TERM")));
    let (code, outcomes) = close_json(&state, &["--session", "l", "--grace-ms", "200"]);
    assert_eq!(code, Some(0), "{outcomes:?}");
    assert_eq!(outcomes[0]["result"], "closed");
    assert!(!member.pid.alive());
    let status = child.wait().unwrap();
    assert_eq!(
        status.code(),
        Some(0),
        "the adapter's own status comes back"
    );
}

#[test]
fn lease_with_spaced_arguments_verifies_by_token_hash() {
    let tmp = TempDir::new("spaced");
    let state = tmp.join("state");
    let mut guard = Guard::new();
    let child = guard.child(
        leash(&state)
            .args([
                "exec",
                "--session",
                "q",
                "--",
                "sh",
                "-c",
                "sleep 1000; : \"$0\"",
                "an arg  with spaces",
            ])
            .spawn()
            .unwrap(),
    );
    let wrapper = Pid::of(child.id() as i32).unwrap();
    let adapter = adapter_of(wrapper);
    let (code, outcomes) = close_json(&state, &["--session", "q", "--grace-ms", "2000"]);
    assert_eq!(code, Some(0), "{outcomes:?}");
    assert_eq!(outcomes[0]["result"], "closed");
    assert!(!adapter.alive());
    child.wait().unwrap();
}

#[test]
fn closing_several_leases_at_once() {
    let tmp = TempDir::new("many");
    let state = tmp.join("state");
    let trap = trap_script(tmp.path());
    let mut guard = Guard::new();
    let mut logged = Vec::new();
    for i in 0..4 {
        let log = tmp.join(&format!("a{i}.log"));
        guard.child(
            leash(&state)
                .args(["exec", "--session", &format!("m{i}"), "--"])
                .arg(&trap)
                .arg(&log)
                .spawn()
                .unwrap(),
        );
        logged.push(Logged::wait_started(log));
    }
    let mut g2 = Guard::new();
    for l in &logged {
        g2.add(l.pid);
    }
    let (code, outcomes) = close_json(
        &state,
        &[
            "--session",
            "m0",
            "--session",
            "m1",
            "--session",
            "m2",
            "--session",
            "m3",
            "--grace-ms",
            "300",
        ],
    );
    assert_eq!(code, Some(0), "{outcomes:?}");
    assert_eq!(outcomes.len(), 4);
    assert!(
        outcomes.iter().all(|o| o["result"] == "closed"),
        "{outcomes:?}"
    );
    assert!(logged.iter().all(|l| !l.pid.alive()));
}

#[test]
fn close_of_an_unknown_lease_or_closed_session_says_so() {
    let tmp = TempDir::new("unknown");
    let state = tmp.join("state");
    // The state root exists (only exec and serve create one).
    assert_eq!(run(&state, &["exec", "--", "true"]).code, Some(0));
    let out = run(&state, &["close", "01936b2a-7c4e-7d10-9a51-3b2c1d0e9f8a"]);
    assert_eq!(out.code, Some(4), "{}", out.stderr);
    let out = run(&state, &["cancel", "--session", "nope"]);
    assert_eq!(out.code, Some(4), "{}", out.stderr);
    assert!(out.stderr.contains("no active lease"), "{}", out.stderr);
}
