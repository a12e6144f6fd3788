//! Stored ensure specs: what `ensure` was asked to run for a session (argv, cwd, env, ownership,
//! grace), kept in the state database so that `ensure {session}` with no argv re-spawns a
//! resumable session as it was, after a daemon restart, without the gateway sending it again.
//!
//! Kept in the store's `meta` table under `session.spec.<key>` (no schema change; the database is
//! 0600 inside the 0700 state root). What a spec holds of `env` (docs/security.md): only the
//! names, unless the ensure asked for the values too (`persistEnv: true`); a spec stored without
//! them re-spawns only when `ensure {session}` gives `env` again, a value for each name
//! ([`Spec::into_request`] says which are missing). A spec goes with its session: deleted by
//! `persistSpec: false` (also on an ensure that finds the session running), by a close with
//! `discardPersistentState`, and when the session's last lease expires past the retention
//! ([`Store::expire`]). The conversion between a request and a spec is pure; only [`save`],
//! [`load`] and [`forget`] touch the store.

use crate::protocol::Ensure;
use crate::store::{Store, StoreError};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

const PREFIX: &str = crate::store::SPEC_KEY_PREFIX;

crate::protocol::with_launch_fields! {
    /// A session's ensure request without its per-call fields.
    #[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub struct Spec {
        ..argv_cwd,
        /// The env values, only when the ensure asked for them to be stored (`persistEnv`).
        #[serde(default)]
        pub env: BTreeMap<String, String>,
        /// The names of an env whose values were not stored: a resume must give them again.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        pub env_names: Vec<String>,
        ..launch,
    }
}

impl Spec {
    /// The spec of a request that started a session: env values only with `persistEnv`.
    pub fn of(e: &Ensure) -> Spec {
        let (env, env_names) = if e.persist_env {
            (e.env.clone(), Vec::new())
        } else {
            (BTreeMap::new(), e.env.keys().cloned().collect())
        };
        Spec {
            argv: e.argv.clone(),
            cwd: e.cwd.clone(),
            env,
            env_names,
            unset_env: e.unset_env.clone(),
            clear_env: e.clear_env,
            keep_env: e.keep_env.clone(),
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

    /// The request that re-spawns this spec (the caller's per-call fields kept). The env is the
    /// stored one, or the one `asked` gives (which must name every stored name: `Err` lists
    /// those it misses). A spec stored with its values keeps them unless `asked` gives `env`.
    pub fn into_request(self, asked: &Ensure) -> Result<Ensure, Vec<String>> {
        let missing: Vec<String> = self
            .env_names
            .iter()
            .filter(|n| !asked.env.contains_key(*n))
            .cloned()
            .collect();
        if !missing.is_empty() {
            return Err(missing);
        }
        let env = if asked.env.is_empty() {
            self.env
        } else {
            asked.env.clone()
        };
        // Stored again as it was: values only if they were stored before.
        let persist_env = self.env_names.is_empty() && !env.is_empty();
        Ok(Ensure {
            session: asked.session.clone(),
            argv: self.argv,
            cwd: self.cwd,
            env,
            unset_env: self.unset_env,
            clear_env: self.clear_env,
            keep_env: self.keep_env,
            agent: self.agent,
            owner: self.owner,
            spawned_by: self.spawned_by,
            parent: self.parent,
            grace_ms: self.grace_ms,
            memory_max: self.memory_max,
            pids_max: self.pids_max,
            cpu_max: self.cpu_max,
            persist_spec: asked.persist_spec,
            persist_env,
            wait_ms: asked.wait_ms,
            queue_timeout_ms: asked.queue_timeout_ms,
            initialize: asked.initialize.clone(),
            handshake_timeout_ms: asked.handshake_timeout_ms,
        })
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
        // Stored without the values: the names only, and a resume must give them.
        assert!(spec.env.is_empty());
        assert_eq!(spec.env_names, vec!["K".to_string()]);
        assert!(!text.contains("\"v\""), "{text}");
        assert_eq!(back.clone().into_request(&resumed).unwrap_err(), vec!["K"]);
        let with_env: Ensure =
            serde_json::from_str(r#"{"session":"s","waitMs":5,"env":{"K":"v2"}}"#).unwrap();
        let req = back.into_request(&with_env).unwrap();
        assert_eq!(req.env.get("K").map(String::as_str), Some("v2"));
        assert!(!req.persist_env);
        // Asked to keep the values: stored, and a resume needs none.
        let asked_env: Ensure = serde_json::from_str(
            r#"{"session":"s","argv":["a","b"],"cwd":"/","env":{"K":"v"},"agent":"ag","graceMs":7,"persistEnv":true}"#,
        )
        .unwrap();
        let req = Spec::of(&asked_env).into_request(&resumed).unwrap();
        assert!(req.persist_env);
        assert_eq!(req.argv, asked.argv);
        assert_eq!(req.env, asked.env);
        assert_eq!(req.cwd, asked.cwd);
        assert_eq!(req.agent, asked.agent);
        assert_eq!(req.grace_ms, Some(7));
        assert_eq!(req.wait_ms, Some(5));
    }

    /// Both [`Ensure`] and [`Spec`] are declared through one field list; what they read and write
    /// stays as it was: a stored spec byte for byte (rows already in databases are read back by
    /// the same names), and an unknown ensure field refused with every field, in order.
    #[test]
    fn the_stored_spec_and_the_ensure_fields_stay_as_they_were() {
        let asked: Ensure = serde_json::from_str(
            r#"{"session":"s","argv":["a","b"],"cwd":"/w","env":{"K":"v"},"unsetEnv":["U"],"clearEnv":true,"keepEnv":["P"],"owner":"o","parent":"p","graceMs":9,"memoryMax":4096,"cpuMax":"0.5","waitMs":3}"#,
        )
        .unwrap();
        assert_eq!(
            serde_json::to_string(&Spec::of(&asked)).unwrap(),
            r#"{"argv":["a","b"],"cwd":"/w","env":{},"envNames":["K"],"unsetEnv":["U"],"clearEnv":true,"keepEnv":["P"],"agent":null,"owner":"o","spawnedBy":null,"parent":"p","graceMs":9,"memoryMax":4096,"pidsMax":null,"cpuMax":"0.5"}"#
        );
        let bare: Ensure = serde_json::from_str(r#"{"session":"s","argv":["a"]}"#).unwrap();
        let refused = crate::protocol::parse_request(
            br#"{"id":1,"op":"ensure","session":"s","argv":["a"],"bogus":1}"#,
        )
        .unwrap_err();
        assert_eq!(
            serde_json::to_string(&Spec::of(&bare)).unwrap(),
            r#"{"argv":["a"],"cwd":null,"env":{},"agent":null,"owner":null,"spawnedBy":null,"parent":null,"graceMs":null,"memoryMax":null,"pidsMax":null,"cpuMax":null}"#
        );
        assert_eq!(
            refused.message,
            "ensure: unknown field `bogus`, expected one of `session`, `argv`, `cwd`, `env`, \
             `unsetEnv`, `clearEnv`, `keepEnv`, `agent`, `owner`, `spawnedBy`, `parent`, \
             `graceMs`, `memoryMax`, `pidsMax`, `cpuMax`, `persistSpec`, `persistEnv`, `waitMs`, \
             `queueTimeoutMs`, `initialize`, `handshakeTimeoutMs`"
        );
    }

    /// A stored spec, every field set, as the database keeps it: pinned, so a change in how the
    /// struct is declared cannot move, rename or drop a field.
    #[test]
    fn a_stored_spec_is_pinned() {
        let spec = Spec {
            argv: vec!["a".into()],
            cwd: Some("/c".into()),
            env: BTreeMap::from([("K".to_string(), "v".to_string())]),
            env_names: vec!["N".into()],
            unset_env: vec!["U".into()],
            clear_env: true,
            keep_env: vec!["P".into()],
            agent: Some("ag".into()),
            owner: Some("ow".into()),
            spawned_by: Some("sb".into()),
            parent: Some("pa".into()),
            grace_ms: Some(5),
            memory_max: Some(6),
            pids_max: Some(7),
            cpu_max: Some("0.5".into()),
        };
        let json = serde_json::to_string(&spec).unwrap();
        assert_eq!(
            json,
            r#"{"argv":["a"],"cwd":"/c","env":{"K":"v"},"envNames":["N"],"unsetEnv":["U"],"clearEnv":true,"keepEnv":["P"],"agent":"ag","owner":"ow","spawnedBy":"sb","parent":"pa","graceMs":5,"memoryMax":6,"pidsMax":7,"cpuMax":"0.5"}"#
        );
        assert_eq!(serde_json::from_str::<Spec>(&json).unwrap(), spec);
    }
}
