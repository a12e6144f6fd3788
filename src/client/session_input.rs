//! The front doors' way to a session's stdin: [`DaemonInput`] hands a line the controller has
//! allowed ([`crate::controller::Controller::send`]) to the daemon serving the state root, the only
//! process that holds the adapters' stdin. It lives here, beside the client, so the controller
//! never calls the daemon: `leash sessions send` and the MCP server's `sessions_send` pass it in.

use super::conn::{socket_for, Client, ClientError};
use crate::controller::session_input::{Sent, SessionInput, SessionsError};
use crate::state::StateRoot;

/// Sends through the daemon serving the state root; [`SessionsError::DaemonNeeded`] when none
/// runs, [`SessionsError::Remote`] when it refuses.
#[derive(Debug, Clone, Copy, Default)]
pub struct DaemonInput;

impl SessionInput for DaemonInput {
    fn send_line(&self, root: &StateRoot, key: &str, line: &str) -> Result<Sent, SessionsError> {
        let Some(mut daemon) = Client::probe(root) else {
            return Err(SessionsError::DaemonNeeded {
                key: key.to_string(),
                socket: socket_for(root),
            });
        };
        daemon.send(key, line).map_err(|e| undelivered(key, e))
    }
}

/// The controller's [`SessionsError::Remote`] for a client's error: the daemon's wire code when
/// it answered with one (its kind is the code's), else none (internal).
pub fn undelivered(key: &str, e: ClientError) -> SessionsError {
    let code = match &e {
        ClientError::Remote { code, .. } => Some(code.clone()),
        _ => None,
    };
    SessionsError::Remote {
        key: key.to_string(),
        code,
        message: e.to_string(),
    }
}
