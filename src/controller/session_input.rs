//! The way a line reaches a session's adapter, as the controller and the front doors share it:
//! [`SessionInput`] (whoever holds the adapters' stdin: the daemon; the front door passes it in),
//! the [`Sent`] it answers, and the [`SessionsError`]s of the sessions operations.

use crate::state::StateRoot;
use crate::store::StoreError;
use leash_core::kind::{HasKind, Kind};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum SessionsError {
    #[error("no session '{0}' in this state root (leash sessions list --as KEY shows what a requester may see)")]
    NotFound(String),
    #[error("session '{key}' is not visible to requester '{requester}' under visibility {visibility}: {why}; nothing was read or sent")]
    NotVisible {
        key: String,
        requester: String,
        /// How the visibility is described, e.g. "tree (sandboxed; configured all)".
        visibility: String,
        why: &'static str,
    },
    #[error("sending to session '{key}' needs a running daemon: start `leash serve` for this state root (it listens on {socket}); nothing was sent")]
    DaemonNeeded { key: String, socket: PathBuf },
    #[error("LINE contains a newline; send one line at a time (nothing was sent)")]
    MultiLine,
    /// Whoever holds the adapter's stdin (the daemon) did not deliver the line: `code` is the wire
    /// code it refused with (none when it could not be asked or its answer did not read), and
    /// `message` says why. The front door's [`SessionInput`] fills it in from its client's error,
    /// so the controller never names the client.
    #[error("the daemon did not send to session '{key}': {message}")]
    Remote {
        key: String,
        code: Option<String>,
        message: String,
    },
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl HasKind for SessionsError {
    fn kind(&self) -> Kind {
        match self {
            SessionsError::NotFound(_) => Kind::NotFound,
            SessionsError::NotVisible { .. } => Kind::NotVisible,
            SessionsError::DaemonNeeded { .. } => Kind::DaemonNeeded,
            SessionsError::MultiLine => Kind::Usage,
            SessionsError::Remote { code, .. } => code
                .as_deref()
                .and_then(leash_core::kind::Code::parse)
                .map_or(Kind::Internal, |c| c.kind()),
            SessionsError::Store(e) => e.kind(),
        }
    }
}

/// A line delivered to a session's adapter; also the daemon's `send` reply (the `send` request's
/// `OpRequest::Reply`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Sent {
    /// The adapter was in the middle of a turn when the line was written.
    pub busy: bool,
    /// The line's length with its newline.
    pub bytes: usize,
    pub session_key: String,
}

/// Whoever holds the adapters' stdin for a state root: the daemon serving it. The controller
/// decides whether a line may be sent; this delivers it.
pub trait SessionInput {
    /// Sends one line (no newline in it) to the session's adapter; the daemon's reply.
    fn send_line(&self, root: &StateRoot, key: &str, line: &str) -> Result<Sent, SessionsError>;
}

/// No way to a session's stdin: every send needs a daemon ([`SessionsError::DaemonNeeded`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct NoSessionInput;

impl SessionInput for NoSessionInput {
    fn send_line(&self, root: &StateRoot, key: &str, _line: &str) -> Result<Sent, SessionsError> {
        Err(SessionsError::DaemonNeeded {
            key: key.to_string(),
            socket: root.socket_path(),
        })
    }
}
