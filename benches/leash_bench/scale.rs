//! Scale: closing many TERM-ignoring trees at once (their graces must run concurrently: the whole
//! close takes about one grace, not one per lease), reaping many stale leases (rows whose
//! processes are long gone), and how many lease commits per second the WAL store takes.

use crate::procs::{self, Children, TempDir, Tracked};
use crate::spawn::verdict;
use crate::stats::{Summary, Table};
use crate::{Config, Env};
use leash::controller::{CloseResult, Controller, LeaseRef};
use leash::lease::{new_lease_id, now_ms};
use leash::proc::{LiveTable, ProcessTable};
use leash::state::StateRoot;
use leash::store::Store;
use leash_core::guard::Sig;
use leash_core::model::Lease;
use leash_core::model::SessionRow;
use leash_core::plan::ReapOptions;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

pub fn run(env: &Env, cfg: &Config) -> Result<String, String> {
    let mut close = Vec::new();
    let mut close_setup = Vec::new();
    let mut reap = Vec::new();
    let mut reap_plan = Vec::new();
    let mut commits_fresh = Vec::new();
    let mut commits_loaded = Vec::new();
    let mut batched = Vec::new();
    for _ in 0..cfg.scale_rounds {
        let (setup, dt) = close_many(env, cfg, None)?;
        close_setup.push(setup);
        close.push(dt);
        let r = reap_stale(cfg)?;
        reap.push(r.reap_s);
        reap_plan.push(r.plan_s);
        commits_loaded.push(r.insert_rate);
        batched.push(r.batched_s);
        commits_fresh.push(commit_rate(cfg.commits)?);
    }

    let g = cfg.close_grace_ms as f64 / 1e3;
    let close_s = Summary::of(&close);
    let reap_s = Summary::of(&reap);
    let secs = |v: f64| format!("{v:.2} s");
    let rate = |v: f64| format!("{v:.0}/s");
    let mut out = format!(
        "\n### 5. Scale\n\n{} rounds; median (min–max).\n\n",
        cfg.scale_rounds
    );
    let mut t = Table::new(&["operation", "result", "target"]);
    t.row(vec![
        format!(
            "close {} TERM-ignoring trees (wrapper → `sh` → `sleep`, 3 processes each) with \
             grace G = {g:.1} s, one `Controller::close` call",
            cfg.close_leases
        ),
        close_s.show(secs),
        verdict(
            close_s.median <= g + 1.0,
            &format!("≤ G + 1 s = {:.1} s", g + 1.0),
        ),
    ]);
    t.row(vec![
        format!(
            "reap {} stale leases (processes gone), one `Controller::reap` call",
            cfg.reap_leases
        ),
        reap_s.show(secs),
        verdict(reap_s.median <= 1.0, "≤ 1 s"),
    ]);
    t.row(vec![
        "… of which the reap plan (`Controller::plan_reap`, read-only)".into(),
        Summary::of(&reap_plan).show(secs),
        String::new(),
    ]);
    t.row(vec![
        "… what-if: the same claims, transitions to `lost` and events as one transaction \
         (bench SQL on leash's schema, sizing the fix; not leash code)"
            .into(),
        Summary::of(&batched).show(secs),
        String::new(),
    ]);
    t.row(vec![
        format!(
            "lease commits (`Store::insert_lease` with its session row), fresh database, {} commits",
            cfg.commits
        ),
        Summary::of(&commits_fresh).show(rate),
        String::new(),
    ]);
    t.row(vec![
        format!(
            "lease commits while filling the reap database (0 → {} leases)",
            cfg.reap_leases
        ),
        Summary::of(&commits_loaded).show(rate),
        String::new(),
    ]);
    out.push_str(&t.render());
    out.push_str(&format!(
        "\nStarting the {} trees (serial `leash exec`, until every `sleep` runs) took {} — \
         not part of the close.\n",
        cfg.close_leases,
        Summary::of(&close_setup).show(secs)
    ));
    Ok(out)
}

/// Starts `n` leases whose trees ignore SIGTERM, closes them all in one call, and returns
/// (set-up seconds, close seconds). With `cgroup_root`, each lease is contained in a cgroup
/// under it and the close ends with `cgroup.kill`.
pub fn close_many(
    env: &Env,
    cfg: &Config,
    cgroup_root: Option<&Path>,
) -> Result<(f64, f64), String> {
    let settings = leash::cgroup::Settings {
        requested: if cgroup_root.is_some() {
            leash::cgroup::Requested::On
        } else {
            leash::cgroup::Requested::Off
        },
        root: cgroup_root.map(Path::to_path_buf),
    };
    let scratch = TempDir::new("close");
    let state_dir = scratch.path().join("state");
    let root = StateRoot::open(&state_dir).map_err(|e| e.to_string())?;
    let sh = procs::which("sh").ok_or("sh is not on PATH")?;
    let mut children = Children::new();
    let mut tracked = Tracked::new();
    let wrappers = root.wrapper_root();

    let t_setup = Instant::now();
    let mut roots = Vec::new();
    for i in 0..cfg.close_leases {
        let c = Command::new(&env.leash)
            .args(["exec", "--session", &format!("close-{i}"), "--grace-ms"])
            .arg(cfg.close_grace_ms.to_string())
            .arg("--")
            .arg(&sh)
            .args(["-c", "trap '' TERM; sleep 600 & wait"])
            .env("LEASH_STATE_DIR", &state_dir)
            .envs(crate::procs::env_of(&settings))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start leash exec {i}: {e}"))?;
        let pid = c.id() as i32;
        children.push(c);
        roots.push(pid);
        tracked.add_pid(pid);
        // One at a time: the next starts once this one has committed and exec'd the wrapper.
        let execd = procs::wait_for(Duration::from_secs(30), || {
            procs::exe_of(pid).is_some_and(|e| e.starts_with(&wrappers))
        });
        if !execd {
            return Err(format!(
                "leash exec {i} did not become the wrapper within 30 s"
            ));
        }
    }
    // Every tree is up once its `sleep` runs: `sh` spawns it after the trap is set, so a tree
    // that shows a `sleep` ignores SIGTERM all the way down.
    let all_up = procs::wait_for(Duration::from_secs(120), || {
        let Ok(snap) = LiveTable.snapshot() else {
            return false;
        };
        roots.iter().all(|&r| {
            snap.subtree(r).iter().any(|p| {
                p.argv
                    .as_ref()
                    .and_then(|a| a.first())
                    .is_some_and(|a0| a0 == "sleep")
            })
        })
    });
    if !all_up {
        return Err("the trees to close did not all come up within 120 s".into());
    }
    let setup = t_setup.elapsed().as_secs_f64();
    for &r in &roots {
        tracked.add_tree(r);
    }

    let ctl = Controller::open(root, &LiveTable)
        .map_err(|e| e.to_string())?
        .with_containment(&settings);
    let refs: Vec<LeaseRef> = (0..cfg.close_leases)
        .map(|i| LeaseRef::Session(format!("close-{i}")))
        .collect();
    let t = Instant::now();
    let outcomes = ctl.close(&refs, None).map_err(|e| e.to_string())?;
    let dt = t.elapsed().as_secs_f64();

    let closed = outcomes
        .iter()
        .filter(|o| o.result == CloseResult::Closed)
        .count();
    let killed = outcomes
        .iter()
        .filter(|o| o.signals.iter().any(|s| s.signal == Sig::Kill))
        .count();
    children.finish(Duration::from_secs(10));
    let leftovers = tracked.kill_all();
    if closed != cfg.close_leases || leftovers > 0 {
        return Err(format!(
            "close: {closed} of {} leases closed, {leftovers} process(es) left alive",
            cfg.close_leases
        ));
    }
    if killed != cfg.close_leases {
        return Err(format!(
            "close: only {killed} of {} trees needed SIGKILL: the trees did not ignore SIGTERM",
            cfg.close_leases
        ));
    }
    Ok((setup, dt))
}

struct ReapRun {
    reap_s: f64,
    plan_s: f64,
    insert_rate: f64,
    /// The same state changes committed as one transaction (bench SQL, not leash's).
    batched_s: f64,
}

/// Pids with no process behind them now, counting down from `pid_max`.
fn dead_pids(n: usize) -> Vec<i32> {
    let max: i32 = std::fs::read_to_string("/proc/sys/kernel/pid_max")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(32_768);
    (2..max)
        .rev()
        .filter(|p| !Path::new(&format!("/proc/{p}")).exists())
        .take(n)
        .collect()
}

fn stale_lease(
    gateway: &str,
    wrapper_root: &Path,
    i: usize,
    pid: i32,
    owner: i32,
) -> (Lease, SessionRow) {
    let command = vec!["codex-acp".to_string(), format!("--session-{i}")];
    let started = now_ms() - 3_600_000;
    let lease = Lease::builder(new_lease_id(), gateway)
        .session(format!("stale-{i}"))
        .agent("codex")
        .wrapper(
            wrapper_root.display().to_string(),
            wrapper_root.join("leash-wrap-0-0").display().to_string(),
        )
        .root(pid, 1_000 + i as u64)
        .process_group(pid)
        .adapter((pid, 1_001 + i as u64))
        .command(command)
        .owner(owner, 999)
        .started_at(started)
        .grace_ms(3_000)
        .build();
    let session = SessionRow {
        session_key: lease.session_key.clone(),
        agent_id: lease.agent_id.clone(),
        backend: "acpx".into(),
        gateway_instance_id: gateway.to_string(),
        created_at: started,
        lease_id: Some(lease.lease_id.clone()),
        ..SessionRow::default()
    };
    (lease, session)
}

/// Fills a store with stale leases through the Store API, then reaps them in one call.
fn reap_stale(cfg: &Config) -> Result<ReapRun, String> {
    let scratch = TempDir::new("reap");
    let root = StateRoot::open(&scratch.path().join("state")).map_err(|e| e.to_string())?;
    let pids = dead_pids(cfg.reap_leases + 1);
    if pids.len() <= cfg.reap_leases {
        return Err("not enough free pids to stage stale leases".into());
    }
    let owner = pids[cfg.reap_leases];
    let mut store = Store::open(&root.db_path()).map_err(|e| e.to_string())?;
    let gateway = store.gateway_instance_id().to_string();
    let wrapper_root = root.wrapper_root();
    let t = Instant::now();
    for (i, &pid) in pids[..cfg.reap_leases].iter().enumerate() {
        let (lease, session) = stale_lease(&gateway, &wrapper_root, i, pid, owner);
        store
            .insert_lease(&lease, Some(&session), |_| None)
            .map_err(|e| e.to_string())?;
    }
    let insert_rate = cfg.reap_leases as f64 / t.elapsed().as_secs_f64();
    drop(store);
    // A copy of the filled database for the what-if below (the last connection is closed, so
    // the database file is complete on its own).
    let copy = scratch.path().join("what-if.db");
    std::fs::copy(root.db_path(), &copy).map_err(|e| format!("cannot copy the database: {e}"))?;

    let ctl = Controller::open(root, &LiveTable).map_err(|e| e.to_string())?;
    let opts = ReapOptions {
        include_live: false,
        retention_ms: 7 * 24 * 3_600_000,
        now_ms: now_ms(),
        grace_ms: None,
    };
    let t = Instant::now();
    let plan = ctl.plan_reap(&opts).map_err(|e| e.to_string())?;
    let plan_s = t.elapsed().as_secs_f64();
    if plan.leases.len() != cfg.reap_leases {
        return Err(format!(
            "reap plan covers {} of {} leases",
            plan.leases.len(),
            cfg.reap_leases
        ));
    }
    let t = Instant::now();
    let report = ctl.reap(&opts).map_err(|e| e.to_string())?;
    let reap_s = t.elapsed().as_secs_f64();
    let lost = report
        .leases
        .iter()
        .filter(|o| o.result == CloseResult::Lost && o.signals.is_empty())
        .count();
    if lost != cfg.reap_leases {
        return Err(format!(
            "reap marked {lost} of {} stale leases lost without a signal",
            cfg.reap_leases
        ));
    }
    let batched_s = batched_what_if(&copy, cfg.reap_leases)?;
    Ok(ReapRun {
        reap_s,
        plan_s,
        insert_rate,
        batched_s,
    })
}

/// What the reap's writes cost when committed together: for every open lease, the claim
/// (`open → closing`) and the transition to `lost`, each with its event row — the writes
/// `Store::claim` and `Store::transition` make — in one transaction with cached statements,
/// instead of two transactions per lease. Bench SQL against leash's schema, to size the fix; not leash code.
fn batched_what_if(db: &Path, n: usize) -> Result<f64, String> {
    // The store's schema, written by hand: the store itself keeps its connection to itself.
    drop(Store::open(db).map_err(|e| e.to_string())?);
    let sql = |e: rusqlite::Error| format!("what-if: {e}");
    let mut conn = rusqlite::Connection::open(db).map_err(sql)?;
    conn.busy_timeout(leash::store::busy_timeout())
        .map_err(sql)?;
    let me = std::process::id() as i64;
    let t = Instant::now();
    let tx = conn.transaction().map_err(sql)?;
    let mut done = 0;
    {
        let rows: Vec<(String, String)> = tx
            .prepare("SELECT lease_id, session_key FROM leases WHERE state = 'open'")
            .and_then(|mut st| {
                st.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
                    .collect::<Result<Vec<_>, _>>()
            })
            .map_err(sql)?;
        let mut claim = tx
            .prepare_cached(
                "UPDATE leases SET state = 'closing', claimed_by_pid = ?2, claimed_by_start = ?3, \
                 updated_at = ?4 WHERE lease_id = ?1 AND state = 'open'",
            )
            .map_err(sql)?;
        let mut lost = tx
            .prepare_cached(
                "UPDATE leases SET state = 'lost', state_reason = ?2, closed_at = ?3, \
                 updated_at = ?3, claimed_by_pid = NULL, claimed_by_start = NULL \
                 WHERE lease_id = ?1 AND state = 'closing'",
            )
            .map_err(sql)?;
        let mut seq = tx
            .prepare_cached("SELECT COALESCE(MAX(seq), 0) + 1 FROM events WHERE session_key = ?1")
            .map_err(sql)?;
        let mut event = tx
            .prepare_cached(
                "INSERT INTO events (session_key, lease_id, seq, kind, detail, at) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            )
            .map_err(sql)?;
        let now = now_ms();
        let reason = "root pid is not running; no live process carries the lease's markers";
        let detail = serde_json::json!({ "reason": reason }).to_string();
        let mut log = |session: &str, id: &str, kind: &str, detail: Option<&str>| {
            let next: i64 = seq.query_row([session], |r| r.get(0))?;
            event.execute(rusqlite::params![session, id, next, kind, detail, now])
        };
        for (id, session) in &rows {
            claim
                .execute(rusqlite::params![id, me, 1, now])
                .map_err(sql)?;
            log(session, id, "closing", None).map_err(sql)?;
            lost.execute(rusqlite::params![id, reason, now])
                .map_err(sql)?;
            log(session, id, "lost", Some(&detail)).map_err(sql)?;
            done += 1;
        }
    }
    tx.commit().map_err(sql)?;
    let dt = t.elapsed().as_secs_f64();
    if done != n {
        return Err(format!("what-if: {done} of {n} leases updated"));
    }
    Ok(dt)
}

/// Lease commits per second into a fresh store.
fn commit_rate(n: usize) -> Result<f64, String> {
    let scratch = TempDir::new("commits");
    let root = StateRoot::open(&scratch.path().join("state")).map_err(|e| e.to_string())?;
    let mut store = Store::open(&root.db_path()).map_err(|e| e.to_string())?;
    let gateway = store.gateway_instance_id().to_string();
    let wrapper_root = root.wrapper_root();
    let me = std::process::id() as i32;
    let leases: Vec<(Lease, SessionRow)> = (0..n)
        .map(|i| stale_lease(&gateway, &wrapper_root, i, me, me))
        .collect();
    let t = Instant::now();
    for (lease, session) in &leases {
        store
            .insert_lease(lease, Some(session), |_| None)
            .map_err(|e| e.to_string())?;
    }
    Ok(n as f64 / t.elapsed().as_secs_f64())
}
