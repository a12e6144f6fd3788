//! Bad input: lease rows rewritten (as anyone able to write the state directory could) to point at
//! pid 1, at the reaper's own process group, or at another uid's process. Each row is made as
//! convincing as a row can be — the named process's real pid *and* start time, a root start time so
//! early that every live process "started after the lease" — so that only the signalling guards
//! stand between the row and a signal. Every case ends in a refusal with a reason (or `lost`,
//! nothing alive being the lease's) and no signal: the decoys trap and log every catchable signal
//! and stay alive.
mod common;
use common::*;
use serde_json::Value;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};

fn dead_lease(state: &Path, session: &str) -> String {
    dead_session(state, session).0
}

/// Runs `leash ARGS --json` (in process group `pgid` when given) and returns its exit code and
/// output.
fn leash_json(state: &Path, args: &[&str], pgid: Option<i32>) -> (Option<i32>, Value, String) {
    let mut c = leash(state);
    c.args(args).arg("--json").stdin(Stdio::null());
    if let Some(g) = pgid {
        c.process_group(g);
    }
    let out = c.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let v = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("leash {args:?} ({e}): {stdout} / {stderr}"));
    (out.status.code(), v, stderr)
}

/// The outcome for `lease` in a close (an array) or reap (`{"leases": [...]}`) report.
fn outcome<'a>(v: &'a Value, lease: &str) -> &'a Value {
    let list = v.get("leases").unwrap_or(v);
    list.as_array()
        .unwrap()
        .iter()
        .find(|o| o["leaseId"] == lease)
        .unwrap_or_else(|| panic!("no outcome for {lease}: {v}"))
}

fn no_signals(o: &Value) {
    assert_eq!(
        o["signals"],
        serde_json::json!([]),
        "nothing signalled: {o}"
    );
}

fn refused_with(o: &Value, pid: i32, why: &str) {
    assert!(
        o["refused"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["pid"] == pid && r["reason"].as_str().unwrap().contains(why)),
        "pid {pid} must be refused with '{why}': {o}"
    );
}

/// The pidfs inode of a live process, as a forger rewriting a row could read it.
fn ino(pid: i32) -> i64 {
    leash::proc::pidfs_ino_of(pid).map_or(0, |i| i as i64)
}

fn pid1() -> Pid {
    Pid::of(1).expect("pid 1 is visible")
}

/// Rewrites the lease's row so that its root is `p`, as convincingly as a row can name it: the
/// real pid, start time and pidfs inode.
fn forge_root(state: &Path, lease: &str, p: Pid) {
    tamper(
        state,
        lease,
        "root_pid = ?2, root_start_time = ?3, root_pidfs_ino = ?4",
        &[p.pid as i64, p.start as i64, ino(p.pid)],
    );
}

/// Rewrites the lease's row so that its adapter and its group are `p` (pid and start time), with
/// a root start time so early that every live process "started after the lease".
fn forge_adapter_and_group(state: &Path, lease: &str, p: Pid) {
    tamper(
        state,
        lease,
        "root_start_time = 1, adapter_pid = ?2, adapter_start_time = ?3, process_group_id = ?2",
        &[p.pid as i64, p.start as i64],
    );
}

/// `close` of the lease and `reap --include-live` (in process group `pgid` when given) each
/// leave it open (exit 6) and signal nothing; `check` sees each one's outcome.
fn close_and_reap_leave_it_open(
    state: &Path,
    lease: &str,
    pgid: Option<i32>,
    check: impl Fn(&[&str], &Value),
) {
    for args in [
        vec!["close", lease, "--grace-ms", "100"],
        vec!["reap", "--include-live", "--grace-ms", "100"],
    ] {
        let (code, v, stderr) = leash_json(state, &args, pgid);
        assert_eq!(code, Some(6), "{args:?}: {v} {stderr}");
        let o = outcome(&v, lease);
        assert_eq!(o["result"], "leftOpen", "{o}");
        no_signals(o);
        check(&args, o);
    }
}

/// Starts `leader` (already given its arguments) as the leader of a new process group, its log
/// at `leader_log`, and the trap script as a second member of that group, its log at
/// `member_log`; both under `guard`.
fn group_of_two(
    guard: &mut Guard,
    tmp: &TempDir,
    mut leader: Command,
    leader_log: std::path::PathBuf,
    member_log: std::path::PathBuf,
) -> (Logged, Logged) {
    guard.child(
        leader
            .process_group(0)
            .stdin(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let leader = Logged::wait_started(leader_log);
    assert_eq!(pgid(leader.pid.pid), Some(leader.pid.pid));
    guard.child(
        Command::new(trap_script(tmp.path()))
            .arg(&member_log)
            .process_group(leader.pid.pid)
            .stdin(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let member = Logged::wait_started(member_log);
    guard.add(leader.pid);
    guard.add(member.pid);
    (leader, member)
}

#[test]
fn a_row_naming_pid_1_as_its_root_is_refused() {
    let tmp = TempDir::new("row-pid1-root");
    let state = tmp.join("state");
    let id = dead_lease(&state, "s");
    let init = pid1();
    // A thorough forger copies the pidfs inode too, so only the remaining guards stand.
    forge_root(&state, &id, init);
    let (code, v, _) = leash_json(&state, &["close", &id, "--grace-ms", "100"], None);
    assert_eq!(code, Some(6), "unverified: {v}");
    let o = outcome(&v, &id);
    assert_eq!(o["result"], "leftOpen", "{o}");
    // Depending on the host, pid 1's exe is unreadable even to root, or it is not a wrapper.
    let reason = o["reason"].as_str().unwrap();
    assert!(
        reason.contains("root pid 1")
            && (reason.contains("not under this gateway's wrapper root")
                || reason.contains("exe is unreadable")),
        "{o}"
    );
    no_signals(o);
    let (code, v, _) = leash_json(
        &state,
        &["reap", "--include-live", "--grace-ms", "100"],
        None,
    );
    assert_eq!(code, Some(6), "{v}");
    no_signals(outcome(&v, &id));
    assert!(init.alive());
    assert_eq!(lease_of(&state, "s")["state"], "open");
}

/// Regression: `close` and `reap` left a lease open with "every live member is refused by the
/// signalling guards" but reported no refusal — which pid, and why — although the plan had them
/// (only `reap --dry-run` showed them).
#[test]
fn close_and_reap_report_which_pids_the_guards_refused_and_why() {
    let tmp = TempDir::new("row-refusals-reported");
    let state = tmp.join("state");
    let (id, g) = lease_naming_own_group(&tmp, &state);
    let group = g.leader.pid.pid;
    let (_, plan, _) = leash_json(
        &state,
        &["reap", "--dry-run", "--include-live"],
        Some(group),
    );
    // The decoys' refusals (the running leash itself is in the group too, a different pid each
    // time, and refused for lack of the marker).
    let decoys = |v: &Value| -> Vec<Value> {
        let mut r: Vec<Value> = outcome(v, &id)["refused"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["pid"] == group || r["pid"] == g.member.pid.pid)
            .cloned()
            .collect();
        r.sort_by_key(|r| r["pid"].as_i64());
        r
    };
    let planned = decoys(&plan);
    assert_eq!(planned.len(), 2, "{plan}");
    for args in [
        vec!["close", id.as_str(), "--grace-ms", "100"],
        vec!["reap", "--include-live", "--grace-ms", "100"],
    ] {
        let (_, v, _) = leash_json(&state, &args, Some(group));
        assert_eq!(decoys(&v), planned, "{args:?}: {v}");
    }
}

#[test]
fn a_row_naming_pid_1_as_its_adapter_and_group_signals_nothing() {
    let tmp = TempDir::new("row-pid1-adapter");
    let state = tmp.join("state");
    let id = dead_lease(&state, "s");
    let init = pid1();
    forge_adapter_and_group(&state, &id, init);
    let (code, v, _) = leash_json(
        &state,
        &["reap", "--include-live", "--grace-ms", "100"],
        None,
    );
    assert_eq!(code, Some(0), "{v}");
    let o = outcome(&v, &id);
    // Group 1 is never even looked at; with the root gone and no process carrying the lease's
    // markers, nothing alive is the lease's.
    assert_eq!(o["result"], "lost", "{o}");
    assert!(
        o["reason"].as_str().unwrap().contains("markers"),
        "the reason says why: {o}"
    );
    no_signals(o);
    assert!(init.alive());
}

/// The lease's markers, as a forged environment: a decoy carrying them passes verification, so
/// only the signalling guards stand between it and a signal.
fn markers(state: &Path, lease: &str) -> Vec<(&'static str, String)> {
    let gateway = run_json(state, &["status", "--json"])["gatewayInstanceId"]
        .as_str()
        .unwrap()
        .to_string();
    vec![
        ("OPENCLAW_ACPX_LEASE_ID", lease.to_string()),
        ("OPENCLAW_GATEWAY_INSTANCE_ID", gateway),
    ]
}

/// A process group led by a decoy that carries the lease's markers, with a second decoy (no
/// markers) as a member: the reaper is then run inside that group, so the group is the reaper's
/// own.
struct OwnGroup {
    _guard: Guard,
    leader: Logged,
    member: Logged,
}

fn own_group(tmp: &TempDir, markers: &[(&str, String)]) -> OwnGroup {
    // The leader's own `sleep`s must not inherit the forged markers: they share its group, and
    // a marked member of the reaper's group that is not its leader is signalled like any marked
    // process (the root wrapper of a gateway that runs `leash close` is such a member).
    let leader_script = script(
        tmp.path(),
        "leader.sh",
        r#"log="$1"
for s in TERM INT HUP QUIT USR1 USR2 ALRM; do trap "echo $s >> '$log'" $s; done
echo $$ > "$log.pid"
while :; do env -u OPENCLAW_ACPX_LEASE_ID -u OPENCLAW_GATEWAY_INSTANCE_ID sleep 1 & wait $!; done"#,
    );
    let mut guard = Guard::new();
    let leader_log = tmp.join("leader.log");
    let mut leader = Command::new(&leader_script);
    leader
        .arg(&leader_log)
        .envs(markers.iter().map(|(k, v)| (k, v)));
    let (leader, member) =
        group_of_two(&mut guard, tmp, leader, leader_log, tmp.join("member.log"));
    OwnGroup {
        _guard: guard,
        leader,
        member,
    }
}

/// A dead lease whose row is rewritten so that its adapter and group are a process group of the
/// test's own (`OwnGroup`), which the reaper will run in; the group's members carry the lease's
/// markers, so only the guards stand between them and a signal.
fn lease_naming_own_group(tmp: &TempDir, state: &Path) -> (String, OwnGroup) {
    let id = dead_lease(state, "s");
    let g = own_group(tmp, &markers(state, &id));
    forge_adapter_and_group(state, &id, g.leader.pid);
    (id, g)
}

#[test]
fn a_row_naming_the_reapers_own_group_is_refused() {
    let tmp = TempDir::new("row-own-group");
    let state = tmp.join("state");
    let (id, g) = lease_naming_own_group(&tmp, &state);
    let group = g.leader.pid.pid;
    close_and_reap_leave_it_open(&state, &id, Some(group), |args, o| {
        refused_with(o, group, "leads leash's own process group");
        refused_with(o, g.member.pid.pid, "without its marker");
        assert!(g.leader.pid.alive() && g.member.pid.alive());
        assert_eq!(g.leader.signals() + &g.member.signals(), "", "{args:?}");
    });
    assert_eq!(lease_of(&state, "s")["state"], "open");
}

/// With the root gone, a row's adapter pid and start time are claims: trusted without the lease's
/// markers, a row rewritten to name any same-uid group leader (both numbers are public in /proc)
/// would get that process and, through the group signal, its whole group SIGTERM and SIGKILL.
/// The markers are required of an adapter that is not a descendant of a verified root.
#[test]
fn a_row_naming_a_stranger_as_its_adapter_signals_nothing() {
    let tmp = TempDir::new("row-stranger-adapter");
    let state = tmp.join("state");
    let mut guard = Guard::new();
    let leader_log = tmp.join("stranger.log");
    let mut stranger = Command::new(trap_script(tmp.path()));
    stranger.arg(&leader_log);
    let (leader, member) = group_of_two(
        &mut guard,
        &tmp,
        stranger,
        leader_log,
        tmp.join("member.log"),
    );
    let id = dead_lease(&state, "s");
    forge_adapter_and_group(&state, &id, leader.pid);
    let (_, plan, _) = leash_json(&state, &["reap", "--dry-run", "--include-live"], None);
    assert_eq!(
        outcome(&plan, &id)["signals"],
        serde_json::json!([]),
        "{plan}"
    );
    let (code, v, stderr) = leash_json(&state, &["close", &id, "--grace-ms", "100"], None);
    assert_eq!(code, Some(0), "{v} {stderr}");
    let o = outcome(&v, &id);
    assert_eq!(
        o["result"], "lost",
        "nothing alive carries the lease's markers: {o}"
    );
    no_signals(o);
    assert!(leader.pid.alive() && member.pid.alive());
    assert_eq!(leader.signals() + &member.signals(), "");
}

/// Starts the trap script as uid/gid 65534 in its own process group, with `markers` in its
/// environment. Its directory is opened up
/// so that the other user can run the script and write its log.
fn foreign_decoy(guard: &mut Guard, tmp: &TempDir, markers: &[(&str, String)]) -> Logged {
    use std::os::unix::fs::PermissionsExt;
    let dir = tmp.join("foreign");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let trap = trap_script(&dir);
    let log = dir.join("foreign.log");
    guard.child(
        Command::new(&trap)
            .arg(&log)
            .envs(markers.iter().map(|(k, v)| (k, v)))
            .uid(65534)
            .gid(65534)
            .process_group(0)
            .current_dir(&dir)
            .stdin(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let d = Logged::wait_started(log);
    guard.add(d.pid);
    d
}

fn uid_of(pid: i32) -> u32 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(format!("/proc/{pid}")).unwrap().uid()
}

#[test]
fn a_row_naming_another_uids_process_is_refused() {
    if !is_root() {
        common::skip("starting a process as another uid needs root");
        return;
    }
    let tmp = TempDir::new("row-foreign");
    let state = tmp.join("state");
    let mut guard = Guard::new();
    // As the adapter and its group, with the lease's markers: everything matches but the uid.
    let id = dead_lease(&state, "a");
    let d = foreign_decoy(&mut guard, &tmp, &markers(&state, &id));
    assert_eq!(uid_of(d.pid.pid), 65534);
    forge_adapter_and_group(&state, &id, d.pid);
    close_and_reap_leave_it_open(&state, &id, None, |_, o| {
        refused_with(o, d.pid.pid, "runs as uid 65534")
    });

    // As the root: its exe is not a wrapper of this gateway.
    let id = dead_lease(&state, "r");
    forge_root(&state, &id, d.pid);
    let (code, v, _) = leash_json(&state, &["close", &id, "--grace-ms", "100"], None);
    assert_eq!(code, Some(6), "{v}");
    let o = outcome(&v, &id);
    no_signals(o);
    assert!(
        o["reason"]
            .as_str()
            .unwrap()
            .contains("not under this gateway's wrapper root"),
        "{o}"
    );
    assert!(d.pid.alive(), "the other user's process lives");
    assert_eq!(d.signals(), "", "and got no signal");
}

#[test]
fn unreadable_proc_entries_leave_the_lease_unverified() {
    // leash running as an unprivileged user cannot read a root process's exe or environment:
    // the lease naming that process is unverifiable, and nothing is signalled.
    if !is_root() {
        common::skip("needs root to run leash as another user against a root process");
        return;
    }
    let tmp = TempDir::new("unreadable");
    let state = tmp.join("state");
    let mut guard = Guard::new();
    let d = start_decoy(&mut guard, tmp.path(), "rootproc");
    let id = dead_lease(&state, "s");
    forge_root(&state, &id, d.pid);
    // Hand the state root to uid 65534 (the tree up to it must be traversable).
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let chown = Command::new("chown")
        .args(["-R", "65534:65534"])
        .arg(&state)
        .status()
        .unwrap();
    assert!(chown.success());
    let out = Command::new(leash_bin())
        .arg("--state-dir")
        .arg(&state)
        .args(["close", &id, "--json", "--grace-ms", "100"])
        .env_remove("LEASH_STATE_DIR")
        .uid(65534)
        .gid(65534)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(6),
        "{stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_str(&stdout).unwrap();
    let o = outcome(&v, &id);
    assert_eq!(o["result"], "leftOpen", "{o}");
    assert!(
        o["reason"].as_str().unwrap().contains("unreadable"),
        "says what it could not read: {o}"
    );
    no_signals(o);
    assert!(d.pid.alive());
    assert_eq!(d.signals(), "");
}
