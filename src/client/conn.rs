//! The thin client: finds the daemon that serves a state root (the lock file names its socket;
//! else the default `<state-dir>/leash.sock`), probes it by connecting, and sends requests.
//! The CLI uses it to go through the daemon when one runs and to work on the store directly
//! when none does.
//!
//! A socket is trusted only when it is the daemon's: its path is not a symlink, the lock file
//! `daemon.lock` is held (a daemon runs) and names a pid, and the peer on the other end of the
//! connection has that pid (`SO_PEERCRED`, from the kernel, not from anything the peer says) —
//! or, under socket activation, the pid of the service manager that listen()ed on the socket,
//! which the daemon read from its own listener and recorded beside its pid. A connection that
//! is accepted before any daemon holds the lock (socket activation starts the daemon on the
//! first connection) waits up to [`ACTIVATION_WAIT`] for one to.

use crate::controller::{CloseOutcome, LeaseRef, ReapReport};
use crate::daemon::LockInfo;
use crate::protocol::{
    self, ErrorData, Frame, LineReader, Message, OpRequest, StatusRequest, StreamItem, MAX_LINE,
};
use crate::state::StateRoot;
use leash_core::kind::{Code, HasKind, Kind};
use leash_core::model::LeaseState;
use leash_core::plan::ReapPlan;
use serde::de::DeserializeOwned;
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
    #[error("{0} is a symbolic link; not trusting it as the daemon's socket (remove it, or give the real path with --socket)")]
    SymlinkSocket(PathBuf),
    #[error("no daemon holds {lock}, so the process answering on {socket} is not this state root's daemon; not trusting it (is it a stale or foreign socket? remove it)")]
    NoDaemon { socket: PathBuf, lock: PathBuf },
    #[error("the process on {socket} is pid {peer}, not the daemon pid {recorded} recorded in {lock}; not trusting it")]
    NotTheDaemon {
        socket: PathBuf,
        lock: PathBuf,
        peer: i32,
        recorded: i32,
    },
    /// The daemon answered with an error.
    #[error("{message}")]
    Remote {
        code: String,
        message: String,
        /// The error's other fields (`oldestSeq`, `exitStatus`, …).
        data: Box<ErrorData>,
    },
    /// The daemon's reply is not the type the request has (another leash version?).
    #[error("the daemon's {op} reply does not parse ({source}); is it another leash version?")]
    Reply {
        op: String,
        #[source]
        source: serde_json::Error,
    },
}

impl HasKind for ClientError {
    /// A daemon's error reply has the kind of its wire code; a connection that failed or a reply
    /// that does not parse is internal.
    fn kind(&self) -> Kind {
        self.code().map_or(Kind::Internal, |c| c.kind())
    }
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

/// How long a connection that a socket accepted waits for a daemon to hold the lock and name
/// itself (socket activation: the first connection starts the daemon, which reaps first).
pub const ACTIVATION_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// The pid of the daemon holding the lock file, if one holds it: the file is not a symlink, a
/// shared lock on it cannot be taken (the daemon's exclusive lock is held), and it names a pid.
pub(super) fn daemon_pid(lock: &Path) -> Option<LockInfo> {
    let text = std::fs::read_to_string(lock).ok()?;
    if !crate::state::daemon_lock_held(lock) {
        return None;
    }
    serde_json::from_str::<LockInfo>(&text)
        .ok()
        .filter(|l| l.pid > 0)
}

/// The socket a daemon of this state root listens on.
pub fn socket_for(root: &StateRoot) -> PathBuf {
    std::fs::read_to_string(root.daemon_lock_path())
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

    /// Connects to `socket` itself, never through a symlink at its path (a link is refused,
    /// whatever it points at).
    pub fn connect_unfollowed(socket: &Path) -> Result<Client, ClientError> {
        if std::fs::symlink_metadata(socket).is_ok_and(|m| m.file_type().is_symlink()) {
            return Err(ClientError::SymlinkSocket(socket.to_path_buf()));
        }
        Client::connect(socket)
    }

    /// Connects to `socket` and keeps the connection only if the peer is the daemon that holds
    /// `root`'s lock file (see the module header).
    pub fn connect_to_daemon(root: &StateRoot, socket: &Path) -> Result<Client, ClientError> {
        // Nothing listening (no daemon, or a stale socket of a killed one) is an I/O error.
        let client = Client::connect_unfollowed(socket)?;
        let lock = root.daemon_lock_path();
        let peer = nix::sys::socket::getsockopt(
            &client.stream,
            nix::sys::socket::sockopt::PeerCredentials,
        )
        .map_err(|e| ClientError::Io {
            socket: socket.to_path_buf(),
            source: io::Error::from(e),
        })?
        .pid();
        // The socket accepted us: a daemon runs, or one is being started by socket activation
        // (it names itself in the lock once its start-up reap is done), or the socket is not
        // this root's. Only the last case waits the whole ACTIVATION_WAIT before the refusal.
        let deadline = std::time::Instant::now() + ACTIVATION_WAIT;
        loop {
            let err = match daemon_pid(&lock) {
                Some(info) if info.pid == peer || info.listener_pid == Some(peer) => {
                    return Ok(client)
                }
                Some(info) => ClientError::NotTheDaemon {
                    socket: socket.to_path_buf(),
                    lock: lock.clone(),
                    peer,
                    recorded: info.pid,
                },
                None => ClientError::NoDaemon {
                    socket: socket.to_path_buf(),
                    lock: lock.clone(),
                },
            };
            if std::time::Instant::now() >= deadline {
                return Err(err);
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    /// The daemon serving `root`, or `None` when nothing answers on its socket (no daemon, or a
    /// stale socket left by a killed one). A socket that answers but is not the daemon's is
    /// not used (a warning says why).
    pub fn probe(root: &StateRoot) -> Option<Client> {
        let socket = socket_for(root);
        match Client::connect_to_daemon(root, &socket) {
            Ok(c) => Some(c),
            Err(ClientError::Io { .. }) => None,
            Err(e) => {
                tracing::warn!(error = %e, "working on the state database directly");
                None
            }
        }
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Bounds how long a read waits for the daemon (`None`: forever), for callers that read a
    /// stream only up to a point they know of (`leash mcp` reading an attach's replay).
    pub fn set_read_timeout(&self, timeout: Option<std::time::Duration>) -> io::Result<()> {
        self.stream.set_read_timeout(timeout)
    }

    /// Sends one request (`fields` is an object; `id` and `op` are added) and reads the `result`
    /// of its reply as `T` (a type of `protocol/reply.rs`). Stream items are skipped.
    pub fn request<T: DeserializeOwned>(
        &mut self,
        op: &str,
        fields: Value,
    ) -> Result<T, ClientError> {
        let v = self.call(op, fields)?;
        serde_json::from_value(v).map_err(|source| ClientError::Reply {
            op: op.to_string(),
            source,
        })
    }

    /// Sends one request of the op `T` (see [`Client::request`]) and reads its reply as the
    /// type the op is answered with ([`OpRequest::Reply`]).
    pub fn op<T: OpRequest>(&mut self, fields: Value) -> Result<T::Reply, ClientError>
    where
        T::Reply: DeserializeOwned,
    {
        self.request(T::NAME, fields)
    }

    /// `status`.
    pub fn status(&mut self) -> Result<protocol::Status, ClientError> {
        self.op::<StatusRequest>(json!({}))
    }

    /// `leases`, of one state or all.
    pub fn leases(
        &mut self,
        state: Option<LeaseState>,
    ) -> Result<Vec<protocol::LeaseRow>, ClientError> {
        let fields = match state {
            Some(s) => json!({"state": s.as_str()}),
            None => json!({}),
        };
        self.op::<protocol::Leases>(fields)
    }

    /// `close` of these targets.
    pub fn close(
        &mut self,
        targets: &[LeaseRef],
        grace_ms: Option<u64>,
    ) -> Result<Vec<CloseOutcome>, ClientError> {
        let (mut leases, mut sessions) = (Vec::new(), Vec::new());
        for t in targets {
            match t {
                LeaseRef::Id(id) => leases.push(id.as_str()),
                LeaseRef::Session(k) => sessions.push(k.as_str()),
            }
        }
        self.op::<protocol::Close>(
            json!({"leases": leases, "sessions": sessions, "graceMs": grace_ms}),
        )
    }

    /// `cancel`, with the ACP session when the caller knows it.
    pub fn cancel(
        &mut self,
        target: &LeaseRef,
        acp: Option<&str>,
    ) -> Result<protocol::Cancelled, ClientError> {
        let mut fields = target_fields(target);
        if let Some(acp) = acp {
            fields["acpSessionId"] = json!(acp);
        }
        self.op::<protocol::Cancel>(fields)
    }

    fn reap_fields(opts: &leash_core::plan::ReapOptions, dry_run: bool) -> Value {
        json!({
            "dryRun": dry_run,
            "includeLive": opts.include_live,
            "retentionMs": u64::try_from(opts.retention_ms).unwrap_or(0),
            "graceMs": opts.grace_ms,
        })
    }

    /// `reap {dryRun: true}`: the plan.
    pub fn reap_plan(
        &mut self,
        opts: &leash_core::plan::ReapOptions,
    ) -> Result<ReapPlan, ClientError> {
        self.request(protocol::Reap::NAME, Self::reap_fields(opts, true))
    }

    /// `reap`: the report.
    pub fn reap(
        &mut self,
        opts: &leash_core::plan::ReapOptions,
    ) -> Result<ReapReport, ClientError> {
        self.request(protocol::Reap::NAME, Self::reap_fields(opts, false))
    }

    /// `verify`.
    pub fn verify(
        &mut self,
        target: &LeaseRef,
    ) -> Result<leash_core::answer::VerifyReport, ClientError> {
        self.op::<protocol::Verify>(target_fields(target))
    }

    /// `sessions` with a `query` (`list`, `history` or `status`), as `view`'s requester: the
    /// answer `leash sessions QUERY --json` prints.
    pub fn sessions_query<T: DeserializeOwned>(
        &mut self,
        view: &crate::controller::sessions::View,
        query: &str,
        key: Option<&str>,
    ) -> Result<T, ClientError> {
        use leash_core::visibility::A2aPolicy;
        let mut req = json!({
            "query": query,
            "requesterSessionKey": view.requester,
            "visibility": view.scope.visibility.as_str(),
            "sandboxed": view.scope.sandboxed,
        });
        match &view.scope.a2a {
            A2aPolicy::Off => req["a2a"] = false.into(),
            A2aPolicy::On { rules } => {
                req["a2a"] = true.into();
                req["a2aAllow"] = rules.iter().map(|r| r.to_string()).collect();
            }
        }
        if let Some(k) = key {
            req["session"] = k.into();
        }
        self.request(protocol::SessionsRequest::NAME, req)
    }

    /// `send`.
    pub fn send(
        &mut self,
        key: &str,
        line: &str,
    ) -> Result<crate::controller::session_input::Sent, ClientError> {
        self.op::<protocol::Send>(json!({"session": key, "line": line}))
    }

    /// `attach`: its reply; the items follow ([`Client::next_item`]), tagged with the id this
    /// request got (the last one sent).
    pub fn attach(&mut self, key: &str, since: i64) -> Result<protocol::Attached, ClientError> {
        self.op::<protocol::Attach>(json!({"session": key, "since": since}))
    }

    /// The next stream item (replies to other requests are skipped).
    pub fn next_item(&mut self) -> Result<StreamItem, ClientError> {
        loop {
            let m = self.next_message()?;
            if m.ok.is_some() {
                continue;
            }
            let fields = Value::Object(m.rest);
            return serde_json::from_value(fields).map_err(|source| ClientError::Reply {
                op: "stream item".into(),
                source,
            });
        }
    }

    /// Sends one request and returns its reply's `result` as it came; [`Client::request`] reads
    /// it as its type.
    fn call(&mut self, op: &str, fields: Value) -> Result<Value, ClientError> {
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
        let id = json!(id);
        loop {
            let m = self.next_message()?;
            if m.id != id {
                continue;
            }
            match m.into_reply() {
                None => continue,
                Some(Ok(result)) => return Ok(result),
                Some(Err(e)) => {
                    return Err(ClientError::Remote {
                        code: e.code,
                        message: e.message,
                        data: Box::new(e.data),
                    })
                }
            }
        }
    }

    /// The next line from the daemon, parsed.
    fn next_message(&mut self) -> Result<Message, ClientError> {
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

/// `{"lease": id}` or `{"session": key}`.
fn target_fields(t: &LeaseRef) -> Value {
    match t {
        LeaseRef::Id(id) => json!({"lease": id}),
        LeaseRef::Session(k) => json!({"session": k}),
    }
}
