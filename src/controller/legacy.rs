//! Legacy records: `leash legacy import` and `list`, and their cleanup as part of `reap`: each
//! record the plan verified (argv, wrapper path, start time before the import) is terminated
//! through the engine and closed; the others are marked lost (nothing running) or left open with
//! the reason. Nothing here trusts a record's pid alone. `legacy import --acpx` reads the acpx
//! extension's own state from disk (its files and SQLite keyed stores; parsing and verification
//! are pure, in [`crate::legacy`]) and imports it in one transaction. The import refuses what
//! would let a record claim leash's own processes or give the root a second gateway id: a lease
//! id of leash's own, a gateway id another live root uses, an adoption while `leash serve` holds
//! the root. Reap verifies records against what the host shows of leash's own leases
//! (`Controller::leash_seen`).

use super::base::*;
use super::close::CloseResult;
use crate::store::legacy::{acpx_keyed_entries, AcpxImported, NewAcpxRecord, NewAcpxSession};

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
                    grace_override.unwrap_or(leash_core::limits::DEFAULT_GRACE_MS),
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
        let read = |path: &std::path::Path| lg::read_input(path);
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
        for db in dbs.iter().filter(|p| lg::exists_unfollowed(p)) {
            lg::check_regular(db)?;
            found.push(db.clone());
            let entries = |ns| acpx_keyed_entries(db, ns, now).map_err(|e| acpx_err(db, e.0));
            for (key, value) in entries("process-leases")? {
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
            for (key, value) in entries("gateway-instance")? {
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
        if lg::exists_unfollowed(&lease_file) {
            found.push(lease_file.clone());
            let text = read(&lease_file)?;
            for r in lg::parse_acpx_lease_file(&text).map_err(|e| acpx_err(&lease_file, e.0))? {
                if !leases.iter().any(|l| l.lease_id == r.lease_id) {
                    leases.push(r);
                }
            }
        }
        let mut file_gateway = None;
        for f in gateway_files.iter().filter(|p| lg::exists_unfollowed(p)) {
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
                .filter(|p| {
                    p.extension().is_some_and(|x| x == "json")
                        && !std::fs::symlink_metadata(p).is_ok_and(|m| m.is_dir())
                })
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
                    "the gateway instance id {} (from {from}) is not a UUID, and a leash state \
                     root keeps a UUID",
                    lg::shown_value(&gateway)
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
        // Nothing the import stores may claim leash's own processes, nor give this root a
        // second gateway id.
        let adopting = gateway != self.gateway;
        let _lock = if adopting {
            self.hold_off_the_daemon(&gateway)?
        } else {
            None
        };
        self.refuse_leash_leases(&leases)?;
        if adopting {
            self.refuse_gateway_in_use(&gateway)?;
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

impl Controller<'_> {
    /// Leash's cgroup root (`<cgroup2 mount>/leash`, or `LEASH_CGROUP_ROOT`) as containment
    /// would resolve it, whether or not this root contains its sessions: where every state
    /// root of the host puts its lease cgroups. Decides only; creates nothing.
    fn leash_cgroup_root(&self) -> Option<PathBuf> {
        let mut settings = cgroup::Settings::from_env().unwrap_or(cgroup::Settings {
            requested: cgroup::Requested::On,
            root: None,
        });
        settings.requested = cgroup::Requested::On;
        Containment::resolve_lean(&settings, &self.gateway).root
    }

    /// What the host shows of leash's own leases ([`leash_core::model::LeashSeen`]): this
    /// root's lease ids (every row, whatever its state), and every lease cgroup under leash's
    /// cgroup root (every gateway's directory, so every state root's), with its members. One
    /// listing per gateway directory and one `cgroup.procs` read per lease cgroup.
    pub(super) fn leash_seen(
        &self,
        leases: &[Result<Lease, String>],
    ) -> leash_core::model::LeashSeen {
        let mut seen = leash_core::model::LeashSeen {
            lease_ids: leases
                .iter()
                .filter_map(|l| l.as_ref().ok())
                .map(|l| l.lease_id.clone())
                .collect(),
            ..Default::default()
        };
        if let Some(root) = self.leash_cgroup_root() {
            for (gateway, _) in cgroup::children(&root) {
                let dir = root.join(&gateway);
                for (lease, _) in cgroup::children(&dir) {
                    let path = dir.join(&lease);
                    for pid in self.table.cgroup(&path).procs {
                        seen.cgroup_members.insert(pid, path.display().to_string());
                    }
                    seen.lease_ids.insert(lease);
                }
            }
        }
        seen
    }

    /// Refuses an import whose leases name a lease of leash's own: a row of this root, or a
    /// lease cgroup under leash's cgroup root (another root's). Such a record would claim the
    /// processes leash started for that lease, which carry the same markers.
    fn refuse_leash_leases(
        &self,
        leases: &[NewAcpxRecord],
    ) -> Result<(), crate::legacy::LegacyError> {
        use crate::legacy::LegacyError;
        for l in leases {
            if let Some(own) = self.store().lease(&l.lease_id)? {
                return Err(LegacyError::Refused(format!(
                    "acpx lease {} is a lease of this state root ({}, session {}, {}): leash \
                     committed it itself, and an imported record never names a leash lease; \
                     remove that entry from the incumbent's state and import again",
                    l.lease_id,
                    self.root.dir().display(),
                    own.session_key,
                    own.state
                )));
            }
        }
        if let Some(root) = self.leash_cgroup_root() {
            for (gateway, _) in cgroup::children(&root) {
                let dir = root.join(&gateway);
                for (lease, _) in cgroup::children(&dir) {
                    if leases.iter().any(|l| l.lease_id == lease) {
                        return Err(LegacyError::Refused(format!(
                            "acpx lease {lease} is a leash lease of gateway {gateway} (its cgroup \
                             {} exists): an imported record never names a leash lease; remove \
                             that entry from the incumbent's state and import again",
                            dir.join(&lease).display()
                        )));
                    }
                }
            }
        }
        Ok(())
    }

    /// Refuses to adopt `gateway` when another live leash state root on the host uses it: its
    /// directory under leash's cgroup root holds processes, or `leash-wrap` processes of this
    /// user carry it. Two roots with one gateway id would each take the other's sessions for
    /// their own (and for the incumbent's).
    fn refuse_gateway_in_use(&self, gateway: &str) -> Result<(), crate::legacy::LegacyError> {
        use crate::legacy::LegacyError;
        let how = "import the incumbent's state into the state root that uses it (its \
                   --state-dir), or end that root's sessions and its `leash serve` first";
        if let Some(dir) = self.leash_cgroup_root().map(|r| r.join(gateway)) {
            let obs = self.table.cgroup(&dir);
            let mut pids: Vec<i32> = obs.procs.clone();
            for (lease, _) in cgroup::children(&dir) {
                pids.extend(self.table.cgroup(&dir.join(lease)).procs);
            }
            if obs.populated || !pids.is_empty() {
                pids.sort_unstable();
                return Err(LegacyError::Refused(format!(
                    "refusing to adopt gateway instance id {gateway}: another live leash state \
                     root uses it (its cgroup directory {} holds pid {}); {how}",
                    dir.display(),
                    if pids.is_empty() {
                        "(a populated subtree)".to_string()
                    } else {
                        pids.iter()
                            .map(|p| p.to_string())
                            .collect::<Vec<_>>()
                            .join(", ")
                    }
                )));
            }
        }
        let uid = self.caller.uid;
        let snap = self
            .table
            .scan(&|p: &leash_core::model::ProcessInfo| p.uid == uid)
            .map_err(|e| {
                LegacyError::Refused(format!(
                    "refusing to adopt gateway instance id {gateway}: the process table cannot \
                     be read ({e}), so whether another leash state root's wrappers carry it is \
                     unknown"
                ))
            })?;
        let wrappers = leash_core::legacy::leash_wrappers_of(&snap, gateway);
        if !wrappers.is_empty() {
            return Err(LegacyError::Refused(format!(
                "refusing to adopt gateway instance id {gateway}: another live leash state root \
                 uses it (leash-wrap pid {} carry it); {how}",
                wrappers
                    .iter()
                    .map(|p| p.pid.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
        Ok(())
    }

    /// Keeps a daemon off this state root while the import gives it another gateway id: a
    /// shared lock on `daemon.lock`, which a serving daemon's exclusive lock refuses (then the
    /// import is refused: the daemon keeps the id it read at start) and which a daemon starting
    /// meanwhile waits for. Held until the returned lock is dropped.
    fn hold_off_the_daemon(
        &self,
        gateway: &str,
    ) -> Result<Option<nix::fcntl::Flock<std::fs::File>>, crate::legacy::LegacyError> {
        use crate::legacy::LegacyError;
        use std::os::unix::fs::OpenOptionsExt;
        let path = self.root.daemon_lock_path();
        let Ok(file) = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)
        else {
            // No lock file: no daemon has served this root.
            return Ok(None);
        };
        match nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockSharedNonblock) {
            Ok(lock) => Ok(Some(lock)),
            Err((_, nix::errno::Errno::EWOULDBLOCK)) => Err(LegacyError::Refused(format!(
                "refusing to adopt gateway instance id {gateway}: `leash serve` serves this \
                 state root ({}) and holds its lock ({}), with gateway id {}; it would keep \
                 that id while the database names the other: stop leash serve first, then \
                 import",
                self.root.dir().display(),
                path.display(),
                self.gateway
            ))),
            Err((_, e)) => Err(LegacyError::Refused(format!(
                "refusing to adopt gateway instance id {gateway}: cannot probe the daemon lock \
                 {}: {e}",
                path.display()
            ))),
        }
    }
}
