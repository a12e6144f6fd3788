//! Live: a stored fact is a claim, never evidence.
//!
//! A lease row rewritten to name a stranger (its adapter pid and start time, its group, its root,
//! its wrapper path, its cgroup) never gets the stranger signalled, on any path that reads it:
//! `close` of one lease (which reads only the root's tree), `close` of two (which may read the
//! whole table), `reap --include-live` and its dry run, and the same through a daemon. A stray
//! cgroup that no lease names is removed only when empty; a populated one is reported and its
//! processes live. A bystander moved into a lease's cgroup is neither listed by `ps`, nor taken
//! by `cgroup.kill`. And one escapee gets one answer from `verify`, `reap --dry-run` and `ps`.
//!
//! Every stranger is a decoy the test started (a shell that traps and logs every catchable
//! signal, in a process group of its own); each is asserted alive and unsignalled.
mod common;
mod daemon_support;
use common::*;
use daemon_support::*;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// A decoy that leads its own process group (`setsid`), as the issue's `setsid sleep` did.
fn group_leader_decoy(guard: &mut Guard, dir: &Path, name: &str) -> Logged {
    let log = dir.join(format!("{name}.log"));
    guard.child(
        Command::new("setsid")
            .arg(trap_script(dir))
            .arg(&log)
            .stdin(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let d = Logged::wait_started(log);
    guard.add(d.pid);
    assert!(
        wait_for(|| pgid(d.pid.pid) == Some(d.pid.pid)),
        "the decoy leads its own group"
    );
    d
}

fn assert_untouched(d: &Logged, what: &str) {
    assert!(d.pid.alive(), "{what}: the decoy was killed");
    assert_eq!(d.signals(), "", "{what}: the decoy got a signal");
}

/// One session of `sleep` under `leash exec` (the leash command given), registered in `guard`.
struct Session {
    child: std::process::Child,
    wrapper: Pid,
    adapter: Pid,
    lease_id: String,
}

fn start(mut cmd: Command, state: &Path, key: &str, guard: &mut Guard) -> Session {
    let child = cmd
        .args(["exec", "--grace-ms", "300", "--session", key, "--"])
        .args(["sleep", "100000"])
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let wrapper = Pid::of(child.id() as i32).unwrap();
    guard.add(wrapper);
    let adapter = adapter_of(wrapper);
    guard.add(adapter);
    let lease_id = lease_of(state, key)["leaseId"]
        .as_str()
        .unwrap()
        .to_string();
    Session {
        child,
        wrapper,
        adapter,
        lease_id,
    }
}

fn json_of(mut cmd: Command, args: &[&str]) -> Value {
    let out = cmd.args(args).stdin(Stdio::null()).output().unwrap();
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "leash {args:?} ({e}): {} / {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// `leash ps --json`, and the pids it lists as members of session `key`.
fn ps_members(cmd: Command, key: &str) -> (Value, Vec<i64>) {
    let ps = json_of(cmd, &["ps", "--json"]);
    let session = ps["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["sessionKey"] == key)
        .cloned()
        .unwrap_or_else(|| panic!("{ps}"));
    let listed = session["members"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["pid"].as_i64())
        .collect();
    (ps, listed)
}

/// Every pid a reap plan (or report) would signal or did signal, across its leases.
fn planned_pids(plan: &Value) -> Vec<i64> {
    let mut out = Vec::new();
    for key in ["leases", "escapees"] {
        for lp in plan[key].as_array().into_iter().flatten() {
            for s in lp["signals"].as_array().into_iter().flatten() {
                out.extend(s["pid"].as_i64());
            }
        }
    }
    out
}

/// The ways a row can be rewritten to point at a stranger (`d`: the decoy, a group leader).
#[derive(Debug, Clone, Copy)]
enum Tamper {
    /// The issue's case: adapter pid, adapter start time and group name the decoy.
    Adapter,
    /// Only the group.
    Group,
    /// The root pid and start time name the decoy.
    Root,
    /// The root's start time alone (the wrapper now looks like a reused pid).
    RootStartTime,
    /// The root's pidfs inode.
    RootPidfsIno,
    /// The wrapper path names the decoy's program.
    WrapperPath,
    /// The cgroup names a directory the test made, holding the decoy.
    Cgroup,
}

const TAMPERINGS: [Tamper; 7] = [
    Tamper::Adapter,
    Tamper::Group,
    Tamper::Root,
    Tamper::RootStartTime,
    Tamper::RootPidfsIno,
    Tamper::WrapperPath,
    Tamper::Cgroup,
];

fn apply(t: Tamper, state: &Path, lease_id: &str, d: &Logged, decoy_cgroup: Option<&Path>) {
    let pid = d.pid.pid as i64;
    let start = start_time(d.pid.pid).unwrap() as i64;
    match t {
        Tamper::Adapter => tamper(
            state,
            lease_id,
            "adapter_pid = ?2, adapter_start_time = ?3, process_group_id = ?2",
            &[pid, start],
        ),
        Tamper::Group => tamper(state, lease_id, "process_group_id = ?2", &[pid]),
        Tamper::Root => tamper(
            state,
            lease_id,
            "root_pid = ?2, root_start_time = ?3, adapter_pid = ?2, adapter_start_time = ?3, \
             process_group_id = ?2",
            &[pid, start],
        ),
        Tamper::RootStartTime => tamper(
            state,
            lease_id,
            "root_start_time = ?2, process_group_id = ?3",
            &[start, pid],
        ),
        Tamper::RootPidfsIno => tamper(
            state,
            lease_id,
            "root_pidfs_ino = ?2, process_group_id = ?3",
            &[1, pid],
        ),
        Tamper::WrapperPath => {
            let conn = rusqlite::Connection::open(state.join("leash.db")).unwrap();
            conn.execute(
                "UPDATE leases SET wrapper_path = '/bin/sh', process_group_id = ?2 \
                 WHERE lease_id = ?1",
                rusqlite::params![lease_id, pid],
            )
            .unwrap();
        }
        Tamper::Cgroup => {
            let Some(dir) = decoy_cgroup else { return };
            use std::os::unix::fs::MetadataExt;
            let ino = std::fs::metadata(dir).unwrap().ino() as i64;
            let conn = rusqlite::Connection::open(state.join("leash.db")).unwrap();
            conn.execute(
                "UPDATE leases SET cgroup_path = ?2, cgroup_id = ?3, process_group_id = ?4 \
                 WHERE lease_id = ?1",
                rusqlite::params![lease_id, dir.to_str().unwrap(), ino, pid],
            )
            .unwrap();
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Path_ {
    CloseOne,
    CloseTwo,
    ReapIncludeLive,
}

/// Runs every tampering over every path, with `leash` built by `cmd` (direct, or with a daemon
/// serving the state root). Each round: two fresh sessions A and B, A's row rewritten, the
/// path run; the decoy (and a second, plain decoy) must stay untouched.
fn every_tampering_on_every_path(
    tmp: &TempDir,
    state: &Path,
    cmd: &dyn Fn() -> Command,
    decoy_cgroup: Option<&Path>,
    d: &Logged,
    label: &str,
) {
    let mut round = 0;
    for t in TAMPERINGS {
        for path in [Path_::CloseOne, Path_::CloseTwo, Path_::ReapIncludeLive] {
            round += 1;
            let mut guard = Guard::new();
            let a_key = format!("{label}-a{round}");
            let b_key = format!("{label}-b{round}");
            let a = start(cmd(), state, &a_key, &mut guard);
            let b = start(cmd(), state, &b_key, &mut guard);
            // A fresh stranger, younger than the lease's root (an older one fails the member
            // check on its start time alone, which would hide the rest of the evidence rule).
            wait_past_tick(start_time(a.wrapper.pid).unwrap());
            let young = group_leader_decoy(&mut guard, tmp.path(), &format!("{label}-{round}"));
            apply(t, state, &a.lease_id, &young, decoy_cgroup);
            let what = format!("{label}: {t:?} via {path:?}");
            match path {
                Path_::CloseOne => {
                    let _ = json_of(cmd(), &["close", "--session", &a_key, "--json"]);
                }
                Path_::CloseTwo => {
                    let _ = json_of(
                        cmd(),
                        &["close", "--session", &a_key, "--session", &b_key, "--json"],
                    );
                }
                Path_::ReapIncludeLive => {
                    let plan = json_of(cmd(), &["reap", "--dry-run", "--include-live", "--json"]);
                    assert!(
                        !planned_pids(&plan).contains(&(young.pid.pid as i64)),
                        "{what}: the dry run plans the decoy: {plan}"
                    );
                    let report = json_of(cmd(), &["reap", "--include-live", "--json"]);
                    assert!(
                        !planned_pids(&report).contains(&(young.pid.pid as i64)),
                        "{what}: reap signalled the decoy: {report}"
                    );
                }
            }
            assert_untouched(&young, &what);
            assert_untouched(d, &what);
            // B, never tampered, is closed like any session on the batch paths.
            if path != Path_::CloseOne {
                assert!(wait_for(|| !b.adapter.alive()), "{what}: B was not closed");
            }
            // Whatever A's fate, end it (the guard SIGKILLs the wrapper and the adapter).
            drop((a.child, b.child));
            let _ = (a.wrapper, b.wrapper);
            drop(guard);
            let _ = tmp;
        }
    }
    assert_eq!(
        round,
        TAMPERINGS.len() * 3,
        "every tampering ran on every path"
    );
}

/// 21.1 and its property, live: the issue's scenario first, then every tampering of a live
/// lease's row towards a stranger, on every path, direct and through a daemon.
#[test]
fn a_row_naming_a_stranger_never_gets_it_signalled_on_any_path() {
    let tmp = TempDir::new("evidence-strangers");
    let state = tmp.join("state");
    init_state_root(&state);
    let mut guard = Guard::new();
    let decoy = group_leader_decoy(&mut guard, tmp.path(), "decoy");
    let plain = start_decoy(&mut guard, tmp.path(), "plain");
    // With cgroup2 and root: the lease cgroups under a root this test made, and a cgroup of the
    // test's own for the cgroup tampering (the second decoy is moved into it).
    let cg = CgroupRoot::new("evidence-strangers");
    let decoy_cgroup = cg.as_ref().map(|cg| {
        let dir = cg.path().join("decoy");
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(dir.join("cgroup.procs"), plain.pid.pid.to_string()).unwrap();
        dir
    });
    let cmd = || match &cg {
        Some(cg) => cg.leash(&state),
        None => {
            let mut c = leash(&state);
            c.env("LEASH_CONTAINMENT", "off");
            c
        }
    };

    // The issue's scenario, exactly: A's adapter, adapter start time and group name the decoy,
    // A's wrapper still runs (it verifies), B is an ordinary second lease.
    let a = start(cmd(), &state, "issue-a", &mut guard);
    let _b = start(cmd(), &state, "issue-b", &mut guard);
    // The stranger starts after the lease's root, as the issue's `setsid sleep` did.
    wait_past_tick(start_time(a.wrapper.pid).unwrap());
    let issue = group_leader_decoy(&mut guard, tmp.path(), "issue-decoy");
    apply(Tamper::Adapter, &state, &a.lease_id, &issue, None);
    let plan = json_of(cmd(), &["reap", "--dry-run", "--include-live", "--json"]);
    assert!(
        !planned_pids(&plan).contains(&(issue.pid.pid as i64)),
        "the dry run plans the stranger: {plan}"
    );
    let report = json_of(cmd(), &["reap", "--include-live", "--json"]);
    assert_untouched(&issue, "reap --include-live");
    assert!(
        report["leases"]
            .as_array()
            .unwrap()
            .iter()
            .any(|l| l["result"] == "closed"),
        "{report}"
    );
    assert!(
        wait_for(|| !a.adapter.alive()),
        "A's own adapter was closed"
    );

    every_tampering_on_every_path(
        &tmp,
        &state,
        &cmd,
        decoy_cgroup.as_deref(),
        &decoy,
        "direct",
    );
    assert_untouched(&plain, "direct");

    // The daemon: the same verbs, answered by a `leash serve` on the same state root.
    let mut args = vec!["--reconcile-interval", "0"];
    let root_arg;
    if let Some(cg) = &cg {
        root_arg = cg.path().to_str().unwrap().to_string();
        args.extend(["--containment", "on", "--cgroup-root", &root_arg]);
    } else {
        args.extend(["--containment", "off"]);
    }
    let _d = Daemon::start(&state, &args);
    every_tampering_on_every_path(
        &tmp,
        &state,
        &cmd,
        decoy_cgroup.as_deref(),
        &decoy,
        "daemon",
    );
    assert_untouched(&decoy, "daemon");
    assert_untouched(&plain, "daemon");
}

/// Waits until a process started now has a later start time (clock ticks) than `tick`: the
/// bystander must have started before the lease's root, not in the same tick.
fn wait_past_tick(tick: u64) {
    assert!(wait_for(|| {
        let out = Command::new("sh")
            .args(["-c", "cat /proc/self/stat"])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let rest = &text[text.rfind(')').unwrap() + 1..];
        let now: u64 = rest.split_whitespace().nth(19).unwrap().parse().unwrap();
        now > tick
    }));
}

/// The gateway's cgroup root (as `status` resolves it), made.
fn gateway_root(cg: &CgroupRoot, state: &Path) -> PathBuf {
    let status = json_of(cg.leash(state), &["status", "--json"]);
    let gw = PathBuf::from(
        status["containment"]["gatewayRoot"]
            .as_str()
            .unwrap_or_else(|| panic!("{status}")),
    );
    std::fs::create_dir_all(&gw).unwrap();
    gw
}

/// 21.2: a stray cgroup no lease names, old enough to be swept, holding a process leash never
/// started: reported (path, pid, command) by the dry run and by the reap, never signalled,
/// never removed; an empty stray beside it is removed.
#[test]
fn a_populated_stray_cgroup_is_reported_and_never_signalled() {
    let Some(cg) = CgroupRoot::new("evidence-stray") else {
        return;
    };
    let tmp = TempDir::new("evidence-stray");
    let state = tmp.join("state");
    init_state_root(&state);
    let gw = gateway_root(&cg, &state);
    let mut guard = Guard::new();
    let decoy = start_decoy(&mut guard, tmp.path(), "stray-decoy");
    // Lease-shaped names (UUIDv7 from 2023): long past any commit in flight.
    let populated = gw.join("01890000-0000-7000-8000-000000000001");
    let empty = gw.join("01890000-0000-7000-8000-000000000002");
    std::fs::create_dir(&populated).unwrap();
    std::fs::create_dir(&empty).unwrap();
    std::fs::write(populated.join("cgroup.procs"), decoy.pid.pid.to_string()).unwrap();

    let plan = json_of(cg.leash(&state), &["reap", "--dry-run", "--json"]);
    let strays = plan["strayCgroups"].as_array().unwrap();
    let of = |p: &Path| {
        strays
            .iter()
            .find(|s| s["path"] == p.to_str().unwrap())
            .cloned()
            .unwrap_or_else(|| panic!("{} not in {plan}", p.display()))
    };
    assert_eq!(of(&populated)["action"], "leave", "{plan}");
    assert_eq!(of(&empty)["action"], "remove", "{plan}");
    let procs = of(&populated)["processes"].clone();
    assert!(
        procs
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["pid"] == decoy.pid.pid && p["command"].as_str().unwrap().contains("trap")),
        "{plan}"
    );

    let report = json_of(cg.leash(&state), &["reap", "--json"]);
    let swept = report["cgroups"].as_array().unwrap();
    let of = |p: &Path| {
        swept
            .iter()
            .find(|s| s["path"] == p.to_str().unwrap())
            .cloned()
            .unwrap_or_else(|| panic!("{} not in {report}", p.display()))
    };
    assert_eq!(of(&populated)["result"], "left", "{report}");
    assert_eq!(of(&populated)["processes"][0]["pid"], decoy.pid.pid);
    assert_eq!(of(&empty)["result"], "removed", "{report}");
    assert!(populated.exists(), "the populated stray was removed");
    assert!(!empty.exists(), "the empty stray was not removed");
    assert_untouched(&decoy, "reap of a populated stray");
    // The human report names it too.
    let out = cg.leash(&state).arg("reap").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&format!("pid {}", decoy.pid.pid)) && text.contains("not signalled"),
        "{text}"
    );
    assert_untouched(&decoy, "second reap");
}

/// 21.2, the daemon: its reconcile leaves a populated stray (and its process) alone and removes
/// an empty one.
#[test]
fn the_daemons_reconcile_leaves_a_populated_stray_alone() {
    let Some(cg) = CgroupRoot::new("evidence-reconcile") else {
        return;
    };
    let tmp = TempDir::new("evidence-reconcile");
    let state = tmp.join("state");
    init_state_root(&state);
    let gw = gateway_root(&cg, &state);
    let d = Daemon::start(
        &state,
        &[
            "--reconcile-interval",
            "300ms",
            "--containment",
            "on",
            "--cgroup-root",
            cg.path().to_str().unwrap(),
        ],
    );
    let mut c = d.connect();
    let passes = |c: &mut Conn| {
        c.call("status", serde_json::json!({}))["daemon"]["reconcile"]["last"]["passes"]
            .as_u64()
            .unwrap_or(0)
    };
    let mut guard = Guard::new();
    let decoy = start_decoy(&mut guard, tmp.path(), "reconcile-decoy");
    let populated = gw.join("01890000-0000-7000-8000-000000000003");
    let empty = gw.join("01890000-0000-7000-8000-000000000004");
    std::fs::create_dir(&populated).unwrap();
    std::fs::create_dir(&empty).unwrap();
    std::fs::write(populated.join("cgroup.procs"), decoy.pid.pid.to_string()).unwrap();
    let from = passes(&mut c);
    assert!(wait_for(|| passes(&mut c) >= from + 2), "no two passes");
    assert!(
        wait_for(|| !empty.exists()),
        "the empty stray was not removed"
    );
    assert!(populated.exists(), "the populated stray was removed");
    assert_untouched(&decoy, "reconcile");
    assert!(
        d.log_text().contains("populated stray cgroup left alone"),
        "{}",
        d.log_text()
    );
}

/// 21.2: a bystander moved into a lease's cgroup is not the session's: `ps` does not list it,
/// and `close` neither writes `cgroup.kill` nor signals it (the adapter, a proven member, is
/// signalled on its own); and `ps` of a lease whose root names an unrelated process lists
/// nothing.
#[test]
fn a_bystander_in_a_lease_cgroup_is_neither_listed_nor_killed() {
    let Some(cg) = CgroupRoot::new("evidence-bystander") else {
        return;
    };
    let tmp = TempDir::new("evidence-bystander");
    let state = tmp.join("state");
    let mut guard = Guard::new();
    let bystander = start_decoy(&mut guard, tmp.path(), "bystander");
    wait_past_tick(start_time(bystander.pid.pid).unwrap());
    let s = start(cg.leash(&state), &state, "moved-into", &mut guard);
    let cgroup = PathBuf::from(
        lease_of(&state, "moved-into")["cgroupPath"]
            .as_str()
            .unwrap(),
    );
    std::fs::write(cgroup.join("cgroup.procs"), bystander.pid.pid.to_string()).unwrap();
    assert!(cgroup_procs(&cgroup).contains(&bystander.pid.pid));

    let (ps, listed) = ps_members(cg.leash(&state), "moved-into");
    assert!(
        !listed.contains(&(bystander.pid.pid as i64)),
        "ps lists the bystander: {ps}"
    );
    assert!(listed.contains(&(s.adapter.pid as i64)), "{ps}");

    let plan = json_of(
        cg.leash(&state),
        &["reap", "--dry-run", "--include-live", "--json"],
    );
    let lp = plan["leases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["leaseId"] == s.lease_id.as_str())
        .cloned()
        .unwrap();
    assert_eq!(lp["cgroup"]["action"], "leave", "{lp}");
    assert!(!planned_pids(&plan).contains(&(bystander.pid.pid as i64)));

    let out = json_of(
        cg.leash(&state),
        &["close", "--session", "moved-into", "--json"],
    );
    assert!(
        wait_for(|| !s.adapter.alive()),
        "the adapter was not closed: {out}"
    );
    assert_untouched(&bystander, "close of a cgroup with a bystander");
    assert!(cgroup.exists(), "the populated cgroup was removed");

    // A root pointed at an unrelated process: ps lists nothing of it.
    let other = start_decoy(&mut guard, tmp.path(), "root-decoy");
    let t = start(cg.leash(&state), &state, "pointed", &mut guard);
    tamper(
        &state,
        &t.lease_id,
        "root_pid = ?2, root_start_time = ?3",
        &[
            other.pid.pid as i64,
            start_time(other.pid.pid).unwrap() as i64,
        ],
    );
    let (ps, listed) = ps_members(cg.leash(&state), "pointed");
    assert!(
        !listed.contains(&(other.pid.pid as i64)),
        "ps lists the process the root names: {ps}"
    );
    assert_untouched(&other, "ps");
    // The guard (dropped before the cgroup root) ends the sessions and the decoys.
    drop((s.child, t.child));
}

/// 25.3: after a wrapper SIGKILL with a `setsid` child alive, `verify`, `reap --dry-run` and
/// `ps` give one answer about it: verdict `escaped` (the escapee listed as the lease's), and
/// `verify` says `dead` (exit 8: nothing to resume) without claiming that nothing carries the
/// markers.
#[test]
fn one_escapee_gets_one_answer_from_verify_reap_and_ps() {
    let tmp = TempDir::new("evidence-one-answer");
    let state = tmp.join("state");
    let mut guard = Guard::new();
    let esc_file = tmp.join("escapee.pid");
    let adapter_sh = script(
        tmp.path(),
        "adapter.sh",
        &format!(
            "setsid sleep 100000 & echo $! > '{}'\nexec sleep 100000",
            esc_file.display()
        ),
    );
    let mut child = leash(&state)
        .args(["exec", "--containment", "off", "--session", "k", "--"])
        .arg(&adapter_sh)
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let wrapper = Pid::of(child.id() as i32).unwrap();
    guard.add(wrapper);
    let adapter = adapter_of(wrapper);
    guard.add(adapter);
    let escapee = read_pid_file(&esc_file);
    guard.add(escapee);
    assert!(wait_for(|| pgid(escapee.pid) == Some(escapee.pid)));
    signal(wrapper, libc::SIGKILL);
    child.wait().unwrap();
    assert!(wait_for(|| !adapter.exists()));
    assert!(escapee.alive());

    let out = run(&state, &["verify", "--session", "k", "--json"]);
    let v: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(out.code, Some(8), "{v}");
    assert_eq!(v["answer"], "dead", "{v}");
    assert_eq!(v["verdict"], "escaped", "{v}");
    let members: Vec<i64> = v["members"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["pid"].as_i64())
        .collect();
    assert_eq!(members, vec![escapee.pid as i64], "{v}");
    let text = v["evidence"].to_string();
    assert!(
        !text.contains("no live process carries the lease's markers"),
        "{v}"
    );

    let plan = run_json(&state, &["reap", "--dry-run", "--include-live", "--json"]);
    let lp = plan["leases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["sessionKey"] == "k")
        .cloned()
        .unwrap();
    assert_eq!(lp["verdict"], v["verdict"], "{lp}");
    assert_eq!(planned_pids(&plan), members, "{plan}");

    let ps = run_json(&state, &["ps", "--json"]);
    let session = ps["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["sessionKey"] == "k")
        .cloned()
        .unwrap_or_else(|| panic!("{ps}"));
    let listed: Vec<i64> = session["members"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["pid"].as_i64())
        .collect();
    assert_eq!(listed, members, "{ps}");
    assert!(escapee.alive(), "nothing here signals");
}
