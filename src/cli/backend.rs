//! The two ways a CLI verb runs: [`Direct`] calls the library on the state database and `/proc`
//! itself; [`ThroughDaemon`] asks the daemon that serves the state root (`leash serve`). Both
//! return the same types — the daemon's reply types, `protocol/reply.rs`, which are the
//! library's results — so a verb renders one result one way and exits with one code whichever
//! way it ran: output and exit codes cannot drift between the two paths. A daemon's error
//! becomes the [`Failure`] the same failure has without it ([`remote`]).
//!
//! Which one runs is decided once, by [`open`]: the daemon when one answers on the state root's
//! socket (or the one `--socket` names), unless `--no-daemon`.

use super::exit::Failure;
use crate::client::{Client, ClientError};
use crate::controller::session_input::Sent;
use crate::controller::sessions::{Listing, SessionStatus, View};
use crate::controller::History;
use crate::controller::{CloseOutcome, Controller, LeaseRef, ReapReport};
use crate::proc::LiveTable;
use crate::protocol::{Cancelled, LeaseRow, Status};
use crate::state::StateRoot;
use leash_core::answer::VerifyReport;
use leash_core::kind::{HasKind, Kind};
use leash_core::model::LeaseState;
use leash_core::plan::{ReapOptions, ReapPlan};
use std::path::{Path, PathBuf};

/// The verbs a CLI command runs, with their typed results.
pub(super) trait Backend {
    fn status(&mut self) -> Result<Status, Failure>;
    fn leases(&mut self, state: Option<LeaseState>) -> Result<Vec<LeaseRow>, Failure>;
    fn close(
        &mut self,
        targets: &[LeaseRef],
        grace_ms: Option<u64>,
    ) -> Result<Vec<CloseOutcome>, Failure>;
    /// Records the intent to cancel; through the daemon it also writes the ACP notification
    /// (and says so in [`Cancelled::notice`]).
    fn cancel(&mut self, target: &LeaseRef, acp: Option<&str>) -> Result<Cancelled, Failure>;
    fn reap_plan(&mut self, opts: &ReapOptions) -> Result<ReapPlan, Failure>;
    fn reap(&mut self, opts: &ReapOptions) -> Result<ReapReport, Failure>;
    fn verify(&mut self, target: &LeaseRef) -> Result<VerifyReport, Failure>;
    fn sessions_list(&mut self, view: &View) -> Result<Listing, Failure>;
    fn sessions_history(&mut self, view: &View, key: &str) -> Result<History, Failure>;
    fn sessions_status(&mut self, view: &View, key: &str) -> Result<SessionStatus, Failure>;
    /// Needs a daemon either way (only it holds the adapter's stdin).
    fn sessions_send(&mut self, view: &View, key: &str, line: &str) -> Result<Sent, Failure>;
}

/// The backend for this invocation: the daemon serving `root` if one does (and `--no-daemon`
/// is not given), else the state database directly. A socket named with `--socket` must
/// answer, and serve this state root.
pub(super) fn open(
    root: &StateRoot,
    socket: Option<&Path>,
    no_daemon: bool,
) -> Result<Box<dyn Backend>, Failure> {
    let direct = || -> Box<dyn Backend> { Box::new(Direct { root: root.clone() }) };
    if no_daemon {
        return Ok(direct());
    }
    let Some(path) = socket else {
        return Ok(match Client::probe(root) {
            Some(client) => Box::new(ThroughDaemon {
                client,
                root: root.clone(),
            }),
            None => direct(),
        });
    };
    let mut client = Client::connect_to_daemon(root, path).map_err(|e| {
        Failure::new(
            Kind::DaemonNeeded,
            format!("{e}; without --socket leash works on the state database directly"),
        )
    })?;
    let serves: PathBuf = client.status().map_err(remote)?.root.state_dir;
    if serves != root.dir() {
        return Err(Failure::new(
            Kind::Usage,
            format!(
                "the daemon on {} serves state root {}, not {}",
                path.display(),
                serves.display(),
                root.dir().display()
            ),
        ));
    }
    Ok(Box::new(ThroughDaemon {
        client,
        root: root.clone(),
    }))
}

/// The state root the daemon on `socket` serves, asked over a connection of its own: how a
/// client that names only a socket finds the root. The answer is a claim, used only as a path:
/// the root must be a private directory of this uid ([`StateRoot::open_existing_dir`]), and
/// [`open`] then trusts the socket only if that root's lock names its peer, as for any socket.
pub(super) fn served_root(socket: &Path) -> Result<PathBuf, Failure> {
    let refused = |e: ClientError| {
        Failure::new(
            Kind::DaemonNeeded,
            format!("{e}; without --socket leash works on the state database directly"),
        )
    };
    let mut client = Client::connect_unfollowed(socket).map_err(refused)?;
    Ok(client.status().map_err(remote)?.root.state_dir)
}

/// Maps a daemon error to the exit code the same failure has without a daemon, its message in
/// the CLI's words (flags, not wire fields), its cause the daemon's code.
pub(super) fn remote(e: ClientError) -> Failure {
    let f = Failure::new(
        e.kind(),
        format!("{} (via the daemon)", cli_words(&e.to_string())),
    );
    match e.code() {
        Some(c) => f.with_cause(c.as_str()),
        None => f,
    }
}

/// A daemon message with the wire fields the CLI sets named as the flags that set them.
fn cli_words(msg: &str) -> String {
    const FIELDS: &[(&str, &str)] = &[
        ("\"acpSessionId\"", "--acp-session"),
        ("\"graceMs\"", "--grace"),
        ("\"retentionMs\"", "--retention"),
        ("\"requesterSessionKey\"", "--as"),
        ("\"a2aAllow\"", "--a2a-allow"),
        ("\"sessions\"", "--session"),
        ("\"session\"", "--session"),
        ("\"leases\"", "LEASE"),
        ("\"lease\"", "LEASE"),
        ("\"state\"", "--state"),
    ];
    let mut out = msg.to_string();
    for (wire, flag) in FIELDS {
        out = out.replace(wire, flag);
    }
    out
}

/// A `leash sessions` query's daemon error: its kind, its message in the CLI's words (without
/// the "via the daemon" of the other verbs: the answer is the one the direct path gives), its
/// cause the daemon's code.
fn remote_query(e: ClientError) -> Failure {
    let f = Failure::new(e.kind(), cli_words(&e.to_string()));
    match e.code() {
        Some(c) => f.with_cause(c.as_str()),
        None => f,
    }
}

/// The library on the state database and `/proc`, in this process.
pub(super) struct Direct {
    root: StateRoot,
}

impl Direct {
    fn controller(&self) -> Result<Controller<'static>, Failure> {
        static TABLE: LiveTable = LiveTable;
        Ok(Controller::open(self.root.clone(), &TABLE)?)
    }
}

impl Backend for Direct {
    fn status(&mut self) -> Result<Status, Failure> {
        Ok(Status {
            root: self.controller()?.root_status()?,
            daemon: None,
        })
    }

    fn leases(&mut self, state: Option<LeaseState>) -> Result<Vec<LeaseRow>, Failure> {
        let states: Vec<LeaseState> = state.into_iter().collect();
        let rows = self.controller()?.leases(&states)?;
        Ok(rows.into_iter().map(LeaseRow::from).collect())
    }

    fn close(
        &mut self,
        targets: &[LeaseRef],
        grace_ms: Option<u64>,
    ) -> Result<Vec<CloseOutcome>, Failure> {
        Ok(self.controller()?.close(targets, grace_ms)?)
    }

    fn cancel(&mut self, target: &LeaseRef, acp: Option<&str>) -> Result<Cancelled, Failure> {
        let detail = acp.map(|acp| serde_json::json!({"acpSessionId": acp, "notified": false}));
        Ok(Cancelled {
            outcome: self.controller()?.cancel(target, detail)?,
            notice: None,
        })
    }

    fn reap_plan(&mut self, opts: &ReapOptions) -> Result<ReapPlan, Failure> {
        Ok(self.controller()?.plan_reap(opts)?)
    }

    fn reap(&mut self, opts: &ReapOptions) -> Result<ReapReport, Failure> {
        Ok(self.controller()?.reap(opts)?)
    }

    fn verify(&mut self, target: &LeaseRef) -> Result<VerifyReport, Failure> {
        Ok(self.controller()?.verify(target)?)
    }

    fn sessions_list(&mut self, view: &View) -> Result<Listing, Failure> {
        Ok(self.controller()?.list(view)?)
    }

    fn sessions_history(&mut self, view: &View, key: &str) -> Result<History, Failure> {
        Ok(self.controller()?.history(view, key)?)
    }

    fn sessions_status(&mut self, view: &View, key: &str) -> Result<SessionStatus, Failure> {
        Ok(self.controller()?.status(view, key)?)
    }

    fn sessions_send(&mut self, view: &View, key: &str, line: &str) -> Result<Sent, Failure> {
        send(&self.root, view, key, line)
    }
}

/// The daemon that serves the state root.
pub(super) struct ThroughDaemon {
    client: Client,
    root: StateRoot,
}

impl Backend for ThroughDaemon {
    fn status(&mut self) -> Result<Status, Failure> {
        self.client.status().map_err(remote)
    }

    fn leases(&mut self, state: Option<LeaseState>) -> Result<Vec<LeaseRow>, Failure> {
        self.client.leases(state).map_err(remote)
    }

    fn close(
        &mut self,
        targets: &[LeaseRef],
        grace_ms: Option<u64>,
    ) -> Result<Vec<CloseOutcome>, Failure> {
        self.client.close(targets, grace_ms).map_err(remote)
    }

    fn cancel(&mut self, target: &LeaseRef, acp: Option<&str>) -> Result<Cancelled, Failure> {
        self.client.cancel(target, acp).map_err(remote)
    }

    fn reap_plan(&mut self, opts: &ReapOptions) -> Result<ReapPlan, Failure> {
        self.client.reap_plan(opts).map_err(remote)
    }

    fn reap(&mut self, opts: &ReapOptions) -> Result<ReapReport, Failure> {
        self.client.reap(opts).map_err(remote)
    }

    fn verify(&mut self, target: &LeaseRef) -> Result<VerifyReport, Failure> {
        self.client.verify(target).map_err(remote)
    }

    fn sessions_list(&mut self, view: &View) -> Result<Listing, Failure> {
        self.client
            .sessions_query(view, "list", None)
            .map_err(remote_query)
    }

    fn sessions_history(&mut self, view: &View, key: &str) -> Result<History, Failure> {
        self.client
            .sessions_query(view, "history", Some(key))
            .map_err(remote_query)
    }

    fn sessions_status(&mut self, view: &View, key: &str) -> Result<SessionStatus, Failure> {
        self.client
            .sessions_query(view, "status", Some(key))
            .map_err(remote_query)
    }

    fn sessions_send(&mut self, view: &View, key: &str, line: &str) -> Result<Sent, Failure> {
        send(&self.root, view, key, line)
    }
}

/// `leash sessions send`, either way: the controller checks visibility and the line, then hands
/// it to the daemon serving the state root ([`DaemonInput`](crate::client::session_input::DaemonInput),
/// looked for even with `--no-daemon`, since only a daemon holds the adapter's stdin), whose
/// reply comes back as its type.
fn send(root: &StateRoot, view: &View, key: &str, line: &str) -> Result<Sent, Failure> {
    static TABLE: LiveTable = LiveTable;
    Ok(Controller::open(root.clone(), &TABLE)?
        .with_session_input(crate::client::session_input::DaemonInput)
        .send(view, key, line)?)
}
