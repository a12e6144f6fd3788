//! Rendering for the CLI: human-readable by default, JSON (camelCase, one document) with `--json`.
//! Everything goes to stdout except warnings; `leash exec` never comes here.

use crate::daemon::protocol::{Cancelled, DaemonStatus, LeaseRow, Status};
use crate::legacy::LegacyRecord;
use crate::lifecycle::{CancelOutcome, CloseOutcome, ReapReport};
use crate::plan::{Decision, ReapPlan};
use serde::Serialize;

/// A value's word in the JSON output (`closed`, `groupMember`, `alreadyGone`, ...), so human
/// output and JSON say the same thing.
fn word<T: Serialize>(v: &T) -> String {
    match serde_json::to_value(v) {
        Ok(serde_json::Value::String(s)) => s,
        Ok(other) => other.to_string(),
        Err(_) => "?".into(),
    }
}

/// How long ago a process started, from its start time in clock ticks since boot
/// (`/proc/<pid>/stat` field 22): "started 4s ago", or the raw ticks when the clock cannot be read.
pub(super) fn started(start_ticks: u64) -> String {
    let hz = procfs::ticks_per_second() as i64;
    let uptime = std::fs::read_to_string("/proc/uptime")
        .ok()
        .and_then(|t| t.split_whitespace().next()?.parse::<f64>().ok());
    match uptime {
        Some(up) if hz > 0 => {
            let age = (up - start_ticks as f64 / hz as f64).max(0.0);
            format!(
                "started {} ago",
                age_text(std::time::Duration::from_secs_f64(age))
            )
        }
        _ => format!("start time {start_ticks} ticks"),
    }
}

/// A duration, rounded for humans: `850ms`, `12s`, `4m 5s`, `3h 2m`, `2d 4h`.
pub fn age_text(d: std::time::Duration) -> String {
    let s = d.as_secs();
    match s {
        0 => format!("{}ms", d.as_millis()),
        1..=59 => format!("{s}s"),
        60..=3599 => format!("{}m {}s", s / 60, s % 60),
        3600..=86399 => format!("{}h {}m", s / 3600, (s % 3600) / 60),
        _ => format!("{}d {}h", s / 86400, (s % 86400) / 3600),
    }
}

/// Age of a Unix time in milliseconds: "4m 5s".
fn age_since(ms: i64) -> String {
    let now = crate::lease::now_ms();
    age_text(std::time::Duration::from_millis(
        now.saturating_sub(ms).max(0) as u64,
    ))
}

pub(super) fn print_json<T: Serialize + ?Sized>(v: &T) {
    println!("{}", serde_json::to_string_pretty(v).expect("serialisable"));
}

pub fn leases(rows: &[LeaseRow], json: bool) {
    if json {
        print_json(rows);
        return;
    }
    if rows.is_empty() {
        println!("no leases");
        return;
    }
    println!(
        "{:<36}  {:<7}  {:<24}  {:>7}  {:>7}  {:>7}  {:>5}  {:>7}  REASON",
        "LEASE", "STATE", "SESSION", "ROOT", "ADAPTER", "PGID", "EXIT", "AGE"
    );
    for r in rows {
        match r {
            LeaseRow::Lease(l) => {
                let opt = |v: Option<i32>| v.map_or("-".to_string(), |v| v.to_string());
                println!(
                    "{:<36}  {:<7}  {:<24}  {:>7}  {:>7}  {:>7}  {:>5}  {:>7}  {}",
                    l.lease_id,
                    l.state.as_str(),
                    truncate(&l.session_key, 24),
                    l.root_pid,
                    opt(l.adapter_pid),
                    opt(l.process_group_id),
                    opt(l.exit_status),
                    age_since(l.started_at),
                    l.state_reason.as_deref().unwrap_or("")
                );
            }
            LeaseRow::Unreadable(u) => println!("!! {}", u.error),
        }
    }
}

fn truncate(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        let mut t: String = s.chars().take(n - 1).collect();
        t.push('…');
        t
    }
}

pub fn status(st: &Status, json: bool) {
    if json {
        print_json(st);
        return;
    }
    let r = &st.root;
    println!("gateway instance  {}", r.gateway_instance_id);
    println!("state directory   {}", r.state_dir.display());
    println!("database          {}", r.database.display());
    println!("wrapper root      {}", r.wrapper_root.display());
    let l = &r.leases;
    println!(
        "leases            {} open, {} closing, {} closed, {} lost",
        l.open, l.closing, l.closed, l.lost
    );
    println!("legacy records    {} open", r.legacy_open);
    let c = &r.containment;
    match &c.gateway_root {
        Some(root) if c.mode == "on" => {
            println!("containment       on, cgroups under {}", root.display());
            println!(
                "                  controllers for limits: {}",
                if c.controllers.is_empty() {
                    "none".to_string()
                } else {
                    c.controllers.join(" ")
                }
            );
        }
        _ => println!(
            "containment       {}: {}",
            c.mode,
            c.reason.as_deref().unwrap_or("-")
        ),
    }
    if let Some(d) = &st.daemon {
        daemon_status(d);
    }
}

/// The daemon's part of `leash status`, when a daemon answered it.
fn daemon_status(d: &DaemonStatus) {
    println!("daemon            pid {} on {}", d.pid, d.socket.display());
    println!(
        "sessions          {} supervised, {} busy",
        d.sessions.len(),
        d.busy.len()
    );
    for s in &d.sessions {
        let s = &s.live;
        println!(
            "  {}  {}{}  lease {}  last seq {}",
            s.session_key,
            word(&s.phase),
            if s.busy { ", busy" } else { "" },
            s.lease_id.as_deref().unwrap_or("-"),
            s.last_seq
        );
    }
    match d.reconcile.interval_ms {
        Some(ms) => {
            let what = match &d.reconcile.last {
                None => "no pass yet".to_string(),
                Some(last) => match &last.error {
                    Some(e) => format!("pass {} failed: {e}", last.passes),
                    None => {
                        let n = |v: Option<u64>| v.map_or("null".to_string(), |v| v.to_string());
                        format!(
                            "pass {}: {} active, {} closed, {} lost, {} left open, {} expired",
                            last.passes,
                            n(last.active),
                            n(last.closed),
                            n(last.lost),
                            n(last.left_open),
                            n(last.expired)
                        )
                    }
                },
            };
            println!("reconcile         every {} ms; {what}", ms);
        }
        None => println!("reconcile         off"),
    }
    if let Some(m) = &d.metrics {
        println!("metrics           http://{m}/metrics");
    }
    for r in &d.resumable {
        println!(
            "resumable         {} (busy when the previous daemon stopped)",
            r.session_key
        );
    }
}

/// `leash cancel`: the outcome, and through the daemon whether it wrote the notification.
pub fn cancelled(c: &Cancelled, json: bool) {
    if json {
        print_json(c);
        return;
    }
    cancel(&c.outcome);
    let Some(n) = &c.notice else {
        return;
    };
    match (n.notified, &n.acp_session_id) {
        (true, Some(acp)) => {
            println!("session/cancel written to the adapter for ACP session {acp}")
        }
        (false, _) if n.supervised == Some(true) => println!(
            "no notification written: the daemon knows no single ACP session of this session \
             (give --acp-session ID)"
        ),
        _ => println!("no notification written: the daemon does not supervise this session"),
    }
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

pub fn ps(report: &crate::ps::PsReport, json: bool) {
    if json {
        print_json(report);
        return;
    }
    if report.sessions.is_empty() {
        println!("no open sessions");
    }
    for s in &report.sessions {
        let t = &s.totals;
        println!(
            "session {}  lease {}  [{}; from {}]  {} process(es), RSS {}, CPU {:.2} s{}",
            s.session_key,
            s.lease_id,
            s.state,
            s.source,
            t.processes,
            mib(t.rss_bytes),
            t.cpu_ms as f64 / 1000.0,
            t.memory_bytes
                .map(|m| format!(", memory.current {}", mib(m)))
                .unwrap_or_default()
        );
        if let Some(r) = &s.reason {
            println!("  {r}");
        }
        for m in &s.members {
            println!(
                "  {:>7}  {:>10}  {:>8.2} s  {}",
                m.pid,
                mib(m.rss_bytes),
                m.cpu_ms as f64 / 1000.0,
                m.command
            );
        }
    }
}

pub fn close(outcomes: &[CloseOutcome], json: bool) {
    if json {
        print_json(outcomes);
        return;
    }
    for o in outcomes {
        println!(
            "lease {} (session {}): {} — {}",
            o.lease_id,
            o.session_key,
            word(&o.result),
            o.reason
        );
        for s in &o.signals {
            println!(
                "  {} → pid {} ({}, {}): {}",
                s.signal.name(),
                s.pid,
                word(&s.role),
                started(s.start_time),
                word(&s.delivery)
            );
        }
        for r in &o.refused {
            println!("  refused pid {}: {}", r.pid, r.reason);
        }
        if let Some(code) = o.exit_status {
            println!("  adapter exit status {code}");
        }
    }
}

fn cancel(o: &CancelOutcome) {
    println!(
        "cancel recorded for lease {} (session {}, event {}); nothing signalled",
        o.lease_id, o.session_key, o.seq
    );
}

fn decision_line(d: &Decision, grace_ms: u64) -> String {
    match d {
        Decision::Terminate => format!(
            "terminate: SIGTERM children first, SIGKILL survivors after {grace_ms} ms, then mark closed"
        ),
        Decision::MarkLost { reason } => format!("mark lost, signal nothing — {reason}"),
        Decision::Leave { reason } => format!("leave open, signal nothing — {reason}"),
        Decision::Skip { reason } => format!("skip — {reason}"),
    }
}

pub fn reap_plan(plan: &ReapPlan, json: bool) {
    if json {
        print_json(plan);
        return;
    }
    println!(
        "reap plan for gateway {} (dry run: nothing changed, nothing signalled)",
        plan.gateway_instance_id
    );
    if plan.leases.is_empty() && plan.legacy.is_empty() {
        println!("  no open or closing leases");
    }
    for lp in &plan.escapees {
        println!(
            "lease {} session {} [{}]: escaped process(es) carry its markers",
            lp.lease_id, lp.session_key, lp.state
        );
        println!("  → {}", decision_line(&lp.decision, lp.grace_ms));
        for s in &lp.signals {
            println!("    pid {}: {}", s.pid, s.evidence);
        }
    }
    for lp in &plan.leases {
        let owner = match lp.owner_alive {
            Some(true) => "owner alive",
            Some(false) => "owner gone",
            None => "owner unknown",
        };
        println!(
            "lease {} session {} [{}; {}; verdict {}]",
            lp.lease_id,
            lp.session_key,
            lp.state,
            owner,
            lp.verdict.as_deref().unwrap_or("-")
        );
        println!("  → {}", decision_line(&lp.decision, lp.grace_ms));
        for e in &lp.evidence {
            println!("    evidence: {e}");
        }
        for s in &lp.signals {
            let sigs: Vec<&str> = s.signals.iter().map(|s| s.name()).collect();
            println!(
                "    pid {} ({}, {}, {}): {} — {}",
                s.pid,
                word(&s.role),
                started(s.start_time),
                s.argv0.as_deref().unwrap_or("?"),
                sigs.join(" then "),
                s.evidence
            );
        }
        for r in &lp.refused {
            println!("    pid {}: not signalled — {}", r.pid, r.reason);
        }
        if let Some(c) = &lp.cgroup {
            println!(
                "    cgroup {} (id {}): {:?}, members {:?} — {}",
                c.path, c.id, c.action, c.members, c.evidence
            );
        }
    }
    for c in &plan.stray_cgroups {
        println!(
            "stray cgroup {} (id {}): {:?} — {}",
            c.path, c.id, c.action, c.reason
        );
        for p in &c.processes {
            println!(
                "    pid {} ({}): not signalled",
                p.pid,
                p.command.as_deref().unwrap_or("?")
            );
        }
    }
    for lg in &plan.legacy {
        println!(
            "legacy #{} session {} pid {} [verdict {}]",
            lg.id, lg.session_key, lg.pid, lg.verdict
        );
        println!(
            "  → {}",
            decision_line(&lg.decision, crate::controller::exec::DEFAULT_GRACE_MS)
        );
        for s in &lg.signals {
            println!(
                "    pid {} ({}): SIGTERM then SIGKILL — {}",
                s.pid,
                word(&s.role),
                s.evidence
            );
        }
        for r in &lg.refused {
            println!("    pid {}: not signalled — {}", r.pid, r.reason);
        }
    }
    if !plan.expire.is_empty() {
        println!(
            "expire {} closed/lost lease(s) past the retention",
            plan.expire.len()
        );
    }
    for b in &plan.bad_rows {
        println!("unreadable row, left alone: {b}");
    }
}

pub fn reap_report(r: &ReapReport, json: bool) {
    if json {
        print_json(r);
        return;
    }
    close(&r.leases, false);
    for o in &r.escapees {
        println!(
            "lease {} session {} (closed or lost earlier): escapees — {}",
            o.lease_id, o.session_key, o.reason
        );
    }
    for lg in &r.legacy {
        println!(
            "legacy #{} session {} pid {}: {} — {}",
            lg.id,
            lg.session_key,
            lg.pid,
            word(&lg.result),
            lg.reason
        );
    }
    for (id, why) in &r.skipped {
        println!("lease {id}: skipped — {why}");
    }
    if r.expired > 0 {
        println!("expired {} old lease(s)", r.expired);
    }
    for b in &r.bad_rows {
        println!("unreadable row, left alone: {b}");
    }
    for c in &r.cgroups {
        println!(
            "stray cgroup {} (id {}): {} — {}",
            c.path, c.id, c.result, c.reason
        );
        for p in &c.processes {
            println!(
                "    pid {} ({}): not signalled",
                p.pid,
                p.command.as_deref().unwrap_or("?")
            );
        }
    }
    if r.leases.is_empty() && r.legacy.is_empty() && r.skipped.is_empty() {
        println!("nothing to reap");
    }
}

pub fn legacy(recs: &[LegacyRecord], json: bool) {
    if json {
        print_json(recs);
        return;
    }
    if recs.is_empty() {
        println!("no legacy records");
    }
    for r in recs {
        println!(
            "#{} session {} pid {} [{}] {} {}",
            r.id,
            r.session_key,
            r.pid,
            r.state,
            r.command,
            r.state_reason.as_deref().unwrap_or("")
        );
    }
}
