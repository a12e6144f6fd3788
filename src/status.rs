//! `status`: the state root's part of `leash status` and of the daemon's `status` reply — the
//! gateway instance, where things are, containment, lease counts, open legacy records — built in
//! this one place for both; the daemon adds what only it knows (`status.daemon`). The type is
//! the wire type, [`crate::daemon::protocol::Status`].

use crate::daemon::protocol::Status;
use crate::state::StateRoot;
use crate::store::{Counts, Store, StoreError};

/// What `status` reads from the store: the part taken under the store's lock.
#[derive(Debug, Clone)]
pub struct Counted {
    pub gateway_instance_id: String,
    pub leases: Counts,
    pub legacy_open: usize,
}

/// Reads the counts from `store` as it is (callers fold wrapper reports in first when they want
/// them counted).
pub fn count(store: &mut Store) -> Result<Counted, StoreError> {
    Ok(Counted {
        leases: store.counts()?,
        legacy_open: crate::legacy::records(store, true)?.len(),
        gateway_instance_id: store.gateway_instance_id().to_string(),
    })
}

/// The state root's status from its counts, with containment as this process resolves it (a few
/// cgroup file reads, no store). `daemon` is `None`.
pub fn status(root: &StateRoot, counted: Counted) -> Status {
    Status {
        containment: crate::cgroup::Containment::resolve(
            &crate::cgroup::Settings::from_env().unwrap_or_default(),
            &counted.gateway_instance_id,
        ),
        daemon: None,
        database: root.db_path(),
        gateway_instance_id: counted.gateway_instance_id,
        leases: counted.leases,
        legacy_open: counted.legacy_open,
        state_dir: root.dir().to_path_buf(),
        wrapper_root: root.wrapper_root(),
    }
}
