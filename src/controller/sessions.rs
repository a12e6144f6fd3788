//! The `leash sessions` operations — list, status and send (history is the events verb's,
//! `events.rs`) — over one state root, each run as a requester, as methods of the one
//! [`Controller`]. Every operation goes through
//! [`Controller::authorize`] or, for `list`,
//! through [`leash_core::visibility::visible_rows`], and both ask the one pure check
//! ([`leash_core::visibility::grant`]) over the rows loaded once from the store. A session the
//! requester may not see is an error, never an empty success. The command line
//! (`cli::sessions`) and the daemon (its `sessions` op with a `query`) both run these, so they
//! answer alike.

use super::base::Controller;
use super::session_input::{Sent, SessionInput, SessionsError};
use leash_core::answer::LiveMember;
use leash_core::model::SessionRow;
use leash_core::model::{Lease, LeaseState, ProcessId};
use leash_core::verify::{verify_owned_tree, Expect, Verdict};
use leash_core::visibility::{visible_rows, A2aPolicy, Grant, Scope, SessionIndex, Visibility};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;

/// A requester and its scope: the input of every sessions operation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct View {
    pub requester: String,
    pub scope: Scope,
}

impl View {
    pub fn new(requester: &str, scope: Scope) -> View {
        View {
            requester: requester.to_string(),
            scope,
        }
    }
}

pub(crate) fn describe(scope: &Scope) -> String {
    let eff = scope.effective();
    if eff == scope.visibility {
        eff.to_string()
    } else {
        format!("{eff} (sandboxed; configured {})", scope.visibility)
    }
}

fn why_hidden(v: Visibility) -> &'static str {
    match v {
        Visibility::SelfOnly => "only the requester's own session is visible",
        Visibility::Tree => "it is neither owned by nor spawned from the requester",
        Visibility::Agent => {
            "it belongs to another agent and is neither owned by nor spawned from the requester"
        }
        Visibility::All => {
            "it belongs to another agent that the a2a policy does not allow, and is neither owned \
             by nor spawned from the requester"
        }
    }
}

/// One row of `list`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Listed {
    #[serde(flatten)]
    pub session: SessionRow,
    /// The state of the session's newest lease (none once expired).
    pub lease_state: Option<LeaseState>,
    pub visible_as: Grant,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Listing {
    pub requester: String,
    pub requester_agent: Option<String>,
    pub visibility: Visibility,
    pub effective_visibility: Visibility,
    pub sandboxed: bool,
    pub a2a: A2aPolicy,
    pub sessions: Vec<Listed>,
}

/// A recorded process and whether that instance is alive now (`None`: the table is unreadable).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProcState {
    pub pid: i32,
    pub start_time: u64,
    pub alive: Option<bool>,
}

/// The live tree of an active lease, as verification proves it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LiveTree {
    pub verdict: String,
    pub reason: Option<String>,
    pub processes: Vec<LiveMember>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionStatus {
    pub session: SessionRow,
    pub visible_as: Grant,
    pub lease: Option<Lease>,
    pub root: Option<ProcState>,
    pub adapter: Option<ProcState>,
    /// Only for an open or closing lease.
    pub tree: Option<LiveTree>,
    /// Members and totals, as `leash ps` shows them (open or closing lease only).
    #[serde(default)]
    pub usage: Option<crate::ps::SessionUsage>,
}

impl Controller<'_> {
    /// The one gate of the single-session operations: the row exists (else `NotFound`) and the
    /// requester may see it (else `NotVisible`), judged from all rows loaded once.
    pub fn authorize(&self, view: &View, key: &str) -> Result<(SessionRow, Grant), SessionsError> {
        let rows = self.store().sessions()?;
        let index = SessionIndex::from_rows(&rows);
        let Some(row) = rows.iter().find(|r| r.session_key == key) else {
            return Err(SessionsError::NotFound(key.to_string()));
        };
        let requester = index.requester(&view.requester);
        let meta = index.get(key).expect("the index holds every loaded row");
        match view.scope.grant(&requester, meta) {
            Some(g) => Ok((row.clone(), g)),
            None => Err(SessionsError::NotVisible {
                key: key.to_string(),
                requester: view.requester.clone(),
                visibility: describe(&view.scope),
                why: why_hidden(view.scope.effective()),
            }),
        }
    }

    pub fn list(&self, view: &View) -> Result<Listing, SessionsError> {
        // Lease states and adapter pids current: the wrappers' reports folded in first.
        self.ingest_reports_marking_ended_lost()?;
        let rows = self.store().sessions()?;
        let mut lease_state: HashMap<String, LeaseState> = HashMap::new();
        // Oldest first, so the newest lease of a session is the one left in the map.
        for lease in self.store().leases(&[])?.into_iter().flatten() {
            lease_state.insert(lease.session_key, lease.state);
        }
        let requester_agent = SessionIndex::from_rows(&rows)
            .requester(&view.requester)
            .agent()
            .map(str::to_string);
        let sessions = visible_rows(&rows, &view.requester, &view.scope)
            .into_iter()
            .map(|(r, g)| Listed {
                lease_state: lease_state.get(&r.session_key).copied(),
                session: r.clone(),
                visible_as: g,
            })
            .collect();
        Ok(Listing {
            requester: view.requester.clone(),
            requester_agent,
            visibility: view.scope.visibility,
            effective_visibility: view.scope.effective(),
            sandboxed: view.scope.sandboxed,
            a2a: view.scope.a2a.clone(),
            sessions,
        })
    }

    pub fn status(&self, view: &View, key: &str) -> Result<SessionStatus, SessionsError> {
        let (session, visible_as) = self.authorize(view, key)?;
        // Lease states and adapter pids current: the wrappers' reports folded in first.
        self.ingest_reports_marking_ended_lost()?;
        let lease = self.store().latest_lease_for_session(key)?;
        let state = |id: ProcessId| ProcState {
            pid: id.pid,
            start_time: id.start_time,
            alive: self.table.alive(id).ok(),
        };
        let root = lease.as_ref().map(|l| state(l.root()));
        let adapter = lease.as_ref().and_then(Lease::adapter).map(state);
        let tree = lease
            .as_ref()
            .filter(|l| l.state.is_active())
            .map(|l| self.live_tree(l));
        let usage = lease.as_ref().filter(|l| l.state.is_active()).map(|l| {
            let containment = crate::cgroup::Containment::resolve(
                &crate::cgroup::Settings::from_env().unwrap_or_default(),
                &self.gateway,
            );
            let wrapper_root = self.root.wrapper_root();
            let expect = Expect {
                gateway_instance_id: &self.gateway,
                wrapper_root: &wrapper_root,
                cgroup_root: containment.gateway_root.as_deref(),
            };
            crate::ps::usage_of(l, &expect, self.table, &crate::ps::Reader::new())
        });
        Ok(SessionStatus {
            session,
            visible_as,
            lease,
            root,
            adapter,
            tree,
            usage,
        })
    }

    fn live_tree(&self, lease: &Lease) -> LiveTree {
        let snap = match self.table.snapshot() {
            Ok(s) => s,
            Err(e) => {
                return LiveTree {
                    verdict: "unverifiable".into(),
                    reason: Some(e.to_string()),
                    processes: Vec::new(),
                }
            }
        };
        let wrapper_root = self.root.wrapper_root();
        let expect = Expect {
            gateway_instance_id: &self.gateway,
            wrapper_root: &wrapper_root,
            cgroup_root: None,
        };
        let verdict = verify_owned_tree(lease, &expect, &snap);
        let name = verdict.name().to_string();
        match verdict {
            Verdict::Owned(tree) => {
                let mut processes: Vec<LiveMember> =
                    tree.children_first().map(LiveMember::from).collect();
                // Root first for reading; the signalling order is not this command's business.
                processes.reverse();
                LiveTree {
                    verdict: name,
                    reason: None,
                    processes,
                }
            }
            Verdict::Gone { reason }
            | Verdict::NotOwned { reason }
            | Verdict::Unverifiable { reason } => LiveTree {
                verdict: name,
                reason: Some(reason),
                processes: Vec::new(),
            },
        }
    }

    /// Checks visibility and the line, then hands it to the controller's [`SessionInput`]:
    /// whoever holds the adapter's stdin. The front doors set
    /// `client::session_input::DaemonInput` ([`Controller::with_session_input`]), the daemon
    /// serving the state root; without one, [`SessionsError::DaemonNeeded`]. The controller
    /// itself never calls the daemon.
    pub fn send(&self, view: &View, key: &str, line: &str) -> Result<Sent, SessionsError> {
        self.authorize(view, key)?;
        if line.contains('\n') || line.contains('\r') {
            return Err(SessionsError::MultiLine);
        }
        self.input.send_line(&self.root, key, line)
    }

    /// Delivers what [`Controller::send`] allows through `input`.
    pub fn with_session_input(mut self, input: impl SessionInput + Send + Sync + 'static) -> Self {
        self.input = Box::new(input);
        self
    }
}
