//! Rendering for the CLI: human-readable by default, JSON (camelCase, one document) with `--json`.
//! Everything goes to stdout except warnings; `leash exec` never comes here.

use crate::controller::{CancelOutcome, CloseOutcome, ReapReport};
use crate::protocol::{Cancelled, DaemonStatus, LeaseRow, Status};
use leash_core::model::LegacyRecord;
use leash_core::plan::{Decision, ReapPlan};
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
    outln!("{}", serde_json::to_string_pretty(v).expect("serialisable"));
}

pub fn leases(rows: &[LeaseRow], json: bool) {
    if json {
        print_json(rows);
        return;
    }
    if rows.is_empty() {
        outln!("no leases");
        return;
    }
    // Session keys are printed whole (they are pasted back into `--session`): the column is as
    // wide as the longest one.
    let width = rows
        .iter()
        .filter_map(|r| match r {
            LeaseRow::Lease(l) => Some(l.session_key.chars().count()),
            LeaseRow::Unreadable(_) => None,
        })
        .max()
        .unwrap_or(0)
        .max("SESSION".len());
    outln!(
        "{:<36}  {:<7}  {:<width$}  {:>7}  {:>7}  {:>7}  {:>5}  {:>7}  REASON",
        "LEASE",
        "STATE",
        "SESSION",
        "ROOT",
        "ADAPTER",
        "PGID",
        "EXIT",
        "AGE"
    );
    for r in rows {
        match r {
            LeaseRow::Lease(l) => {
                let opt = |v: Option<i32>| v.map_or("-".to_string(), |v| v.to_string());
                outln!(
                    "{:<36}  {:<7}  {:<width$}  {:>7}  {:>7}  {:>7}  {:>5}  {:>7}  {}",
                    l.lease_id,
                    l.state.as_str(),
                    l.session_key,
                    l.root_pid,
                    opt(l.adapter_pid),
                    opt(l.process_group_id),
                    opt(l.exit_status),
                    age_since(l.started_at),
                    short_reason(l)
                );
            }
            LeaseRow::Unreadable(u) => outln!("!! {}", u.error),
        }
    }
}

/// A lease's reason for the table: its own cgroup's path shortened to the last component (the
/// whole path is in `--json` and `leash verify`).
fn short_reason(l: &leash_core::model::Lease) -> String {
    let reason = l.state_reason.as_deref().unwrap_or("");
    match l.cgroup_path.as_deref() {
        Some(path) if !path.is_empty() => {
            let last = path.rsplit('/').next().unwrap_or(path);
            reason.replace(path, &format!("…/{last}"))
        }
        _ => reason.to_string(),
    }
}

/// What reap does to a cgroup, in words (the JSON says `killAndRemove`, ...).
fn cgroup_action_words(action: leash_core::plan::CgroupAction, members: Option<usize>) -> String {
    use leash_core::plan::CgroupAction;
    match action {
        CgroupAction::KillAndRemove => format!(
            "cgroup.kill {} once the grace is over, wait until it is empty, then remove it",
            members.map_or("its members".to_string(), |n| format!("its {n} member(s)"))
        ),
        CgroupAction::Remove => "remove it (empty)".into(),
        CgroupAction::None => "nothing to do (already gone)".into(),
        CgroupAction::Leave => {
            "leave it alone (not verified: never written to, never removed)".into()
        }
    }
}

pub fn status(st: &Status, json: bool) {
    if json {
        print_json(st);
        return;
    }
    let r = &st.root;
    outln!("gateway instance  {}", r.gateway_instance_id);
    outln!("state directory   {}", r.state_dir.display());
    outln!("database          {}", r.database.display());
    outln!("wrapper root      {}", r.wrapper_root.display());
    let l = &r.leases;
    outln!(
        "leases            {} open, {} closing, {} closed, {} ended, {} lost",
        l.open,
        l.closing,
        l.closed,
        l.ended,
        l.lost
    );
    outln!("legacy records    {} open", r.legacy_open);
    let c = &r.containment;
    match &c.gateway_root {
        Some(root) if c.mode == "on" => {
            outln!("containment       on, cgroups under {}", root.display());
            outln!(
                "                  controllers for limits: {}",
                if c.controllers.is_empty() {
                    "none".to_string()
                } else {
                    c.controllers.join(" ")
                }
            );
        }
        _ => outln!(
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
    outln!("daemon            pid {} on {}", d.pid, d.socket.display());
    outln!(
        "sessions          {} supervised, {} busy",
        d.sessions.len(),
        d.busy.len()
    );
    for s in &d.sessions {
        let s = &s.live;
        outln!(
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
            outln!("reconcile         every {} ms; {what}", ms);
        }
        None => outln!("reconcile         off"),
    }
    if let Some(m) = &d.metrics {
        outln!("metrics           http://{m}/metrics");
    }
    for r in &d.resumable {
        outln!(
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
            outln!("session/cancel written to the adapter for ACP session {acp}")
        }
        (false, _) if n.supervised == Some(true) => outln!(
            "no notification written: the daemon knows no single ACP session of this session \
             (give --acp-session ID)"
        ),
        _ => outln!("no notification written: the daemon does not supervise this session"),
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
        outln!("no open sessions");
    }
    for s in &report.sessions {
        let t = &s.totals;
        outln!(
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
            outln!("  {r}");
        }
        for m in &s.members {
            outln!(
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
        outln!(
            "lease {} (session {}): {} — {}",
            o.lease_id,
            o.session_key,
            word(&o.result),
            o.reason
        );
        for s in &o.signals {
            outln!(
                "  {} → pid {} ({}, {}): {}",
                s.signal.name(),
                s.pid,
                word(&s.role),
                started(s.start_time),
                word(&s.delivery)
            );
        }
        for r in &o.refused {
            outln!("  refused pid {}: {}", r.pid, r.reason);
        }
        if let Some(code) = o.exit_status {
            outln!("  adapter exit status {code}");
        }
    }
}

fn cancel(o: &CancelOutcome) {
    outln!(
        "cancel recorded for lease {} (session {}, event {}); nothing signalled",
        o.lease_id,
        o.session_key,
        o.seq
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
    outln!(
        "reap plan for gateway {} (dry run: nothing changed, nothing signalled)",
        plan.gateway_instance_id
    );
    if plan.leases.is_empty() && plan.legacy.is_empty() {
        outln!("  no open or closing leases");
    }
    for lp in &plan.escapees {
        outln!(
            "lease {} session {} [{}]: escaped process(es) carry its markers",
            lp.lease_id,
            lp.session_key,
            lp.state
        );
        outln!("  → {}", decision_line(&lp.decision, lp.grace_ms));
        for s in &lp.signals {
            outln!("    pid {}: {}", s.pid, s.evidence);
        }
    }
    for lp in &plan.leases {
        let owner = match lp.owner_alive {
            Some(true) => "owner alive",
            Some(false) => "owner gone",
            None => "owner unknown",
        };
        outln!(
            "lease {} session {} [{}; {}; verdict {}]",
            lp.lease_id,
            lp.session_key,
            lp.state,
            owner,
            lp.verdict.as_deref().unwrap_or("-")
        );
        outln!("  → {}", decision_line(&lp.decision, lp.grace_ms));
        for e in &lp.evidence {
            outln!("    evidence: {e}");
        }
        for s in &lp.signals {
            let sigs: Vec<&str> = s.signals.iter().map(|s| s.name()).collect();
            outln!(
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
            outln!("    pid {}: not signalled — {}", r.pid, r.reason);
        }
        if let Some(c) = &lp.cgroup {
            outln!(
                "    cgroup {} (id {}): {}",
                c.path,
                c.id,
                cgroup_action_words(c.action, Some(c.members.len()))
            );
            // Said once: the cgroup's evidence is usually one of the evidence lines above.
            if !lp.evidence.iter().any(|e| e == &c.evidence) {
                outln!("      {}", c.evidence);
            }
        }
    }
    for c in &plan.stray_cgroups {
        outln!(
            "stray cgroup {} (id {}): {} — {}",
            c.path,
            c.id,
            cgroup_action_words(c.action, None),
            c.reason
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
        outln!(
            "legacy #{} session {} pid {} [verdict {}]",
            lg.id,
            lg.session_key,
            lg.pid,
            lg.verdict
        );
        outln!(
            "  → {}",
            decision_line(&lg.decision, leash_core::limits::DEFAULT_GRACE_MS)
        );
        for s in &lg.signals {
            outln!(
                "    pid {} ({}): SIGTERM then SIGKILL — {}",
                s.pid,
                word(&s.role),
                s.evidence
            );
        }
        for r in &lg.refused {
            outln!("    pid {}: not signalled — {}", r.pid, r.reason);
        }
    }
    if !plan.expire.is_empty() {
        outln!(
            "expire {} closed/lost lease(s) past the retention",
            plan.expire.len()
        );
    }
    for b in &plan.bad_rows {
        outln!("unreadable row, left alone: {b}");
    }
}

pub fn reap_report(r: &ReapReport, json: bool) {
    if json {
        print_json(r);
        return;
    }
    close(&r.leases, false);
    for o in &r.escapees {
        outln!(
            "lease {} session {} (closed or lost earlier): escapees — {}",
            o.lease_id,
            o.session_key,
            o.reason
        );
    }
    for lg in &r.legacy {
        outln!(
            "legacy #{} session {} pid {}: {} — {}",
            lg.id,
            lg.session_key,
            lg.pid,
            word(&lg.result),
            lg.reason
        );
    }
    for (id, why) in &r.skipped {
        outln!("lease {id}: skipped — {why}");
    }
    if r.expired > 0 {
        outln!("expired {} old lease(s)", r.expired);
    }
    for b in &r.bad_rows {
        outln!("unreadable row, left alone: {b}");
    }
    for c in &r.cgroups {
        outln!(
            "stray cgroup {} (id {}): {} — {}",
            c.path,
            c.id,
            c.result,
            c.reason
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
        outln!("nothing to reap");
    }
}

/// What `legacy import --acpx` wrote: one line on stdout, or with `--json` the result as one
/// JSON object (`gatewayInstanceId`, `adoption`, `leases`, `alreadyPresent`, `sessions`,
/// `skippedFiles`).
pub fn acpx_imported(r: &crate::store::legacy::AcpxImported, skipped: usize, json: bool) {
    if json {
        let mut v = serde_json::to_value(r).unwrap_or_default();
        v["skippedFiles"] = skipped.into();
        print_json(&v);
        return;
    }
    let how = match r.adoption {
        crate::store::legacy::Adoption::Same => "already this root's",
        crate::store::legacy::Adoption::Fresh => "adopted by this fresh root",
        crate::store::legacy::Adoption::Adopted => "adopted (--adopt-gateway-id)",
    };
    outln!(
        "gateway instance id {} {how}; imported {} acpx lease(s) as legacy records ({} already \
         present), {} session row(s){}; `leash reap --dry-run` shows what each would get",
        r.gateway_instance_id,
        r.leases,
        r.already_present,
        r.sessions,
        if skipped > 0 {
            format!(", {skipped} JSON file(s) in the sessions directory not session records")
        } else {
            String::new()
        }
    );
}

/// What `legacy import FILE` wrote: one line on stdout, or `{"imported": N}` with `--json`.
pub fn legacy_imported(n: usize, json: bool) {
    if json {
        print_json(&serde_json::json!({ "imported": n }));
    } else {
        outln!("imported {n} legacy record(s)");
    }
}

pub fn legacy(recs: &[LegacyRecord], json: bool) {
    if json {
        print_json(recs);
        return;
    }
    if recs.is_empty() {
        outln!("no legacy records");
    }
    for r in recs {
        outln!(
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
