//! The effects behind the MCP tools, for one requester fixed at start: every tool first runs the
//! matching [`Controller`] operation — the same functions `leash sessions` runs, with the same
//! [`View`], so the one visibility check decides — and only then asks the running daemon for
//! what only it holds (output lines, phase, busy), about the one session already authorised.
//!
//! A session that does not exist and a session that is not visible give the *same* tool error,
//! so an agent cannot probe for the existence of sessions it may not see.

use super::tools::{
    merge_history, HistoryItem, HistoryResult, Resources, SendResult, StatusResult, ToolError,
    Tools,
};
use crate::client::{Client, ClientError};
use crate::controller::session_input::SessionsError;
use crate::controller::sessions::{describe, Listing, SessionStatus, View};
use crate::controller::Controller;
use crate::proc::LiveTable;
use crate::protocol::{StatusSession, StreamItem};
use crate::state::StateRoot;
use leash_core::kind::Code;
use serde_json::Value;
use std::collections::VecDeque;
use std::time::Duration;

/// How long reading the daemon's replay of a session may wait for the next item. The replay is
/// in the daemon's memory, so this bounds a daemon that hangs, not normal work.
const REPLAY_READ_TIMEOUT: Duration = Duration::from_secs(5);

static TABLE: LiveTable = LiveTable;

/// The tools of one requester over one state root. The database is opened on the first call, so
/// `initialize` never waits for it and a broken state root is a tool error the model sees.
pub struct SessionTools {
    root: StateRoot,
    view: View,
    sessions: Option<Controller<'static>>,
}

impl SessionTools {
    pub fn new(root: StateRoot, view: View) -> SessionTools {
        SessionTools {
            root,
            view,
            sessions: None,
        }
    }

    fn sessions(&mut self) -> Result<&Controller<'static>, ToolError> {
        if self.sessions.is_none() {
            let s = Controller::open(self.root.clone(), &TABLE).map_err(|e| {
                ToolError(format!(
                    "leash cannot open its state database ({e}); this is a problem of the host, \
                     not of your request: report it to the operator"
                ))
            })?;
            self.sessions = Some(s.with_session_input(crate::client::session_input::DaemonInput));
        }
        Ok(self.sessions.as_ref().expect("just opened"))
    }

    fn daemon(&self) -> Option<Client> {
        Client::probe(&self.root)
    }
}

/// The tool error for a [`SessionsError`]. Not found and not visible read the same.
fn refusal(view: &View, key: &str, e: SessionsError) -> ToolError {
    // The key comes from the agent: shown escaped and, when long, shortened (never echoed whole).
    let key = &leash_core::limits::show_key(key);
    let hidden = || {
        ToolError(format!(
            "session {key} is not visible to this session ({}, visibility {}); call \
                 sessions_list to see the sessions you may use. Nothing was read or sent.",
            leash_core::limits::show_key(&view.requester),
            describe(&view.scope)
        ))
    };
    match e {
        SessionsError::NotFound(_) | SessionsError::NotVisible { .. } => hidden(),
        SessionsError::Remote { ref code, .. } => match code.as_deref().and_then(Code::parse) {
            Some(Code::NotFound) => ToolError(format!(
                "session {key} is not supervised by the running leash daemon (it was started \
                     by another process), so leash cannot write to its stdin; nothing was sent"
            )),
            Some(Code::NotRunning) => ToolError(format!(
                "session {key} is closing or has ended; nothing was sent (session_status \
                     shows its phase)"
            )),
            _ => ToolError(e.to_string()),
        },
        SessionsError::Store(ref s) => ToolError(format!(
            "leash could not read its state ({s}); try again, and report it to the operator \
                 if it persists"
        )),
        SessionsError::DaemonNeeded { .. } | SessionsError::MultiLine => ToolError(e.to_string()),
    }
}

/// The one key rule ([`leash_core::limits::check_key`]) for a key an agent names: a key no session
/// can have (empty, over-long, with control characters) is refused with the words of a key that
/// is not visible, so the rule is no oracle; the key is shown shortened.
fn key_rule(view: &View, key: &str) -> Result<(), ToolError> {
    leash_core::limits::check_key("sessionKey", key)
        .map_err(|_| refusal(view, key, SessionsError::NotFound(String::new())))
}

impl Tools for SessionTools {
    fn list(&mut self) -> Result<Listing, ToolError> {
        let view = self.view.clone();
        let s = self.sessions()?;
        s.list(&view).map_err(|e| refusal(&view, "", e))
    }

    fn history(&mut self, key: &str, limit: u64) -> Result<HistoryResult, ToolError> {
        let view = self.view.clone();
        key_rule(&view, key)?;
        let h = self
            .sessions()?
            .history(&view, key)
            .map_err(|e| refusal(&view, key, e))?;
        // The daemon's live output is the current lease's: merged only when that lease is one
        // the requester may see (a reused key streams its new owner's output).
        let replay = if h.current_lease_visible {
            self.daemon().and_then(|c| replay(c, key, limit))
        } else {
            None
        };
        let (supervised, oldest, output, dropped) = match replay {
            Some(r) => (true, r.oldest_seq, r.items, r.dropped),
            None => (false, None, Vec::new(), 0),
        };
        let (items, merged) = merge_history(h.events, output, limit);
        Ok(HistoryResult {
            session_key: h.session_key,
            visible_as: h.visible_as,
            items,
            total: merged + dropped,
            supervised,
            oldest_buffered_seq: oldest,
        })
    }

    fn send(&mut self, key: &str, message: &str) -> Result<SendResult, ToolError> {
        let view = self.view.clone();
        key_rule(&view, key)?;
        // The daemon's `send` reply, as `DaemonInput` passed it on.
        let sent = self
            .sessions()?
            .send(&view, key, message)
            .map_err(|e| refusal(&view, key, e))?;
        Ok(SendResult {
            session_key: key.to_string(),
            bytes: sent.bytes as u64,
            busy: sent.busy,
        })
    }

    fn status(&mut self, key: &str) -> Result<StatusResult, ToolError> {
        let view = self.view.clone();
        key_rule(&view, key)?;
        let s = self.sessions()?;
        let detail = s.status(&view, key).map_err(|e| refusal(&view, key, e))?;
        let live = self.daemon().and_then(|c| live_session(c, key));
        let stored_seq = self
            .sessions()?
            .store()
            .last_seq(key)
            .ok()
            .filter(|&s| s > 0);
        Ok(status_result(key, detail, live, stored_seq))
    }
}

/// Combines `leash sessions status` with the daemon's view of the session.
fn status_result(
    key: &str,
    detail: SessionStatus,
    live: Option<StatusSession>,
    stored_seq: Option<i64>,
) -> StatusResult {
    let lease_state = detail.lease.as_ref().map(|l| l.state.as_str().to_string());
    let phase = match (&live, &lease_state) {
        (Some(l), _) => match serde_json::to_value(l.live.phase) {
            Ok(Value::String(p)) => p,
            _ => "unknown".to_string(),
        },
        (None, Some(s)) => match s.as_str() {
            "open" => "running",
            "closing" => "closing",
            _ => "ended",
        }
        .to_string(),
        (None, None) => "none".to_string(),
    };
    StatusResult {
        session_key: key.to_string(),
        visible_as: detail.visible_as,
        phase,
        lease_state,
        busy: live.as_ref().map(|l| l.live.busy),
        last_seq: live.as_ref().map(|l| l.live.last_seq).or(stored_seq),
        supervised: live.is_some(),
        resources: resources(&detail),
        live: live.map(|l| serde_json::to_value(l).expect("status sessions serialise")),
        detail,
    }
}

/// RSS and CPU time of the processes verification proved to belong to the lease, read from
/// /proc; a process whose start time no longer matches (it exited, its pid was reused) is left
/// out.
fn resources(detail: &SessionStatus) -> Option<Resources> {
    let tree = detail.tree.as_ref()?;
    if tree.processes.is_empty() {
        return None;
    }
    let page = procfs::page_size();
    let ticks = procfs::ticks_per_second().max(1);
    let mut r = Resources {
        source: "verified tree".into(),
        processes: 0,
        rss_bytes: 0,
        cpu_ms: 0,
    };
    for p in &tree.processes {
        let Ok(stat) = procfs::process::Process::new(p.pid).and_then(|pr| pr.stat()) else {
            continue;
        };
        if stat.starttime != p.start_time {
            continue;
        }
        r.processes += 1;
        r.rss_bytes += stat.rss * page;
        r.cpu_ms += (stat.utime + stat.stime) * 1000 / ticks;
    }
    (r.processes > 0).then_some(r)
}

/// The daemon's session object for `key` (its `status` op), if it supervises it.
fn live_session(mut c: Client, key: &str) -> Option<StatusSession> {
    let st = c
        .status()
        .map_err(|e| tracing::warn!(error = %e, "the daemon's status is unavailable"))
        .ok()?;
    st.daemon?
        .sessions
        .into_iter()
        .find(|s| s.live.session_key == key)
}

struct Replay {
    oldest_seq: Option<i64>,
    /// The newest `limit` output lines.
    items: Vec<HistoryItem>,
    /// Output lines read but not kept (older than the newest `limit`).
    dropped: usize,
}

/// The output lines the daemon holds for `key`: an `attach` from the start of its replay
/// buffer, read up to the `lastSeq` its reply names, then the connection is dropped (which ends
/// the attach on the daemon's side). `None` when the daemon does not supervise the session.
fn replay(mut c: Client, key: &str, limit: u64) -> Option<Replay> {
    let _ = c.set_read_timeout(Some(REPLAY_READ_TIMEOUT));
    let reply = match c.attach(key, 0) {
        Ok(r) => r,
        Err(ClientError::Remote {
            ref code, ref data, ..
        }) if code == Code::SeqEvicted.as_str() => {
            let oldest = data.oldest_seq?;
            c.attach(key, oldest - 1)
                .map_err(|e| tracing::warn!(error = %e, "attach for history failed"))
                .ok()?
        }
        Err(e) => {
            if e.code() != Some(Code::NotFound) {
                tracing::warn!(error = %e, session = key, "attach for history failed");
            }
            return None;
        }
    };
    // The attach's id is the one `call` just used; stream items carry it.
    let last = reply.last_seq;
    let since = reply.since;
    let mut out = Replay {
        oldest_seq: reply.oldest_seq,
        items: Vec::new(),
        dropped: 0,
    };
    let keep = usize::try_from(limit).unwrap_or(usize::MAX);
    let mut ring: VecDeque<HistoryItem> = VecDeque::new();
    let mut seen = since;
    while seen < last {
        let item = match c.next_item() {
            Ok(v) => v,
            Err(e) => {
                tracing::warn!(error = %e, session = key, "reading the replay stopped early");
                break;
            }
        };
        let Some(seq) = item.seq() else {
            // `end` (the session ended and everything was delivered, or we were evicted).
            break;
        };
        seen = seq;
        if let StreamItem::Output {
            line,
            lossy,
            truncated,
            ..
        } = item
        {
            ring.push_back(HistoryItem::output(seq, line, lossy, truncated));
            if ring.len() > keep {
                ring.pop_front();
                out.dropped += 1;
            }
        }
    }
    out.items = ring.into();
    Some(out)
}
