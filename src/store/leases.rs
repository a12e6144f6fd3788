//! The `leases` table: insert (with the session row and the first event, all or nothing),
//! reads that report a bad row as an error for that row only, claims and transitions as
//! conditional UPDATEs (of two racing reapers exactly one wins), wrapper reports, expiry, and the
//! repair of a row that does not read.

use super::db::{Store, StoreError};
use super::events::insert_event;
use leash_core::model::SessionRow;
use leash_core::model::{Lease, LeaseState, ProcessId};
use rusqlite::{params, Connection, OptionalExtension, Row};
use serde::{Deserialize, Serialize};

/// Lease counts by state, for `leash status`.
#[derive(Debug, Default, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Counts {
    pub open: u64,
    pub closing: u64,
    pub closed: u64,
    pub lost: u64,
    /// Absent in the JSON of an older leash: 0.
    #[serde(default)]
    pub ended: u64,
}

impl Counts {
    /// The count of one state (so lists of states derive from [`LeaseState::ALL`]).
    pub fn get(&self, state: LeaseState) -> u64 {
        match state {
            LeaseState::Open => self.open,
            LeaseState::Closing => self.closing,
            LeaseState::Closed => self.closed,
            LeaseState::Lost => self.lost,
            LeaseState::Ended => self.ended,
        }
    }
}

/// What the wrapper reported about its lease (see `report.rs`).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ReportUpdate {
    pub process_group_id: Option<i32>,
    pub adapter_pid: Option<i32>,
    pub adapter_start_time: Option<u64>,
    pub exit_status: Option<i32>,
}

/// How a session's previous lease ends when a new lease takes its place (its processes are
/// verifiably gone): `ended` with the exit status its wrapper reported, else `lost`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Superseded {
    pub reason: String,
    pub exit_status: Option<i32>,
}

impl Superseded {
    /// Gone without a report of its end.
    pub fn lost(reason: impl Into<String>) -> Superseded {
        Superseded {
            reason: reason.into(),
            exit_status: None,
        }
    }
}

impl Store {
    /// Inserts a new open lease (and the session row, when given) in one transaction. When the
    /// session already has an active lease, `supersede` decides: it is given that lease and
    /// returns how it ended ([`Superseded`]: its processes are verifiably gone) or `None` to
    /// refuse with [`StoreError::SessionBusy`].
    pub fn insert_lease(
        &mut self,
        lease: &Lease,
        session: Option<&SessionRow>,
        supersede: impl FnOnce(&Lease) -> Option<Superseded>,
    ) -> Result<(), StoreError> {
        let unstorable = |detail: String| StoreError::Unstorable {
            lease_id: lease.lease_id.clone(),
            detail,
        };
        leash_core::limits::check_grace_ms("the grace", lease.grace_ms)
            .map_err(|e| unstorable(e.to_string()))?;
        leash_core::limits::check_key("the session key", &lease.session_key)
            .map_err(|e| unstorable(e.to_string()))?;
        let now = crate::lease::now_ms();
        self.write(|tx, ctx| {
        let err = |e| ctx.err(e);
        // The statements of a lease's commit are prepared once per connection (the daemon
        // commits every `leash exec` on one warm connection).
        let existing = tx
            .prepare_cached(&format!("SELECT {LEASE_COLS} FROM leases WHERE session_key = ?1 AND state IN ('open','closing')"))
            .map_err(err)?
            .query_row([&lease.session_key], |r| Ok(lease_from_row(r)))
            .optional()
            .map_err(err)?;
        if let Some(old) = existing {
            let old = old?;
            match supersede(&old) {
                Some(Superseded {
                    reason,
                    exit_status,
                }) => {
                    let to = match exit_status {
                        Some(_) => LeaseState::Ended,
                        None => LeaseState::Lost,
                    };
                    tx.execute(
                        "UPDATE leases SET state = ?4, state_reason = ?2, closed_at = ?3, \
                         updated_at = ?3, claimed_by_pid = NULL, claimed_by_start = NULL, \
                         exit_status = COALESCE(exit_status, ?5) \
                         WHERE lease_id = ?1 AND state IN ('open','closing')",
                        params![old.lease_id, reason, now, to.as_str(), exit_status],
                    )
                    .map_err(err)?;
                    insert_event(
                        tx,
                        &old.session_key,
                        Some(&old.lease_id),
                        to.as_str(),
                        Some(serde_json::json!({"reason": reason})),
                        now,
                    )
                    .map_err(err)?;
                }
                None => {
                    return Err(StoreError::SessionBusy {
                        session_key: old.session_key,
                        lease_id: old.lease_id,
                    })
                }
            }
        }
        tx.prepare_cached(
            "INSERT INTO leases (lease_id, gateway_instance_id, session_key, agent_id, wrapper_root, \
             wrapper_path, root_pid, root_start_time, process_group_id, adapter_pid, \
             adapter_start_time, command_hash, command_json, owner_pid, owner_start_time, \
             started_at, grace_ms, state, state_reason, closed_at, exit_status, updated_at, \
             root_pidfs_ino, cgroup_path, cgroup_id, report_dir) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, \
             ?18, ?19, ?20, ?21, ?22, ?23, ?24, ?25, ?26)",
        )
        .map_err(err)?
        .execute(params![
                lease.lease_id,
                lease.gateway_instance_id,
                lease.session_key,
                lease.agent_id,
                lease.wrapper_root,
                lease.wrapper_path,
                lease.root_pid,
                lease.root_start_time as i64,
                lease.process_group_id,
                lease.adapter_pid,
                lease.adapter_start_time.map(|v| v as i64),
                lease.command_hash,
                serde_json::to_string(&lease.command).expect("argv serialises"),
                lease.owner_pid,
                lease.owner_start_time as i64,
                lease.started_at,
                lease.grace_ms as i64,
                lease.state.as_str(),
                lease.state_reason,
                lease.closed_at,
                lease.exit_status,
                now,
                lease.root_pidfs_ino.map(|v| v as i64),
                lease.cgroup_path,
                lease.cgroup_id.map(|v| v as i64),
                lease.report_dir,
            ])
        .map_err(err)?;
        // Store only what reads back: the row just written must parse as the lease it came from,
        // else the transaction is dropped (rolled back) and nothing is stored. A row that does
        // not read can be neither listed nor closed nor reaped.
        let back = tx
            .prepare_cached(&format!("SELECT {LEASE_COLS} FROM leases WHERE lease_id = ?1"))
            .map_err(err)?
            .query_row([&lease.lease_id], |r| Ok(lease_from_row(r)))
            .map_err(err)?;
        match back {
            Ok(l) if l == *lease => {}
            Ok(_) => return Err(unstorable("a field reads back changed".into())),
            Err(e) => return Err(unstorable(e.to_string())),
        }
        if let Some(s) = session {
            super::sessions::upsert(tx, s).map_err(err)?;
            super::sessions::record_lease_owner(tx, &lease.lease_id, &s.session_key)
                .map_err(err)?;
        }
        let kind = if lease.state == LeaseState::Open {
            "spawned"
        } else {
            lease.state.as_str()
        };
        let detail = serde_json::json!({
            "rootPid": lease.root_pid,
            "command": lease.command,
            "reason": lease.state_reason,
        });
        insert_event(
            tx,
            &lease.session_key,
            Some(&lease.lease_id),
            kind,
            Some(detail),
            now,
        )
        .map_err(err)?;
        Ok(())
        })
    }

    pub fn lease(&self, lease_id: &str) -> Result<Option<Lease>, StoreError> {
        self.conn
            .prepare_cached(&format!(
                "SELECT {LEASE_COLS} FROM leases WHERE lease_id = ?1"
            ))
            .map_err(|e| self.err(e))?
            .query_row([lease_id], |r| Ok(lease_from_row(r)))
            .optional()
            .map_err(|e| self.err(e))?
            .transpose()
    }

    /// The active (open or closing) lease of a session, if any.
    pub fn active_lease_for_session(&self, session_key: &str) -> Result<Option<Lease>, StoreError> {
        self.conn
            .query_row(
                &format!(
                    "SELECT {LEASE_COLS} FROM leases WHERE session_key = ?1 \
                     AND state IN ('open','closing')"
                ),
                [session_key],
                |r| Ok(lease_from_row(r)),
            )
            .optional()
            .map_err(|e| self.err(e))?
            .transpose()
    }

    /// The newest lease of a session, whatever its state.
    pub fn latest_lease_for_session(&self, session_key: &str) -> Result<Option<Lease>, StoreError> {
        self.conn
            .query_row(
                &format!(
                    "SELECT {LEASE_COLS} FROM leases WHERE session_key = ?1 \
                     ORDER BY started_at DESC, lease_id DESC LIMIT 1"
                ),
                [session_key],
                |r| Ok(lease_from_row(r)),
            )
            .optional()
            .map_err(|e| self.err(e))?
            .transpose()
    }

    /// Leases, oldest first, optionally of some states only. A row that does not parse is
    /// returned as an error for that row (`Err` inside the vector), so one tampered row neither
    /// hides the others nor gets acted on.
    pub fn leases(
        &self,
        states: &[LeaseState],
    ) -> Result<Vec<Result<Lease, StoreError>>, StoreError> {
        let filter = if states.is_empty() {
            String::new()
        } else {
            let list: Vec<String> = states.iter().map(|s| format!("'{}'", s.as_str())).collect();
            format!("WHERE state IN ({})", list.join(","))
        };
        let mut stmt = self
            .conn
            .prepare(&format!(
                "SELECT {LEASE_COLS} FROM leases {filter} ORDER BY started_at, lease_id"
            ))
            .map_err(|e| self.err(e))?;
        let rows = stmt
            .query_map([], |r| Ok(lease_from_row(r)))
            .map_err(|e| self.err(e))?;
        let mut out = Vec::new();
        for r in rows {
            out.push(r.map_err(|e| self.err(e))?);
        }
        Ok(out)
    }

    pub fn counts(&self) -> Result<Counts, StoreError> {
        let mut c = Counts::default();
        let mut stmt = self
            .conn
            .prepare("SELECT state, COUNT(*) FROM leases GROUP BY state")
            .map_err(|e| self.err(e))?;
        let rows = stmt
            .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))
            .map_err(|e| self.err(e))?;
        for r in rows {
            let (state, n) = r.map_err(|e| self.err(e))?;
            let n = n as u64;
            match state.as_str() {
                "open" => c.open = n,
                "closing" => c.closing = n,
                "closed" => c.closed = n,
                "lost" => c.lost = n,
                "ended" => c.ended = n,
                _ => {} // a tampered state counts nowhere; `leases` shows it as an error
            }
        }
        Ok(c)
    }

    /// Claims a lease for closing: `open → closing`, or re-claims a `closing` lease whose
    /// claimant `stale_claim` says is gone. Returns the lease as claimed, or `None` when another
    /// process got there first or the lease is not in a claimable state. One conditional UPDATE
    /// in one immediate transaction: of two racing claimants exactly one wins.
    pub fn claim(
        &mut self,
        lease_id: &str,
        claimant: ProcessId,
        stale_claim: impl Fn(ProcessId) -> bool,
    ) -> Result<Option<Lease>, StoreError> {
        let mut claimed = self.claim_many(&[lease_id], claimant, stale_claim)?;
        Ok(claimed.pop().flatten())
    }

    /// [`Store::claim`] for many leases in one transaction (a startup reap may claim thousands):
    /// one result per id, in order.
    pub fn claim_many(
        &mut self,
        lease_ids: &[&str],
        claimant: ProcessId,
        stale_claim: impl Fn(ProcessId) -> bool,
    ) -> Result<Vec<Option<Lease>>, StoreError> {
        let now = crate::lease::now_ms();
        self.write_ending(|tx, ctx| {
            let mut out = Vec::with_capacity(lease_ids.len());
            for id in lease_ids {
                out.push(
                    claim_in(tx, id, claimant, &stale_claim, now).map_err(|e| match e {
                        ClaimError::Sql(e) => ctx.err(e),
                        ClaimError::Row(e) => e,
                    })?,
                );
            }
            Ok(out)
        })
    }

    /// Moves a lease to `to`, only if it is currently in `from` (and, when `claimant` is given,
    /// held by that claimant). Returns whether the row changed. Records a lifecycle event.
    pub fn transition(
        &mut self,
        lease_id: &str,
        from: LeaseState,
        to: LeaseState,
        claimant: Option<ProcessId>,
        reason: &str,
    ) -> Result<bool, StoreError> {
        let changed = self.transition_many(
            &[Transition {
                lease_id,
                from,
                to,
                reason,
            }],
            claimant,
        )?;
        Ok(changed[0])
    }

    /// [`Store::transition`] for many leases in one transaction: whether each row changed.
    pub fn transition_many(
        &mut self,
        items: &[Transition<'_>],
        claimant: Option<ProcessId>,
    ) -> Result<Vec<bool>, StoreError> {
        for t in items {
            if !t.from.can_become(t.to) {
                return Err(StoreError::BadRow {
                    lease_id: t.lease_id.to_string(),
                    detail: format!("transition {} -> {} is not allowed", t.from, t.to),
                });
            }
        }
        let now = crate::lease::now_ms();
        self.write_ending(|tx, ctx| {
            let mut out = Vec::with_capacity(items.len());
            for t in items {
                out.push(transition_in(tx, t, claimant, now).map_err(|e| ctx.err(e))?);
            }
            Ok(out)
        })
    }

    /// Fills in what the wrapper reported. Only fills: a reported value never overwrites one
    /// already recorded, so a forged report cannot redirect an existing lease.
    pub fn apply_report(&mut self, lease_id: &str, r: &ReportUpdate) -> Result<bool, StoreError> {
        let now = crate::lease::now_ms();
        let n = self
            .conn
            .execute(
                "UPDATE leases SET \
                 process_group_id = COALESCE(process_group_id, ?2), \
                 adapter_pid = COALESCE(adapter_pid, ?3), \
                 adapter_start_time = COALESCE(adapter_start_time, ?4), \
                 exit_status = COALESCE(exit_status, ?5), updated_at = ?6 \
                 WHERE lease_id = ?1 AND ( \
                   (process_group_id IS NULL AND ?2 IS NOT NULL) OR \
                   (adapter_pid IS NULL AND ?3 IS NOT NULL) OR \
                   (adapter_start_time IS NULL AND ?4 IS NOT NULL) OR \
                   (exit_status IS NULL AND ?5 IS NOT NULL))",
                params![
                    lease_id,
                    r.process_group_id,
                    r.adapter_pid,
                    r.adapter_start_time.map(|v| v as i64),
                    r.exit_status,
                    now
                ],
            )
            .map_err(|e| self.err(e))?;
        Ok(n == 1)
    }

    /// Deletes closed, lost and ended leases that ended before `before_ms`, and with them the stored
    /// ensure specs of the sessions left without a lease (a spec may hold env values: it must
    /// not outlive its session's retention). Returns how many leases.
    pub fn expire(&mut self, before_ms: i64) -> Result<usize, StoreError> {
        self.write(|tx, ctx| {
            let n = tx
                .execute(
                    "DELETE FROM leases WHERE state IN ('closed','lost','ended') AND closed_at IS NOT NULL \
                     AND closed_at < ?1",
                    [before_ms],
                )
                .map_err(|e| ctx.err(e))?;
            super::meta::prune_specs(tx).map_err(|e| ctx.err(e))?;
            Ok(n)
        })
    }
    /// Repairs an active lease row that does not read, so that it can be closed: the fields that
    /// identify its processes (id, gateway, session, wrapper root and path, root pid, start time
    /// and pidfs inode, command hash, owner, state) must read, since verification compares them
    /// with the live process table; every other field that does not read is reset to a safe
    /// value (grace → the default, adapter pid/group/start time, exit status, claim and times →
    /// unknown, command → empty) and a `repaired` event records which. Returns the repaired
    /// lease and what was reset, `Ok(None)` when there is no such active row, and `BadRow` when
    /// an identifying field does not read (such a row cannot be verified and is never signalled).
    pub fn repair_lease(
        &mut self,
        lease_id: &str,
    ) -> Result<Option<(Lease, Vec<String>)>, StoreError> {
        let repaired = self.write(|tx, ctx| {
            let err = |e| ctx.err(e);
            let read = |tx: &Connection| -> rusqlite::Result<Option<Result<Lease, StoreError>>> {
                tx.query_row(
                    &format!(
                        "SELECT {LEASE_COLS} FROM leases WHERE lease_id = ?1 \
                     AND state IN ('open','closing')"
                    ),
                    [lease_id],
                    |r| Ok(lease_from_row(r)),
                )
                .optional()
            };
            let Some(first) = read(tx).map_err(err)? else {
                return Ok(None);
            };
            let detail = match first {
                Ok(l) => return Ok(Some((l, Vec::new(), None))),
                Err(e) => e.to_string(),
            };
            let mut fixed = Vec::new();
            for (check, reset, what) in REPAIRS {
                let bad: bool = tx
                    .query_row(
                        &format!("SELECT NOT ({check}) FROM leases WHERE lease_id = ?1"),
                        [lease_id],
                        |r| r.get::<_, Option<bool>>(0),
                    )
                    .map_err(err)?
                    .unwrap_or(true);
                if bad {
                    let sql = format!("UPDATE leases SET {reset} WHERE lease_id = ?1");
                    if reset.contains("?2") {
                        let grace = leash_core::limits::DEFAULT_GRACE_MS as i64;
                        tx.execute(&sql, params![lease_id, grace]).map_err(err)?;
                    } else {
                        tx.execute(&sql, [lease_id]).map_err(err)?;
                    }
                    fixed.push(what.to_string());
                }
            }
            let lease = match read(tx).map_err(err)? {
                Some(Ok(l)) => l,
                Some(Err(e)) => {
                    return Err(StoreError::BadRow {
                        lease_id: lease_id.to_string(),
                        detail: format!(
                        "{e}; a field that identifies its processes does not read, so it cannot \
                         be verified and nothing is signalled (fix or delete the row by hand)"
                    ),
                    })
                }
                None => return Ok(None),
            };
            insert_event(
                tx,
                &lease.session_key,
                Some(lease_id),
                "repaired",
                Some(serde_json::json!({ "reset": fixed, "was": detail })),
                crate::lease::now_ms(),
            )
            .map_err(err)?;
            Ok(Some((lease, fixed, Some(detail))))
        })?;
        Ok(repaired.map(|(lease, fixed, was)| {
            if let Some(was) = was {
                tracing::warn!(lease_id, reset = crate::logvalue::json(&fixed), was = %was, "repaired an unreadable lease row");
            }
            (lease, fixed)
        }))
    }
}

const LEASE_COLS: &str = "lease_id, gateway_instance_id, session_key, agent_id, wrapper_root, \
    wrapper_path, root_pid, root_start_time, process_group_id, adapter_pid, adapter_start_time, \
    command_hash, command_json, owner_pid, owner_start_time, started_at, grace_ms, state, \
    state_reason, closed_at, exit_status, claimed_by_pid, claimed_by_start, root_pidfs_ino, \
    cgroup_path, cgroup_id, report_dir";

/// The fields [`Store::repair_lease`] may reset: (SQL that holds when the field reads, the reset
/// (?2 is the default grace), what is said in the `repaired` event). They mirror the checks of
/// [`lease_from_row`]; none of them is evidence that verification compares with `/proc`.
const REPAIRS: &[(&str, &str, &str)] = &[
    (
        "typeof(grace_ms) = 'integer' AND grace_ms BETWEEN 0 AND 3600000",
        "grace_ms = ?2",
        "grace_ms (now the default)",
    ),
    (
        "process_group_id IS NULL OR (typeof(process_group_id) = 'integer' \
         AND process_group_id BETWEEN 1 AND 2147483647)",
        "process_group_id = NULL",
        "process_group_id",
    ),
    (
        "adapter_pid IS NULL OR (typeof(adapter_pid) = 'integer' \
         AND adapter_pid BETWEEN 1 AND 2147483647)",
        "adapter_pid = NULL",
        "adapter_pid",
    ),
    (
        "adapter_start_time IS NULL OR (typeof(adapter_start_time) = 'integer' \
         AND adapter_start_time >= 0)",
        "adapter_start_time = NULL",
        "adapter_start_time",
    ),
    (
        "exit_status IS NULL OR typeof(exit_status) = 'integer'",
        "exit_status = NULL",
        "exit_status",
    ),
    (
        "(claimed_by_pid IS NULL OR (typeof(claimed_by_pid) = 'integer' \
         AND claimed_by_pid BETWEEN 1 AND 2147483647)) AND (claimed_by_start IS NULL \
         OR (typeof(claimed_by_start) = 'integer' AND claimed_by_start >= 0))",
        "claimed_by_pid = NULL, claimed_by_start = NULL",
        "claimed_by",
    ),
    (
        "typeof(started_at) = 'integer'",
        "started_at = 0",
        "started_at",
    ),
    (
        "closed_at IS NULL OR typeof(closed_at) = 'integer'",
        "closed_at = NULL",
        "closed_at",
    ),
    (
        "state_reason IS NULL OR typeof(state_reason) = 'text'",
        "state_reason = NULL",
        "state_reason",
    ),
    (
        "agent_id IS NULL OR typeof(agent_id) = 'text'",
        "agent_id = NULL",
        "agent_id",
    ),
    (
        "typeof(command_json) = 'text' AND json_valid(command_json) \
         AND json_type(command_json) = 'array'",
        "command_json = '[]'",
        "command_json",
    ),
];

/// Parses a lease row, validating what a tampered or corrupt row could get wrong. Column types
/// are read loosely (SQLite is dynamically typed) and checked here, so a bad row becomes a
/// `BadRow` error for that row only.
fn lease_from_row(r: &Row<'_>) -> Result<Lease, StoreError> {
    let lease_id: String = r
        .get::<_, rusqlite::types::Value>(0)
        .ok()
        .and_then(|v| match v {
            rusqlite::types::Value::Text(t) => Some(t),
            _ => None,
        })
        .unwrap_or_else(|| "<unreadable id>".to_string());
    let bad = |detail: String| StoreError::BadRow {
        lease_id: lease_id.clone(),
        detail,
    };
    let text = |i: usize, name: &str| -> Result<String, StoreError> {
        r.get::<_, String>(i)
            .map_err(|e| bad(format!("{name}: {e}")))
    };
    let opt_text = |i: usize, name: &str| -> Result<Option<String>, StoreError> {
        r.get::<_, Option<String>>(i)
            .map_err(|e| bad(format!("{name}: {e}")))
    };
    let int = |i: usize, name: &str| -> Result<i64, StoreError> {
        r.get::<_, i64>(i).map_err(|e| bad(format!("{name}: {e}")))
    };
    let opt_int = |i: usize, name: &str| -> Result<Option<i64>, StoreError> {
        r.get::<_, Option<i64>>(i)
            .map_err(|e| bad(format!("{name}: {e}")))
    };
    let pid = |v: i64, name: &str| -> Result<i32, StoreError> {
        if v <= 0 || v > i32::MAX as i64 {
            Err(bad(format!("{name} {v} is not a valid pid")))
        } else {
            Ok(v as i32)
        }
    };
    let ticks = |v: i64, name: &str| -> Result<u64, StoreError> {
        u64::try_from(v).map_err(|_| bad(format!("{name} {v} is negative")))
    };
    if uuid::Uuid::parse_str(&lease_id).is_err() {
        return Err(bad("lease id is not a UUID".into()));
    }
    let state: LeaseState = text(17, "state")?
        .parse()
        .map_err(|e: leash_core::model::BadState| bad(e.to_string()))?;
    let command_json = text(12, "command_json")?;
    let command: Vec<String> =
        serde_json::from_str(&command_json).map_err(|e| bad(format!("command_json: {e}")))?;
    let claimed_by = match (
        opt_int(21, "claimed_by_pid")?,
        opt_int(22, "claimed_by_start")?,
    ) {
        (Some(p), Some(s)) => Some(ProcessId {
            pid: pid(p, "claimed_by_pid")?,
            start_time: ticks(s, "claimed_by_start")?,
        }),
        _ => None,
    };
    Ok(Lease {
        gateway_instance_id: text(1, "gateway_instance_id")?,
        session_key: text(2, "session_key")?,
        agent_id: opt_text(3, "agent_id")?,
        wrapper_root: text(4, "wrapper_root")?,
        wrapper_path: text(5, "wrapper_path")?,
        root_pid: pid(int(6, "root_pid")?, "root_pid")?,
        root_start_time: ticks(int(7, "root_start_time")?, "root_start_time")?,
        process_group_id: opt_int(8, "process_group_id")?
            .map(|v| pid(v, "process_group_id"))
            .transpose()?,
        adapter_pid: opt_int(9, "adapter_pid")?
            .map(|v| pid(v, "adapter_pid"))
            .transpose()?,
        adapter_start_time: opt_int(10, "adapter_start_time")?
            .map(|v| ticks(v, "adapter_start_time"))
            .transpose()?,
        command_hash: text(11, "command_hash")?,
        command,
        owner_pid: pid(int(13, "owner_pid")?, "owner_pid")?,
        owner_start_time: ticks(int(14, "owner_start_time")?, "owner_start_time")?,
        started_at: int(15, "started_at")?,
        grace_ms: leash_core::limits::check_grace_ms(
            "grace_ms",
            ticks(int(16, "grace_ms")?, "grace_ms")?,
        )
        .map_err(|e| bad(e.to_string()))?,
        state,
        state_reason: opt_text(18, "state_reason")?,
        closed_at: opt_int(19, "closed_at")?,
        exit_status: opt_int(20, "exit_status")?.map(|v| v as i32),
        claimed_by,
        root_pidfs_ino: opt_int(23, "root_pidfs_ino")?
            .map(|v| ticks(v, "root_pidfs_ino"))
            .transpose()?,
        cgroup_path: opt_text(24, "cgroup_path")?,
        cgroup_id: opt_int(25, "cgroup_id")?
            .map(|v| ticks(v, "cgroup_id"))
            .transpose()?,
        report_dir: opt_text(26, "report_dir")?,
        lease_id,
    })
}

/// One state change for [`Store::transition_many`].
#[derive(Debug, Clone, Copy)]
pub struct Transition<'a> {
    pub lease_id: &'a str,
    pub from: LeaseState,
    pub to: LeaseState,
    pub reason: &'a str,
}

enum ClaimError {
    Sql(rusqlite::Error),
    Row(StoreError),
}

impl From<rusqlite::Error> for ClaimError {
    fn from(e: rusqlite::Error) -> Self {
        ClaimError::Sql(e)
    }
}

/// The body of a claim, inside the caller's immediate transaction.
fn claim_in(
    tx: &Connection,
    lease_id: &str,
    claimant: ProcessId,
    stale_claim: &impl Fn(ProcessId) -> bool,
    now: i64,
) -> Result<Option<Lease>, ClaimError> {
    let current = tx
        .prepare_cached(&format!(
            "SELECT {LEASE_COLS} FROM leases WHERE lease_id = ?1"
        ))?
        .query_row([lease_id], |r| Ok(lease_from_row(r)))
        .optional()?;
    let Some(current) = current else {
        return Ok(None);
    };
    let current = current.map_err(ClaimError::Row)?;
    let changed = match (current.state, current.claimed_by) {
        (LeaseState::Open, _) => tx
            .prepare_cached(
                "UPDATE leases SET state = 'closing', claimed_by_pid = ?2, \
                 claimed_by_start = ?3, updated_at = ?4 WHERE lease_id = ?1 AND state = 'open'",
            )?
            .execute(params![
                lease_id,
                claimant.pid,
                claimant.start_time as i64,
                now
            ])?,
        (LeaseState::Closing, claimed) => {
            let stale = match claimed {
                Some(c) => c == claimant || stale_claim(c),
                None => true,
            };
            if !stale {
                return Ok(None);
            }
            tx.prepare_cached(
                "UPDATE leases SET claimed_by_pid = ?2, claimed_by_start = ?3, updated_at = ?4 \
                 WHERE lease_id = ?1 AND state = 'closing' \
                 AND claimed_by_pid IS ?5 AND claimed_by_start IS ?6",
            )?
            .execute(params![
                lease_id,
                claimant.pid,
                claimant.start_time as i64,
                now,
                claimed.map(|c| c.pid),
                claimed.map(|c| c.start_time as i64)
            ])?
        }
        _ => 0,
    };
    if changed != 1 {
        return Ok(None);
    }
    if current.state == LeaseState::Open {
        insert_event(
            tx,
            &current.session_key,
            Some(lease_id),
            "closing",
            None,
            now,
        )?;
    }
    let mut lease = current;
    lease.state = LeaseState::Closing;
    lease.claimed_by = Some(claimant);
    Ok(Some(lease))
}

/// The body of a transition, inside the caller's immediate transaction.
fn transition_in(
    tx: &Connection,
    t: &Transition<'_>,
    claimant: Option<ProcessId>,
    now: i64,
) -> rusqlite::Result<bool> {
    let closed_at = t.to.is_terminal().then_some(now);
    let changed = tx
        .prepare_cached(
            "UPDATE leases SET state = ?3, state_reason = ?4, closed_at = COALESCE(?5, closed_at), \
             updated_at = ?6, claimed_by_pid = NULL, claimed_by_start = NULL \
             WHERE lease_id = ?1 AND state = ?2 \
             AND (?7 IS NULL OR (claimed_by_pid = ?7 AND claimed_by_start = ?8))",
        )?
        .execute(params![
            t.lease_id,
            t.from.as_str(),
            t.to.as_str(),
            t.reason,
            closed_at,
            now,
            claimant.map(|c| c.pid),
            claimant.map(|c| c.start_time as i64),
        ])?;
    if changed == 1 {
        let session: String = tx
            .prepare_cached("SELECT session_key FROM leases WHERE lease_id = ?1")?
            .query_row([t.lease_id], |r| r.get(0))?;
        let kind = if t.to == LeaseState::Open {
            "reopened"
        } else {
            t.to.as_str()
        };
        insert_event(
            tx,
            &session,
            Some(t.lease_id),
            kind,
            Some(serde_json::json!({ "reason": t.reason })),
            now,
        )?;
    }
    Ok(changed == 1)
}
