//! Round trip on the live host: a staged scene (an orphaned wrapper with its TERM-ignoring
//! adapter, a `setsid` escapee of a SIGKILLed wrapper, a stranger on a lease's reused root pid
//! forced through ns_last_pid, another gateway's live wrapper, a decoy with an adapter's argv),
//! `leash snapshot` of it, `leash simulate` of the snapshot, then the real `leash reap`: the real
//! signals are exactly the simulated ones, pid for pid, in the same order (children first), and
//! the strangers get none. Run quiet and among 2,000 unrelated processes. The snapshot holds no
//! environment value but the markers: a secret planted in an adapter's environment is not in it.
//! Forces pids, so it holds `FORCING_PIDS` like the other pid-forcing tests.
mod common;
use common::*;
use serde_json::Value;
use std::path::Path;
use std::process::{Command, Stdio};

/// `leash --state-dir STATE ARGS…`, with `--containment off` unless the scene is contained
/// (then as the test binary's containment says: its own cgroup root).
fn leash_in(state: &Path, contained: bool) -> Command {
    let mut c = leash(state);
    if !contained {
        c.args(["--containment", "off"]);
    }
    c
}

/// Waits until `p` runs `sleep` (the stubborn script has ignored SIGTERM and exec'd).
fn wait_sleeping(p: Pid) {
    assert!(
        wait_for(|| std::fs::read_to_string(format!("/proc/{}/comm", p.pid))
            .is_ok_and(|c| c.trim() == "sleep")),
        "{} never exec'd sleep",
        p.pid
    );
}

fn out_of(c: &mut Command) -> (Option<i32>, String, String) {
    let o = c.stdin(Stdio::null()).output().unwrap();
    (
        o.status.code(),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// (signal, pid, role, delivery) of every signal an outcome list records, leases then
/// escapees, in order.
fn signals(report: &Value) -> Vec<(String, i64, String, String)> {
    let mut out = Vec::new();
    for part in ["leases", "escapees"] {
        for o in report[part].as_array().into_iter().flatten() {
            for s in o["signals"].as_array().into_iter().flatten() {
                out.push((
                    s["signal"].as_str().unwrap_or("?").to_string(),
                    s["pid"].as_i64().unwrap(),
                    s["role"].as_str().unwrap_or("?").to_string(),
                    s["delivery"].as_str().unwrap_or("?").to_string(),
                ));
            }
        }
    }
    out
}

/// A lease's id, its result and its (signal, pid) list.
type LeaseSignals = (String, String, Vec<(String, i64)>);

/// Per lease: its id, its result and its (signal, pid) list, sorted by id.
fn per_lease(report: &Value) -> Vec<LeaseSignals> {
    let mut v: Vec<_> = report["leases"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|o| {
            (
                o["leaseId"].as_str().unwrap().to_string(),
                o["result"].as_str().unwrap_or("?").to_string(),
                o["signals"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|s| {
                        (
                            s["signal"].as_str().unwrap().to_string(),
                            s["pid"].as_i64().unwrap(),
                        )
                    })
                    .collect(),
            )
        })
        .collect();
    v.sort();
    v
}

fn scene_and_round_trip(tag: &str, background: usize, contained: bool) {
    let leash_off = |state: &Path| leash_in(state, contained);
    let off = if contained { "" } else { "--containment off " };
    let _serial = FORCING_PIDS.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = TempDir::new(tag);
    let state = tmp.join("state");
    let other = tmp.join("other-gateway");
    let d = tmp.path().display().to_string();
    let trap = trap_script(tmp.path());
    // SIGTERM ignored (the disposition survives exec), no children: a stubborn process whose
    // tree does not change between the snapshot and the reap.
    let deaf = script(tmp.path(), "deaf.sh", "trap '' TERM\nexec sleep 1000");
    let bin = leash_bin().display().to_string();
    let mut guard = Guard::new();

    // Unrelated processes: nothing the snapshot lists, nothing reap touches.
    let mut crowd = Guard::new();
    for _ in 0..background {
        crowd.child(
            Command::new("sleep")
                .arg("1000")
                .stdin(Stdio::null())
                .spawn()
                .unwrap(),
        );
    }

    // Another gateway's live wrapper (its owner, this test, lives), and a decoy running an
    // adapter's argv without markers.
    let other_wrapper = Pid::of(
        guard
            .child(
                leash_off(&other)
                    .args(["exec", "--session", "theirs", "--", "sleep", "1000"])
                    .stdin(Stdio::null())
                    .spawn()
                    .unwrap(),
            )
            .id() as i32,
    )
    .unwrap();
    let other_adapter = adapter_of(other_wrapper);
    guard.add(other_adapter);
    let decoy = start_decoy(&mut guard, tmp.path(), "decoy");

    // 1. An orphaned wrapper with its adapter: the owner dies, the wrapper's 10-minute grace
    //    keeps both alive; the adapter ignores SIGTERM and carries a secret in its environment.
    let secret = format!("s3cret-{}", uuid::Uuid::new_v4().simple());
    let spawner = script(
        tmp.path(),
        "orphan.sh",
        &format!(
            "'{bin}' --state-dir '{}' {off}exec --grace-ms 600000 --session orphan -- '{}' &\necho $! > '{d}/orphan-wrapper.pid'\nwait",
            state.display(),
            deaf.display()
        ),
    );
    let sp = guard.child(
        Command::new(&spawner)
            .env("LEASH_TEST_SECRET", &secret)
            .stdin(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let orphan_owner = Pid::of(sp.id() as i32).unwrap();
    let orphan_wrapper = read_pid_file(&tmp.join("orphan-wrapper.pid"));
    guard.add(orphan_wrapper);
    let orphan_adapter = adapter_of(orphan_wrapper);
    guard.add(orphan_adapter);
    wait_sleeping(orphan_adapter);
    let environ = std::fs::read(format!("/proc/{}/environ", orphan_adapter.pid)).unwrap();
    assert!(
        String::from_utf8_lossy(&environ).contains(&secret),
        "the secret is planted in the adapter's environment"
    );
    signal(orphan_owner, libc::SIGKILL);
    assert!(wait_for(|| !orphan_owner.alive()));

    // 2. A setsid escapee of a SIGKILLed wrapper (its adapter dies with the wrapper).
    let adapter_sh = script(
        tmp.path(),
        "escaping-adapter.sh",
        &format!(
            "setsid '{}' &\necho $! > '{d}/escapee.pid'\nexec sleep 1000",
            deaf.display()
        ),
    );
    let spawner = script(
        tmp.path(),
        "escape.sh",
        &format!(
            "'{bin}' --state-dir '{}' {off}exec --session escape -- '{}' &\necho $! > '{d}/escape-wrapper.pid'\nwait",
            state.display(),
            adapter_sh.display()
        ),
    );
    let sp = guard.child(Command::new(&spawner).stdin(Stdio::null()).spawn().unwrap());
    let escape_owner = Pid::of(sp.id() as i32).unwrap();
    let escape_wrapper = read_pid_file(&tmp.join("escape-wrapper.pid"));
    guard.add(escape_wrapper);
    let escapee = read_pid_file(&tmp.join("escapee.pid"));
    guard.add(escapee);
    wait_sleeping(escapee);
    let escape_adapter = adapter_of(escape_wrapper);
    wait_sleeping(escape_adapter);
    signal(escape_wrapper, libc::SIGKILL);
    assert!(wait_for(|| !escape_adapter.alive()));
    signal(escape_owner, libc::SIGKILL);
    assert!(wait_for(|| !escape_owner.alive()));

    // 3. A stranger on a lease's reused root pid: the wrapper is SIGKILLed, its owner ends, and
    //    a decoy is started on the freed pid.
    let mut stranger = None;
    for attempt in 0..10 {
        let session = format!("reuse{attempt}");
        let spawner = script(
            tmp.path(),
            &format!("{session}.sh"),
            &format!(
                "'{bin}' --state-dir '{}' {off}exec --session {session} -- sleep 1000 &\necho $! > '{d}/{session}.pid'\nwait",
                state.display(),
            ),
        );
        let mut sp = Command::new(&spawner).stdin(Stdio::null()).spawn().unwrap();
        let wrapper = read_pid_file(&tmp.join(&format!("{session}.pid")));
        let adapter = adapter_of(wrapper);
        signal(wrapper, libc::SIGKILL);
        sp.wait().unwrap();
        assert!(wait_for(|| !adapter.alive()));
        let log = tmp.join(&format!("stranger{attempt}.log"));
        if let Some(c) = spawn_with_pid(
            wrapper.pid,
            Command::new(&trap).arg(&log).stdin(Stdio::null()),
        ) {
            guard.child(c);
            stranger = Some(Logged::wait_started(log));
            break;
        }
    }
    let stranger = stranger.expect("could not hand a dead root's pid to a stranger in 10 tries");
    guard.add(stranger.pid);

    // The snapshot: what reap will read, and no environment value but the markers.
    let (code, snap_text, err) = out_of(leash_off(&state).arg("snapshot"));
    assert_eq!(code, Some(0), "snapshot: {err}");
    assert!(
        !snap_text.contains(&secret),
        "the snapshot holds an environment value"
    );
    assert!(!snap_text.contains("LEASH_TEST_SECRET"));
    let snap: Value = serde_json::from_str(&snap_text).unwrap();
    assert_eq!(snap["format"], "leash-snapshot");
    assert_eq!(snap["version"], 1);
    assert!(snap["environment"]
        .as_str()
        .unwrap()
        .contains("markers only"));
    let listed: Vec<i64> = snap["table"]["processes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["pid"].as_i64().unwrap())
        .collect();
    for p in [
        orphan_wrapper,
        orphan_adapter,
        escapee,
        stranger.pid,
        other_wrapper,
    ] {
        assert!(
            listed.contains(&(p.pid as i64)),
            "{} (alive: {}, ppid {:?}) not in the snapshot: {snap_text}",
            p.pid,
            p.alive(),
            ppid(p.pid)
        );
    }
    for p in snap["table"]["processes"].as_array().unwrap() {
        if let Some(env) = p["env"].as_object() {
            assert!(
                env.keys()
                    .all(|k| k == "leaseId" || k == "gatewayInstanceId"),
                "{p}"
            );
        }
    }
    assert!(
        listed.len() < 60,
        "the snapshot lists the processes that matter, not the host: {}",
        listed.len()
    );
    // How the staged processes exit, for the replay: the trap scripts ignore SIGTERM, and a
    // wrapper ends once its tree has gone.
    let mut snap = snap;
    let mut script_v = serde_json::Map::new();
    for p in [orphan_adapter, escapee] {
        script_v.insert(p.pid.to_string(), serde_json::json!({"onTerm": null}));
    }
    script_v.insert(
        orphan_wrapper.pid.to_string(),
        serde_json::json!({"onTerm": null, "after": [orphan_adapter.pid]}),
    );
    snap["simulate"] = serde_json::json!({ "script": script_v });
    let file = tmp.join("snapshot.json");
    std::fs::write(&file, snap.to_string()).unwrap();

    let (code, sim_text, err) = out_of(
        Command::new(leash_bin())
            .arg("simulate")
            .arg(&file)
            .arg("--json"),
    );
    assert_eq!(code, Some(1), "simulate: some signals: {err}");
    let sim: Value = serde_json::from_str(&sim_text).unwrap();
    let simulated = signals(&sim["reap"]);

    let (code, real_text, err) =
        out_of(leash_off(&state).args(["reap", "--json", "--grace-ms", "300"]));
    assert_eq!(code, Some(0), "reap: {real_text} {err}");
    let real: Value = serde_json::from_str(&real_text).unwrap();
    let really = signals(&real);

    assert_eq!(
        really, simulated,
        "real signals differ from the simulated ones\nreal {real:#}\nsimulated {:#}",
        sim["reap"]
    );
    assert_eq!(per_lease(&real), per_lease(&sim["reap"]));
    if contained {
        assert!(
            really.iter().any(|s| s.3 == "cgroupKill"),
            "a contained lease's survivors go by cgroup.kill: {really:?}"
        );
    }
    // The scene's facts, on both sides: the orphan's adapter, then its wrapper; the escapee;
    // never the strangers.
    let pids: Vec<i64> = really.iter().map(|s| s.1).collect();
    let at = |p: Pid| pids.iter().position(|&x| x == p.pid as i64);
    assert!(
        at(orphan_adapter).unwrap() < at(orphan_wrapper).unwrap(),
        "{really:?}"
    );
    assert!(at(escapee).is_some(), "{really:?}");
    for p in [stranger.pid, decoy.pid, other_wrapper, other_adapter] {
        assert!(at(p).is_none(), "{} was signalled: {really:?}", p.pid);
    }
    assert!(wait_for(|| !orphan_adapter.alive() && !escapee.alive()));
    assert!(stranger.pid.alive() && decoy.pid.alive() && other_wrapper.alive());
    assert_eq!(stranger.signals(), "", "the stranger got no signal");
    assert_eq!(decoy.signals(), "", "the decoy got no signal");
    drop(crowd);
}

#[test]
fn snapshot_simulate_and_reap_agree_quiet() {
    if !is_root() {
        common::skip("forcing pids through ns_last_pid needs root");
        return;
    }
    scene_and_round_trip("roundtrip-quiet", 0, false);
}

#[test]
fn snapshot_simulate_and_reap_agree_among_2000_processes() {
    if !is_root() {
        common::skip("forcing pids through ns_last_pid needs root");
        return;
    }
    scene_and_round_trip("roundtrip-busy", 2000, false);
}

#[test]
fn snapshot_simulate_and_reap_agree_contained() {
    if !is_root() {
        common::skip("forcing pids through ns_last_pid needs root");
        return;
    }
    if !containment_available() {
        common::skip("containment (cgroup2) is not available here");
        return;
    }
    scene_and_round_trip("roundtrip-contained", 0, true);
}
