//! Continuous reconcile's decision: what one active or ended lease needs from a pass of
//! `leash serve --reconcile-interval`, from the few facts the pass read of its processes (its
//! owner, its root, its claimant) and who is deciding. The pass itself (reading the facts,
//! settling through the controller) is the `leash` crate's `reconcile.rs`.

use crate::model::{Lease, LeaseState, ProcessId};
use std::time::Duration;

/// What a pass knows of one active lease's processes (`None`: could not be read).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Facts {
    pub owner_alive: Option<bool>,
    pub root_alive: Option<bool>,
    pub claimant_alive: Option<bool>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Nothing to do (a live session, a lease another process is closing, a fresh lease).
    Leave,
    /// The owner is gone: reap it (verify, terminate what is left, or mark it lost).
    Reap,
    /// The owner lives but the wrapper is gone: settle it through `close`.
    Settle,
    /// A closed or lost lease past the retention: delete it.
    Expire,
}

/// Who is deciding: the daemon (its sessions are its own business) and the state root's gateway
/// (a row naming another gateway is never this root's to act on, and would only make every
/// pass read the whole process table to conclude that again).
#[derive(Debug, Clone, Copy)]
pub struct Decider<'a> {
    pub me: ProcessId,
    pub gateway_instance_id: &'a str,
}

/// The pure decision for one lease.
pub fn decide(
    lease: &Lease,
    facts: Facts,
    who: Decider<'_>,
    now_ms: i64,
    retention: Duration,
) -> Action {
    if lease.state.is_terminal() {
        let ended = lease.closed_at.unwrap_or(lease.started_at);
        let cutoff = now_ms.saturating_sub(retention.as_millis().min(i64::MAX as u128) as i64);
        return if ended < cutoff {
            Action::Expire
        } else {
            Action::Leave
        };
    }
    if lease.owner() == who.me || lease.gateway_instance_id != who.gateway_instance_id {
        return Action::Leave;
    }
    if lease.state == LeaseState::Closing && facts.claimant_alive != Some(false) {
        return Action::Leave; // someone is closing it (or we cannot tell)
    }
    match (facts.owner_alive, facts.root_alive) {
        (Some(false), _) => Action::Reap,
        (Some(true), Some(false)) => Action::Settle,
        // A live session, or facts we could not read: never act on a guess.
        _ => Action::Leave,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(state: &str, owner: i32) -> Lease {
        serde_json::from_value(serde_json::json!({
            "leaseId": "L", "sessionKey": "s", "gatewayInstanceId": "G", "state": state,
            "ownerPid": owner, "ownerStartTime": 1, "rootPid": 100, "rootStartTime": 2,
            "commandHash": "h", "command": ["a"], "wrapperPath": "/w/x", "wrapperRoot": "/w",
            "startedAt": 1_000, "closedAt": 2_000, "graceMs": 1,
        }))
        .unwrap()
    }

    const ME: Decider<'static> = Decider {
        me: ProcessId {
            pid: 7,
            start_time: 7,
        },
        gateway_instance_id: "G",
    };

    fn facts(owner: Option<bool>, root: Option<bool>) -> Facts {
        Facts {
            owner_alive: owner,
            root_alive: root,
            claimant_alive: Some(false),
        }
    }

    #[test]
    fn a_live_session_is_left_alone() {
        let l = lease("open", 50);
        let d = decide(&l, facts(Some(true), Some(true)), ME, 3_000, Duration::ZERO);
        assert_eq!(d, Action::Leave);
    }

    #[test]
    fn an_orphan_is_reaped_and_a_dead_wrapper_settled() {
        let l = lease("open", 50);
        let h = Duration::from_secs(3600);
        assert_eq!(
            decide(&l, facts(Some(false), Some(true)), ME, 3_000, h),
            Action::Reap
        );
        assert_eq!(
            decide(&l, facts(Some(true), Some(false)), ME, 3_000, h),
            Action::Settle
        );
    }

    #[test]
    fn unknown_facts_and_own_sessions_are_left_alone() {
        let l = lease("open", 50);
        let h = Duration::from_secs(3600);
        assert_eq!(
            decide(&l, facts(None, Some(false)), ME, 3_000, h),
            Action::Leave
        );
        assert_eq!(
            decide(&l, facts(Some(true), None), ME, 3_000, h),
            Action::Leave
        );
        let mut own = lease("open", 7);
        own.owner_start_time = 7;
        assert_eq!(
            decide(&own, facts(Some(true), Some(false)), ME, 3_000, h),
            Action::Leave
        );
        let mut foreign = lease("open", 50);
        foreign.gateway_instance_id = "other".into();
        assert_eq!(
            decide(&foreign, facts(Some(false), Some(false)), ME, 3_000, h),
            Action::Leave
        );
    }

    #[test]
    fn a_closing_lease_with_a_live_claimant_is_left_alone() {
        let l = lease("closing", 50);
        let mut f = facts(Some(false), Some(true));
        f.claimant_alive = Some(true);
        assert_eq!(decide(&l, f, ME, 3_000, Duration::ZERO), Action::Leave);
        f.claimant_alive = Some(false);
        assert_eq!(decide(&l, f, ME, 3_000, Duration::ZERO), Action::Reap);
    }

    #[test]
    fn ended_leases_expire_after_the_retention() {
        let l = lease("closed", 50);
        let f = facts(None, None);
        assert_eq!(
            decide(&l, f, ME, 3_000, Duration::from_millis(500)),
            Action::Expire
        );
        assert_eq!(
            decide(&l, f, ME, 3_000, Duration::from_millis(5_000)),
            Action::Leave
        );
    }
}
