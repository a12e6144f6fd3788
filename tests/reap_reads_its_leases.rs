//! When every lease is contained, `reap` reads only what its leases name — their roots,
//! owners and adapters, and the members their cgroups list — not the host. A counting
//! `ProcessTable` over the live table counts every `/proc` entry read through the trait while a
//! reap runs next to a thousand unrelated processes: no host-wide pass, and a few entries per
//! lease. The reap still does its work: the session whose wrapper was SIGKILLed is reaped through
//! its verified cgroup (its `setsid` escapee with it), the live sessions are skipped, a closed
//! lease's cgroup is gone, and every unrelated process survives. Real cgroups, real processes.
//!
//! The retained history costs nothing either: 2,000 closed contained leases (kept for days by
//! the retention, their cgroups long gone, their recorded pids reused by the unrelated
//! processes) add no `/proc` read. What can still hold a process of ours is read all the same:
//! a closed lease whose wrapper still runs (its cgroup still there) is found and its tree
//! reaped, also when its cgroup emptied while the wrapper was stopped and a stray sweep ran
//! first. When the host-wide pass is needed all the same (an uncontained lease among the rows),
//! the history's recorded pids, reused by another user's processes, are not read in full.
mod common;
use common::counting::Counting;
use common::*;
use leash::controller::{CloseOutcome, CloseResult, Controller, ReapReport};
use leash::state::StateRoot;
use leash::store::Store;
use leash_core::model::{LeaseState, ProcessId};
use leash_core::plan::ReapOptions;
use std::path::Path;
use std::process::{Command, Stdio};

/// Unrelated processes on the host: the test's own `sleep`s, of the reaper's uid (the costly
/// case: their environ is what a host-wide pass reads).
const UNRELATED: usize = 1000;

/// Retained terminal leases: closed, contained, their cgroups gone (what days of history leave).
const HISTORY: usize = 2000;

/// A controller over the counting table, containment on under the test's root.
fn controller<'t>(cg: &CgroupRoot, state: &Path, t: &'t Counting) -> Controller<'t> {
    let settings = leash::cgroup::Settings {
        requested: leash::cgroup::Requested::On,
        root: Some(cg.path().to_path_buf()),
    };
    let c = Controller::open(StateRoot::open(state).unwrap(), t)
        .unwrap()
        .with_containment(&settings);
    assert!(c.containment().is_on(), "{:?}", c.containment());
    c
}

fn reap_options() -> ReapOptions {
    ReapOptions {
        include_live: false,
        retention_ms: 3_600_000,
        now_ms: leash::lease::now_ms(),
        grace_ms: Some(500),
    }
}

/// This test process as a claimant (pid and start time).
fn me() -> ProcessId {
    let pid = std::process::id() as i32;
    ProcessId {
        pid,
        start_time: start_time(pid).unwrap(),
    }
}

/// One contained session of [`adapter`]'s, its processes in the guard.
struct Session {
    wrapper: Pid,
    adapter: Pid,
    escapee: Pid,
    cgroup: std::path::PathBuf,
}

impl Session {
    fn start(cg: &CgroupRoot, dir: &Path, state: &Path, key: &str, guard: &mut Guard) -> Session {
        let child = guard.child(
            cg.leash(state)
                .args(["exec", "--grace-ms", "200", "--session", key, "--"])
                .arg(adapter(dir, key))
                .stdin(Stdio::null())
                .spawn()
                .unwrap(),
        );
        let wrapper = Pid::of(child.id() as i32).unwrap();
        let escapee = read_pid_file(&dir.join(format!("{key}.escapee.pid")));
        let adapter = read_pid_file(&dir.join(format!("{key}.adapter.pid")));
        guard.add(escapee);
        guard.add(adapter);
        let cgroup = lease_of(state, key)["cgroupPath"].as_str().unwrap().into();
        Session {
            wrapper,
            adapter,
            escapee,
            cgroup,
        }
    }
}

/// One contained session started for a test of its own: its processes in the guard, its
/// cgroup under the test's root. Fields drop in order: the guard (the processes), the scratch
/// directory, the cgroup root.
struct Staged {
    guard: Guard,
    session: Session,
    state: std::path::PathBuf,
    _tmp: TempDir,
    cg: CgroupRoot,
}

/// [`Session::start`] of `key` in a cgroup root and a scratch directory named `tag`; `None`
/// (with the skip said) where no cgroup root can be had.
fn staged(tag: &str, key: &str) -> Option<Staged> {
    let cg = CgroupRoot::new(tag)?;
    let tmp = TempDir::new(tag);
    let mut guard = Guard::new();
    let state = tmp.join("state");
    let session = Session::start(&cg, tmp.path(), &state, key, &mut guard);
    Some(Staged {
        guard,
        session,
        state,
        _tmp: tmp,
        cg,
    })
}

/// One reap of the state root through a fresh counting table; the table is returned for its
/// counts.
fn counted_reap(cg: &CgroupRoot, state: &Path) -> (ReapReport, Counting) {
    let t = Counting::default();
    let report = controller(cg, state, &t).reap(&reap_options()).unwrap();
    (report, t)
}

/// The reap took lease `id`'s tree as escapees and signalled its wrapper itself.
fn reaped_as_escapees<'r>(report: &'r ReapReport, id: &str, wrapper: Pid) -> &'r CloseOutcome {
    let out = report
        .escapees
        .iter()
        .find(|o| o.lease_id == id)
        .unwrap_or_else(|| panic!("the running wrapper was not reaped: {report:?}"));
    assert!(
        out.signals.iter().any(|s| s.pid == wrapper.pid),
        "the wrapper was signalled: {out:?}"
    );
    out
}

/// Every process of the session ends.
fn all_gone(s: &Session) {
    for (what, p) in [
        ("wrapper", s.wrapper),
        ("adapter", s.adapter),
        ("escapee", s.escapee),
    ] {
        assert!(wait_for(|| !p.alive()), "the {what} is gone");
    }
}

/// Records the session's lease `closed` while its wrapper still runs: what a store says after a
/// close whose kills the wrapper outlived (or restored from a copy taken before the close's end).
fn mark_closed_while_running(state: &Path, key: &str) -> String {
    let root = StateRoot::open(state).unwrap();
    let mut store = Store::open(&root.db_path()).unwrap();
    let id = store
        .active_lease_for_session(key)
        .unwrap()
        .unwrap()
        .lease_id;
    assert!(store.claim(&id, me(), |_| false).unwrap().is_some());
    assert!(store
        .transition(
            &id,
            LeaseState::Closing,
            LeaseState::Closed,
            Some(me()),
            "closed (test: its wrapper outlived the close)"
        )
        .unwrap());
    id
}

/// Adds `n` retained closed leases, each a copy of `template`'s row with its own id and key,
/// ended a minute ago, contained (a cgroup where this gateway puts them, long removed), its
/// root and adapter pids those of live unrelated processes (reused pids, other start times).
fn add_history(state: &Path, template: &str, n: usize, reused: &[Pid]) {
    let root = StateRoot::open(state).unwrap();
    let mut store = Store::open(&root.db_path()).unwrap();
    let t = store.lease(template).unwrap().unwrap();
    let gateway_dir = Path::new(t.cgroup_path.as_deref().unwrap())
        .parent()
        .unwrap()
        .to_path_buf();
    for i in 0..n {
        let mut l = t.clone();
        l.lease_id = leash::lease::new_lease_id();
        l.session_key = format!("history-{i}");
        l.state = LeaseState::Closed;
        l.state_reason = Some("terminated 2 process(es) children first".into());
        l.closed_at = Some(leash::lease::now_ms() - 60_000);
        l.claimed_by = None;
        l.root_pid = reused[(2 * i) % reused.len()].pid;
        l.adapter_pid = Some(reused[(2 * i + 1) % reused.len()].pid);
        l.cgroup_path = Some(gateway_dir.join(&l.lease_id).display().to_string());
        l.cgroup_id = Some(1_000_000 + i as u64);
        store.insert_lease(&l, None, |_| None).unwrap();
    }
}

/// An adapter with a `setsid` child (out of the group, still in the lease's cgroup).
fn adapter(dir: &Path, key: &str) -> std::path::PathBuf {
    let d = dir.display();
    script(
        dir,
        &format!("adapter-{key}.sh"),
        &format!(
            "echo $$ > '{d}/{key}.adapter.pid'\nsetsid sleep 100000 & echo $! > '{d}/{key}.escapee.pid'\nexec sleep 100000"
        ),
    )
}

fn close(cg: &CgroupRoot, state: &Path, key: &str) {
    let out = cg
        .leash(state)
        .args(["close", "--session", key])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "close {key}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_reap_of_contained_leases_reads_their_members_not_the_host() {
    let Some(cg) = CgroupRoot::new("reapreads") else {
        return;
    };
    let tmp = TempDir::new("reapreads");
    let state = tmp.join("state");
    let mut guard = Guard::new();

    // Four contained sessions, owned by this (live) test process.
    let keys = ["a", "b", "c", "d"];
    let mut sessions = Vec::new();
    for key in keys {
        let child = cg
            .leash(&state)
            .args(["exec", "--grace-ms", "200", "--session", key, "--"])
            .arg(adapter(tmp.path(), key))
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        let wrapper = Pid::of(child.id() as i32).unwrap();
        guard.add(wrapper);
        let escapee = read_pid_file(&tmp.join(&format!("{key}.escapee.pid")));
        guard.add(escapee);
        sessions.push((child, wrapper, escapee));
    }
    let cgroup_of =
        |key: &str| std::path::PathBuf::from(lease_of(&state, key)["cgroupPath"].as_str().unwrap());
    for (key, (_, _, escapee)) in keys.iter().zip(&sessions) {
        assert!(
            cgroup_procs(&cgroup_of(key)).contains(&escapee.pid),
            "{key}'s escapee is in its cgroup"
        );
    }

    // "a": its wrapper is SIGKILLed, and then its adapter (the group's one member) exits, so
    // only the `setsid` escapee is left: in no tree and no group of the lease, only in its
    // cgroup. (A group still populated would bring the host-wide pass back, to prove the whole
    // group before a group signal: docs/security.md.)
    let a_adapter = read_pid_file(&tmp.join("a.adapter.pid"));
    guard.add(a_adapter);
    signal(sessions[0].1, libc::SIGKILL);
    sessions[0].0.wait().unwrap();
    signal(a_adapter, libc::SIGKILL);
    assert!(wait_for(|| !a_adapter.exists()), "a's adapter is gone");
    // "b": closed, so the store holds a closed contained lease (its escapees are looked for).
    let b_cgroup = cgroup_of("b");
    close(&cg, &state, "b");
    sessions[1].0.wait().unwrap();
    assert!(wait_for(|| !sessions[1].2.exists()), "b's escapee is gone");
    assert!(!b_cgroup.exists(), "b's cgroup was removed");

    // A thousand unrelated processes of the reaper's uid.
    let mut unrelated = Vec::new();
    for _ in 0..UNRELATED {
        let c = guard.child(
            Command::new("sleep")
                .arg("100000")
                .stdin(Stdio::null())
                .spawn()
                .unwrap(),
        );
        unrelated.push(Pid::of(c.id() as i32).unwrap());
    }

    // Days of history: closed leases the retention keeps, whose pids are now other processes'.
    let b_id = lease_of(&state, "b")["leaseId"]
        .as_str()
        .unwrap()
        .to_string();
    add_history(&state, &b_id, HISTORY, &unrelated);

    let t = Counting::default();
    let c = controller(&cg, &state, &t);
    let report = c.reap(&reap_options()).unwrap();
    let (scans, entries) = (t.scans(), t.entries());
    drop(c);

    // It did its work: "a" reaped through its cgroup, "c" and "d" skipped as live sessions.
    let a = lease_of(&state, "a");
    let a_out = report
        .leases
        .iter()
        .find(|o| o.lease_id == a["leaseId"].as_str().unwrap())
        .unwrap_or_else(|| panic!("a was not reaped: {report:?}"));
    assert_eq!(a_out.result, CloseResult::Closed, "{a_out:?}");
    assert!(wait_for(|| !sessions[0].2.exists()), "a's escapee is gone");
    for (i, key) in [(2, "c"), (3, "d")] {
        assert!(
            report
                .skipped
                .iter()
                .any(|(id, _)| id == lease_of(&state, key)["leaseId"].as_str().unwrap()),
            "{key} skipped: {report:?}"
        );
        assert!(sessions[i].2.alive(), "{key}'s escapee untouched");
    }
    assert!(
        unrelated.iter().all(Pid::alive),
        "no unrelated process touched"
    );

    // And it read what its leases name, not the host.
    assert_eq!(
        scans, 0,
        "reap took a host-wide pass over {UNRELATED} unrelated processes"
    );
    assert!(
        entries <= 20 * keys.len(),
        "reap read {entries} /proc entries for {} leases and {HISTORY} retained closed ones",
        keys.len()
    );
    assert!(report.escapees.is_empty(), "{:?}", report.escapees);
    assert_eq!(report.expired, 0, "the history is retained");

    for (i, key) in [(2, "c"), (3, "d")] {
        close(&cg, &state, key);
        sessions[i].0.wait().unwrap();
    }
}

/// Stops `p` (SIGSTOP) and waits until `/proc` shows it stopped.
fn stop(p: Pid) {
    signal(p, libc::SIGSTOP);
    assert!(
        wait_for(|| stat_fields(p.pid).is_some_and(|f| f[0] == "T")),
        "the wrapper stopped"
    );
}

/// A closed lease whose wrapper still runs (the store says closed; the wrapper, outside its
/// cgroup as always, carries the lease's markers, and its adapter and `setsid` escapee are in
/// the cgroup): reap finds it, from the cgroup that is still there, and takes the whole tree as
/// the lease's escapees, leaving the lease closed; no host-wide pass.
#[test]
fn a_closed_lease_whose_wrapper_still_runs_is_reaped() {
    let key = "z";
    let Some(s) = staged("reapclosedlive", key) else {
        return;
    };
    let state = &s.state;
    let Session {
        wrapper,
        escapee,
        ref cgroup,
        ..
    } = s.session;
    assert!(cgroup_procs(cgroup).contains(&escapee.pid));
    let id = mark_closed_while_running(state, key);
    // Stopped, the wrapper cannot end by itself once reap's TERM has ended its adapter (it
    // exits with its adapter, and under load that came before reap's turn to signal it): so
    // whether reap signals the wrapper itself is what is tested, not the wrapper's speed.
    stop(wrapper);

    let (report, t) = counted_reap(&s.cg, state);
    reaped_as_escapees(&report, &id, wrapper);
    all_gone(&s.session);
    assert_eq!(lease_of(state, key)["state"], "closed");
    assert_eq!(t.scans(), 0, "no host-wide pass");
    assert!(wait_for(|| !cgroup.exists()), "its cgroup went with it");
}

/// The same with its cgroup emptied while the wrapper was stopped: a stray sweep (the daemon's,
/// between reaps) must not take the cgroup away while the wrapper runs, or no later reap would
/// look for the wrapper; the reap then ends the wrapper (SIGTERM, SIGCONT) and the cgroup goes.
#[test]
fn a_closed_lease_whose_stopped_wrapper_outlived_its_adapter_is_reaped_after_a_sweep() {
    let key = "w";
    let Some(s) = staged("reapclosedstopped", key) else {
        return;
    };
    let (state, cg) = (&s.state, &s.cg);
    let Session {
        wrapper,
        adapter,
        escapee,
        ref cgroup,
    } = s.session;
    // The wrapper stopped, its adapter and escapee gone: the cgroup is empty, the wrapper runs.
    stop(wrapper);
    signal(adapter, libc::SIGKILL);
    signal(escapee, libc::SIGKILL);
    assert!(
        wait_for(|| !cgroup_populated(cgroup) && cgroup_procs(cgroup).is_empty()),
        "the cgroup emptied"
    );
    let id = mark_closed_while_running(state, key);

    let t = Counting::default();
    let c = controller(cg, state, &t);
    let swept = c.sweep_stray_cgroups(leash::lease::now_ms()).unwrap();
    let report = c.reap(&reap_options()).unwrap();
    drop(c);
    assert!(
        report.escapees.iter().any(|o| o.lease_id == id),
        "the stopped wrapper was not reaped (sweep: {swept:?}): {report:?}"
    );
    assert!(wait_for(|| !wrapper.alive()), "the wrapper is gone");
    assert_eq!(lease_of(state, key)["state"], "closed");
    assert_eq!(t.scans(), 0, "no host-wide pass");
    assert!(wait_for(|| !cgroup.exists()), "its cgroup went with it");
}

/// When reap does need the host-wide pass (here: an uncontained closed lease of this gateway
/// among the rows), the retained history still costs nothing beyond it: the recorded roots and
/// adapters of closed leases that can hold nothing any more (reused by now by another user's
/// processes) are not read in full, while a closed lease whose wrapper still runs (its cgroup
/// still there) is found and reaped all the same.
#[test]
fn the_host_wide_pass_reads_no_retained_row_and_still_reaps_a_closed_lease_whose_wrapper_runs() {
    if !is_root() {
        common::skip("processes of another user need root to start");
        return;
    }
    let key = "z";
    let Some(mut s) = staged("reapscanhistory", key) else {
        return;
    };
    let (state, wrapper) = (s.state.clone(), s.session.wrapper);
    let id = mark_closed_while_running(&state, key);
    stop(wrapper);
    // Another user's processes, at the pids the history recorded.
    let strangers: Vec<Pid> = (0..20)
        .map(|_| {
            let child = s.guard.child(
                Command::new("setpriv")
                    .args([
                        "--reuid=65534",
                        "--regid=65534",
                        "--clear-groups",
                        "sleep",
                        "100000",
                    ])
                    .stdin(Stdio::null())
                    .spawn()
                    .unwrap(),
            );
            let pid = child.id() as i32;
            assert!(wait_for(|| stat_fields(pid).is_some_and(|_| {
                std::fs::read_to_string(format!("/proc/{pid}/status")).is_ok_and(|s| {
                    s.lines()
                        .any(|l| l.starts_with("Uid:") && l.contains("65534"))
                })
            })));
            Pid::of(pid).unwrap()
        })
        .collect();
    add_history(&state, &id, 200, &strangers);
    // One uncontained closed lease of this gateway: its escapees could be anywhere, so reap
    // takes the host-wide pass.
    {
        let root = StateRoot::open(&state).unwrap();
        let mut store = Store::open(&root.db_path()).unwrap();
        let mut l = store.lease(&id).unwrap().unwrap();
        l.lease_id = leash::lease::new_lease_id();
        l.session_key = "uncontained".into();
        l.cgroup_path = None;
        l.cgroup_id = None;
        l.root_pid = std::process::id() as i32;
        l.adapter_pid = None;
        l.closed_at = Some(leash::lease::now_ms() - 60_000);
        store.insert_lease(&l, None, |_| None).unwrap();
    }

    let (report, t) = counted_reap(&s.cg, &state);
    assert_eq!(t.scans(), 1, "the host-wide pass");
    assert_eq!(
        t.others_in_full(),
        0,
        "another user's processes were read in full for the retained rows that name them"
    );
    reaped_as_escapees(&report, &id, wrapper);
    all_gone(&s.session);
    for s in &strangers {
        assert!(s.alive(), "another user's process was signalled");
    }
}
