//! Legacy records: `leash legacy import` and `list`, and their cleanup as part of `reap`: each
//! record the plan verified (argv, wrapper path, start time before the import) is terminated
//! through the engine and closed; the others are marked lost (nothing running) or left open with
//! the reason. Nothing here trusts a record's pid alone.

use super::*;

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
                    grace_override.unwrap_or(crate::controller::exec::DEFAULT_GRACE_MS),
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
