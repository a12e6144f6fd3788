//! `cancel`: records the intent to cancel a session's active turn as an event. It signals nothing
//! and the lease stays open; the daemon, which holds the adapter's stdin, turns the event into
//! the ACP `session/cancel` notification.

use super::base::*;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CancelOutcome {
    pub lease_id: String,
    pub session_key: String,
    pub seq: i64,
}

impl<'t> Controller<'t> {
    /// Records the intent to cancel the active turn. Sends no signal; the lease stays open.
    pub fn cancel(
        &self,
        r: &LeaseRef,
        detail: Option<serde_json::Value>,
    ) -> Result<CancelOutcome, LifecycleError> {
        let lease = self.resolve(r)?;
        if lease.state != LeaseState::Open {
            return Err(LifecycleError::NotOpen {
                lease_id: lease.lease_id,
                state: lease.state,
            });
        }
        let seq = self.store().record_event(
            &lease.session_key,
            Some(&lease.lease_id),
            "cancel",
            detail,
        )?;
        tracing::info!(lease_id = %lease.lease_id, session = %lease.session_key, "cancel recorded; nothing signalled");
        Ok(CancelOutcome {
            lease_id: lease.lease_id,
            session_key: lease.session_key,
            seq,
        })
    }
}
