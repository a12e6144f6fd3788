//! Stored ensure specs: what `ensure` was asked to run for a session (argv, cwd, env, ownership,
//! grace), kept in the state database so that `ensure {session}` with no argv re-spawns a
//! resumable session as it was, after a daemon restart, without the gateway sending it again.
//!
//! Kept in the store's `meta` table under `session.spec.<key>` (no schema change; the database is
//! 0600 inside the 0700 state root, see docs/security.md: env values are stored as given).
//! `persistSpec: false` on `ensure` deletes a stored spec and stores none. The conversion between
//! a request and a spec is pure; only [`save`], [`load`] and [`forget`] touch the store.

use super::protocol::Ensure;
use crate::store::{Store, StoreError};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

const PREFIX: &str = "session.spec.";

/// A session's ensure request without its per-call fields.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Spec {
    pub argv: Vec<String>,
    #[serde(default)]
    pub cwd: Option<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
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
    #[serde(default)]
    pub memory_max: Option<u64>,
    #[serde(default)]
    pub pids_max: Option<u64>,
    #[serde(default)]
    pub cpu_max: Option<String>,
}

impl Spec {
    pub fn of(e: &Ensure) -> Spec {
        Spec {
            argv: e.argv.clone(),
            cwd: e.cwd.clone(),
            env: e.env.clone(),
            agent: e.agent.clone(),
            owner: e.owner.clone(),
            spawned_by: e.spawned_by.clone(),
            parent: e.parent.clone(),
            grace_ms: e.grace_ms,
            memory_max: e.memory_max,
            pids_max: e.pids_max,
            cpu_max: e.cpu_max.clone(),
        }
    }

    /// The request that re-spawns this spec (the caller's per-call fields kept).
    pub fn into_request(self, asked: &Ensure) -> Ensure {
        Ensure {
            session: asked.session.clone(),
            argv: self.argv,
            cwd: self.cwd,
            env: self.env,
            agent: self.agent,
            owner: self.owner,
            spawned_by: self.spawned_by,
            parent: self.parent,
            grace_ms: self.grace_ms,
            memory_max: self.memory_max,
            pids_max: self.pids_max,
            cpu_max: self.cpu_max,
            persist_spec: asked.persist_spec,
            wait_ms: asked.wait_ms,
        }
    }
}

fn key(session: &str) -> String {
    format!("{PREFIX}{session}")
}

/// Makes the database files `0600` before a spec (with its env values) is written into them: the
/// 0700 state root already keeps others out, this keeps it so if the root's mode is loosened.
/// SQLite creates `-wal` and `-shm` with the database's mode.
pub fn protect(root: &crate::state::StateRoot) {
    use std::os::unix::fs::PermissionsExt;
    let db = root.db_path();
    let mut paths = vec![db.clone()];
    for suffix in ["-wal", "-shm", "-journal"] {
        let mut p = db.clone().into_os_string();
        p.push(suffix);
        paths.push(p.into());
    }
    for p in paths {
        match std::fs::metadata(&p) {
            Ok(m) if m.permissions().mode() & 0o077 != 0 => {
                if let Err(e) = std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600))
                {
                    tracing::warn!(path = %p.display(), error = %e, "cannot make the database 0600");
                }
            }
            _ => {}
        }
    }
}

pub fn save(store: &mut Store, session: &str, spec: &Spec) -> Result<(), StoreError> {
    let text = serde_json::to_string(spec).expect("specs serialise");
    store.set_meta(&key(session), Some(&text))
}

/// The stored spec; `Ok(None)` when there is none or it cannot be read (logged: an unreadable
/// spec is treated as absent, so the caller asks for argv rather than running garbage).
pub fn load(store: &Store, session: &str) -> Result<Option<Spec>, StoreError> {
    let Some(text) = store.meta(&key(session))? else {
        return Ok(None);
    };
    match serde_json::from_str::<Spec>(&text) {
        Ok(s) if !s.argv.is_empty() && !s.argv[0].is_empty() => Ok(Some(s)),
        Ok(_) => Ok(None),
        Err(e) => {
            tracing::warn!(session_key = %session, error = %e, "ignoring an unreadable stored spec");
            Ok(None)
        }
    }
}

pub fn forget(store: &mut Store, session: &str) -> Result<(), StoreError> {
    store.set_meta(&key(session), None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spec_round_trips_into_the_request_that_started_it() {
        let asked: Ensure = serde_json::from_str(
            r#"{"session":"s","argv":["a","b"],"cwd":"/","env":{"K":"v"},"agent":"ag","graceMs":7}"#,
        )
        .unwrap();
        let spec = Spec::of(&asked);
        let text = serde_json::to_string(&spec).unwrap();
        let back: Spec = serde_json::from_str(&text).unwrap();
        let resumed: Ensure = serde_json::from_str(r#"{"session":"s","waitMs":5}"#).unwrap();
        let req = back.into_request(&resumed);
        assert_eq!(req.argv, asked.argv);
        assert_eq!(req.env, asked.env);
        assert_eq!(req.cwd, asked.cwd);
        assert_eq!(req.agent, asked.agent);
        assert_eq!(req.grace_ms, Some(7));
        assert_eq!(req.wait_ms, Some(5));
    }
}
