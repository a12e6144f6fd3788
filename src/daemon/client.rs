//! The thin client: finds the daemon that serves a state root (the lock file names its socket;
//! else the default `<state-dir>/leash.sock`), probes it by connecting, and sends requests.
//! The CLI uses it to go through the daemon when one runs and to work on the store directly
//! when none does.

use super::protocol::{Code, Frame, LineReader, MAX_LINE};
use super::{lock_path, LockInfo};
use crate::state::StateRoot;
use serde_json::{json, Value};
use std::io::{self, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot talk to the daemon on {socket}: {source}")]
    Io {
        socket: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("the daemon closed the connection before answering")]
    Closed,
    #[error("the daemon's reply is not valid: {0}")]
    Protocol(String),
    /// The daemon answered with an error.
    #[error("{message}")]
    Remote {
        code: String,
        message: String,
        error: Value,
    },
}

impl ClientError {
    /// The protocol error code, when the daemon answered with one.
    pub fn code(&self) -> Option<Code> {
        match self {
            ClientError::Remote { code, .. } => Code::parse(code),
            _ => None,
        }
    }
}

/// The socket a daemon of this state root listens on.
pub fn socket_for(root: &StateRoot) -> PathBuf {
    std::fs::read_to_string(lock_path(root))
        .ok()
        .and_then(|t| serde_json::from_str::<LockInfo>(&t).ok())
        .map(|l| l.socket)
        .unwrap_or_else(|| root.socket_path())
}

pub struct Client {
    socket: PathBuf,
    stream: UnixStream,
    reader: LineReader<UnixStream>,
    next_id: u64,
}

impl Client {
    pub fn connect(socket: &Path) -> Result<Client, ClientError> {
        let io_err = |source| ClientError::Io {
            socket: socket.to_path_buf(),
            source,
        };
        let stream = UnixStream::connect(socket).map_err(io_err)?;
        let reader = LineReader::new(stream.try_clone().map_err(io_err)?, 64 * MAX_LINE);
        Ok(Client {
            socket: socket.to_path_buf(),
            stream,
            reader,
            next_id: 1,
        })
    }

    /// The daemon serving `root`, or `None` when nothing answers on its socket (no daemon, or a
    /// stale socket left by a killed one).
    pub fn probe(root: &StateRoot) -> Option<Client> {
        Client::connect(&socket_for(root)).ok()
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Bounds how long a read waits for the daemon (`None`: forever), for callers that read a
    /// stream only up to a point they know of (`leash mcp` reading an attach's replay).
    pub fn set_read_timeout(&self, timeout: Option<std::time::Duration>) -> io::Result<()> {
        self.stream.set_read_timeout(timeout)
    }

    /// Sends one request (`fields` is an object; `id` and `op` are added) and returns the
    /// `result` of its reply. Stream items of other requests are skipped.
    pub fn call(&mut self, op: &str, fields: Value) -> Result<Value, ClientError> {
        let id = self.next_id;
        self.next_id += 1;
        let mut req = match fields {
            Value::Object(m) => m,
            Value::Null => serde_json::Map::new(),
            other => {
                return Err(ClientError::Protocol(format!(
                    "fields must be an object, not {other}"
                )))
            }
        };
        req.insert("id".into(), json!(id));
        req.insert("op".into(), json!(op));
        let mut line = serde_json::to_vec(&Value::Object(req)).expect("serialisable");
        line.push(b'\n');
        self.stream
            .write_all(&line)
            .map_err(|source| ClientError::Io {
                socket: self.socket.clone(),
                source,
            })?;
        loop {
            let v = self.next_message()?;
            if v["id"] != json!(id) || v.get("ok").is_none() {
                continue;
            }
            if v["ok"] == true {
                return Ok(v.get("result").cloned().unwrap_or(Value::Null));
            }
            let error = v.get("error").cloned().unwrap_or(Value::Null);
            return Err(ClientError::Remote {
                code: error["code"].as_str().unwrap_or("internal").to_string(),
                message: error["message"]
                    .as_str()
                    .unwrap_or("the daemon reported an error without a message")
                    .to_string(),
                error,
            });
        }
    }

    /// The next line from the daemon, parsed.
    pub fn next_message(&mut self) -> Result<Value, ClientError> {
        loop {
            match self.reader.next_frame() {
                Ok(Some(Frame::Line(l))) if l.is_empty() => continue,
                Ok(Some(Frame::Line(l))) => {
                    return serde_json::from_slice(&l)
                        .map_err(|e| ClientError::Protocol(e.to_string()))
                }
                Ok(Some(Frame::TooLong)) => {
                    return Err(ClientError::Protocol("a reply line is too long".into()))
                }
                Ok(None) => return Err(ClientError::Closed),
                Err(source) => {
                    return Err(ClientError::Io {
                        socket: self.socket.clone(),
                        source,
                    })
                }
            }
        }
    }
}
