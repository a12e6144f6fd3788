//! `leases`: the lease rows, optionally of some states only, with the wrappers' reports folded
//! in first (so a lease whose wrapper reported its end reads `lost`). A row that does not read is
//! returned as its error, in place, never dropped.

use super::base::*;

impl Controller<'_> {
    /// The leases in `states` (all when empty), oldest first.
    pub fn leases(
        &self,
        states: &[LeaseState],
    ) -> Result<Vec<Result<Lease, StoreError>>, StoreError> {
        self.ingest_reports_marking_ended_lost()?;
        self.store().leases(states)
    }
}
