//! The requests, one type per op, each with its [`OpRequest`]: its name on the wire, how its
//! fields parse (strictly: unknown fields, bad values and out-of-range milliseconds are a
//! `bad_request` here, at the edge), and the type it is answered with (`reply.rs`). The table of
//! ops that lists them is in `mod.rs`.

use super::{
    bad, check_key, check_ms, check_since, fields_of, no_nul, one_target, Attached, Cancelled,
    Detached, Ensured, LeaseRow, MetricsText, OpRequest, Pong, Reaped, SessionsAnswer, Status,
    Upgraded, Welcome,
};
use crate::controller::session_input::Sent;
use crate::controller::{CloseOutcome, LeaseRef};
use crate::store::Event;
use leash_core::answer::VerifyReport;
use leash_core::kind::Code;
use leash_core::visibility::{A2aPolicy, A2aRule, Scope, Visibility};
use serde::Deserialize;
use serde_json::Value;

/// `status`: takes no fields.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StatusRequest {}

impl OpRequest for StatusRequest {
    const NAME: &'static str = "status";
    type Reply = Status;

    fn parse(fields: Value) -> Result<Self, (Code, String)> {
        fields_of(Self::NAME, fields)
    }
}

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

impl OpRequest for Hello {
    const NAME: &'static str = "hello";
    type Reply = Welcome;

    fn parse(fields: Value) -> Result<Self, (Code, String)> {
        let op = Self::NAME;
        let h: Hello = fields_of(op, fields)?;
        if let Some(c) = &h.client {
            check_key("client", c)?;
        }
        Ok(h)
    }
}

/// `detach`: ends the attach whose request id is `attach_id`, on this connection.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Detach {
    pub attach_id: Value,
}

impl OpRequest for Detach {
    const NAME: &'static str = "detach";
    type Reply = Detached;

    fn parse(fields: Value) -> Result<Self, (Code, String)> {
        let op = Self::NAME;
        let d: Detach = fields_of(op, fields)?;
        if !matches!(d.attach_id, Value::String(_) | Value::Number(_)) {
            return Err(bad(
                "detach: \"attachId\" must be the id (a string or a number) of an attach on this connection",
            ));
        }
        Ok(d)
    }
}

/// Declares a struct with the fields of an `ensure` that say what to run, where and as whom: the
/// part of the request a stored spec keeps. [`Ensure`] and `daemon::spec::Spec` are both declared
/// through it, so the list (its names on the wire and in the database, its defaults) is written
/// once. A struct gives its own fields before `argv`, in the place of the environment (after
/// `cwd`: the request's values; the spec's values or names) and after the list.
/// The ownership fields in it (`agent` … `parent`) come from
/// `controller::exec::with_ownership_fields!`, which the `exec`
/// request shares.
macro_rules! with_launch_fields {
    (
        $(#[$meta:meta])*
        pub struct $name:ident {
            $($(#[$head_meta:meta])* pub $head:ident: $head_ty:ty,)*
            ..argv_cwd,
            $($(#[$env_meta:meta])* pub $env:ident: $env_ty:ty,)*
            ..launch,
            $($(#[$tail_meta:meta])* pub $tail:ident: $tail_ty:ty,)*
        }
    ) => {
        $crate::controller::exec::with_ownership_fields! {
        $(#[$meta])*
        pub struct $name {
            $($(#[$head_meta])* pub $head: $head_ty,)*
            /// The adapter's command line. Empty when a request gave none: the session's stored
            /// spec is used (resume); a stored spec always has one.
            #[serde(default)]
            pub argv: Vec<String>,
            #[serde(default)]
            pub cwd: Option<String>,
            $($(#[$env_meta])* pub $env: $env_ty,)*
            /// Removed from the daemon's environment (beside the default scrub of provider
            /// credentials, [`crate::envpolicy::PROVIDER_CREDENTIALS`]).
            #[serde(default, skip_serializing_if = "Vec::is_empty")]
            pub unset_env: Vec<String>,
            /// Start from an empty environment: only `keepEnv`, `env` and the lease markers pass.
            #[serde(default, skip_serializing_if = "std::ops::Not::not")]
            pub clear_env: bool,
            /// With `clearEnv`: the daemon's variables that pass; without: names spared from the
            /// default scrub (e.g. `["ANTHROPIC_API_KEY"]` for an adapter that needs the
            /// gateway's key).
            #[serde(default, skip_serializing_if = "Vec::is_empty")]
            pub keep_env: Vec<String>,
            ..ownership,
            #[serde(default)]
            pub grace_ms: Option<u64>,
            /// Limits of the session's cgroup (`leash exec --memory-max` etc.): bytes, a count,
            /// and `cpu.max` as CPUs ("0.5") or "QUOTA PERIOD". Refused where they cannot be
            /// enforced.
            #[serde(default)]
            pub memory_max: Option<u64>,
            #[serde(default)]
            pub pids_max: Option<u64>,
            #[serde(default)]
            pub cpu_max: Option<String>,
            $($(#[$tail_meta])* pub $tail: $tail_ty,)*
        }
        }
    };
}
pub(crate) use with_launch_fields;

with_launch_fields! {
    /// Spawn a session's adapter under a lease, or return the running one.
    #[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
    #[serde(rename_all = "camelCase", deny_unknown_fields)]
    pub struct Ensure {
        pub session: String,
        ..argv_cwd,
        /// Added to (or overriding) the daemon's environment, after the scrub: a name set here
        /// reaches the adapter whatever `unsetEnv`, `clearEnv` and the default scrub say.
        #[serde(default)]
        pub env: std::collections::BTreeMap<String, String>,
        ..launch,
        /// Keep this spec in the state database so `ensure {session}` can re-spawn it (default
        /// true).
        #[serde(default = "yes")]
        pub persist_spec: bool,
        /// Store the values of `env` with the spec (default false: only their names are stored,
        /// and `ensure {session}` must give `env` again with a value for each).
        #[serde(default)]
        pub persist_env: bool,
        /// How long `ensure` waits for a new adapter's first line of output (default `serve
        /// --ensure-wait-ms`, 0): an exit before it within the wait is the ensure's
        /// `start_failed` (after it, the stream's `start_failed` end). At most
        /// [`leash_core::limits::MAX_ENSURE_WAIT_MS`].
        #[serde(default)]
        pub wait_ms: Option<u64>,
        /// How long this ensure waits behind an ensure of the same key in flight (FIFO, at most
        /// 16 queued) before it answers `conflict` (default 120000; 0: at once). At most
        /// [`leash_core::limits::MAX_ENSURE_QUEUE_MS`].
        #[serde(default)]
        pub queue_timeout_ms: Option<u64>,
        /// The params of the ACP `initialize` request the daemon sends a new adapter itself (id
        /// `"leash-handshake"`) before it answers: the reply carries the response
        /// (`initialize`), or the ensure fails `handshake_timeout` and the session is closed. Per
        /// call, never stored.
        #[serde(default)]
        pub initialize: Option<Value>,
        /// How long that `initialize` may go unanswered (default 30000 with `initialize`; needs
        /// `initialize`). At most [`leash_core::limits::MAX_HANDSHAKE_TIMEOUT_MS`].
        #[serde(default)]
        pub handshake_timeout_ms: Option<u64>,
    }
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

impl OpRequest for Box<Ensure> {
    const NAME: &'static str = "ensure";
    type Reply = Ensured;

    fn parse(fields: Value) -> Result<Self, (Code, String)> {
        let op = Self::NAME;
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
        check_ms(
            op,
            "graceMs",
            e.grace_ms,
            leash_core::limits::check_grace_ms,
        )?;
        check_ms(
            op,
            "waitMs",
            e.wait_ms,
            leash_core::limits::check_ensure_wait_ms,
        )?;
        check_ms(
            op,
            "queueTimeoutMs",
            e.queue_timeout_ms,
            leash_core::limits::check_ensure_queue_ms,
        )?;
        check_ms(
            op,
            "handshakeTimeoutMs",
            e.handshake_timeout_ms,
            leash_core::limits::check_handshake_ms,
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
            leash_core::limits::check_cgroup_limit,
        )?;
        check_ms(
            op,
            "pidsMax",
            e.pids_max,
            leash_core::limits::check_cgroup_limit,
        )?;
        if let Some(c) = &e.cpu_max {
            crate::cgroup::parse_cpu_max(c)
                .map_err(|err| bad(format!("{op}: \"cpuMax\": {err}")))?;
        }
        Ok(Box::new(e))
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

impl OpRequest for Send {
    const NAME: &'static str = "send";
    type Reply = Sent;

    fn parse(fields: Value) -> Result<Self, (Code, String)> {
        let op = Self::NAME;
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
        Ok(s)
    }
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

impl OpRequest for Attach {
    const NAME: &'static str = "attach";
    type Reply = Attached;

    fn parse(fields: Value) -> Result<Self, (Code, String)> {
        let op = Self::NAME;
        let a: Attach = fields_of(op, fields)?;
        check_key("session", &a.session)?;
        check_since(op, a.since)?;
        Ok(a)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cancel {
    pub target: LeaseRef,
    /// The ACP session whose turn is cancelled; inferred when the daemon knows exactly one.
    pub acp_session_id: Option<String>,
}

impl OpRequest for Cancel {
    const NAME: &'static str = "cancel";
    type Reply = Cancelled;

    fn parse(fields: Value) -> Result<Self, (Code, String)> {
        let op = Self::NAME;
        let raw: RawTarget = fields_of(op, fields)?;
        let target = one_target(op, raw.session, raw.lease)?;
        if let Some(acp) = &raw.acp_session_id {
            check_key("acpSessionId", acp)?;
        }
        Ok(Cancel {
            target,
            acp_session_id: raw.acp_session_id,
        })
    }
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

impl OpRequest for Close {
    const NAME: &'static str = "close";
    type Reply = Vec<CloseOutcome>;

    fn parse(fields: Value) -> Result<Self, (Code, String)> {
        let op = Self::NAME;
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
        check_ms(
            op,
            "graceMs",
            raw.grace_ms,
            leash_core::limits::check_grace_ms,
        )?;
        if let Some(r) = &raw.reason {
            if r.chars().count() > 200 || r.chars().any(char::is_control) {
                return Err(bad(
                    "close: \"reason\" must be one line of at most 200 characters",
                ));
            }
        }
        Ok(Close {
            targets,
            grace_ms: raw.grace_ms,
            discard_persistent_state: raw.discard_persistent_state,
            reason: raw.reason,
        })
    }
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

impl OpRequest for Reap {
    const NAME: &'static str = "reap";
    type Reply = Reaped;

    fn parse(fields: Value) -> Result<Self, (Code, String)> {
        let op = Self::NAME;
        let r: Reap = fields_of(op, fields)?;
        check_ms(
            op,
            "graceMs",
            r.grace_ms,
            leash_core::limits::check_grace_ms,
        )?;
        check_ms(
            op,
            "retentionMs",
            r.retention_ms,
            leash_core::limits::check_retention_ms,
        )?;
        Ok(r)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Leases {
    #[serde(default)]
    pub state: Option<String>,
}

impl OpRequest for Leases {
    const NAME: &'static str = "leases";
    type Reply = Vec<LeaseRow>;

    fn parse(fields: Value) -> Result<Self, (Code, String)> {
        let op = Self::NAME;
        let l: Leases = fields_of(op, fields)?;
        if let Some(s) = &l.state {
            s.parse::<leash_core::model::LeaseState>()
                .map_err(|e| bad(format!("leases: {e}")))?;
        }
        Ok(l)
    }
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

impl OpRequest for SessionsRequest {
    const NAME: &'static str = "sessions";
    type Reply = SessionsAnswer;

    fn parse(fields: Value) -> Result<Self, (Code, String)> {
        let op = Self::NAME;
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
        Ok(SessionsRequest {
            requester: raw.requester_session_key,
            scope: Scope::new(visibility, a2a, raw.sandboxed),
            query,
        })
    }
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

impl OpRequest for Events {
    const NAME: &'static str = "events";
    type Reply = Vec<Event>;

    fn parse(fields: Value) -> Result<Self, (Code, String)> {
        let op = Self::NAME;
        let e: Events = fields_of(op, fields)?;
        check_key("session", &e.session)?;
        check_since(op, e.since)?;
        Ok(e)
    }
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

/// `verify`: is this lease's process alive and ours, dead, or unknowable? (`leash verify`)
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verify {
    pub target: LeaseRef,
}

impl OpRequest for Verify {
    const NAME: &'static str = "verify";
    type Reply = VerifyReport;

    fn parse(fields: Value) -> Result<Self, (Code, String)> {
        let op = Self::NAME;
        let raw: RawVerify = fields_of(op, fields)?;
        Ok(Verify {
            target: one_target(op, raw.session, raw.lease)?,
        })
    }
}

/// `metrics`: the metrics in the OpenMetrics text format (as `--metrics` serves them over
/// HTTP); takes no fields.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetricsRequest {}

impl OpRequest for MetricsRequest {
    const NAME: &'static str = "metrics";
    type Reply = MetricsText;

    fn parse(fields: Value) -> Result<Self, (Code, String)> {
        fields_of(Self::NAME, fields)
    }
}

/// `ping`: takes no fields.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Ping {}

impl OpRequest for Ping {
    const NAME: &'static str = "ping";
    type Reply = Pong;

    fn parse(fields: Value) -> Result<Self, (Code, String)> {
        fields_of(Self::NAME, fields)
    }
}

/// `upgrade`: hand the daemon over to a new program of itself (`leash serve --upgrade`); takes
/// no fields. The reply comes from the program that serves after the handoff.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpgradeRequest {}

impl OpRequest for UpgradeRequest {
    const NAME: &'static str = "upgrade";
    type Reply = Upgraded;

    fn parse(fields: Value) -> Result<Self, (Code, String)> {
        fields_of(Self::NAME, fields)
    }
}

/// `exec`: commit the lease of the calling `leash exec` process. The request is the
/// library's [`ExecAsk`](crate::controller::exec::ExecAsk); the root and the owner are never in
/// it (the daemon reads them from the socket's peer).
impl OpRequest for Box<crate::controller::exec::ExecAsk> {
    const NAME: &'static str = "exec";
    type Reply = crate::controller::exec::ExecAnswer;

    fn parse(fields: Value) -> Result<Self, (Code, String)> {
        let op = Self::NAME;
        let a: crate::controller::exec::ExecAsk = fields_of(op, fields)?;
        if !crate::controller::exec::is_canonical_uuid(&a.lease_id) {
            return Err(bad(format!(
                "exec: \"leaseId\" must be a UUID in canonical form, got {:?}",
                super::truncate(&a.lease_id, 64)
            )));
        }
        for (name, v) in [
            ("session", &a.session),
            ("agent", &a.agent),
            ("owner", &a.owner),
            ("spawnedBy", &a.spawned_by),
            ("parent", &a.parent),
        ] {
            if let Some(v) = v {
                check_key(name, v)?;
            }
        }
        check_ms(
            op,
            "graceMs",
            Some(a.grace_ms),
            leash_core::limits::check_grace_ms,
        )?;
        if a.argv.is_empty() || a.argv[0].is_empty() {
            return Err(bad("exec: \"argv\" must name a command"));
        }
        for v in &a.argv {
            no_nul("argv", v)?;
        }
        for (name, v) in [
            ("stateDir", Some(&a.state_dir)),
            ("wrapper", Some(&a.wrapper)),
            ("cgroupRoot", a.cgroup_root.as_ref()),
        ] {
            if let Some(p) = v {
                if !p.is_absolute() {
                    return Err(bad(format!("exec: \"{name}\" must be an absolute path")));
                }
            }
        }
        if !matches!(a.containment.as_str(), "on" | "off" | "unavailable") {
            return Err(bad("exec: \"containment\" must be on, off or unavailable"));
        }
        check_ms(
            op,
            "limits.memoryMax",
            a.limits.memory_max,
            leash_core::limits::check_cgroup_limit,
        )?;
        check_ms(
            op,
            "limits.pidsMax",
            a.limits.pids_max,
            leash_core::limits::check_cgroup_limit,
        )?;
        if let Some(c) = &a.limits.cpu_max {
            if c.is_empty() || c.contains(['\0', '\n']) {
                return Err(bad("exec: \"limits.cpuMax\" must be one line"));
            }
        }
        if a.owner_pid.is_some_and(|p| p <= 0) {
            return Err(bad("exec: \"ownerPid\" must be a pid (> 0)"));
        }
        Ok(Box::new(a))
    }
}
