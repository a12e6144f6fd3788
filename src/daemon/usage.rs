//! The usage of contained sessions as `status` last sampled it, and the sampling itself (the
//! cgroup's counters and its members' `/proc` entries, as `leash ps` reads them).

use crate::state::StateRoot;
use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

/// How old a usage sample may be before `status` has it sampled again. Sampling reads each
/// session's cgroup and its members' `/proc` entries (some 10 file reads a session): 100
/// sessions cost several milliseconds of CPU, which a health check on a busy host should not
/// pay, so `status` answers from the last sample and a background thread takes the next.
pub(super) const USAGE_MAX_AGE: Duration = Duration::from_secs(1);

/// Usage samples by lease id.
#[derive(Default)]
pub(super) struct UsageCache {
    pub(super) by_lease: HashMap<String, (Instant, crate::ps::Totals)>,
    /// A background sample is running.
    pub(super) sampling: bool,
}

/// Reads the usage of contained leases as `leash ps` does (the cgroup's counters and its
/// members' `/proc` entries; never a walk of `/proc`).
pub(super) fn sample_usage(
    leases: &[leash_core::model::Lease],
    root: &StateRoot,
    gateway: &str,
    cgroup_root: Option<&Path>,
) -> Vec<(String, (Instant, crate::ps::Totals))> {
    let wrapper_root = root.wrapper_root();
    let expect = leash_core::verify::Expect {
        gateway_instance_id: gateway,
        wrapper_root: &wrapper_root,
        cgroup_root,
    };
    let reader = crate::ps::Reader::new();
    leases
        .iter()
        .map(|l| {
            let totals = crate::ps::usage_of(l, &expect, &crate::proc::LiveTable, &reader).totals;
            (l.lease_id.clone(), (Instant::now(), totals))
        })
        .collect()
}
