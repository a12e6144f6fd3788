//! `leash exec`'s way to the daemon: one request on one connection, no database.
//!
//! The daemon is found the way [`super::conn`] finds it — the lock file is held and names
//! the socket and the pid, the socket is not a symlink, the peer is that pid — but nothing
//! waits: no daemon holding the lock, a socket that does not accept, or a peer that is not the
//! daemon is [`DaemonAnswer::NotAsked`], and `leash exec` commits the lease itself. Once the
//! request is sent, a connection that ends without an answer is [`DaemonAnswer::Lost`]: the
//! lease may be committed, and `leash exec` looks its id up.

use super::conn::daemon_pid;
use crate::controller::exec::{DaemonAnswer, ExecAnswer, ExecAsk, ExecDaemon};
use crate::state::StateRoot;
use leash_core::kind::Code;
use serde::{Deserialize, Serialize};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;

/// The daemon of `root`, if one serves it.
pub struct ExecThroughDaemon<'a> {
    pub root: &'a StateRoot,
}

/// The request line: the envelope and the ask's fields.
#[derive(Serialize)]
struct Line<'a> {
    id: u32,
    op: &'static str,
    #[serde(flatten)]
    ask: &'a ExecAsk,
}

/// The reply line, read for what exec needs.
#[derive(Deserialize)]
struct Reply {
    #[serde(default)]
    result: Option<ExecAnswer>,
    #[serde(default)]
    error: Option<ReplyError>,
}

#[derive(Deserialize)]
struct ReplyError {
    code: String,
    message: String,
}

impl ExecDaemon for ExecThroughDaemon<'_> {
    fn commit(&self, ask: &dyn Fn() -> Option<ExecAsk>) -> DaemonAnswer {
        use DaemonAnswer::NotAsked;
        let Some(info) = daemon_pid(&self.root.daemon_lock_path()) else {
            return NotAsked("no daemon holds the state root's lock".into());
        };
        if std::fs::symlink_metadata(&info.socket).is_ok_and(|m| m.file_type().is_symlink()) {
            return NotAsked(format!("{} is a symbolic link", info.socket.display()));
        }
        let mut stream = match UnixStream::connect(&info.socket) {
            Ok(s) => s,
            Err(e) => return NotAsked(format!("{}: {e}", info.socket.display())),
        };
        let peer =
            nix::sys::socket::getsockopt(&stream, nix::sys::socket::sockopt::PeerCredentials)
                .map(|c| c.pid());
        match peer {
            Ok(p) if p == info.pid || info.listener_pid == Some(p) => {}
            Ok(p) => {
                return NotAsked(format!(
                    "the peer on {} is pid {p}, not the daemon pid {}",
                    info.socket.display(),
                    info.pid
                ))
            }
            Err(e) => return NotAsked(format!("cannot read the peer's credentials: {e}")),
        }
        let Some(ask) = ask() else {
            return NotAsked("the direct path reports what is wrong with the request".into());
        };
        let line = Line {
            id: 1,
            op: <Box<ExecAsk> as crate::protocol::OpRequest>::NAME,
            ask: &ask,
        };
        let mut bytes = match serde_json::to_vec(&line) {
            Ok(b) => b,
            Err(e) => return NotAsked(format!("cannot encode the request: {e}")),
        };
        bytes.push(b'\n');
        // A write that fails never delivered the newline: the daemon did not take the request.
        if let Err(e) = stream.write_all(&bytes) {
            return NotAsked(format!("cannot send the request: {e}"));
        }
        let mut reply = Vec::new();
        match BufReader::new(&stream).read_until(b'\n', &mut reply) {
            Ok(_) if reply.ends_with(b"\n") => {}
            Ok(_) => return DaemonAnswer::Lost("the daemon closed the connection".into()),
            Err(e) => return DaemonAnswer::Lost(format!("reading the answer: {e}")),
        }
        let reply: Reply = match serde_json::from_slice(&reply) {
            Ok(r) => r,
            Err(e) => return DaemonAnswer::Lost(format!("the answer does not parse: {e}")),
        };
        match (reply.result, reply.error) {
            (Some(a), None) => DaemonAnswer::Answered(a),
            (_, Some(e)) => match Code::parse(&e.code) {
                // A daemon that does not know the op (an older leash), or reads the request
                // otherwise: the direct path decides, and says what is wrong if anything is.
                Some(Code::UnknownOp | Code::BadRequest | Code::BadJson) | None => {
                    NotAsked(format!("the daemon refused the request: {}", e.message))
                }
                Some(c) => DaemonAnswer::Refused {
                    kind: c.kind(),
                    message: e.message,
                },
            },
            (None, None) => DaemonAnswer::Lost("the answer has neither result nor error".into()),
        }
    }
}
