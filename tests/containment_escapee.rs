//! One cgroup per lease takes the escapee that pids, groups and markers cannot: a descendant that
//! double-forks, calls setsid, clears its environment (`env -i`) and ignores SIGTERM. After a
//! wrapper SIGKILL, `reap` kills it through the lease's verified cgroup and removes the cgroup;
//! `close` takes it while the wrapper lives; a bystander session with the same kind of escapee is
//! untouched by both. Real cgroups under a root each test makes for itself (removed on drop, also
//! when the test fails).
mod common;
use common::*;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};

/// An adapter that stages the escapee and then sleeps: a subshell forks the escapee and exits
/// (double fork), the escapee is a new session (`setsid`) with an empty environment (`env -i`)
/// and ignores TERM (the ignored disposition survives its exec of sleep).
fn escapee_adapter(dir: &Path, tag: &str) -> PathBuf {
    let d = dir.display();
    script(
        dir,
        &format!("adapter-{tag}.sh"),
        &format!(
            "( setsid env -i /bin/sh -c 'trap \"\" TERM; echo $$ > \"{d}/{tag}.escapee.pid\"; \
             exec sleep 100000' & )\nexec sleep 100000"
        ),
    )
}

struct Session {
    child: Child,
    wrapper: Pid,
    escapee: Pid,
    cgroup: PathBuf,
}

fn start(cg: &CgroupRoot, tmp: &TempDir, state: &Path, key: &str, guard: &mut Guard) -> Session {
    let adapter = escapee_adapter(tmp.path(), key);
    let child = cg
        .leash(state)
        .args(["exec", "--grace-ms", "200", "--session", key, "--"])
        .arg(&adapter)
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let wrapper = Pid::of(child.id() as i32).unwrap();
    guard.add(wrapper);
    let escapee = read_pid_file(&tmp.join(&format!("{key}.escapee.pid")));
    guard.add(escapee);
    let lease = lease_of(state, key);
    let cgroup = PathBuf::from(
        lease["cgroupPath"]
            .as_str()
            .expect("lease records a cgroup"),
    );
    assert!(cgroup.starts_with(cg.path()), "{}", cgroup.display());
    assert!(
        cgroup_procs(&cgroup).contains(&escapee.pid),
        "the escapee is in the lease's cgroup"
    );
    assert!(
        !cgroup_procs(&cgroup).contains(&wrapper.pid),
        "the wrapper stays outside its cgroup"
    );
    assert_ne!(pgid(escapee.pid), pgid(wrapper.pid));
    let env = std::fs::read_to_string(format!("/proc/{}/environ", escapee.pid)).unwrap();
    assert!(
        !env.contains("OPENCLAW_"),
        "env -i: the escapee carries no markers: {env:?}"
    );
    Session {
        child,
        wrapper,
        escapee,
        cgroup,
    }
}

fn json(cg: &CgroupRoot, state: &Path, args: &[&str]) -> (Option<i32>, Value) {
    let out = cg
        .leash(state)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let v = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "leash {args:?} ({e}): {} / {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.code(), v)
}

#[test]
fn escapee_of_a_sigkilled_wrapper_is_reaped_with_its_cgroup_and_the_bystander_survives() {
    let Some(cg) = CgroupRoot::new("escapee") else {
        return;
    };
    let tmp = TempDir::new("cg-escapee");
    let state = tmp.join("state");
    let mut guard = Guard::new();
    let mut victim = start(&cg, &tmp, &state, "victim", &mut guard);
    let bystander = start(&cg, &tmp, &state, "bystander", &mut guard);

    signal(victim.wrapper, libc::SIGKILL);
    victim.child.wait().unwrap();
    // The adapter dies with the wrapper (parent-death signal); the escapee does not.
    assert!(wait_for(
        || cgroup_procs(&victim.cgroup) == vec![victim.escapee.pid]
    ));
    assert!(victim.escapee.alive());

    // The dry run shows the cgroup membership as the evidence, and changes nothing.
    let (code, plan) = json(&cg, &state, &["reap", "--dry-run", "--json"]);
    assert_eq!(code, Some(0), "{plan}");
    let lp = plan["leases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["sessionKey"] == "victim")
        .unwrap_or_else(|| panic!("{plan}"))
        .clone();
    assert_eq!(lp["decision"]["action"], "terminate", "{lp}");
    assert_eq!(lp["cgroup"]["action"], "killAndRemove", "{lp}");
    assert_eq!(lp["cgroup"]["members"][0], victim.escapee.pid, "{lp}");
    let member = lp["signals"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["pid"] == victim.escapee.pid)
        .unwrap_or_else(|| panic!("escapee not planned: {lp}"))
        .clone();
    assert_eq!(member["role"], "cgroupMember", "{member}");
    assert!(victim.escapee.alive(), "the dry run signals nothing");

    let (code, report) = json(&cg, &state, &["reap", "--json", "--grace-ms", "200"]);
    assert_eq!(code, Some(0), "{report}");
    let o = report["leases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["sessionKey"] == "victim")
        .unwrap_or_else(|| panic!("{report}"))
        .clone();
    assert_eq!(o["result"], "closed", "{o}");
    assert!(
        wait_for(|| !victim.escapee.alive()),
        "the escapee outlived reap"
    );
    assert!(!victim.cgroup.exists(), "the lease's cgroup was removed");

    // The bystander's session is live (its wrapper runs): untouched.
    assert!(bystander.escapee.alive() && bystander.wrapper.alive());
    assert!(cgroup_procs(&bystander.cgroup).contains(&bystander.escapee.pid));
    assert_eq!(lease_of(&state, "bystander")["state"], "open");
}

#[test]
fn close_takes_the_escapee_while_the_wrapper_lives_and_spares_the_bystander() {
    let Some(cg) = CgroupRoot::new("close") else {
        return;
    };
    let tmp = TempDir::new("cg-close");
    let state = tmp.join("state");
    let mut guard = Guard::new();
    let mut closed = start(&cg, &tmp, &state, "closed", &mut guard);
    let bystander = start(&cg, &tmp, &state, "bystander", &mut guard);

    let (code, out) = json(
        &cg,
        &state,
        &[
            "close",
            "--json",
            "--session",
            "closed",
            "--grace-ms",
            "200",
        ],
    );
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(out[0]["result"], "closed", "{out}");
    assert!(!closed.escapee.alive(), "close left the escapee");
    closed.child.wait().unwrap();
    assert!(wait_for(|| !closed.cgroup.exists()), "cgroup not removed");

    assert!(bystander.escapee.alive() && bystander.wrapper.alive());
    assert!(cgroup_procs(&bystander.cgroup).contains(&bystander.escapee.pid));
    assert_eq!(lease_of(&state, "bystander")["state"], "open");
}

#[test]
fn parent_death_with_containment_takes_the_escapee_and_removes_the_cgroup() {
    let Some(cg) = CgroupRoot::new("pdeath") else {
        return;
    };
    let tmp = TempDir::new("cg-pdeath");
    let state = tmp.join("state");
    let d = tmp.path().display().to_string();
    let adapter = escapee_adapter(tmp.path(), "p");
    let spawner = script(
        tmp.path(),
        "spawner.sh",
        &format!(
            "'{}' --state-dir '{}' exec --grace-ms 300 --session p -- '{}' &\n\
             echo $! > '{d}/wrapper.pid'\nwait",
            leash_bin().display(),
            state.display(),
            adapter.display()
        ),
    );
    let mut guard = Guard::new();
    let mut tree = Guard::new();
    let sp = guard.child(
        std::process::Command::new(&spawner)
            .env("LEASH_CGROUP_ROOT", cg.path())
            .env("LEASH_CONTAINMENT", "on")
            .spawn()
            .unwrap(),
    );
    let spawner_pid = Pid::of(sp.id() as i32).unwrap();
    let wrapper = read_pid_file(&tmp.join("wrapper.pid"));
    tree.add(wrapper);
    let escapee = read_pid_file(&tmp.join("p.escapee.pid"));
    tree.add(escapee);
    let cgroup = PathBuf::from(lease_of(&state, "p")["cgroupPath"].as_str().unwrap());
    assert!(cgroup_procs(&cgroup).contains(&escapee.pid));

    signal(spawner_pid, libc::SIGKILL);
    assert!(wait_for(|| !wrapper.alive()), "wrapper never exited");
    assert!(!escapee.alive(), "the escapee outlived the wrapper");
    assert!(
        !cgroup.exists(),
        "the wrapper removes its cgroup before exiting"
    );
    let _ = sp.wait();
}

#[test]
fn a_cgroup_made_again_under_the_recorded_name_is_not_killed() {
    let Some(cg) = CgroupRoot::new("recreated") else {
        return;
    };
    let tmp = TempDir::new("cg-recreated");
    let state = tmp.join("state");
    let mut guard = Guard::new();
    let mut child = cg
        .leash(&state)
        .args(["exec", "--session", "r", "--", "sleep", "100000"])
        .spawn()
        .unwrap();
    let wrapper = Pid::of(child.id() as i32).unwrap();
    guard.add(wrapper);
    let adapter = adapter_of(wrapper);
    let lease = lease_of(&state, "r");
    let path = PathBuf::from(lease["cgroupPath"].as_str().unwrap());
    let id = lease["cgroupId"].as_u64().unwrap();
    // The wrapper dies; its adapter with it; the cgroup empties.
    signal(wrapper, libc::SIGKILL);
    child.wait().unwrap();
    assert!(wait_for(|| !adapter.alive() && !cgroup_populated(&path)));
    // Someone removes it and makes a directory of the same name, with a process of its own.
    std::fs::remove_dir(&path).unwrap();
    std::fs::create_dir(&path).unwrap();
    let mut decoy = std::process::Command::new("sleep")
        .arg("100000")
        .spawn()
        .unwrap();
    let decoy_pid = Pid::of(decoy.id() as i32).unwrap();
    guard.add(decoy_pid);
    std::fs::write(path.join("cgroup.procs"), decoy_pid.pid.to_string()).unwrap();
    assert!(cgroup_procs(&path).contains(&decoy_pid.pid));

    let (_, plan) = json(
        &cg,
        &state,
        &["reap", "--dry-run", "--json", "--include-live"],
    );
    let c = &plan["leases"][0]["cgroup"];
    assert_eq!(c["action"], "leave", "{plan}");
    assert!(
        c["evidence"]
            .as_str()
            .unwrap()
            .contains(&format!("recorded {id}")),
        "{plan}"
    );
    let (_, report) = json(&cg, &state, &["reap", "--json", "--include-live"]);
    assert_eq!(report["leases"][0]["result"], "lost", "{report}");
    assert!(
        decoy_pid.alive(),
        "a cgroup that is not the lease's was killed"
    );
    assert!(
        path.exists(),
        "a cgroup that is not the lease's was removed"
    );
    signal(decoy_pid, libc::SIGKILL);
    let _ = decoy.wait();
}

#[test]
fn a_crash_between_mkdir_and_commit_leaves_a_stray_that_reap_sweeps() {
    let Some(cg) = CgroupRoot::new("stray") else {
        return;
    };
    let tmp = TempDir::new("cg-stray");
    let state = tmp.join("state");
    init_state_root(&state);
    let (_, status) = json(&cg, &state, &["status", "--json"]);
    let gw_root = PathBuf::from(
        status["containment"]["gatewayRoot"]
            .as_str()
            .unwrap_or_else(|| panic!("{status}")),
    );
    // Hold the database's write lock: `leash exec` makes the cgroup, then waits on the commit.
    let conn = rusqlite::Connection::open(state.join("leash.db")).unwrap();
    conn.execute_batch("BEGIN IMMEDIATE").unwrap();
    let mut guard = Guard::new();
    let mut exec = cg
        .leash(&state)
        .env("LEASH_BUSY_TIMEOUT_MS", "60000")
        .args(["exec", "--session", "s", "--", "sleep", "100000"])
        .spawn()
        .unwrap();
    let exec_pid = Pid::of(exec.id() as i32).unwrap();
    guard.add(exec_pid);
    let mut stray = None;
    assert!(wait_for(|| {
        stray = std::fs::read_dir(&gw_root)
            .ok()
            .and_then(|mut rd| rd.find_map(|e| e.ok().filter(|e| e.path().is_dir())))
            .map(|e| e.path());
        stray.is_some()
    }));
    let stray = stray.unwrap();
    // The crash: between the mkdir and the commit.
    signal(exec_pid, libc::SIGKILL);
    exec.wait().unwrap();
    conn.execute_batch("ROLLBACK").unwrap();
    drop(conn);
    assert!(stray.exists());
    // Something ended up inside it (as if the crash came later in a slower world).
    let mut inside = std::process::Command::new("sleep")
        .arg("100000")
        .spawn()
        .unwrap();
    let inside_pid = Pid::of(inside.id() as i32).unwrap();
    guard.add(inside_pid);
    std::fs::write(stray.join("cgroup.procs"), inside_pid.pid.to_string()).unwrap();

    // A young directory without a lease may be a commit in flight: left alone until it is older
    // than the busy timeout allows a commit to wait.
    let fast = |args: &[&str]| {
        let out = cg
            .leash(&state)
            .env("LEASH_BUSY_TIMEOUT_MS", "100")
            .args(args)
            .output()
            .unwrap();
        serde_json::from_slice::<Value>(&out.stdout).unwrap()
    };
    // Old enough, but populated: no lease names it, and a lease's wrapper starts only after its
    // commit, so what is inside is not leash's. Reported, never signalled, never removed.
    assert!(
        wait_for(|| {
            let plan = fast(&["reap", "--dry-run", "--json"]);
            plan["strayCgroups"][0]["action"] == "leave"
                && plan["strayCgroups"][0]["processes"][0]["pid"] == inside_pid.pid
        }),
        "the populated stray was never reported"
    );
    let report = fast(&["reap", "--json"]);
    assert_eq!(report["cgroups"][0]["result"], "left", "{report}");
    assert!(
        inside_pid.alive() && stray.exists(),
        "a populated stray was signalled or removed"
    );
    // Once empty, the next sweep removes it.
    signal(inside_pid, libc::SIGKILL);
    let _ = inside.wait();
    assert!(wait_for(|| cgroup_procs(&stray).is_empty()));
    let plan = fast(&["reap", "--dry-run", "--json"]);
    assert_eq!(plan["strayCgroups"][0]["action"], "remove", "{plan}");
    let report = fast(&["reap", "--json"]);
    assert_eq!(report["cgroups"][0]["result"], "removed", "{report}");
    assert!(!stray.exists());
}
