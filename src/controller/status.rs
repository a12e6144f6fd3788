//! `status`: what a state root holds — its gateway instance, where its files are, whether
//! containment is in effect (and if not, why not), lease counts by state and open legacy
//! records — after the wrappers' reports are folded in. `leash status` renders it; the daemon's
//! `status` reply carries the same fields plus its own section.

use super::base::*;
use crate::store::Counts;

/// A state root's status (the fields `leash status --json` prints).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StoreStatus {
    pub gateway_instance_id: String,
    pub state_dir: PathBuf,
    pub database: PathBuf,
    pub wrapper_root: PathBuf,
    pub containment: Containment,
    pub leases: Counts,
    pub legacy_open: usize,
}

/// [`Controller::root_status`] over a store the caller holds (the reports already folded in).
pub fn store_status(root: &StateRoot, store: &mut Store) -> Result<StoreStatus, StoreError> {
    // The full resolution (with the controllers available for limits), as status shows it.
    let containment = Containment::resolve(
        &cgroup::Settings::from_env().unwrap_or_default(),
        store.gateway_instance_id(),
    );
    store_status_with(root, store, containment)
}

/// [`store_status`] with the containment the caller resolved (the daemon resolves it once, at
/// start, and re-reads only the controllers, outside its store lock).
pub fn store_status_with(
    root: &StateRoot,
    store: &mut Store,
    containment: Containment,
) -> Result<StoreStatus, StoreError> {
    let counts = store.counts()?;
    let legacy_open = crate::legacy::records(store, true)?.len();
    Ok(StoreStatus {
        gateway_instance_id: store.gateway_instance_id().to_string(),
        state_dir: root.dir().to_path_buf(),
        database: root.db_path(),
        wrapper_root: root.wrapper_root(),
        containment,
        leases: counts,
        legacy_open,
    })
}

impl Controller<'_> {
    /// The state root's status, with the wrappers' reports folded in first.
    pub fn root_status(&self) -> Result<StoreStatus, StoreError> {
        self.ingest_reports_marking_ended_lost()?;
        store_status(&self.root, &mut self.store())
    }
}
