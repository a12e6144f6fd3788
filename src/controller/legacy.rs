//! Legacy records: `leash legacy import` and `list`, and their cleanup as part of `reap`: each
//! record the plan verified (argv, wrapper path, start time before the import) is terminated
//! through the engine and closed; the others are marked lost (nothing running) or left open with
//! the reason. Nothing here trusts a record's pid alone. `legacy import --acpx` reads the acpx
//! extension's own state from disk (its files and SQLite keyed stores; parsing and verification
//! are pure, in [`crate::legacy`]) and imports it in one transaction.

use super::*;
use crate::store::legacy::{AcpxImported, NewAcpxRecord, NewAcpxSession};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LegacyOutcome {
    pub id: i64,
    pub session_key: String,
    pub pid: i32,
    pub result: CloseResult,
    pub reason: String,
    pub signals: Vec<SignalRecord>,
    pub refused: Vec<RefusedSignal>,
}

impl<'t> Controller<'t> {
    /// Imports legacy records from a JSON file, in one transaction (all or nothing); how many.
    pub fn legacy_import(
        &self,
        file: &std::path::Path,
        wrapper_root: Option<&std::path::Path>,
    ) -> Result<usize, crate::legacy::LegacyError> {
        crate::legacy::import(&mut self.store(), file, wrapper_root)
    }

    /// The legacy records (only the open ones when `only_open`).
    pub fn legacy_records(&self, only_open: bool) -> Result<Vec<LegacyRecord>, StoreError> {
        crate::legacy::records(&mut self.store(), only_open)
    }

    pub(super) fn reap_legacy(
        &self,
        plan: &ReapPlan,
        grace_override: Option<u64>,
    ) -> Result<Vec<LegacyOutcome>, StoreError> {
        let records = crate::legacy::records(&mut self.store(), true)?;
        let mut out = Vec::new();
        let mut jobs = Vec::new();
        for lp in &plan.legacy {
            let Some(rec) = records.iter().find(|r| r.id == lp.id) else {
                continue;
            };
            match &lp.decision {
                Decision::Terminate => jobs.push(Job::new(
                    JobKind::Legacy(rec.clone()),
                    rec.session_key.clone(),
                    grace_override.unwrap_or(crate::limits::DEFAULT_GRACE_MS),
                    lp.signals.clone(),
                    lp.refused.clone(),
                    self.clock.now(),
                )),
                Decision::MarkLost { reason } => {
                    crate::legacy::finish(&mut self.store(), rec.id, "lost", reason)?;
                    out.push(LegacyOutcome {
                        id: rec.id,
                        session_key: rec.session_key.clone(),
                        pid: rec.pid,
                        result: CloseResult::Lost,
                        reason: reason.clone(),
                        signals: Vec::new(),
                        refused: Vec::new(),
                    });
                }
                Decision::Leave { reason } | Decision::Skip { reason } => {
                    crate::legacy::note(&mut self.store(), rec.id, reason)?;
                    out.push(LegacyOutcome {
                        id: rec.id,
                        session_key: rec.session_key.clone(),
                        pid: rec.pid,
                        result: CloseResult::LeftOpen,
                        reason: reason.clone(),
                        signals: Vec::new(),
                        refused: lp.refused.clone(),
                    });
                }
            }
        }
        self.engine().run_jobs(&mut jobs);
        for j in jobs {
            let JobKind::Legacy(rec) = j.kind else {
                continue;
            };
            let reason = format!(
                "legacy record verified; terminated {} process(es)",
                j.pins.len()
            );
            crate::legacy::finish(&mut self.store(), rec.id, "closed", &reason)?;
            out.push(LegacyOutcome {
                id: rec.id,
                session_key: j.session_key,
                pid: rec.pid,
                result: CloseResult::Closed,
                reason,
                signals: j.signals,
                refused: j.refused,
            });
        }
        Ok(out)
    }
}

/// Where `leash legacy import --acpx` reads the incumbent's state (docs/acpx-import.md).
#[derive(Debug, Clone)]
pub struct AcpxSources {
    /// The acpx directory, `<OpenClaw state dir>/acpx`: the wrapper root, the older
    /// `process-leases.json`, and (by default) the session records under `sessions/`.
    pub acpx_dir: std::path::PathBuf,
    /// The OpenClaw state directory (default: the acpx directory's parent): `gateway-instance-id`
    /// and the SQLite keyed stores `state/openclaw.sqlite` and `plugin-state/state.sqlite`.
    pub openclaw_state: Option<std::path::PathBuf>,
    /// The session records' directory (default: `<acpx dir>/sessions`).
    pub sessions_dir: Option<std::path::PathBuf>,
}

/// The keyed store's table, its rows for the acpx plugin: (entry key, value JSON), oldest first.
fn keyed_entries(
    db: &std::path::Path,
    namespace: &str,
    now: i64,
) -> Result<Vec<(String, String)>, crate::legacy::LegacyError> {
    use rusqlite::OpenFlags;
    let bad = |detail: String| crate::legacy::LegacyError::Acpx {
        path: db.display().to_string(),
        detail,
    };
    let conn = rusqlite::Connection::open_with_flags(
        db,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|e| bad(format!("cannot open the incumbent's SQLite store: {e}")))?;
    conn.busy_timeout(crate::store::DEFAULT_BUSY_TIMEOUT)
        .map_err(|e| bad(e.to_string()))?;
    let mut stmt = conn
        .prepare(
            "SELECT entry_key, value_json FROM plugin_state_entries \
             WHERE plugin_id = 'acpx' AND namespace = ?1 \
             AND (expires_at IS NULL OR expires_at > ?2) ORDER BY created_at, entry_key",
        )
        .map_err(|e| {
            bad(format!(
                "not the incumbent's plugin state store (no readable plugin_state_entries \
                 table): {e}"
            ))
        })?;
    let rows = stmt
        .query_map(rusqlite::params![namespace, now], |r| {
            Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?))
        })
        .and_then(|rows| rows.collect::<Result<Vec<_>, _>>())
        .map_err(|e| bad(format!("reading namespace {namespace}: {e}")))?;
    Ok(rows)
}

impl<'t> Controller<'t> {
    /// `leash legacy import --acpx`: reads the acpx extension's own state as it is on disk (the
    /// older lease file and gateway id file, the newer SQLite keyed stores, the session
    /// records), checks all of it, then imports it in one transaction (all or nothing): the
    /// gateway id becomes this root's own, open and closing leases become legacy records for the
    /// fail-safe path, session records become ownership rows. Nothing is signalled here.
    pub fn legacy_import_acpx(
        &self,
        src: &AcpxSources,
        adopt: bool,
    ) -> Result<(AcpxImported, usize), crate::legacy::LegacyError> {
        use crate::legacy::{self as lg, LegacyError};
        let dir = &src.acpx_dir;
        let state = src
            .openclaw_state
            .clone()
            .or_else(|| dir.parent().map(std::path::Path::to_path_buf))
            .unwrap_or_else(|| dir.clone());
        let acpx_err = |path: &std::path::Path, detail: String| LegacyError::Acpx {
            path: path.display().to_string(),
            detail,
        };
        let read = |path: &std::path::Path| {
            std::fs::read_to_string(path).map_err(|source| LegacyError::Read {
                path: path.display().to_string(),
                source,
            })
        };
        if !dir.is_dir() {
            return Err(acpx_err(dir, "not a directory".into()));
        }
        let lease_file = dir.join("process-leases.json");
        let gateway_files = [
            state.join("gateway-instance-id"),
            dir.join("gateway-instance-id"),
        ];
        let dbs = [
            state.join("state").join("openclaw.sqlite"),
            state.join("plugin-state").join("state.sqlite"),
        ];
        let sessions_dir = src
            .sessions_dir
            .clone()
            .unwrap_or_else(|| dir.join("sessions"));
        let now = crate::lease::now_ms();

        // Leases: the SQLite stores first (newer), then the file; one record per lease id.
        let mut leases: Vec<NewAcpxRecord> = Vec::new();
        let mut keyed_gateway: Option<(String, std::path::PathBuf)> = None;
        let mut found = Vec::new();
        for db in dbs.iter().filter(|p| p.is_file()) {
            found.push(db.clone());
            for (key, value) in keyed_entries(db, "process-leases", now)? {
                let v: serde_json::Value = serde_json::from_str(&value)
                    .map_err(|e| acpx_err(db, format!("process-leases/{key}: not JSON: {e}")))?;
                let Some(r) = lg::parse_acpx_lease(&v)
                    .map_err(|e| acpx_err(db, format!("process-leases/{key}: {e}")))?
                else {
                    continue;
                };
                if r.lease_id != key {
                    return Err(acpx_err(
                        db,
                        format!("process-leases/{key} holds lease {}", r.lease_id),
                    ));
                }
                if !leases.iter().any(|l| l.lease_id == r.lease_id) {
                    leases.push(r);
                }
            }
            for (key, value) in keyed_entries(db, "gateway-instance", now)? {
                if key != "current" {
                    continue;
                }
                let id = lg::parse_acpx_gateway_record(&value)
                    .map_err(|e| acpx_err(db, format!("gateway-instance/current: {e}")))?;
                match &keyed_gateway {
                    Some((other, at)) if *other != id => {
                        return Err(acpx_err(
                            db,
                            format!(
                                "its gateway instance id {id} differs from {other} in {}: \
                                 which gateway is this?",
                                at.display()
                            ),
                        ))
                    }
                    Some(_) => {}
                    None => keyed_gateway = Some((id, db.clone())),
                }
            }
        }
        if lease_file.is_file() {
            found.push(lease_file.clone());
            let text = read(&lease_file)?;
            for r in lg::parse_acpx_lease_file(&text).map_err(|e| acpx_err(&lease_file, e.0))? {
                if !leases.iter().any(|l| l.lease_id == r.lease_id) {
                    leases.push(r);
                }
            }
        }
        let mut file_gateway = None;
        for f in gateway_files.iter().filter(|p| p.is_file()) {
            found.push(f.clone());
            let id = read(f)?.trim().to_string();
            if id.is_empty() {
                return Err(acpx_err(f, "the gateway instance id file is empty".into()));
            }
            file_gateway.get_or_insert((id, f.clone()));
        }
        // Session records.
        let mut sessions = Vec::new();
        let mut skipped_files = 0;
        if sessions_dir.is_dir() {
            found.push(sessions_dir.clone());
            let mut names: Vec<_> = std::fs::read_dir(&sessions_dir)
                .map_err(|source| LegacyError::Read {
                    path: sessions_dir.display().to_string(),
                    source,
                })?
                .flatten()
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|x| x == "json") && p.is_file())
                .collect();
            names.sort();
            for p in names {
                let stem = p
                    .file_stem()
                    .map(|s| s.to_string_lossy().into_owned())
                    .unwrap_or_default();
                match lg::parse_acpx_session(&stem, &read(&p)?).map_err(|e| acpx_err(&p, e.0))? {
                    Some(s)
                        if !sessions
                            .iter()
                            .any(|o: &NewAcpxSession| o.session_key == s.session_key) =>
                    {
                        sessions.push(s)
                    }
                    Some(_) => {}
                    None => skipped_files += 1,
                }
            }
        }
        if found.is_empty() {
            let looked = [lease_file.clone(), sessions_dir.clone()]
                .iter()
                .chain(gateway_files.iter())
                .chain(dbs.iter())
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ");
            return Err(LegacyError::AcpxMissing {
                dir: dir.display().to_string(),
                looked,
            });
        }
        // The gateway id: the keyed store's (what the incumbent's runtime uses), else the file's,
        // else the one the leases name.
        let lease_ids: std::collections::BTreeSet<&str> = leases
            .iter()
            .map(|l| l.gateway_instance_id.as_str())
            .collect();
        let (gateway, from) = match (&keyed_gateway, &file_gateway) {
            (Some((id, at)), _) | (None, Some((id, at))) => (id.clone(), at.display().to_string()),
            (None, None) if lease_ids.len() == 1 => (
                lease_ids.iter().next().unwrap().to_string(),
                "its leases".to_string(),
            ),
            (None, None) => {
                return Err(acpx_err(
                    dir,
                    format!(
                        "no gateway instance id found (no gateway-instance-id file, no \
                         gateway-instance/current row), and the leases name {} gateway ids",
                        lease_ids.len()
                    ),
                ))
            }
        };
        if uuid::Uuid::parse_str(&gateway).is_err() {
            return Err(acpx_err(
                dir,
                format!(
                    "the gateway instance id {gateway:?} (from {from}) is not a UUID, and a leash \
                     state root keeps a UUID"
                ),
            ));
        }
        if let Some(l) = leases.iter().find(|l| l.gateway_instance_id != gateway) {
            return Err(acpx_err(
                dir,
                format!(
                    "lease {} names gateway {}, not the incumbent's {gateway} (from {from}): \
                     its wrappers are another gateway's",
                    l.lease_id, l.gateway_instance_id
                ),
            ));
        }
        let imported = self.store().import_acpx(
            &gateway,
            adopt,
            &leases,
            &sessions,
            crate::proc::self_id().start_time,
            now,
        )?;
        Ok((imported, skipped_files))
    }
}
