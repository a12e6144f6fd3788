//! `ps`: what each open or closing session costs the machine (members, RSS, CPU time, totals),
//! read from each lease down — its verified cgroup, else its verified tree — never from the whole
//! host. The reading itself (`cgroup.procs`, `cpu.stat`, `/proc/<pid>/stat`…) is the machine
//! room's, `crate::ps`; this verb picks the leases and the containment to read them under.

use super::base::*;
use crate::ps::{usage_of, PsReport, Reader};

impl Controller<'_> {
    /// The usage of every open or closing lease, after the wrappers' reports are folded in.
    /// Reads only; the store is held for the lease read alone.
    pub fn ps(&self) -> Result<PsReport, StoreError> {
        self.ingest_reports_marking_ended_lost()?;
        let leases: Vec<Lease> = self
            .store()
            .leases(&[LeaseState::Open, LeaseState::Closing])?
            .into_iter()
            .filter_map(Result::ok)
            .collect();
        // The full resolution (with the controllers), as `status` shows it.
        let containment = Containment::resolve(
            &cgroup::Settings::from_env().unwrap_or_default(),
            &self.gateway,
        );
        let wrapper_root = self.wrapper_root();
        let expect = Expect {
            gateway_instance_id: &self.gateway,
            wrapper_root: &wrapper_root,
            cgroup_root: containment.gateway_root.as_deref(),
        };
        let reader = Reader::new();
        let sessions = leases
            .iter()
            .map(|l| usage_of(l, &expect, self.table, &reader))
            .collect();
        Ok(PsReport { sessions })
    }
}
