//! Legacy session records: processes the old gateway started before leases existed. They have a
//! stored pid and the command as the old store kept it (possibly shell-quoted), and nothing else,
//! so their cleanup is fail-safe: a live root is required; when a wrapper path is recorded, the
//! live process must run that wrapper and the wrapper must lie under the recorded wrapper root;
//! otherwise the live argv must equal the stored command token for token (never as raw strings).
//! A stored pid alone never leads to a signal, and what cannot be verified is left alone.

use crate::signal::Caller;
use crate::store::{NewLegacyRecord, Store, StoreError};
use crate::verify::{Expect, Member, OwnedTree, Role};
use leash_core::kind::{HasKind, Kind};
use leash_core::model::Snapshot;
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

use leash_core::model::LegacyRecord;

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
    #[error("{path}: {detail}; nothing imported")]
    Acpx { path: String, detail: String },
    #[error(
        "no acpx state in {dir}: looked for {looked}; point --acpx at the incumbent's acpx \
         directory (<OpenClaw state dir>/acpx), and --openclaw-state at its state dir if that is \
         not the parent"
    )]
    AcpxMissing { dir: String, looked: String },
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl HasKind for LegacyError {
    /// A file that cannot be read or parsed is bad input to `legacy import` — but it always
    /// exited 1, and gateways may branch on that, so every legacy error stays internal.
    fn kind(&self) -> Kind {
        Kind::Internal
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error("unterminated {0} quote")]
    Unterminated(char),
    #[error("trailing backslash")]
    TrailingBackslash,
}

/// A stored command that does not split is bad input.
impl HasKind for TokenError {
    fn kind(&self) -> Kind {
        Kind::Usage
    }
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

/// The hard refusals of a stored pid, before anything is read of it: pid 1 or lower, the reaper
/// itself or the leader of its group (both the leash-format and the acpx records' check).
fn stored_pid_refusal(rec: &LegacyRecord, caller: &Caller) -> Option<String> {
    if rec.pid <= 1 {
        Some(format!(
            "stored pid {} is 1 or lower: never signalled",
            rec.pid
        ))
    } else if rec.pid == caller.pid || rec.pid == caller.pgid {
        Some(format!(
            "stored pid {} is the reaper itself (or leads its process group)",
            rec.pid
        ))
    } else {
        None
    }
}

/// The legacy fail-safe check. Pure.
pub fn verify_legacy(
    rec: &LegacyRecord,
    expect: &Expect<'_>,
    snap: &Snapshot,
    caller: &Caller,
) -> LegacyVerdict {
    if rec.source.as_deref() == Some(ACPX_SOURCE) {
        return verify_acpx(rec, expect, snap, caller);
    }
    let refuse = |reason: String| LegacyVerdict::Refused { reason };
    if let Some(reason) = stored_pid_refusal(rec, caller) {
        return refuse(reason);
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
    owned_tree(p, snap, None, reason)
}

/// The tree of a verified legacy root: the root and its descendants, each started after it, of
/// the same uid, and not carrying some other lease's marker (`own_lease`, the incumbent's lease
/// id, is this record's own: a descendant carrying it is a member, and says so).
fn owned_tree(
    p: &leash_core::model::ProcessInfo,
    snap: &Snapshot,
    own_lease: Option<&str>,
    reason: String,
) -> LegacyVerdict {
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
            let marker = k.env.as_ref().and_then(|e| e.lease_id.as_deref());
            let why = if k.start_time < p.start_time {
                Some("started before the root")
            } else if k.uid != p.uid {
                Some("runs as another uid")
            } else if marker.is_some() && marker != own_lease {
                Some("carries another lease's marker")
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
                    let evidence = match marker {
                        Some(l) => format!("child of {pid}, carries the lease's env marker {l}"),
                        None => format!("child of {pid}"),
                    };
                    members.push(member(k, Role::Descendant, depth + 1, evidence));
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

fn member(
    p: &leash_core::model::ProcessInfo,
    role: Role,
    depth: usize,
    evidence: String,
) -> Member {
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

// ---- The acpx extension's own state (`leash legacy import --acpx DIR`) ----------------------
//
// The formats, as its source writes them (openclaw/openclaw `extensions/acpx`; docs/acpx-import.md
// lists them with file names). Parsing here is pure: the
// controller reads the files and the SQLite store and hands the text over.

/// `legacy_records.source` of a lease imported from the acpx extension.
pub const ACPX_SOURCE: &str = "acpx";
/// The argv markers its wrapper command ends with (`process-lease.ts`).
pub const ACPX_LEASE_ARG: &str = "--openclaw-acpx-lease-id";
pub const ACPX_GATEWAY_ARG: &str = "--openclaw-gateway-instance-id";
/// The session record schemas (`legacy-session-migration.ts`).
pub const ACPX_SESSION_SCHEMAS: [&str; 2] = ["acpx.session.v1", "openclaw.acpx.session.v1"];

pub use crate::store::legacy::{AcpxImported, Adoption, NewAcpxRecord, NewAcpxSession};

/// What is wrong with one part of the incumbent's state.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct AcpxFormatError(pub String);

/// One lease, parsed: the record to import, or `None` for a `closed` or `lost` one (nothing of
/// it runs by the incumbent's own account; its doctor drops those too).
pub fn parse_acpx_lease(v: &serde_json::Value) -> Result<Option<NewAcpxRecord>, AcpxFormatError> {
    let bad = |m: String| AcpxFormatError(m);
    let o = v
        .as_object()
        .ok_or_else(|| bad(format!("not an object: {v}")))?;
    let text = |k: &str| -> Result<String, AcpxFormatError> {
        match o.get(k) {
            Some(serde_json::Value::String(s)) if !s.trim().is_empty() => Ok(s.clone()),
            Some(serde_json::Value::String(_)) => Err(bad(format!("{k} is empty"))),
            Some(other) => Err(bad(format!("{k} is not a string: {other}"))),
            None => Err(bad(format!("{k} is missing"))),
        }
    };
    let lease_id = text("leaseId")?;
    let at = |m: String| bad(format!("lease {lease_id}: {m}"));
    let field = |k: &str| text(k).map_err(|e| at(e.0));
    let gateway_instance_id = field("gatewayInstanceId")?;
    let session_key = field("sessionKey")?;
    let wrapper_root = field("wrapperRoot")?;
    let wrapper_path = field("wrapperPath")?;
    for (k, p) in [
        ("wrapperRoot", &wrapper_root),
        ("wrapperPath", &wrapper_path),
    ] {
        if !p.starts_with('/') {
            return Err(at(format!("{k} {p:?} is not an absolute path")));
        }
    }
    let integer = |k: &str, v: &serde_json::Value| -> Result<i64, AcpxFormatError> {
        // A JavaScript number: 123 and 123.0 are the same integer.
        match v.as_i64() {
            Some(n) => Ok(n),
            None => match v.as_f64() {
                Some(f) if f.fract() == 0.0 && f.abs() < 9.0e15 => Ok(f as i64),
                _ => Err(at(format!("{k} is not an integer: {v}"))),
            },
        }
    };
    let root_pid = integer(
        "rootPid",
        o.get("rootPid")
            .ok_or_else(|| at("rootPid is missing".into()))?,
    )?;
    if !(0..=i32::MAX as i64).contains(&root_pid) {
        return Err(at(format!(
            "rootPid {root_pid} is not a pid (nor 0, pending)"
        )));
    }
    let process_group_id = match o.get("processGroupId") {
        None | Some(serde_json::Value::Null) => None,
        Some(v) => {
            let g = integer("processGroupId", v)?;
            if !(0..=i32::MAX as i64).contains(&g) {
                return Err(at(format!("processGroupId {g} is not a process group")));
            }
            Some(g as i32)
        }
    };
    let command_hash = field("commandHash")?.to_ascii_lowercase();
    if command_hash.len() != 64 || !command_hash.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(at(format!(
            "commandHash {command_hash:?} is not a sha256 in hex"
        )));
    }
    let started_at = integer(
        "startedAt",
        o.get("startedAt")
            .ok_or_else(|| at("startedAt is missing".into()))?,
    )?;
    let state = field("state")?;
    match state.as_str() {
        "open" | "closing" => {}
        "closed" | "lost" => return Ok(None),
        other => {
            return Err(at(format!(
                "state {other:?} is none of open, closing, closed, lost"
            )))
        }
    }
    Ok(Some(NewAcpxRecord {
        lease_id,
        gateway_instance_id,
        session_key,
        wrapper_root,
        wrapper_path,
        root_pid: root_pid as i32,
        process_group_id,
        command_hash,
        started_at,
    }))
}

/// The older lease file, `process-leases.json`: `{"version": 1, "leases": [...]}`.
pub fn parse_acpx_lease_file(text: &str) -> Result<Vec<NewAcpxRecord>, AcpxFormatError> {
    let v: serde_json::Value =
        serde_json::from_str(text).map_err(|e| AcpxFormatError(format!("not JSON: {e}")))?;
    let o = v
        .as_object()
        .ok_or_else(|| AcpxFormatError("not a JSON object".into()))?;
    match o.get("version") {
        Some(n) if n.as_i64() == Some(1) => {}
        other => {
            return Err(AcpxFormatError(format!(
                "version is {}, not 1",
                other.map_or("missing".to_string(), |v| v.to_string())
            )))
        }
    }
    let leases = o
        .get("leases")
        .and_then(|l| l.as_array())
        .ok_or_else(|| AcpxFormatError("leases is not an array".into()))?;
    let mut out: Vec<NewAcpxRecord> = Vec::new();
    let mut ids = std::collections::HashSet::new();
    for (i, l) in leases.iter().enumerate() {
        let at = |m: String| AcpxFormatError(format!("lease {i}: {m}"));
        let id = l
            .get("leaseId")
            .and_then(|v| v.as_str())
            .unwrap_or_default();
        if !id.is_empty() && !ids.insert(id.to_string()) {
            return Err(at(format!("lease id {id} appears twice")));
        }
        if let Some(r) = parse_acpx_lease(l).map_err(|e| at(e.0))? {
            out.push(r);
        }
    }
    Ok(out)
}

/// The gateway instance id of the keyed store (`gateway-instance` / `current`):
/// `{"instanceId": ID, "createdAt": MS}`.
pub fn parse_acpx_gateway_record(text: &str) -> Result<String, AcpxFormatError> {
    let v: serde_json::Value =
        serde_json::from_str(text).map_err(|e| AcpxFormatError(format!("not JSON: {e}")))?;
    match v.get("instanceId").and_then(|i| i.as_str()).map(str::trim) {
        Some(id) if !id.is_empty() => Ok(id.to_string()),
        _ => Err(AcpxFormatError(format!("no instanceId string in {v}"))),
    }
}

/// One session record file, as an ownership row: `None` for a JSON file of another kind (not a
/// session record: no known `schema`). The key is the record's `name` (the session key the
/// incumbent gave it), else the file's own name; the agent is the key's `agent:<agent>:` part.
/// The incumbent's records have no owner, spawner or parent fields: those stay empty.
pub fn parse_acpx_session(
    file_stem: &str,
    text: &str,
) -> Result<Option<NewAcpxSession>, AcpxFormatError> {
    let v: serde_json::Value =
        serde_json::from_str(text).map_err(|e| AcpxFormatError(format!("not JSON: {e}")))?;
    let Some(o) = v.as_object() else {
        return Err(AcpxFormatError("not a JSON object".into()));
    };
    match o.get("schema").and_then(|s| s.as_str()) {
        Some(s) if ACPX_SESSION_SCHEMAS.contains(&s) => {}
        _ => return Ok(None),
    }
    let session_key = match o.get("name") {
        Some(serde_json::Value::String(n)) if !n.trim().is_empty() => n.trim().to_string(),
        Some(serde_json::Value::String(_)) | None | Some(serde_json::Value::Null) => {
            percent_decode(file_stem)
        }
        Some(other) => return Err(AcpxFormatError(format!("name is not a string: {other}"))),
    };
    if session_key.trim().is_empty() {
        return Err(AcpxFormatError("the record has no session key".into()));
    }
    let agent_id = session_key
        .strip_prefix("agent:")
        .and_then(|r| r.split(':').next())
        .filter(|a| !a.is_empty())
        .map(|a| a.to_ascii_lowercase());
    Ok(Some(NewAcpxSession {
        session_key,
        agent_id,
    }))
}

/// `decodeURIComponent` of a file name the incumbent wrote with `encodeURIComponent`; a `%` not
/// followed by two hex digits is kept as it is.
fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        if b[i] == b'%' && i + 2 < b.len() {
            if let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2])) {
                out.push((h * 16 + l) as u8);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `quoteEnvValue` of `process-lease.ts`: the value as it is when plain, else single-quoted.
fn acpx_quote_env(v: &str) -> String {
    let plain = !v.is_empty()
        && v.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_./:=@+-".contains(&b));
    if plain {
        v.to_string()
    } else {
        format!("'{}'", v.replace('\'', "'\\''"))
    }
}

/// The ways the incumbent renders a command's parts into its command string, one per version of
/// its source: `JSON.stringify` of each part (`codex-auth-bridge.ts`, `buildWrapperCommand`), a
/// part quoted only when it needs it (`codex-agent-command.ts`), and the parts as they are.
fn acpx_renderings(parts: &[String]) -> Vec<(&'static str, String)> {
    let json = parts
        .iter()
        .map(|p| serde_json::to_string(p).unwrap_or_default())
        .collect::<Vec<_>>()
        .join(" ");
    let minimal = parts
        .iter()
        .map(|p| {
            if p.is_empty() {
                "\"\"".to_string()
            } else if p
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"_./:@%+=,-".contains(&b))
            {
                p.clone()
            } else {
                format!("\"{}\"", p.replace('\\', "\\\\").replace('"', "\\\""))
            }
        })
        .collect::<Vec<_>>()
        .join(" ");
    vec![
        ("JSON-quoted parts", json),
        ("parts quoted where needed", minimal),
        ("plain parts", parts.join(" ")),
    ]
}

/// `commandHash` as the incumbent computes it (`hashAcpxProcessCommand` of the command
/// `withAcpxLeaseEnvironment` built): sha256, in hex, of `env OPENCLAW_ACPX_LEASE_ID=<id>
/// OPENCLAW_GATEWAY_INSTANCE_ID=<gid> <command> --openclaw-acpx-lease-id <id>
/// --openclaw-gateway-instance-id <gid>`, with `<command>` the wrapper command string.
pub fn acpx_command_hash(command: &str, lease_id: &str, gateway_id: &str) -> String {
    use sha2::{Digest, Sha256};
    let (l, g) = (acpx_quote_env(lease_id), acpx_quote_env(gateway_id));
    let leased = [
        "env".to_string(),
        format!("{}={l}", leash_core::model::ENV_LEASE_ID),
        format!("{}={g}", leash_core::model::ENV_GATEWAY_ID),
        command.to_string(),
        ACPX_LEASE_ARG.to_string(),
        l.clone(),
        ACPX_GATEWAY_ARG.to_string(),
        g,
    ]
    .join(" ");
    Sha256::digest(leased.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The command parts of a live argv that ends with this lease's markers (`None` otherwise).
fn acpx_parts<'a>(argv: &'a [String], lease_id: &str, gateway_id: &str) -> Option<&'a [String]> {
    let n = argv.len();
    (n > 4
        && argv[n - 4] == ACPX_LEASE_ARG
        && argv[n - 3] == lease_id
        && argv[n - 2] == ACPX_GATEWAY_ARG
        && argv[n - 1] == gateway_id)
        .then(|| &argv[..n - 4])
}

/// Live wrappers of this lease: processes (not zombies, of the caller's uid) whose argv runs the
/// recorded wrapper script and ends with the lease's markers.
fn acpx_candidates<'s>(
    snap: &'s Snapshot,
    lease_id: &str,
    gateway_id: &str,
    wrapper: &str,
    uid: u32,
) -> Vec<&'s leash_core::model::ProcessInfo> {
    let mut v: Vec<_> = snap
        .iter()
        .filter(|p| p.state != 'Z' && p.uid == uid)
        .filter(|p| {
            p.argv.as_deref().is_some_and(|a| {
                acpx_parts(a, lease_id, gateway_id)
                    .is_some_and(|parts| parts.iter().any(|t| t == wrapper))
            })
        })
        .collect();
    v.sort_by_key(|p| p.pid);
    v
}

/// The fail-safe check of a lease imported from the acpx extension. Pure. Its root is verified
/// by the evidence the incumbent's own wrappers carry: the argv runs the recorded wrapper script
/// (which lies under the recorded wrapper root) and ends with the lease id and gateway id
/// markers, the gateway id is this root's own, the argv hashes to the recorded `commandHash`,
/// the environment (when readable) does not name another lease or gateway, and the process
/// started before the import; processes carrying its env markers join the tree (or, the root
/// gone, are the tree). A pending lease (`rootPid: 0`) and an ambiguous one (several live
/// wrappers carry its markers) are left alone, with what was seen.
fn verify_acpx(
    rec: &LegacyRecord,
    expect: &Expect<'_>,
    snap: &Snapshot,
    caller: &Caller,
) -> LegacyVerdict {
    let refuse = |reason: String| LegacyVerdict::Refused { reason };
    let (Some(lease), Some(gw), Some(wrapper), Some(hash)) = (
        rec.acpx_lease_id.as_deref(),
        rec.acpx_gateway_id.as_deref(),
        rec.wrapper_path.as_deref(),
        rec.command_hash.as_deref(),
    ) else {
        return refuse(
            "imported acpx lease lacks its lease id, gateway id, wrapper path or hash".into(),
        );
    };
    let pids = |v: &[&leash_core::model::ProcessInfo]| {
        v.iter()
            .map(|p| p.pid.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let candidates = acpx_candidates(snap, lease, gw, wrapper, caller.uid);
    // Processes carrying the lease's environment markers (the wrapper's `env` set them, every
    // descendant inherits them), this root's gateway id, of the caller's uid, started before the
    // import: the lease's escapees once they left the tree (the detached adapter of a wrapper
    // that was SIGKILLed: the incumbent's own leak).
    let marked: Vec<&leash_core::model::ProcessInfo> = snap
        .marked(lease)
        .filter(|m| m.state != 'Z' && m.uid == caller.uid && m.pid > 1)
        .filter(|m| m.pid != caller.pid && m.pid != caller.pgid)
        .filter(|m| {
            m.env
                .as_ref()
                .is_some_and(|e| e.gateway_instance_id.as_deref() == Some(gw))
        })
        .filter(|m| rec.imported_ticks == 0 || m.start_time <= rec.imported_ticks)
        .collect();
    if rec.pid == 0 {
        return refuse(format!(
            "pending acpx lease {lease} (rootPid 0: saved before its wrapper started, the pid \
             never recorded): left alone; {} live wrapper(s) carry its markers{}",
            candidates.len(),
            if candidates.is_empty() {
                String::new()
            } else {
                format!(" (pid {})", pids(&candidates))
            }
        ));
    }
    if let Some(reason) = stored_pid_refusal(rec, caller) {
        return refuse(reason);
    }
    if gw != expect.gateway_instance_id {
        return refuse(format!(
            "acpx lease {lease} names gateway {gw}, not this root's {}",
            expect.gateway_instance_id
        ));
    }
    let Some(p) = snap.get(rec.pid).filter(|p| p.state != 'Z') else {
        if candidates.is_empty() && !marked.is_empty() {
            let reason = format!(
                "stored pid {} is gone; pid {} carry {}={lease} and {}={gw} (this root's gateway \
                 id) in their environment and started before the import: the lease's escapees",
                rec.pid,
                pids(&marked),
                leash_core::model::ENV_LEASE_ID,
                leash_core::model::ENV_GATEWAY_ID
            );
            return escapees_only(&marked, reason);
        }
        if candidates.is_empty() {
            return LegacyVerdict::Gone {
                reason: format!(
                    "stored pid {} is not running and no live wrapper carries lease {lease}'s \
                     markers",
                    rec.pid
                ),
            };
        }
        return refuse(format!(
            "stored pid {} is not running, but pid {} carry lease {lease}'s markers: left alone \
             (the record does not name them)",
            rec.pid,
            pids(&candidates)
        ));
    };
    if rec.imported_ticks > 0 && p.start_time > rec.imported_ticks {
        return refuse(format!(
            "pid {} started after the lease was imported: the pid was reused",
            p.pid
        ));
    }
    if p.uid != caller.uid {
        return refuse(format!("pid {} runs as uid {}, not ours", p.pid, p.uid));
    }
    let Some(argv) = &p.argv else {
        return refuse(format!("pid {}: its command line is unreadable", p.pid));
    };
    let root = rec
        .wrapper_root
        .as_deref()
        .map(Path::new)
        .unwrap_or(expect.wrapper_root);
    if !Path::new(wrapper).starts_with(root) {
        return refuse(format!(
            "recorded wrapper {wrapper} is outside the recorded wrapper root {}",
            root.display()
        ));
    }
    let Some(parts) = acpx_parts(argv, lease, gw) else {
        return refuse(format!(
            "pid {} does not carry lease {lease}'s markers ({ACPX_LEASE_ARG} {lease} \
             {ACPX_GATEWAY_ARG} {gw} at the end of its argv {argv:?}): not the incumbent's wrapper",
            p.pid
        ));
    };
    if !parts.iter().any(|t| t == wrapper) {
        return refuse(format!(
            "pid {} carries the markers but does not run the recorded wrapper {wrapper} (argv \
             {argv:?})",
            p.pid
        ));
    }
    let Some((how, _)) = acpx_renderings(parts)
        .into_iter()
        .find(|(_, c)| acpx_command_hash(c, lease, gw) == hash)
    else {
        return refuse(format!(
            "pid {}: its argv does not hash to the recorded commandHash {hash} (under any of the \
             incumbent's quotings): the command changed, left alone",
            p.pid
        ));
    };
    if candidates.iter().any(|c| c.pid != p.pid) {
        return refuse(format!(
            "ambiguous: pid {} carry lease {lease}'s markers: left alone",
            pids(&candidates)
        ));
    }
    let env_note = match &p.env {
        Some(env) => {
            if let Some(l) = env.lease_id.as_deref().filter(|l| *l != lease) {
                return refuse(format!("pid {} carries another lease's id {l}", p.pid));
            }
            if let Some(g) = env.gateway_instance_id.as_deref().filter(|g| *g != gw) {
                return refuse(format!("pid {} carries another gateway's id {g}", p.pid));
            }
            if env.lease_id.is_some() {
                "its environment carries the same lease id"
            } else {
                "its environment carries no lease marker"
            }
        }
        None => "its environment is unreadable",
    };
    let reason = format!(
        "pid {} runs the recorded wrapper {wrapper} under {}, its argv ends with \
         {ACPX_LEASE_ARG} {lease} {ACPX_GATEWAY_ARG} {gw} (this root's gateway id) and hashes to \
         the recorded commandHash ({how}); {env_note}; it started before the import",
        p.pid,
        root.display()
    );
    let mut verdict = owned_tree(p, snap, Some(lease), reason);
    if let LegacyVerdict::Owned { tree, .. } = &mut verdict {
        for m in &marked {
            let known = m.pid == p.pid
                || tree.members.iter().any(|x| x.pid == m.pid)
                || tree.excluded.iter().any(|x| x.pid == m.pid);
            if !known && m.start_time >= p.start_time {
                tree.members.push(member(
                    m,
                    Role::Marked,
                    0,
                    format!("carries lease {lease}'s env markers, outside the wrapper's tree"),
                ));
            }
        }
    }
    verdict
}

/// The verdict for an acpx lease whose wrapper is gone but whose marked processes remain.
fn escapees_only(marked: &[&leash_core::model::ProcessInfo], reason: String) -> LegacyVerdict {
    let mut members: Vec<Member> = marked
        .iter()
        .map(|m| member(m, Role::Marked, 0, reason.clone()))
        .collect();
    members.sort_by_key(|m| std::cmp::Reverse(m.pid));
    LegacyVerdict::Owned {
        tree: OwnedTree {
            root: None,
            members,
            excluded: Vec::new(),
            evidence: vec![reason.clone()],
            member_uid: marked.first().map(|m| m.uid),
        },
        reason,
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

    /// The hash as the incumbent computes it: these vectors are the output of its own
    /// `withAcpxLeaseEnvironment` + `hashAcpxProcessCommand`, run in node.
    #[test]
    fn acpx_command_hash_matches_the_incumbents() {
        let cmd = r#""/usr/bin/node" "/s/acpx/codex-acp-wrapper.mjs""#;
        assert_eq!(
            acpx_command_hash(cmd, "lease-1", "gw-1"),
            "234b4be1f871ea91ac9695223ad82005c8426c1388be3f85fc7616f7d0f3b446"
        );
        assert_eq!(
            acpx_command_hash(cmd, "it's", "g 1"),
            "92d1b1fc7e431c5dd87a766b066c9fb1687b57a5a1f8084a510e82e1fb6dcf84"
        );
        let parts = [
            "/usr/bin/node".to_string(),
            "/s/acpx/codex-acp-wrapper.mjs".into(),
        ];
        let json = &acpx_renderings(&parts)[0].1;
        assert_eq!(json, cmd);
        assert_eq!(acpx_renderings(&parts)[1].1, parts.join(" "));
    }

    #[test]
    fn acpx_leases_parse_or_say_what_is_wrong() {
        let lease = serde_json::json!({
            "leaseId": "l", "gatewayInstanceId": "g", "sessionKey": "agent:codex:acp:x",
            "wrapperRoot": "/s/acpx", "wrapperPath": "/s/acpx/codex-acp-wrapper.mjs",
            "rootPid": 12.0, "processGroupId": 12, "commandHash": "AB".repeat(32),
            "startedAt": 1.5e12, "state": "closing", "extra": [1]
        });
        let r = parse_acpx_lease(&lease).unwrap().unwrap();
        assert_eq!((r.root_pid, r.process_group_id), (12, Some(12)));
        assert_eq!(r.command_hash, "ab".repeat(32));
        let mut closed = lease.clone();
        closed["state"] = "lost".into();
        assert!(parse_acpx_lease(&closed).unwrap().is_none());
        for (field, value, says) in [
            ("rootPid", serde_json::json!(-1), "not a pid"),
            ("rootPid", serde_json::json!(1.5), "not an integer"),
            ("wrapperPath", serde_json::json!("rel/w.mjs"), "absolute"),
            ("commandHash", serde_json::json!("abc"), "sha256"),
            ("sessionKey", serde_json::json!(""), "empty"),
            ("state", serde_json::json!("up"), "none of"),
        ] {
            let mut bad = lease.clone();
            bad[field] = value;
            let e = parse_acpx_lease(&bad).unwrap_err().0;
            assert!(e.contains(says) && e.contains("lease l"), "{field}: {e}");
        }
        assert!(parse_acpx_lease_file(r#"{"version":1,"leases":{}}"#).is_err());
        assert_eq!(
            parse_acpx_gateway_record(r#"{"instanceId":" x ","createdAt":1}"#).unwrap(),
            "x"
        );
        let s = parse_acpx_session(
            "agent%3Aclaude%3Aacp%3Ay",
            r#"{"schema":"acpx.session.v1"}"#,
        )
        .unwrap()
        .unwrap();
        assert_eq!(s.session_key, "agent:claude:acp:y");
        assert_eq!(s.agent_id.as_deref(), Some("claude"));
        assert!(parse_acpx_session("x", r#"{"schema":"other"}"#)
            .unwrap()
            .is_none());
        assert_eq!(percent_decode("a%2"), "a%2");
        assert_eq!(percent_decode("%zz%41"), "%zzA");
    }
}
