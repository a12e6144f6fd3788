//! Legacy session records: processes the old gateway started before leases existed. They have a
//! stored pid and the command as the old store kept it (possibly shell-quoted), and nothing else,
//! so their cleanup is fail-safe: a live root is required; when a wrapper path is recorded, the
//! live process must run that wrapper and the wrapper must lie under the recorded wrapper root;
//! otherwise the live argv must equal the stored command token for token (never as raw strings).
//! A stored pid alone never leads to a signal, and what cannot be verified is left alone.

use crate::proc::Snapshot;
use crate::signal::Caller;
use crate::store::{NewLegacyRecord, Store, StoreError};
use crate::verify::{Expect, Member, OwnedTree, Role};
use serde::Deserialize;
use std::path::Path;

/// One record as the old store exported it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LegacyImport {
    pub session_key: String,
    pub pid: i64,
    pub command: String,
    #[serde(default)]
    pub wrapper_path: Option<String>,
}

pub use crate::store::legacy::LegacyRecord;

#[derive(Debug, thiserror::Error)]
pub enum LegacyError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: not a JSON array of {{\"sessionKey\", \"pid\", \"command\", \"wrapperPath\"?}}: {detail}")]
    Format { path: String, detail: String },
    #[error("{path}: record {index}: {detail}")]
    Record {
        path: String,
        index: usize,
        detail: String,
    },
    #[error(transparent)]
    Store(#[from] StoreError),
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error("unterminated {0} quote")]
    Unterminated(char),
    #[error("trailing backslash")]
    TrailingBackslash,
}

/// Splits a command line the way a POSIX shell would for plain words (the `shlex` crate):
/// spaces, tabs and newlines separate tokens; single quotes keep everything literally; double
/// quotes keep everything but the `\"`, `\\`, `\$` and `` \` `` escapes; a backslash outside
/// quotes escapes the next character; a `#` that starts a word starts a comment up to the end of
/// the line. No expansion of any kind is performed.
pub fn shell_split(s: &str) -> Result<Vec<String>, TokenError> {
    shlex::split(s).ok_or_else(|| why_unsplittable(s))
}

/// Why `shlex` refused a command line (it says only that it did): the quote left open, or a
/// backslash with nothing after it. Follows the same quoting rules, reading no further than the
/// error.
fn why_unsplittable(s: &str) -> TokenError {
    let mut chars = s.chars();
    let mut word_start = true;
    while let Some(c) = chars.next() {
        match c {
            ' ' | '\t' | '\n' => word_start = true,
            '#' if word_start => {
                if !chars.by_ref().any(|c| c == '\n') {
                    break;
                }
            }
            '\'' => {
                word_start = false;
                if !chars.by_ref().any(|c| c == '\'') {
                    return TokenError::Unterminated('\'');
                }
            }
            '"' => {
                word_start = false;
                loop {
                    match chars.next() {
                        Some('"') => break,
                        Some('\\') if chars.next().is_some() => {}
                        Some('\\') | None => return TokenError::Unterminated('"'),
                        Some(_) => {}
                    }
                }
            }
            '\\' => {
                word_start = false;
                if chars.next().is_none() {
                    return TokenError::TrailingBackslash;
                }
            }
            _ => word_start = false,
        }
    }
    // shlex refuses only the three cases above; say the likeliest if it ever refuses another.
    TokenError::Unterminated('"')
}

/// Imports records from a JSON file in one transaction: all or nothing.
pub fn import(
    store: &mut Store,
    path: &Path,
    wrapper_root: Option<&Path>,
) -> Result<usize, LegacyError> {
    let shown = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| LegacyError::Read {
        path: shown.clone(),
        source,
    })?;
    let records: Vec<LegacyImport> =
        serde_json::from_str(&text).map_err(|e| LegacyError::Format {
            path: shown.clone(),
            detail: e.to_string(),
        })?;
    for (index, r) in records.iter().enumerate() {
        let bad = |detail: String| LegacyError::Record {
            path: shown.clone(),
            index,
            detail,
        };
        if r.session_key.trim().is_empty() {
            return Err(bad("sessionKey is empty".into()));
        }
        if r.pid <= 0 || r.pid > i32::MAX as i64 {
            return Err(bad(format!("pid {} is not a valid pid", r.pid)));
        }
        if r.command.trim().is_empty() {
            return Err(bad("command is empty".into()));
        }
    }
    let rows: Vec<NewLegacyRecord<'_>> = records
        .iter()
        .map(|r| NewLegacyRecord {
            session_key: &r.session_key,
            pid: r.pid,
            command: &r.command,
            wrapper_path: r.wrapper_path.as_deref(),
        })
        .collect();
    let root = wrapper_root.map(|p| p.display().to_string());
    Ok(store.import_legacy(
        &rows,
        root.as_deref(),
        crate::proc::self_id().start_time,
        crate::lease::now_ms(),
    )?)
}

/// Legacy records, optionally only the open ones.
pub fn records(store: &mut Store, only_open: bool) -> Result<Vec<LegacyRecord>, StoreError> {
    store.legacy_records(only_open)
}

/// Ends a legacy record (`closed` after a verified cleanup, `lost` when its process was gone).
pub fn finish(store: &mut Store, id: i64, state: &str, reason: &str) -> Result<bool, StoreError> {
    store.finish_legacy(id, state, reason)
}

/// Records why a legacy record was left alone (it stays open).
pub fn note(store: &mut Store, id: i64, reason: &str) -> Result<(), StoreError> {
    store.note_legacy(id, reason)
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LegacyVerdict {
    Owned { tree: OwnedTree, reason: String },
    Gone { reason: String },
    Refused { reason: String },
}

/// The legacy fail-safe check. Pure.
pub fn verify_legacy(
    rec: &LegacyRecord,
    expect: &Expect<'_>,
    snap: &Snapshot,
    caller: &Caller,
) -> LegacyVerdict {
    let refuse = |reason: String| LegacyVerdict::Refused { reason };
    if rec.pid <= 1 {
        return refuse(format!(
            "stored pid {} is 1 or lower: never signalled",
            rec.pid
        ));
    }
    if rec.pid == caller.pid || rec.pid == caller.pgid {
        return refuse(format!(
            "stored pid {} is the reaper itself (or leads its process group)",
            rec.pid
        ));
    }
    let Some(p) = snap.get(rec.pid).filter(|p| p.state != 'Z') else {
        return LegacyVerdict::Gone {
            reason: format!("stored pid {} is not running", rec.pid),
        };
    };
    if rec.imported_ticks > 0 && p.start_time > rec.imported_ticks {
        return refuse(format!(
            "pid {} started after the record was imported: the pid was reused",
            p.pid
        ));
    }
    if p.uid != caller.uid {
        return refuse(format!("pid {} runs as uid {}, not ours", p.pid, p.uid));
    }
    if let Some(env) = &p.env {
        if let Some(g) = env.gateway_instance_id.as_deref() {
            if g != expect.gateway_instance_id {
                return refuse(format!("pid {} carries another gateway's id {g}", p.pid));
            }
        }
        if let Some(l) = env.lease_id.as_deref() {
            return refuse(format!(
                "pid {} carries lease id {l}: it is leased, not legacy",
                p.pid
            ));
        }
    }
    let Some(argv) = &p.argv else {
        return refuse(format!("pid {}: its command line is unreadable", p.pid));
    };
    let reason = match &rec.wrapper_path {
        Some(wrapper) => {
            let root = rec
                .wrapper_root
                .as_deref()
                .map(Path::new)
                .unwrap_or(expect.wrapper_root);
            if !Path::new(wrapper).starts_with(root) {
                return refuse(format!(
                    "recorded wrapper {wrapper} is outside the wrapper root {}",
                    root.display()
                ));
            }
            let runs_it =
                p.exe_path() == Some(wrapper.as_str()) || argv.iter().any(|a| a == wrapper);
            if !runs_it {
                return refuse(format!(
                    "pid {} does not run the recorded wrapper {wrapper} (argv {:?})",
                    p.pid, argv
                ));
            }
            format!(
                "pid {} runs the recorded wrapper {wrapper} under {}",
                p.pid,
                root.display()
            )
        }
        None => {
            let tokens = match shell_split(&rec.command) {
                Ok(t) => t,
                Err(e) => return refuse(format!("stored command cannot be tokenised: {e}")),
            };
            if &tokens != argv {
                return refuse(format!(
                    "pid {}: live argv {:?} differs from the stored command {:?}",
                    p.pid, argv, tokens
                ));
            }
            format!(
                "pid {}: live argv equals the stored command, token for token",
                p.pid
            )
        }
    };
    // The tree: the verified root and its descendants, each started after it, same uid, and not
    // carrying some lease's marker.
    let mut members = Vec::new();
    let mut excluded = Vec::new();
    let mut stack = vec![(p.pid, 0usize)];
    // Visited pids: a cycle in the parent links (pids recycled between reads, a corrupt fixture)
    // must end the walk, not loop it.
    let mut seen = std::collections::HashSet::from([p.pid]);
    while let Some((pid, depth)) = stack.pop() {
        for &kid in snap.children_of(pid) {
            if !seen.insert(kid) {
                continue;
            }
            let Some(k) = snap.get(kid) else { continue };
            let why = if k.start_time < p.start_time {
                Some("started before the root")
            } else if k.uid != p.uid {
                Some("runs as another uid")
            } else if k.env.as_ref().is_some_and(|e| e.lease_id.is_some()) {
                Some("carries a lease marker")
            } else if k.state == 'Z' {
                Some("zombie")
            } else {
                None
            };
            match why {
                Some(w) => excluded.push(crate::verify::Excluded {
                    pid: k.pid,
                    start_time: k.start_time,
                    reason: w.into(),
                }),
                None => {
                    members.push(member(
                        k,
                        Role::Descendant,
                        depth + 1,
                        format!("child of {pid}"),
                    ));
                    stack.push((k.pid, depth + 1));
                }
            }
        }
    }
    members.sort_by(|a, b| b.depth.cmp(&a.depth).then(a.pid.cmp(&b.pid)));
    LegacyVerdict::Owned {
        tree: OwnedTree {
            root: Some(member(p, Role::Root, 0, reason.clone())),
            members,
            excluded,
            evidence: vec![reason.clone()],
            member_uid: Some(p.uid),
        },
        reason,
    }
}

fn member(p: &crate::proc::ProcessInfo, role: Role, depth: usize, evidence: String) -> Member {
    Member {
        pid: p.pid,
        start_time: p.start_time,
        ppid: p.ppid,
        pgid: p.pgid,
        uid: p.uid,
        role,
        depth,
        argv0: p.argv.as_ref().and_then(|a| a.first().cloned()),
        evidence,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_like_a_shell() {
        assert_eq!(shell_split("a b  c").unwrap(), vec!["a", "b", "c"]);
        assert_eq!(
            shell_split(r#"node '/opt/my wrapper.js' --x="a b" c\ d"#).unwrap(),
            vec!["node", "/opt/my wrapper.js", "--x=a b", "c d"]
        );
        assert_eq!(
            shell_split(r#""a\"b" 'it'\''s'"#).unwrap(),
            vec![r#"a"b"#, "it's"]
        );
        assert_eq!(shell_split("''").unwrap(), vec![""]);
        assert_eq!(shell_split("").unwrap(), Vec::<String>::new());
        assert_eq!(
            shell_split("'x").unwrap_err(),
            TokenError::Unterminated('\'')
        );
        assert_eq!(
            shell_split("\"x").unwrap_err(),
            TokenError::Unterminated('"')
        );
        assert_eq!(
            shell_split("x\\").unwrap_err(),
            TokenError::TrailingBackslash
        );
    }

    /// As a POSIX shell reads them: `#` starting a word is a comment, `\r` is part of a word,
    /// and the diagnosis of a refused line skips what the splitter skips.
    #[test]
    fn comments_and_carriage_returns_as_a_shell_reads_them() {
        assert_eq!(
            shell_split("node a.js # it's").unwrap(),
            vec!["node", "a.js"]
        );
        assert_eq!(shell_split("a#b 'c#'").unwrap(), vec!["a#b", "c#"]);
        assert_eq!(shell_split("a\rb").unwrap(), vec!["a\rb"]);
        assert_eq!(
            shell_split("# it's\n'x").unwrap_err(),
            TokenError::Unterminated('\'')
        );
        assert_eq!(
            shell_split("\"a\\\"").unwrap_err(),
            TokenError::Unterminated('"')
        );
    }
}
