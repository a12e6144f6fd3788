//! The daemon's wire protocol: newline-delimited JSON over a Unix socket (see `docs/protocol.md`).
//!
//! Everything here is pure: [`parse_request`] turns one line into a [`Request`] or a
//! [`ProtoError`] that already knows its error code and, when it could be read, the request id,
//! so a malformed line always gets a reply and never takes the connection down. [`LineReader`]
//! frames a byte stream into lines with a hard length limit, and the `*_line` functions render
//! replies. A fuzz target can call [`parse_request`] on arbitrary bytes.
//!
//! The replies and stream items themselves are types, in `reply.rs`: the daemon builds them,
//! the client reads them back into the same types.

mod reply;
pub use reply::*;

use crate::kind::Kind;
use leash_core::visibility::{A2aPolicy, A2aRule, Scope, Visibility};
use serde::Deserialize;
use serde_json::{Map, Value};
use std::io::{self, Read};

/// The longest request line accepted, newline excluded.
pub const MAX_LINE: usize = 1 << 20;

/// Error codes, as they appear on the wire (`error.code`). Documented in `docs/protocol.md`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    /// The line is not valid UTF-8.
    BadUtf8,
    /// The line is not a JSON object.
    BadJson,
    /// The line is longer than [`MAX_LINE`] bytes; it was discarded up to its newline.
    LineTooLong,
    /// A field is missing, unknown, of the wrong type, or has a bad value.
    BadRequest,
    /// `op` names no operation.
    UnknownOp,
    /// No such session or lease.
    NotFound,
    /// The requester may not see that session.
    NotVisible,
    /// The request conflicts with the current state (a lease held by someone else, a session
    /// being started or closed, …).
    Conflict,
    /// The session exists but is not running (closing or ended): nothing was written.
    NotRunning,
    /// The requested `since` fell out of the replay buffer.
    SeqEvicted,
    /// The adapter could not be started.
    SpawnFailed,
    /// The adapter started but exited before its first line of output (whenever that was).
    StartFailed,
    /// `ensure`: a `close` of the key arrived while this ensure was starting it, and closed what
    /// it started.
    Closed,
    /// The peer runs as another user.
    Forbidden,
    /// The daemon is shutting down and takes no new sessions.
    ShuttingDown,
    /// `send`: the adapter did not read its stdin before the send's timeout.
    SendTimeout,
    /// `send`/`attach`: the session runs under a lease this daemon did not start (`leash
    /// exec`): only sessions started with `ensure` take input or stream output.
    NotSupervised,
    /// `ensure` with `initialize`: the adapter did not answer the `initialize` the daemon sent
    /// within `handshakeTimeoutMs`; the session was closed (TERM, grace, KILL).
    HandshakeTimeout,
    /// Anything else (database, I/O); the message says what failed.
    Internal,
}

/// The wire-code table: each code's name on the wire and the [`Kind`] of failure it is (which
/// gives the CLI's exit code through [`crate::kind::KINDS`]). The only place a code is named.
pub const CODES: [(Code, &str, Kind); 19] = [
    (Code::BadUtf8, "bad_utf8", Kind::Usage),
    (Code::BadJson, "bad_json", Kind::Usage),
    (Code::LineTooLong, "line_too_long", Kind::Usage),
    (Code::BadRequest, "bad_request", Kind::Usage),
    (Code::UnknownOp, "unknown_op", Kind::Usage),
    (Code::NotFound, "not_found", Kind::NotFound),
    (Code::NotVisible, "not_visible", Kind::NotVisible),
    (Code::Conflict, "conflict", Kind::Conflict),
    (Code::NotRunning, "not_running", Kind::Conflict),
    (Code::SeqEvicted, "seq_evicted", Kind::Internal),
    (Code::SpawnFailed, "spawn_failed", Kind::SpawnFailed),
    (Code::StartFailed, "start_failed", Kind::SpawnFailed),
    (Code::Closed, "closed", Kind::Conflict),
    (Code::Forbidden, "forbidden", Kind::Internal),
    (Code::ShuttingDown, "shutting_down", Kind::Conflict),
    (Code::SendTimeout, "send_timeout", Kind::Internal),
    // A session `leash exec` started has no stdin the daemon could write to: a conflict with
    // how it runs, not a missing daemon.
    (Code::NotSupervised, "not_supervised", Kind::Conflict),
    // The adapter never became usable: a failed start, as the CLI counts it.
    (
        Code::HandshakeTimeout,
        "handshake_timeout",
        Kind::SpawnFailed,
    ),
    (Code::Internal, "internal", Kind::Internal),
];

impl Code {
    fn row(self) -> &'static (Code, &'static str, Kind) {
        CODES
            .iter()
            .find(|r| r.0 == self)
            .expect("every code has a row in CODES (a unit test checks it)")
    }

    pub fn as_str(self) -> &'static str {
        self.row().1
    }

    pub fn parse(s: &str) -> Option<Code> {
        CODES.iter().find(|r| r.1 == s).map(|r| r.0)
    }

    /// The kind of failure this code reports.
    pub fn kind(self) -> Kind {
        self.row().2
    }

    /// The code a failure of `kind` is sent with: the code whose name is the kind's cause word
    /// (`not_found`, `conflict`, …); `internal` for the kinds only the CLI has (`unverified`,
    /// `daemon_needed`, `dead`).
    pub fn of(kind: Kind) -> Code {
        Code::parse(kind.cause()).unwrap_or(Code::Internal)
    }
}

impl std::fmt::Display for Code {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A request that could not be parsed, with what is needed to answer it.
#[derive(Debug, Clone, PartialEq)]
pub struct ProtoError {
    /// The request's id when it could be read, else `null`.
    pub id: Value,
    pub code: Code,
    pub message: String,
}

impl ProtoError {
    fn new(id: &Value, code: Code, message: impl Into<String>) -> ProtoError {
        ProtoError {
            id: id.clone(),
            code,
            message: message.into(),
        }
    }
}

/// One parsed request.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// Echoed in the reply and in every stream item: a string or a number.
    pub id: Value,
    pub op: Op,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Op {
    Status,
    // Boxed: the largest request by far, and every other op would pay its size.
    Ensure(Box<Ensure>),
    Send(Send),
    Attach(Attach),
    Cancel(Cancel),
    Close(Close),
    Reap(Reap),
    Leases(Leases),
    Sessions(SessionsRequest),
    Events(Events),
    /// Is this lease's process alive and ours, dead, or unknowable? (`leash verify`)
    Verify(LeaseRef),
    /// The metrics in the OpenMetrics text format (as `--metrics` serves them over HTTP).
    Metrics,
    Hello(Hello),
    Ping,
    Detach(Detach),
}

impl Op {
    /// The op's name on the wire (a label of the request metrics).
    pub fn name(&self) -> &'static str {
        match self {
            Op::Status => "status",
            Op::Ensure(_) => "ensure",
            Op::Send(_) => "send",
            Op::Attach(_) => "attach",
            Op::Cancel(_) => "cancel",
            Op::Close(_) => "close",
            Op::Reap(_) => "reap",
            Op::Leases(_) => "leases",
            Op::Sessions(_) => "sessions",
            Op::Events(_) => "events",
            Op::Verify(_) => "verify",
            Op::Metrics => "metrics",
            Op::Hello(_) => "hello",
            Op::Ping => "ping",
            Op::Detach(_) => "detach",
        }
    }
}

/// The operation names, in the order `docs/protocol.md` lists them.
pub const OPS: &[&str] = &[
    "status", "ensure", "send", "attach", "cancel", "close", "reap", "leases", "sessions",
    "events", "verify", "metrics", "hello", "ping", "detach",
];

/// The protocol version `hello` reports. Additions that old clients can ignore (a new op, a new
/// optional field, a new stream item a client asks for) are announced as features instead.
pub const PROTOCOL_VERSION: u32 = 1;

/// `hello`: the client says who it is and may subscribe the connection to lifecycle pushes.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Hello {
    /// The client's name and version, for the daemon's log.
    #[serde(default)]
    pub client: Option<String>,
    /// The protocol version the client speaks (informational: the daemon answers with its own).
    #[serde(default)]
    pub protocol: Option<u32>,
    /// Push lifecycle items (`resumable`) on this connection, tagged with this request's id.
    #[serde(default)]
    pub events: bool,
}

/// `detach`: ends the attach whose request id is `attach_id`, on this connection.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Detach {
    pub attach_id: Value,
}

/// Spawn a session's adapter under a lease, or return the running one.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Ensure {
    pub session: String,
    /// Empty when the request gave none: the session's stored spec is used (resume).
    #[serde(default)]
    pub argv: Vec<String>,
    #[serde(default)]
    pub cwd: Option<String>,
    /// Added to (or overriding) the daemon's environment, after the scrub: a name set here
    /// reaches the adapter whatever `unsetEnv`, `clearEnv` and the default scrub say.
    #[serde(default)]
    pub env: std::collections::BTreeMap<String, String>,
    /// Removed from the daemon's environment (beside the default scrub of provider credentials,
    /// [`crate::envpolicy::PROVIDER_CREDENTIALS`]).
    #[serde(default)]
    pub unset_env: Vec<String>,
    /// Start from an empty environment: only `keepEnv`, `env` and the lease markers pass.
    #[serde(default)]
    pub clear_env: bool,
    /// With `clearEnv`: the daemon's variables that pass; without: names spared from the
    /// default scrub (e.g. `["ANTHROPIC_API_KEY"]` for an adapter that needs the gateway's key).
    #[serde(default)]
    pub keep_env: Vec<String>,
    #[serde(default)]
    pub agent: Option<String>,
    #[serde(default)]
    pub owner: Option<String>,
    #[serde(default)]
    pub spawned_by: Option<String>,
    #[serde(default)]
    pub parent: Option<String>,
    #[serde(default)]
    pub grace_ms: Option<u64>,
    /// Limits of the session's cgroup (`leash exec --memory-max` etc.): bytes, a count, and
    /// `cpu.max` as CPUs ("0.5") or "QUOTA PERIOD". Refused where they cannot be enforced.
    #[serde(default)]
    pub memory_max: Option<u64>,
    #[serde(default)]
    pub pids_max: Option<u64>,
    #[serde(default)]
    pub cpu_max: Option<String>,
    /// Keep this spec in the state database so `ensure {session}` can re-spawn it (default true).
    #[serde(default = "yes")]
    pub persist_spec: bool,
    /// Store the values of `env` with the spec (default false: only their names are stored,
    /// and `ensure {session}` must give `env` again with a value for each).
    #[serde(default)]
    pub persist_env: bool,
    /// How long `ensure` waits for a new adapter's first line of output (default `serve
    /// --ensure-wait-ms`, 0): an exit before it within the wait is the ensure's `start_failed`
    /// (after it, the stream's `start_failed` end). At most [`crate::limits::MAX_ENSURE_WAIT_MS`].
    #[serde(default)]
    pub wait_ms: Option<u64>,
    /// How long this ensure waits behind an ensure of the same key in flight (FIFO, at most 16
    /// queued) before it answers `conflict` (default 120000; 0: at once). At most
    /// [`crate::limits::MAX_ENSURE_QUEUE_MS`].
    #[serde(default)]
    pub queue_timeout_ms: Option<u64>,
    /// The params of the ACP `initialize` request the daemon sends a new adapter itself (id
    /// `"leash-handshake"`) before it answers: the reply carries the response (`initialize`), or
    /// the ensure fails `handshake_timeout` and the session is closed. Per call, never stored.
    #[serde(default)]
    pub initialize: Option<Value>,
    /// How long that `initialize` may go unanswered (default 30000 with `initialize`; needs
    /// `initialize`). At most [`crate::limits::MAX_HANDSHAKE_TIMEOUT_MS`].
    #[serde(default)]
    pub handshake_timeout_ms: Option<u64>,
}

fn yes() -> bool {
    true
}

impl Ensure {
    /// True when the request names no adapter and the stored spec is meant.
    pub fn wants_stored_spec(&self) -> bool {
        self.argv.is_empty()
    }
}

/// Write one line to the adapter's stdin.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Send {
    pub session: String,
    pub line: String,
    /// How long to wait for an adapter that does not read its stdin (default
    /// [`SEND_TIMEOUT_MS`], at most [`MAX_SEND_TIMEOUT_MS`]).
    #[serde(default)]
    pub timeout_ms: Option<u64>,
}

/// Default `send` timeout.
pub const SEND_TIMEOUT_MS: u64 = 10_000;
/// Longest `send` timeout a request may ask for.
pub const MAX_SEND_TIMEOUT_MS: u64 = 600_000;

/// Stream the adapter's output and lifecycle events with a seq above `since`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Attach {
    pub session: String,
    #[serde(default)]
    pub since: i64,
    /// Also stream the adapter's stderr lines (`stderr` items); off for clients that predate them.
    #[serde(default)]
    pub stderr: bool,
}

/// A request names a lease by id (`lease`), or as the active lease of a session (`session`):
/// the library's one name for that, [`LeaseRef`].
pub use crate::controller::LeaseRef;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cancel {
    pub target: LeaseRef,
    /// The ACP session whose turn is cancelled; inferred when the daemon knows exactly one.
    pub acp_session_id: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Close {
    pub targets: Vec<LeaseRef>,
    pub grace_ms: Option<u64>,
    /// Also delete what the daemon keeps to resume the sessions (their stored specs, their
    /// resumable entries): the design's `closeSession({discardPersistentState})`.
    pub discard_persistent_state: bool,
    /// Why the gateway closes (logged with the close).
    pub reason: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Reap {
    #[serde(default)]
    pub dry_run: bool,
    #[serde(default)]
    pub include_live: bool,
    /// Closed and lost leases older than this are deleted (default 7 days).
    #[serde(default)]
    pub retention_ms: Option<u64>,
    #[serde(default)]
    pub grace_ms: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Leases {
    #[serde(default)]
    pub state: Option<String>,
}

/// The visibility inputs of a session listing (the seed's `SessionVisibilityInput`); checked by
/// [`leash_core::visibility`], the same check `leash sessions` uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionsRequest {
    /// Without a requester every row is listed (an operator's view).
    pub requester: Option<String>,
    pub scope: Scope,
    /// `leash sessions list|history|status` run in the daemon (same answers, same JSON as the
    /// CLI's `--json`); `None` is the plain row listing.
    pub query: Option<SessionQuery>,
}

/// One of the `leash sessions` read operations, asked of the daemon by the thin client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionQuery {
    List,
    History(String),
    Status(String),
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawSessions {
    #[serde(default)]
    requester_session_key: Option<String>,
    #[serde(default)]
    visibility: Option<String>,
    #[serde(default)]
    a2a: Option<bool>,
    #[serde(default)]
    a2a_allow: Vec<String>,
    #[serde(default)]
    sandboxed: bool,
    #[serde(default)]
    query: Option<String>,
    #[serde(default)]
    session: Option<String>,
}

/// The lifecycle events persisted for a session, with a seq above `since`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Events {
    pub session: String,
    #[serde(default)]
    pub since: i64,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawTarget {
    #[serde(default)]
    session: Option<String>,
    #[serde(default)]
    lease: Option<String>,
    #[serde(default)]
    acp_session_id: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawVerify {
    #[serde(default)]
    session: Option<String>,
    #[serde(default)]
    lease: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawClose {
    #[serde(default)]
    session: Option<String>,
    #[serde(default)]
    lease: Option<String>,
    #[serde(default)]
    sessions: Vec<String>,
    #[serde(default)]
    leases: Vec<String>,
    #[serde(default)]
    grace_ms: Option<u64>,
    #[serde(default)]
    discard_persistent_state: bool,
    #[serde(default)]
    reason: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NoFields {}

/// Parses one request line (without its newline). Pure: no I/O, no allocation beyond the
/// result, any input gives `Ok` or a [`ProtoError`] (never a panic).
pub fn parse_request(line: &[u8]) -> Result<Request, ProtoError> {
    let null = Value::Null;
    if line.len() > MAX_LINE {
        return Err(ProtoError::new(
            &null,
            Code::LineTooLong,
            format!(
                "request line of {} bytes exceeds the limit of {MAX_LINE}",
                line.len()
            ),
        ));
    }
    let text = std::str::from_utf8(line).map_err(|e| {
        ProtoError::new(
            &null,
            Code::BadUtf8,
            format!("request is not valid UTF-8 ({e})"),
        )
    })?;
    // Strict: an object with a key twice is refused (serde_json would keep the last one).
    let value: Value = super::strict_json::parse(text).map_err(|e| {
        let code = if e.to_string().starts_with("duplicate key") {
            Code::BadRequest
        } else {
            Code::BadJson
        };
        ProtoError::new(&null, code, format!("request is not valid JSON: {e}"))
    })?;
    let Value::Object(mut map) = value else {
        return Err(ProtoError::new(
            &null,
            Code::BadJson,
            "request must be a JSON object like {\"id\": 1, \"op\": \"status\"}",
        ));
    };
    let id = match map.remove("id") {
        Some(v @ Value::String(_)) => v,
        // Only integers that read back exactly: a larger number (or a fraction) would come back
        // as a float the client could not match with its request.
        Some(Value::Number(n)) if n.is_i64() || n.is_u64() => Value::Number(n),
        Some(Value::Number(n)) => {
            return Err(ProtoError::new(
                &null,
                Code::BadRequest,
                format!(
                    "\"id\" {n} is not an integer between -2^63 and 2^64-1; use such an integer or a string"
                ),
            ))
        }
        Some(other) => {
            return Err(ProtoError::new(
                &null,
                Code::BadRequest,
                format!(
                    "\"id\" must be a string or a number, not {}",
                    kind_of(&other)
                ),
            ))
        }
        None => {
            return Err(ProtoError::new(
                &null,
                Code::BadRequest,
                "missing \"id\" (a string or number echoed in the reply)",
            ))
        }
    };
    let op = match map.remove("op") {
        Some(Value::String(s)) => s,
        Some(other) => {
            return Err(ProtoError::new(
                &id,
                Code::BadRequest,
                format!("\"op\" must be a string, not {}", kind_of(&other)),
            ))
        }
        None => {
            return Err(ProtoError::new(
                &id,
                Code::BadRequest,
                format!("missing \"op\" (one of: {})", OPS.join(", ")),
            ))
        }
    };
    let op = parse_op(&op, map).map_err(|(code, msg)| ProtoError::new(&id, code, msg))?;
    Ok(Request { id, op })
}

fn parse_op(op: &str, fields: Map<String, Value>) -> Result<Op, (Code, String)> {
    let fields = Value::Object(fields);
    Ok(match op {
        "status" => {
            let _: NoFields = fields_of(op, fields)?;
            Op::Status
        }
        "ensure" => {
            let argv_given = fields.get("argv").is_some();
            let e: Ensure = fields_of(op, fields)?;
            check_key("session", &e.session)?;
            if !argv_given {
                // `ensure {session}`: the stored spec says everything; mixing is ambiguous.
                // `env` is the exception: it carries the values of a spec stored without them.
                let spec_fields = e.cwd.is_some()
                    || !e.unset_env.is_empty()
                    || e.clear_env
                    || !e.keep_env.is_empty()
                    || e.persist_env
                    || e.agent.is_some()
                    || e.owner.is_some()
                    || e.spawned_by.is_some()
                    || e.parent.is_some()
                    || e.grace_ms.is_some();
                if spec_fields {
                    return Err(bad(
                        "ensure: without \"argv\" the session's stored spec is used; give argv too, or drop cwd/unsetEnv/clearEnv/keepEnv/persistEnv/ownership/graceMs (only \"env\" may fill in the values of a spec stored without them)",
                    ));
                }
            } else if e.argv.is_empty() || e.argv[0].is_empty() {
                return Err(bad("ensure: \"argv\" must name a command"));
            }
            for a in &e.argv {
                no_nul("argv", a)?;
            }
            if let Some(cwd) = &e.cwd {
                no_nul("cwd", cwd)?;
                if !cwd.starts_with('/') {
                    return Err(bad("ensure: \"cwd\" must be an absolute path"));
                }
            }
            for (k, v) in &e.env {
                if k.is_empty() || k.contains('=') || k.contains('\0') {
                    return Err(bad(format!("ensure: bad environment variable name {k:?}")));
                }
                // They configure leash itself (which wrapper binary, which state root): not a
                // session's to choose.
                if k.starts_with("LEASH_") {
                    return Err(bad(format!(
                        "ensure: {k} configures leash itself and cannot be set per session"
                    )));
                }
                no_nul("env", v)?;
            }
            let policy = crate::envpolicy::EnvPolicy {
                unset: e.unset_env.clone(),
                clear: e.clear_env,
                keep: e.keep_env.clone(),
            };
            policy
                .validate(crate::envpolicy::ENSURE)
                .map_err(|err| bad(format!("ensure: {err}")))?;
            if let Some(k) = e.unset_env.iter().find(|k| e.env.contains_key(*k)) {
                return Err(bad(format!(
                    "ensure: {k} is both removed (unsetEnv) and set (env); name it in one of them"
                )));
            }
            if e.persist_env && !e.persist_spec {
                return Err(bad(
                    "ensure: persistEnv stores env values with the spec, and persistSpec: false stores no spec; drop one",
                ));
            }
            for (name, v) in [
                ("agent", &e.agent),
                ("owner", &e.owner),
                ("spawnedBy", &e.spawned_by),
                ("parent", &e.parent),
            ] {
                if let Some(v) = v {
                    check_key(name, v)?;
                }
            }
            check_ms(op, "graceMs", e.grace_ms, crate::limits::check_grace_ms)?;
            check_ms(op, "waitMs", e.wait_ms, crate::limits::check_ensure_wait_ms)?;
            check_ms(
                op,
                "queueTimeoutMs",
                e.queue_timeout_ms,
                crate::limits::check_ensure_queue_ms,
            )?;
            check_ms(
                op,
                "handshakeTimeoutMs",
                e.handshake_timeout_ms,
                crate::limits::check_handshake_ms,
            )?;
            match (&e.initialize, e.handshake_timeout_ms) {
                (Some(p), _) if !p.is_object() => {
                    return Err(bad(
                        "ensure: \"initialize\" must be an object: the params of the ACP initialize request the daemon sends",
                    ))
                }
                (None, Some(_)) => {
                    return Err(bad(
                        "ensure: \"handshakeTimeoutMs\" times the initialize request the daemon sends: give \"initialize\" (its params) too",
                    ))
                }
                _ => {}
            }
            // The limits by the CLI's own rules (`leash exec --memory-max/--pids-max/--cpu-max`),
            // here at the edge: a bad one is a bad request, never a failed spawn.
            check_ms(
                op,
                "memoryMax",
                e.memory_max,
                crate::limits::check_cgroup_limit,
            )?;
            check_ms(op, "pidsMax", e.pids_max, crate::limits::check_cgroup_limit)?;
            if let Some(c) = &e.cpu_max {
                crate::cgroup::parse_cpu_max(c)
                    .map_err(|err| bad(format!("{op}: \"cpuMax\": {err}")))?;
            }
            Op::Ensure(Box::new(e))
        }
        "send" => {
            let s: Send = fields_of(op, fields)?;
            check_key("session", &s.session)?;
            if s.timeout_ms
                .is_some_and(|t| t == 0 || t > MAX_SEND_TIMEOUT_MS)
            {
                return Err(bad(format!(
                    "send: \"timeoutMs\" must be between 1 and {MAX_SEND_TIMEOUT_MS}"
                )));
            }
            if s.line.contains(['\n', '\r']) {
                return Err(bad(
                    "send: \"line\" must be one line (no \\n or \\r): the adapter reads newline-framed messages",
                ));
            }
            Op::Send(s)
        }
        "attach" => {
            let a: Attach = fields_of(op, fields)?;
            check_key("session", &a.session)?;
            check_since(op, a.since)?;
            Op::Attach(a)
        }
        "cancel" => {
            let raw: RawTarget = fields_of(op, fields)?;
            let target = one_target(op, raw.session, raw.lease)?;
            if let Some(acp) = &raw.acp_session_id {
                check_key("acpSessionId", acp)?;
            }
            Op::Cancel(Cancel {
                target,
                acp_session_id: raw.acp_session_id,
            })
        }
        "close" => {
            let raw: RawClose = fields_of(op, fields)?;
            let mut targets: Vec<LeaseRef> = Vec::new();
            for s in raw.session.into_iter().chain(raw.sessions) {
                check_key("session", &s)?;
                targets.push(LeaseRef::Session(s));
            }
            for l in raw.lease.into_iter().chain(raw.leases) {
                check_key("lease", &l)?;
                targets.push(LeaseRef::Id(l));
            }
            if targets.is_empty() {
                return Err(bad(
                    "close: name a \"session\" or a \"lease\" (or lists \"sessions\"/\"leases\")",
                ));
            }
            check_ms(op, "graceMs", raw.grace_ms, crate::limits::check_grace_ms)?;
            if let Some(r) = &raw.reason {
                if r.chars().count() > 200 || r.chars().any(char::is_control) {
                    return Err(bad(
                        "close: \"reason\" must be one line of at most 200 characters",
                    ));
                }
            }
            Op::Close(Close {
                targets,
                grace_ms: raw.grace_ms,
                discard_persistent_state: raw.discard_persistent_state,
                reason: raw.reason,
            })
        }
        "reap" => {
            let r: Reap = fields_of(op, fields)?;
            check_ms(op, "graceMs", r.grace_ms, crate::limits::check_grace_ms)?;
            check_ms(
                op,
                "retentionMs",
                r.retention_ms,
                crate::limits::check_retention_ms,
            )?;
            Op::Reap(r)
        }
        "leases" => {
            let l: Leases = fields_of(op, fields)?;
            if let Some(s) = &l.state {
                s.parse::<crate::lease::LeaseState>()
                    .map_err(|e| bad(format!("leases: {e}")))?;
            }
            Op::Leases(l)
        }
        "sessions" => {
            let raw: RawSessions = fields_of(op, fields)?;
            if let Some(r) = &raw.requester_session_key {
                check_key("requesterSessionKey", r)?;
            }
            let visibility: Visibility = match &raw.visibility {
                Some(v) => v.parse().map_err(|e| bad(format!("sessions: {e}")))?,
                None => Visibility::Tree,
            };
            let rules = raw
                .a2a_allow
                .iter()
                .map(|r| r.parse::<A2aRule>())
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| bad(format!("sessions: {e}")))?;
            let a2a = match (raw.a2a, rules.is_empty()) {
                (Some(false), false) => {
                    return Err(bad("sessions: \"a2a\": false contradicts \"a2aAllow\""))
                }
                (Some(false), true) | (None, true) => A2aPolicy::Off,
                (Some(true), _) | (None, false) => A2aPolicy::On { rules },
            };
            let session = || {
                raw.session
                    .clone()
                    .ok_or_else(|| bad("sessions: this query needs \"session\""))
            };
            let query = match raw.query.as_deref() {
                None => None,
                Some("list") => Some(SessionQuery::List),
                Some("history") => Some(SessionQuery::History(session()?)),
                Some("status") => Some(SessionQuery::Status(session()?)),
                Some(other) => {
                    return Err(bad(format!(
                        "sessions: unknown query {other:?} (list, history or status)"
                    )))
                }
            };
            if let Some(k) = &raw.session {
                check_key("session", k)?;
            }
            if query.is_some() && raw.requester_session_key.is_none() {
                return Err(bad("sessions: a query needs \"requesterSessionKey\""));
            }
            Op::Sessions(SessionsRequest {
                requester: raw.requester_session_key,
                scope: Scope::new(visibility, a2a, raw.sandboxed),
                query,
            })
        }
        "events" => {
            let e: Events = fields_of(op, fields)?;
            check_key("session", &e.session)?;
            check_since(op, e.since)?;
            Op::Events(e)
        }
        "metrics" => {
            let _: NoFields = fields_of(op, fields)?;
            Op::Metrics
        }
        "verify" => {
            let raw: RawVerify = fields_of(op, fields)?;
            Op::Verify(one_target(op, raw.session, raw.lease)?)
        }
        "hello" => {
            let h: Hello = fields_of(op, fields)?;
            if let Some(c) = &h.client {
                check_key("client", c)?;
            }
            Op::Hello(h)
        }
        "ping" => {
            let _: NoFields = fields_of(op, fields)?;
            Op::Ping
        }
        "detach" => {
            let d: Detach = fields_of(op, fields)?;
            if !matches!(d.attach_id, Value::String(_) | Value::Number(_)) {
                return Err(bad(
                    "detach: \"attachId\" must be the id (a string or a number) of an attach on this connection",
                ));
            }
            Op::Detach(d)
        }
        other => {
            return Err((
                Code::UnknownOp,
                format!(
                    "unknown op {:?} (one of: {})",
                    truncate(other, 64),
                    OPS.join(", ")
                ),
            ))
        }
    })
}

fn fields_of<T: serde::de::DeserializeOwned>(op: &str, v: Value) -> Result<T, (Code, String)> {
    serde_json::from_value(v).map_err(|e| bad(format!("{op}: {e}")))
}

fn one_target(
    op: &str,
    session: Option<String>,
    lease: Option<String>,
) -> Result<LeaseRef, (Code, String)> {
    match (session, lease) {
        (Some(s), None) => {
            check_key("session", &s)?;
            Ok(LeaseRef::Session(s))
        }
        (None, Some(l)) => {
            check_key("lease", &l)?;
            Ok(LeaseRef::Id(l))
        }
        (Some(_), Some(_)) => Err(bad(format!(
            "{op}: give \"session\" or \"lease\", not both"
        ))),
        (None, None) => Err(bad(format!("{op}: missing \"session\" (or \"lease\")"))),
    }
}

fn bad(msg: impl Into<String>) -> (Code, String) {
    (Code::BadRequest, msg.into())
}

/// The one key rule ([`crate::limits::check_key`]), the field named as on the wire.
fn check_key(name: &str, v: &str) -> Result<(), (Code, String)> {
    crate::limits::check_key("key", v).map_err(|e| bad(format!("\"{name}\": {e}")))
}

/// A millisecond field against its real range ([`crate::limits`]): `bad_request` naming the range.
fn check_ms(
    op: &str,
    name: &str,
    v: Option<u64>,
    check: fn(&'static str, u64) -> Result<u64, crate::limits::ValueError>,
) -> Result<(), (Code, String)> {
    match v {
        Some(ms) => check("value", ms)
            .map(|_| ())
            .map_err(|e| bad(format!("{op}: \"{name}\": {e}"))),
        None => Ok(()),
    }
}

/// The one rule for `since` (`attach`, `events`): 0 (from the start) or a seq, never negative.
fn check_since(op: &str, since: i64) -> Result<(), (Code, String)> {
    if since < 0 {
        return Err(bad(format!(
            "{op}: \"since\" must be 0 or a seq, got {since}"
        )));
    }
    Ok(())
}

fn no_nul(name: &str, v: &str) -> Result<(), (Code, String)> {
    if v.contains('\0') {
        Err(bad(format!("\"{name}\" must not contain NUL")))
    } else {
        Ok(())
    }
}

fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn truncate(s: &str, n: usize) -> String {
    s.chars().take(n).collect()
}

// ---------------------------------------------------------------------------------------------
// Framing

/// What [`LineReader::next_frame`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// A complete line, without its `\n` (and without a `\r` before it).
    Line(Vec<u8>),
    /// A line longer than the limit; its bytes up to the next newline are discarded.
    TooLong,
}

/// Splits a byte stream into lines of at most `limit` bytes, never holding more than `limit`
/// plus one read's worth in memory: a longer line is reported once as [`Frame::TooLong`] and
/// skipped up to its newline, and the stream stays usable after it.
pub struct LineReader<R> {
    inner: R,
    buf: Vec<u8>,
    limit: usize,
    skipping: bool,
    eof: bool,
}

impl<R: Read> LineReader<R> {
    pub fn new(inner: R, limit: usize) -> LineReader<R> {
        LineReader {
            inner,
            buf: Vec::new(),
            limit,
            skipping: false,
            eof: false,
        }
    }

    /// The next frame; `Ok(None)` at end of stream (a final unterminated line is returned first).
    pub fn next_frame(&mut self) -> io::Result<Option<Frame>> {
        let mut scanned = 0;
        loop {
            if let Some(pos) = self.buf[scanned..].iter().position(|&b| b == b'\n') {
                let end = scanned + pos;
                let mut line: Vec<u8> = self.buf.drain(..=end).collect();
                line.pop();
                if self.skipping {
                    self.skipping = false;
                    scanned = 0;
                    continue;
                }
                if line.last() == Some(&b'\r') {
                    line.pop();
                }
                if line.len() > self.limit {
                    return Ok(Some(Frame::TooLong));
                }
                return Ok(Some(Frame::Line(line)));
            }
            scanned = self.buf.len();
            if self.skipping {
                self.buf.clear();
                scanned = 0;
            } else if self.buf.len() > self.limit + 1 {
                self.buf.clear();
                self.skipping = true;
                return Ok(Some(Frame::TooLong));
            }
            if self.eof {
                if self.buf.is_empty() || self.skipping {
                    return Ok(None);
                }
                let line = std::mem::take(&mut self.buf);
                return Ok(Some(Frame::Line(line)));
            }
            let mut chunk = [0u8; 64 * 1024];
            match self.inner.read(&mut chunk) {
                Ok(0) => self.eof = true,
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn code_of(line: &[u8]) -> Code {
        parse_request(line).unwrap_err().code
    }

    #[test]
    fn parses_every_op() {
        type Check = fn(&Op) -> bool;
        let cases: &[(&str, Check)] = &[
            (r#"{"id":1,"op":"status"}"#, |o| *o == Op::Status),
            (
                r#"{"id":"a","op":"ensure","session":"s","argv":["cat"],"env":{"A":"1"},"graceMs":5}"#,
                |o| matches!(o, Op::Ensure(e) if e.argv == ["cat"] && e.grace_ms == Some(5)),
            ),
            (
                r#"{"id":2,"op":"send","session":"s","line":"{}"}"#,
                |o| matches!(o, Op::Send(s) if s.line == "{}"),
            ),
            (
                r#"{"id":3,"op":"attach","session":"s","since":7}"#,
                |o| matches!(o, Op::Attach(a) if a.since == 7),
            ),
            (
                r#"{"id":4,"op":"cancel","session":"s","acpSessionId":"x"}"#,
                |o| matches!(o, Op::Cancel(c) if c.acp_session_id.as_deref() == Some("x")),
            ),
            (
                r#"{"id":5,"op":"close","lease":"L","sessions":["a","b"]}"#,
                |o| matches!(o, Op::Close(c) if c.targets.len() == 3),
            ),
            (
                r#"{"id":6,"op":"reap","dryRun":true}"#,
                |o| matches!(o, Op::Reap(r) if r.dry_run),
            ),
            (r#"{"id":7,"op":"leases","state":"open"}"#, |o| {
                matches!(o, Op::Leases(_))
            }),
            (
                r#"{"id":8,"op":"sessions","requesterSessionKey":"r","visibility":"self"}"#,
                |o| matches!(o, Op::Sessions(s) if s.scope.visibility == Visibility::SelfOnly),
            ),
            (r#"{"id":9,"op":"events","session":"s"}"#, |o| {
                matches!(o, Op::Events(_))
            }),
            (
                r#"{"id":10,"op":"verify","lease":"L"}"#,
                |o| matches!(o, Op::Verify(LeaseRef::Id(l)) if l == "L"),
            ),
            (r#"{"id":11,"op":"metrics"}"#, |o| matches!(o, Op::Metrics)),
            (
                r#"{"id":12,"op":"hello","client":"t/1","protocol":1,"events":true}"#,
                |o| matches!(o, Op::Hello(h) if h.events),
            ),
            (r#"{"id":13,"op":"ping"}"#, |o| *o == Op::Ping),
            (
                r#"{"id":14,"op":"detach","attachId":7}"#,
                |o| matches!(o, Op::Detach(d) if d.attach_id == 7),
            ),
        ];
        for (line, check) in cases {
            let r = parse_request(line.as_bytes()).unwrap_or_else(|e| panic!("{line}: {e:?}"));
            assert!(check(&r.op), "{line}: {:?}", r.op);
        }
        assert_eq!(OPS.len(), cases.len());
    }

    #[test]
    fn malformed_requests_get_codes_and_keep_the_id_when_readable() {
        assert_eq!(code_of(b"{nope"), Code::BadJson);
        assert_eq!(code_of(b"[1,2]"), Code::BadJson);
        assert_eq!(code_of(b"\"status\""), Code::BadJson);
        assert_eq!(code_of(b"{\"id\":1,\"op\":\"st\xffatus\"}"), Code::BadUtf8);
        assert_eq!(code_of(br#"{"op":"status"}"#), Code::BadRequest);
        assert_eq!(code_of(br#"{"id":[1],"op":"status"}"#), Code::BadRequest);
        let e = parse_request(br#"{"id":9,"op":"frobnicate"}"#).unwrap_err();
        assert_eq!((e.code, e.id), (Code::UnknownOp, Value::from(9)));
        let e = parse_request(br#"{"id":"x","op":"send","line":"a"}"#).unwrap_err();
        assert_eq!((e.code, e.id.clone()), (Code::BadRequest, Value::from("x")));
        assert!(e.message.contains("session"), "{}", e.message);
        assert_eq!(
            code_of(br#"{"id":1,"op":"status","extra":1}"#),
            Code::BadRequest
        );
        assert_eq!(
            code_of(br#"{"id":1,"op":"reap","dryrun":true}"#),
            Code::BadRequest
        );
        assert_eq!(
            code_of(br#"{"id":1,"op":"send","session":"s","line":"a\nb"}"#),
            Code::BadRequest
        );
        assert_eq!(
            code_of(br#"{"id":1,"op":"attach","session":"s","since":"x"}"#),
            Code::BadRequest
        );
        assert_eq!(
            code_of(br#"{"id":1,"op":"cancel","session":"s","lease":"l"}"#),
            Code::BadRequest
        );
        assert_eq!(
            code_of(br#"{"id":1,"op":"ensure","session":"s","argv":[]}"#),
            Code::BadRequest
        );
        assert_eq!(
            code_of(br#"{"id":1,"op":"ensure","session":"s","argv":["x"],"env":{"LEASH_WRAP_BIN":"/tmp/evil"}}"#),
            Code::BadRequest
        );
        assert_eq!(
            code_of(br#"{"id":1,"op":"ensure","session":"s","argv":["x"],"cwd":"rel"}"#),
            Code::BadRequest
        );
        assert_eq!(
            code_of(br#"{"id":1,"op":"leases","state":"gone"}"#),
            Code::BadRequest
        );
        assert_eq!(
            code_of(br#"{"id":1,"op":"sessions","visibility":"everything"}"#),
            Code::BadRequest
        );
        assert_eq!(
            code_of(br#"{"id":1,"op":"sessions","a2a":false,"a2aAllow":["a:b"]}"#),
            Code::BadRequest
        );
        let long = vec![b' '; MAX_LINE + 1];
        assert_eq!(code_of(&long), Code::LineTooLong);
    }

    #[test]
    fn close_takes_a_reason_and_discard_persistent_state() {
        let r = parse_request(
            br#"{"id":1,"op":"close","session":"s","reason":"user closed","discardPersistentState":true}"#,
        )
        .unwrap();
        assert!(
            matches!(&r.op, Op::Close(c) if c.discard_persistent_state && c.reason.as_deref() == Some("user closed")),
            "{:?}",
            r.op
        );
        let plain = parse_request(br#"{"id":1,"op":"close","session":"s"}"#).unwrap();
        assert!(
            matches!(&plain.op, Op::Close(c) if !c.discard_persistent_state && c.reason.is_none())
        );
        let long = format!(
            r#"{{"id":1,"op":"close","session":"s","reason":"{}"}}"#,
            "x".repeat(201)
        );
        for line in [
            br#"{"id":1,"op":"close","session":"s","reason":"two\nlines"}"#.to_vec(),
            long.into_bytes(),
            br#"{"id":1,"op":"close","session":"s","discardPersistentState":"yes"}"#.to_vec(),
        ] {
            assert_eq!(
                code_of(&line),
                Code::BadRequest,
                "{}",
                String::from_utf8_lossy(&line)
            );
        }
    }

    #[test]
    fn millisecond_fields_are_checked_against_their_range() {
        for line in [
            r#"{"id":1,"op":"ensure","session":"s","argv":["x"],"graceMs":9223372036854775808}"#,
            r#"{"id":1,"op":"ensure","session":"s","argv":["x"],"graceMs":3600001}"#,
            r#"{"id":1,"op":"close","session":"s","graceMs":18446744073709551615}"#,
            r#"{"id":1,"op":"reap","graceMs":3600001}"#,
            r#"{"id":1,"op":"reap","retentionMs":18446744073709551615}"#,
        ] {
            let e = parse_request(line.as_bytes()).unwrap_err();
            assert_eq!(e.code, Code::BadRequest, "{line}");
            assert!(e.message.contains("at most"), "{line}: {}", e.message);
        }
        let ok = r#"{"id":1,"op":"ensure","session":"s","argv":["x"],"graceMs":3600000}"#;
        assert!(parse_request(ok.as_bytes()).is_ok());
        let e =
            parse_request(br#"{"id":1,"op":"ensure","session":"a\nb","argv":["x"]}"#).unwrap_err();
        assert!(e.message.contains("control characters"), "{}", e.message);
    }

    #[test]
    fn limits_waits_and_since_are_refused_at_the_edge_by_one_rule() {
        for (line, says) in [
            (
                r#"{"id":1,"op":"ensure","session":"s","argv":["x"],"pidsMax":0}"#,
                "pidsMax",
            ),
            (
                r#"{"id":1,"op":"ensure","session":"s","argv":["x"],"memoryMax":0}"#,
                "memoryMax",
            ),
            (
                r#"{"id":1,"op":"ensure","session":"s","argv":["x"],"cpuMax":"0"}"#,
                "cpuMax",
            ),
            (
                r#"{"id":1,"op":"ensure","session":"s","argv":["x"],"waitMs":60001}"#,
                "waitMs",
            ),
            (
                r#"{"id":1,"op":"events","session":"s","since":-5}"#,
                "since",
            ),
            (
                r#"{"id":1,"op":"attach","session":"s","since":-5}"#,
                "since",
            ),
        ] {
            let e = parse_request(line.as_bytes()).unwrap_err();
            assert_eq!(e.code, Code::BadRequest, "{line}");
            assert!(e.message.contains(says), "{line}: {}", e.message);
        }
        for ok in [
            r#"{"id":1,"op":"ensure","session":"s","argv":["x"],"pidsMax":1,"memoryMax":1,"cpuMax":"0.5","waitMs":60000}"#,
            r#"{"id":1,"op":"events","session":"s","since":0}"#,
        ] {
            assert!(parse_request(ok.as_bytes()).is_ok(), "{ok}");
        }
    }

    #[test]
    fn additions_parse_and_refuse_what_they_should() {
        // `ensure {session}`: the stored spec; other spec fields without argv are ambiguous.
        let r = parse_request(br#"{"id":1,"op":"ensure","session":"s"}"#).unwrap();
        assert!(matches!(&r.op, Op::Ensure(e) if e.wants_stored_spec() && e.persist_spec));
        assert_eq!(
            code_of(br#"{"id":1,"op":"ensure","session":"s","cwd":"/"}"#),
            Code::BadRequest
        );
        let r = parse_request(
            br#"{"id":1,"op":"ensure","session":"s","argv":["x"],"persistSpec":false,"waitMs":0}"#,
        )
        .unwrap();
        assert!(
            matches!(&r.op, Op::Ensure(e) if !e.persist_spec && e.wait_ms == Some(0)),
            "{r:?}"
        );
        let r = parse_request(br#"{"id":1,"op":"attach","session":"s","stderr":true}"#).unwrap();
        assert!(matches!(&r.op, Op::Attach(a) if a.stderr));
        assert_eq!(code_of(br#"{"id":1,"op":"ping","x":1}"#), Code::BadRequest);
        assert_eq!(code_of(br#"{"id":1,"op":"detach"}"#), Code::BadRequest);
        assert_eq!(
            code_of(br#"{"id":1,"op":"detach","attachId":null}"#),
            Code::BadRequest
        );
        assert_eq!(
            code_of(br#"{"id":1,"op":"hello","events":"yes"}"#),
            Code::BadRequest
        );
    }

    /// Every variant, through an exhaustive match: a new code fails to compile here until it is
    /// listed, and the round trip then fails until it has a row in [`CODES`].
    fn every_code() -> Vec<Code> {
        let all = [
            Code::BadUtf8,
            Code::BadJson,
            Code::LineTooLong,
            Code::BadRequest,
            Code::UnknownOp,
            Code::NotFound,
            Code::NotVisible,
            Code::Conflict,
            Code::NotRunning,
            Code::SeqEvicted,
            Code::SpawnFailed,
            Code::StartFailed,
            Code::Closed,
            Code::Forbidden,
            Code::ShuttingDown,
            Code::SendTimeout,
            Code::NotSupervised,
            Code::HandshakeTimeout,
            Code::Internal,
        ];
        for c in all {
            match c {
                Code::BadUtf8
                | Code::BadJson
                | Code::LineTooLong
                | Code::BadRequest
                | Code::UnknownOp
                | Code::NotFound
                | Code::NotVisible
                | Code::Conflict
                | Code::NotRunning
                | Code::SeqEvicted
                | Code::SpawnFailed
                | Code::StartFailed
                | Code::Closed
                | Code::Forbidden
                | Code::ShuttingDown
                | Code::SendTimeout
                | Code::NotSupervised
                | Code::HandshakeTimeout
                | Code::Internal => {}
            }
        }
        all.to_vec()
    }

    #[test]
    fn every_code_round_trips() {
        let all = every_code();
        assert_eq!(all.len(), CODES.len());
        let mut names = std::collections::HashSet::new();
        for c in all {
            assert_eq!(CODES.iter().filter(|r| r.0 == c).count(), 1, "{c:?}");
            assert!(names.insert(c.as_str()), "{c:?}: name used twice");
            assert_eq!(Code::parse(c.as_str()), Some(c));
            // Through a reply line and back, as the client reads it.
            let line = err_line(&Value::from(1), c, "m", &ErrorData::default());
            let v: Value = serde_json::from_slice(&line).unwrap();
            assert_eq!(Code::parse(v["error"]["code"].as_str().unwrap()), Some(c));
        }
        assert_eq!(Code::parse("no_such_code"), None);
    }

    #[test]
    fn every_kind_with_a_wire_name_is_sent_with_it() {
        for row in crate::kind::KINDS {
            let c = Code::of(row.kind);
            match Code::parse(row.cause) {
                Some(named) => {
                    assert_eq!(c, named);
                    assert_eq!(c.kind(), row.kind, "{c:?}");
                }
                None => assert_eq!(c, Code::Internal, "{:?}", row.kind),
            }
        }
    }

    #[test]
    fn replies_are_single_lines() {
        let id = Value::from("a\nb");
        for line in [
            ok_line(&id, &serde_json::json!({"x": "y\nz"})),
            err_line(
                &id,
                Code::Internal,
                "m\n",
                &ErrorData {
                    oldest_seq: Some(3),
                    ..ErrorData::default()
                },
            ),
            stream_line(&id, r#""seq":1,"type":"output","line":"x""#),
            {
                let mut buf = Vec::new();
                stream_line_into(&mut buf, &serde_json::to_string(&id).unwrap(), r#""seq":1"#);
                buf
            },
        ] {
            assert_eq!(line.iter().filter(|&&b| b == b'\n').count(), 1);
            let v: Value = serde_json::from_slice(&line).unwrap();
            assert_eq!(v["id"], id);
        }
        let e: Value = serde_json::from_slice(&err_line(
            &id,
            Code::SeqEvicted,
            "m",
            &ErrorData {
                oldest_seq: Some(3),
                ..ErrorData::default()
            },
        ))
        .unwrap();
        assert_eq!(e["error"]["code"], "seq_evicted");
        assert_eq!(e["error"]["oldestSeq"], 3);
    }

    #[test]
    fn line_reader_frames_and_survives_overlong_lines() {
        let mut input = Vec::new();
        input.extend_from_slice(b"one\r\n");
        input.extend(std::iter::repeat_n(b'x', 300));
        input.extend_from_slice(b"\ntwo\n\nthree");
        let mut r = LineReader::new(&input[..], 100);
        let mut frames = Vec::new();
        while let Some(f) = r.next_frame().unwrap() {
            frames.push(f);
        }
        assert_eq!(
            frames,
            vec![
                Frame::Line(b"one".to_vec()),
                Frame::TooLong,
                Frame::Line(b"two".to_vec()),
                Frame::Line(Vec::new()),
                Frame::Line(b"three".to_vec()),
            ]
        );
    }

    #[test]
    fn line_reader_handles_one_byte_reads() {
        struct Trickle<'a>(&'a [u8]);
        impl Read for Trickle<'_> {
            fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
                if self.0.is_empty() || buf.is_empty() {
                    return Ok(0);
                }
                buf[0] = self.0[0];
                self.0 = &self.0[1..];
                Ok(1)
            }
        }
        let mut data = b"ab\n".to_vec();
        data.extend(std::iter::repeat_n(b'y', 50));
        data.extend_from_slice(b"\ncd\n");
        let mut r = LineReader::new(Trickle(&data), 10);
        assert_eq!(r.next_frame().unwrap(), Some(Frame::Line(b"ab".to_vec())));
        assert_eq!(r.next_frame().unwrap(), Some(Frame::TooLong));
        assert_eq!(r.next_frame().unwrap(), Some(Frame::Line(b"cd".to_vec())));
        assert_eq!(r.next_frame().unwrap(), None);
    }
}
