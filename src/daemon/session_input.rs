//! The front doors' way to a session's stdin: [`ThroughDaemon`] hands a line the controller has
//! allowed ([`crate::sessions::Sessions::send`]) to the daemon serving the state root, the only
//! process that holds the adapters' stdin. It lives here, beside the client, so the controller
//! never calls the daemon: `leash sessions send` and the MCP server's `sessions_send` pass it in.

use crate::daemon::client::{socket_for, Client};
use crate::sessions::{SessionInput, SessionsError};
use crate::state::StateRoot;

/// Sends through the daemon serving the state root; [`SessionsError::DaemonNeeded`] when none
/// runs, [`SessionsError::Daemon`] when it refuses.
#[derive(Debug, Clone, Copy, Default)]
pub struct ThroughDaemon;

impl SessionInput for ThroughDaemon {
    fn send_line(
        &self,
        root: &StateRoot,
        key: &str,
        line: &str,
    ) -> Result<serde_json::Value, SessionsError> {
        let Some(mut daemon) = Client::probe(root) else {
            return Err(SessionsError::DaemonNeeded {
                key: key.to_string(),
                socket: socket_for(root),
            });
        };
        let sent = daemon.send(key, line).map_err(|e| SessionsError::Daemon {
            key: key.to_string(),
            source: e,
        })?;
        Ok(serde_json::to_value(sent).expect("replies serialise"))
    }
}
