//! The daemon's replies and stream items as types (`Serialize + Deserialize`): the op handlers
//! (`conn/`) build them and write them with [`ok_line`]/[`err_line`], the client (`client.rs`,
//! and through it the CLI and `leash mcp`) reads them back into the same types, so no side reads
//! a reply by indexing a `serde_json::Value` and the two cannot drift. The wire format is the one
//! `docs/protocol.md` documents: camelCase fields, `null` for a field that has no value unless
//! the doc says the field is absent (those are `skip_serializing_if`). Fields are declared in
//! the order of their wire names, so a reply renders byte for byte as the `json!` objects these
//! types replaced did (serde_json sorts the keys of a `Value`).
//!
//! Output and stderr items are rendered once per adapter line by the session's reader (a
//! hand-written, escape-aware renderer, see `session/stdio.rs`): [`StreamItem`] is how clients read
//! them, and a unit test checks that the renderer's bodies parse as it.

use crate::controller::CancelOutcome;
use crate::controller::StoreStatus;
use crate::ps::Totals;
use leash_core::kind::Code;
use leash_core::model::Lease;
use leash_core::model::SessionRow;
use leash_core::visibility::Grant;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::net::SocketAddr;
use std::path::PathBuf;

// ---------------------------------------------------------------------------------------------
// Lines

/// `{"id": …, "ok": true, "result": …}` and a newline.
pub fn ok_line<T: Serialize + ?Sized>(id: &Value, result: &T) -> Vec<u8> {
    // Borrowed: a status with many sessions is tens of KB and is not copied on its way out.
    #[derive(Serialize)]
    struct OkReply<'a, T: ?Sized> {
        id: &'a Value,
        ok: bool,
        result: &'a T,
    }
    let mut out = serde_json::to_vec(&OkReply {
        id,
        ok: true,
        result,
    })
    .expect("replies serialise");
    out.push(b'\n');
    out
}

/// `{"id": …, "ok": false, "error": {"code": …, "message": …, …data}}` and a newline.
pub fn err_line(id: &Value, code: Code, message: &str, data: &ErrorData) -> Vec<u8> {
    #[derive(Serialize)]
    struct ErrReply<'a> {
        error: ErrorBody<'a>,
        id: &'a Value,
        ok: bool,
    }
    #[derive(Serialize)]
    struct ErrorBody<'a> {
        code: &'a str,
        message: &'a str,
        #[serde(flatten)]
        data: &'a ErrorData,
    }
    let mut out = serde_json::to_vec(&ErrReply {
        error: ErrorBody {
            code: code.as_str(),
            message,
            data,
        },
        id,
        ok: false,
    })
    .expect("replies serialise");
    out.push(b'\n');
    out
}

/// A stream item: `{"id": …,` followed by a pre-rendered body (`"seq":…,"type":…}`), so one
/// rendering of an adapter line serves every attached client.
pub fn stream_line(id: &Value, body: &str) -> Vec<u8> {
    let id = serde_json::to_string(id).expect("JSON values serialise");
    let mut out = Vec::with_capacity(id.len() + body.len() + 10);
    stream_line_into(&mut out, &id, body);
    out
}

/// [`stream_line`] appended to `buf`, with the id already rendered (`id_json`): an attach renders
/// its id once, not once per item.
pub fn stream_line_into(buf: &mut Vec<u8>, id_json: &str, body: &str) {
    buf.reserve(id_json.len() + body.len() + 10);
    buf.extend_from_slice(b"{\"id\":");
    buf.extend_from_slice(id_json.as_bytes());
    buf.push(b',');
    buf.extend_from_slice(body.as_bytes());
    buf.extend_from_slice(b"}\n");
}

/// A typed stream item as a body for [`stream_line`] (without the braces and the id).
pub fn item_body(item: &StreamItem) -> String {
    let s = serde_json::to_string(item).expect("stream items serialise");
    // `{…}` → `…`: the id goes first, in front of it.
    s[1..s.len() - 1].to_string()
}

// ---------------------------------------------------------------------------------------------
// Errors

/// The extra fields of an error reply, beside `code` and `message` (see the table in
/// `docs/protocol.md`); absent when they do not apply.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ErrorData {
    /// `send_timeout`: the length of the line with its newline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes: Option<u64>,
    /// `send_timeout`: how much of it the adapter took.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_written: Option<u64>,
    /// `spawn_failed`: leash's cause word when `leash exec` itself refused or could not start
    /// the adapter (`adapter_not_found`, `adapter_not_executable`, `conflict`, `spawn_failed`,
    /// `internal`, …): the `code` of its JSON error line, as a `leash exec --error-format json`
    /// caller reads it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cause: Option<String>,
    /// `spawn_failed`: the adapter's exit status, when it started and died at once; given as
    /// `null` with `stderr` when the adapter died without one being known (a client reads that
    /// `null` back as `None`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_status: Option<Option<i32>>,
    /// `seq_evicted`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_seq: Option<i64>,
    /// `not_supervised`: the lease someone else started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_id: Option<String>,
    /// `seq_evicted`: attach with `since = oldestSeq - 1` to take what is there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oldest_seq: Option<i64>,
    /// `not_supervised`: that lease's wrapper.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root_pid: Option<i32>,
    /// `spawn_failed`: the adapter's last stderr lines.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stderr: Option<Vec<String>>,
}

/// An error reply's `error` object as a client reads it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RemoteError {
    pub code: String,
    #[serde(default = "no_message")]
    pub message: String,
    #[serde(flatten)]
    pub data: ErrorData,
}

fn no_message() -> String {
    "the daemon reported an error without a message".into()
}

/// One line from the daemon as a client reads it: a reply (`ok` present) or a stream item.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Message {
    #[serde(default)]
    pub id: Value,
    /// Present on replies only.
    #[serde(default)]
    pub ok: Option<bool>,
    /// The rest: a reply's `result` or `error`, or a stream item's fields (`seq`, `type`, …).
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

impl Message {
    /// The reply this line carries (`None` for a stream item): its `result` (`null` when it has
    /// none), or its `error`.
    pub fn into_reply(mut self) -> Option<Result<Value, RemoteError>> {
        let ok = self.ok?;
        if ok {
            return Some(Ok(self.rest.remove("result").unwrap_or(Value::Null)));
        }
        let error = self.rest.remove("error").unwrap_or(Value::Null);
        Some(Err(serde_json::from_value(error).unwrap_or_else(|e| {
            RemoteError {
                code: Code::Internal.as_str().into(),
                message: format!("the daemon's error reply does not parse: {e}"),
                data: ErrorData::default(),
            }
        })))
    }

    /// The stream item this line carries, when it is one.
    pub fn into_item(self) -> Option<StreamItem> {
        if self.ok.is_some() {
            return None;
        }
        serde_json::from_value(Value::Object(self.rest)).ok()
    }
}

// ---------------------------------------------------------------------------------------------
// status

/// `status`, and `leash status` without a daemon (then `daemon` is absent): the state root's
/// part, built once by the controller ([`crate::controller::store_status`]), and the daemon's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Status {
    #[serde(flatten)]
    pub root: StoreStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub daemon: Option<DaemonStatus>,
}

/// `status.daemon`: what only the daemon knows.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DaemonStatus {
    /// Keys of the sessions that are busy now.
    pub busy: Vec<String>,
    pub idle_close_ms: Option<u64>,
    /// The address `--metrics` serves on.
    pub metrics: Option<SocketAddr>,
    pub pid: i32,
    pub reconcile: ReconcileStatus,
    pub replay_bytes: usize,
    pub replay_lines: usize,
    pub resumable: Vec<Resumable>,
    pub sessions: Vec<StatusSession>,
    pub shutting_down: bool,
    pub socket: PathBuf,
    pub socket_activated: bool,
    pub started_at: i64,
    pub startup_reap: StartupReap,
    pub version: String,
    /// When this program began serving (ms since the epoch): `startedAt` after a handoff is
    /// the daemon's first start, this is the program's.
    #[serde(default)]
    pub serving_since: i64,
    /// Handoffs to a new program this daemon has done.
    #[serde(default)]
    pub handoffs: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_handoff: Option<LastHandoff>,
}

/// A supervised session in `status`: its live state and its usage sample.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StatusSession {
    #[serde(flatten)]
    pub live: LiveSession,
    /// `null` for a session without a cgroup (status never walks `/proc`).
    pub usage: Option<Totals>,
    /// How old the usage sample is; absent when there is none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage_age_ms: Option<u64>,
}

/// A session that was busy when the previous daemon stopped (the `interrupted` entry, plus the
/// seq of its `resumable` event); the other fields are passed on as they were recorded.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Resumable {
    pub session_key: String,
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

/// What the startup reap did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StartupReap {
    pub bad_rows: usize,
    pub closed: usize,
    pub conflict: usize,
    pub expired: usize,
    pub left_open: usize,
    pub legacy: usize,
    pub lost: usize,
    pub skipped: usize,
}

/// `status.daemon.reconcile`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReconcileStatus {
    /// `null`: the timer is off.
    pub interval_ms: Option<u64>,
    /// The last pass; `null` before the first.
    pub last: Option<ReconcilePass>,
}

/// One reconcile pass as `status` reports it: its counts, or the error it failed with.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReconcilePass {
    pub at: i64,
    /// Numbered, so a client can wait for "two more passes" without sleeping.
    pub passes: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub closed: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lost: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub left_open: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expired: Option<u64>,
    /// Whatever else the pass reports (`conflict`, `unreadable`, `straysRemoved`, `durationMs`).
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

/// Where a supervised session is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Phase {
    /// Spawned; the lease or the adapter's start is not confirmed yet.
    Starting,
    Running,
    /// A close is in flight (or ended and the exit is being collected).
    Closing,
    /// The wrapper exited and was reaped; the buffer stays readable for a while.
    Ended,
}

/// A `session/prompt` request written to the adapter and not answered yet.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PendingPrompt {
    pub acp_session_id: Option<String>,
    pub id: Value,
    pub since: i64,
}

/// A supervised session's state as `status` and `sessions` report it (the daemon's view; the
/// lease-and-processes view of `leash sessions status` is [`crate::controller::sessions::SessionStatus`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LiveSession {
    pub acp_session_ids: Vec<String>,
    /// Each ACP session with the `cwd` and `mcpServers` it was opened with (as the gateway sent
    /// them in `session/new` or `session/load`): what `resume` opens it with again.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub acp_sessions: Vec<Value>,
    pub attached: usize,
    pub buffered_bytes: usize,
    pub buffered_lines: usize,
    pub busy: bool,
    pub created_at: i64,
    pub exit_status: Option<i32>,
    pub idle_ms: u64,
    pub last_seq: i64,
    pub lease_id: Option<String>,
    pub oldest_seq: Option<i64>,
    /// Lines dropped because the session ended before the store took seqs again.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub output_dropped: u64,
    /// Output is held because no seqs can be reserved in the store (the error says why).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_held: Option<String>,
    pub output_lines: u64,
    pub pending_prompts: Vec<PendingPrompt>,
    pub phase: Phase,
    pub root_pid: Option<i32>,
    pub session_key: String,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

// ---------------------------------------------------------------------------------------------
// Session ops

/// `ensure`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Ensured {
    /// False when a running session was found with another argv (it keeps running as it is).
    pub argv_matches: bool,
    /// False when the session was already running (or starting).
    pub created: bool,
    pub last_seq: i64,
    pub lease_id: Option<String>,
    pub phase: Phase,
    pub root_pid: Option<i32>,
    pub session_key: String,
    /// `ensure` with `initialize` that started the adapter: its response to that request (the
    /// whole JSON-RPC response object, `result` or `error`; `null` when it fell out of the
    /// replay buffer before it was read).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initialize: Option<Value>,
}

/// `attach`'s reply, before the stream items.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Attached {
    /// Present (true) when `since` was above `lastSeq` and was clamped to it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub clamped: bool,
    pub last_seq: i64,
    pub lease_id: Option<String>,
    pub oldest_seq: Option<i64>,
    pub phase: Phase,
    /// The `since` asked for, when it was clamped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested_since: Option<i64>,
    pub session_key: String,
    pub since: i64,
}

/// A stream item (everything but the `id`), as clients read it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "camelCase")]
pub enum StreamItem {
    /// One line of the adapter's stdout.
    Output {
        seq: i64,
        line: String,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        lossy: bool,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        truncated: bool,
    },
    /// One line of the adapter's stderr (`attach` with `stderr: true`).
    Stderr {
        seq: i64,
        line: String,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        truncated: bool,
    },
    /// A lifecycle event, the same fields as in the `events` op (without the session key).
    #[serde(rename_all = "camelCase")]
    Event {
        seq: i64,
        kind: String,
        lease_id: Option<String>,
        detail: Value,
        at: i64,
    },
    /// The last item of an attach.
    #[serde(rename_all = "camelCase")]
    End {
        /// `evicted` only: why.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<EndError>,
        last_seq: i64,
        reason: EndReason,
    },
    /// A push (`hello {"events": true}`): a session that was busy when the previous daemon
    /// stopped, and whether `ensure {session}` can re-spawn it from a stored spec.
    #[serde(rename_all = "camelCase")]
    Resumable {
        has_spec: bool,
        /// The env names the stored spec keeps without values (stored without `persistEnv`):
        /// `ensure {session, env}` must give a value for each.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        needs_env: Vec<String>,
        #[serde(flatten)]
        entry: Resumable,
    },
    /// A push: a resumable session was ensured again.
    #[serde(rename_all = "camelCase")]
    Resumed {
        lease_id: Option<String>,
        session_key: String,
    },
}

impl StreamItem {
    /// The item's seq; `None` for `end` and the pushes.
    pub fn seq(&self) -> Option<i64> {
        match self {
            StreamItem::Output { seq, .. }
            | StreamItem::Stderr { seq, .. }
            | StreamItem::Event { seq, .. } => Some(*seq),
            StreamItem::End { .. } | StreamItem::Resumable { .. } | StreamItem::Resumed { .. } => {
                None
            }
        }
    }
}

/// Why an attach ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum EndReason {
    /// The session ended and everything was delivered.
    Ended,
    /// The client fell out of the replay buffer; attach again.
    Evicted,
    /// The client ended the attach with `detach`.
    Detached,
    /// The adapter exited before its first line of output (and no close ended it): its start
    /// failed. The `error` has code `start_failed`, the exit status and the last stderr lines.
    /// Named as its error code.
    #[serde(rename = "start_failed")]
    StartFailed,
}

/// The `error` of an `evicted` end (`seq_evicted`) or a `start_failed` one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EndError {
    pub code: String,
    pub last_seq: i64,
    pub message: String,
    pub oldest_seq: i64,
    /// `start_failed`: the adapter's exit status (`null` when unknown).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_status: Option<Option<i32>>,
    /// `start_failed`: the adapter's last stderr lines.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stderr: Option<Vec<String>>,
}

/// `cancel` through the daemon, and `leash cancel` (whose direct path has no notice).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cancelled {
    #[serde(flatten)]
    pub outcome: CancelOutcome,
    /// Only the daemon says whether it wrote a `session/cancel` notification.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub notice: Option<CancelNotice>,
}

/// Whether the daemon wrote the `session/cancel` notification, and if not why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CancelNotice {
    pub acp_session_id: Option<String>,
    pub notified: bool,
    /// Set when the intent was recorded but the notification could not be written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Whether the daemon supervises the session; absent when `reason` is given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub supervised: Option<bool>,
}

/// `leases`: a lease row, or the error that made it unreadable.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum LeaseRow {
    /// First, so that a lease object is never read as an unreadable row.
    Unreadable(Unreadable),
    Lease(Box<Lease>),
}

/// A lease row that could not be read: `{"error": "…"}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Unreadable {
    pub error: String,
}

impl<E: std::fmt::Display> From<Result<Lease, E>> for LeaseRow {
    fn from(r: Result<Lease, E>) -> LeaseRow {
        match r {
            Ok(l) => LeaseRow::Lease(Box::new(l)),
            Err(e) => LeaseRow::Unreadable(Unreadable {
                error: e.to_string(),
            }),
        }
    }
}

/// A row of `sessions` without a query.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionEntry {
    /// The daemon's session object, when it supervises the session.
    pub live: Option<LiveSession>,
    #[serde(flatten)]
    pub row: SessionRow,
    /// Why the row is visible; `null` without a requester.
    pub visible_as: Option<Grant>,
}

/// `metrics`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MetricsText {
    pub content_type: String,
    pub text: String,
}

/// `hello`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Welcome {
    pub daemon_pid: i32,
    /// Whether this connection gets lifecycle pushes.
    pub events: bool,
    pub features: Vec<String>,
    pub ops: Vec<String>,
    pub protocol: u32,
    pub version: String,
}

/// `upgrade`: answered by the program that serves after the handoff.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Upgraded {
    /// The version that handed over, and the one that serves now.
    pub from: String,
    pub to: String,
    /// From the request to this answer.
    pub handoff_ms: f64,
    pub sessions: usize,
    /// Handoffs this daemon has done, this one included.
    pub handoffs: u64,
}

/// The last handoff of the daemon, as `status` reports it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LastHandoff {
    pub at: i64,
    pub from: String,
    pub to: String,
    /// Whether the new program took over (`false`: the handoff was refused or undone, and
    /// `error` says why).
    pub ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<f64>,
}

/// `ping`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pong {
    pub at: i64,
    pub pong: bool,
}

/// `detach`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Detached {
    pub attach_id: Value,
    pub detached: usize,
}

/// `reap`: the plan of a dry run, or the report.
#[derive(Serialize)]
#[serde(untagged)]
pub enum Reaped {
    Plan(leash_core::plan::ReapPlan),
    Report(crate::controller::ReapReport),
}

/// `sessions`: the plain rows, or the answer to a query.
#[derive(Serialize)]
#[serde(untagged)]
pub enum SessionsAnswer {
    Rows(Vec<SessionEntry>),
    List(crate::controller::sessions::Listing),
    History(crate::controller::History),
    Status(Box<crate::controller::sessions::SessionStatus>),
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::session_input::Sent;
    use serde::de::DeserializeOwned;

    /// Serialises `v`, reads it back as the client does, and checks nothing was lost.
    fn round_trip<T: Serialize + DeserializeOwned + PartialEq + std::fmt::Debug>(v: &T) {
        let text = serde_json::to_string(v).unwrap();
        let back: T = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text}: {e}"));
        assert_eq!(&back, v, "{text}");
    }

    fn live() -> LiveSession {
        LiveSession {
            acp_session_ids: vec!["acp-1".into()],
            acp_sessions: vec![
                serde_json::json!({"sessionId": "acp-1", "cwd": "/w", "mcpServers": []}),
            ],
            attached: 1,
            buffered_bytes: 10,
            buffered_lines: 2,
            busy: true,
            created_at: 5,
            exit_status: None,
            idle_ms: 3,
            last_seq: 9,
            lease_id: Some("L".into()),
            oldest_seq: Some(8),
            output_dropped: 0,
            output_held: None,
            output_lines: 2,
            pending_prompts: vec![PendingPrompt {
                acp_session_id: Some("acp-1".into()),
                id: Value::from(4),
                since: 1,
            }],
            phase: Phase::Running,
            root_pid: Some(42),
            session_key: "s".into(),
        }
    }

    #[test]
    fn every_reply_reads_back_as_it_was_sent() {
        round_trip(&live());
        round_trip(&StatusSession {
            live: live(),
            usage: None,
            usage_age_ms: Some(3),
        });
        round_trip(&Ensured {
            argv_matches: true,
            created: false,
            last_seq: 1,
            lease_id: None,
            phase: Phase::Starting,
            root_pid: None,
            session_key: "s".into(),
            initialize: Some(
                serde_json::json!({"jsonrpc": "2.0", "id": "leash-handshake", "result": {}}),
            ),
        });
        round_trip(&Sent {
            busy: false,
            bytes: 3,
            session_key: "s".into(),
        });
        round_trip(&Attached {
            clamped: true,
            last_seq: 4,
            lease_id: Some("L".into()),
            oldest_seq: None,
            phase: Phase::Ended,
            requested_since: Some(99),
            session_key: "s".into(),
            since: 4,
        });
        let outcome = CancelOutcome {
            lease_id: "L".into(),
            session_key: "s".into(),
            seq: 3,
        };
        round_trip(&Cancelled {
            outcome: outcome.clone(),
            notice: None,
        });
        round_trip(&Cancelled {
            outcome,
            notice: Some(CancelNotice {
                acp_session_id: None,
                notified: false,
                reason: Some("r".into()),
                supervised: None,
            }),
        });
        round_trip(&LeaseRow::Unreadable(Unreadable {
            error: "bad row".into(),
        }));
        round_trip(&StartupReap::default());
        round_trip(&Resumable {
            session_key: "s".into(),
            rest: serde_json::json!({"leaseId": "L", "eventSeq": 4})
                .as_object()
                .unwrap()
                .clone(),
        });
        round_trip(&ReconcileStatus {
            interval_ms: Some(60_000),
            last: Some(ReconcilePass {
                at: 1,
                passes: 2,
                error: None,
                active: Some(1),
                closed: Some(0),
                lost: Some(0),
                left_open: Some(0),
                expired: Some(0),
                rest: serde_json::json!({"straysRemoved": 0})
                    .as_object()
                    .unwrap()
                    .clone(),
            }),
        });
        round_trip(&Welcome {
            daemon_pid: 1,
            events: true,
            features: vec!["ping".into()],
            ops: vec!["status".into()],
            protocol: 1,
            version: "0".into(),
        });
        round_trip(&Pong { at: 1, pong: true });
        round_trip(&Detached {
            attach_id: Value::from("a"),
            detached: 1,
        });
        round_trip(&MetricsText {
            content_type: "t".into(),
            text: "x".into(),
        });
    }

    #[test]
    fn a_cancel_without_a_notice_is_the_bare_outcome() {
        // `leash cancel --json` without a daemon prints the outcome alone, as it always did.
        let c = Cancelled {
            outcome: CancelOutcome {
                lease_id: "L".into(),
                session_key: "s".into(),
                seq: 3,
            },
            notice: None,
        };
        assert_eq!(
            serde_json::to_value(&c).unwrap(),
            serde_json::json!({"leaseId": "L", "sessionKey": "s", "seq": 3})
        );
    }

    #[test]
    fn a_lease_row_is_never_read_as_an_unreadable_one() {
        let row: LeaseRow = serde_json::from_value(serde_json::json!({"error": "x"})).unwrap();
        assert!(matches!(row, LeaseRow::Unreadable(_)));
        let extra: Result<LeaseRow, _> =
            serde_json::from_value(serde_json::json!({"error": "x", "leaseId": "L"}));
        assert!(extra.is_err(), "neither a lease nor an unreadable row");
    }

    /// The bodies the session's reader and `push_event` render by hand (`session/stdio.rs`, `session/replay.rs`), and the
    /// ones rendered from types here, read back as the items clients expect.
    #[test]
    fn stream_bodies_read_as_stream_items() {
        let id = Value::from(7);
        let cases: Vec<(String, StreamItem)> = vec![
            (
                r#""seq":3,"type":"output","line":"{\"a\":1}","lossy":true"#.into(),
                StreamItem::Output {
                    seq: 3,
                    line: "{\"a\":1}".into(),
                    lossy: true,
                    truncated: false,
                },
            ),
            (
                r#""seq":4,"type":"stderr","line":"oops","truncated":true"#.into(),
                StreamItem::Stderr {
                    seq: 4,
                    line: "oops".into(),
                    truncated: true,
                },
            ),
            (
                r#""seq":5,"type":"event","kind":"cancel","leaseId":"L","detail":{"notified":true},"at":9"#
                    .into(),
                StreamItem::Event {
                    seq: 5,
                    kind: "cancel".into(),
                    lease_id: Some("L".into()),
                    detail: serde_json::json!({"notified": true}),
                    at: 9,
                },
            ),
        ];
        for (body, want) in cases {
            let line = stream_line(&id, &body);
            let m: Message = serde_json::from_slice(&line).unwrap();
            assert_eq!(m.id, id);
            assert_eq!(m.into_item(), Some(want.clone()), "{body}");
            // And the typed rendering reads back the same.
            let typed = stream_line(&id, &item_body(&want));
            let m: Message = serde_json::from_slice(&typed).unwrap();
            assert_eq!(m.into_item(), Some(want));
        }
        let end = StreamItem::End {
            error: Some(EndError {
                code: "seq_evicted".into(),
                last_seq: 9,
                message: "m".into(),
                oldest_seq: 4,
                exit_status: None,
                stderr: None,
            }),
            last_seq: 2,
            reason: EndReason::Evicted,
        };
        let v: Value = serde_json::from_slice(&stream_line(&id, &item_body(&end))).unwrap();
        assert_eq!(v["type"], "end");
        assert_eq!(v["reason"], "evicted");
        assert_eq!(v["error"]["oldestSeq"], 4);
        assert_eq!(end.seq(), None);
        round_trip(&end);
    }

    #[test]
    fn a_client_reads_replies_and_errors() {
        let ok = ok_line(&Value::from(1), &Pong { at: 2, pong: true });
        let m: Message = serde_json::from_slice(&ok).unwrap();
        let result = m.into_reply().unwrap().unwrap();
        assert_eq!(
            serde_json::from_value::<Pong>(result).unwrap(),
            Pong { at: 2, pong: true }
        );
        let data = ErrorData {
            exit_status: Some(None),
            stderr: Some(vec!["boom".into()]),
            ..ErrorData::default()
        };
        let err = err_line(&Value::from(1), Code::SpawnFailed, "m", &data);
        let v: Value = serde_json::from_slice(&err).unwrap();
        assert!(v["error"]["exitStatus"].is_null() && v["error"].get("exitStatus").is_some());
        let m: Message = serde_json::from_slice(&err).unwrap();
        let e = m.into_reply().unwrap().unwrap_err();
        assert_eq!((e.code.as_str(), e.message.as_str()), ("spawn_failed", "m"));
        assert_eq!(e.data.stderr, Some(vec!["boom".to_string()]));
    }
}
