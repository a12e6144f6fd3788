//! `hello`: version, features and ops, and the subscription to lifecycle pushes.

use super::cx::*;
use crate::daemon::spec;
use crate::protocol::{Resumable, Welcome, OPS, PROTOCOL_VERSION};

/// What `hello` announces beyond the original protocol; a client checks these instead of
/// comparing versions. Ops are listed separately (`ops`), so ops added later need no entry here.
pub const FEATURES: &[&str] = &[
    "ping",
    "detach",
    "attach.sinceClamp",
    "attach.stderr",
    "ensure.wait",
    "ensure.argvMatches",
    "ensure.storedSpec",
    "events.resumable",
    // An exit before the adapter's first output line ends the stream `start_failed`.
    "attach.startFailed",
    // A close that meets an ensure in flight closes what it started; the ensure says `closed`.
    "ensure.closedInFlight",
    // `initialize` and `handshakeTimeoutMs`: the daemon sends the handshake (`handshake_timeout`).
    "ensure.handshake",
];

fn hello(d: &Arc<Daemon>, out: &Arc<Out>, id: &Value, h: &Hello) {
    tracing::debug!(
        client = h.client.as_deref(),
        protocol = h.protocol,
        events = h.events,
        "hello"
    );
    let result = Welcome {
        daemon_pid: d.me.pid,
        events: h.events,
        features: FEATURES.iter().map(|f| f.to_string()).collect(),
        ops: OPS.iter().map(|o| o.to_string()).collect(),
        protocol: PROTOCOL_VERSION,
        version: crate::daemon::version::version(),
    };
    if !out.reply(id, Ok(result)) || !h.events {
        return;
    }
    let initial: Vec<String> = d
        .resumable
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .map(|entry| resumable_item(d, entry))
        .map(|item| item_body(&item))
        .collect();
    let weak = Arc::downgrade(out);
    d.push.subscribe(
        id.clone(),
        Box::new(move |line| weak.upgrade().is_some_and(|o| o.send(line))),
        &initial,
    );
}

/// A resumable entry as a push item, with whether `ensure {session}` can re-spawn it from a
/// stored spec, and the env names it must then give values for.
fn resumable_item(d: &Daemon, entry: &Resumable) -> StreamItem {
    let stored = spec::load(&d.store(), &entry.session_key).ok().flatten();
    StreamItem::Resumable {
        has_spec: stored.is_some(),
        needs_env: stored.map(|s| s.env_names).unwrap_or_default(),
        entry: entry.clone(),
    }
}

impl Handles<Hello> for Cx<'_> {
    type Done = Timed;

    fn handle(self, h: Hello) -> Timed {
        hello(self.d, self.out, &self.id, &h);
        Timed::Here
    }
}
