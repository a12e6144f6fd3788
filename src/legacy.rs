//! Legacy session records: processes the old gateway started before leases existed, and the
//! leases of the acpx extension. This module is their host side: importing records into the
//! store (one transaction), listing and ending them, and parsing the acpx extension's files. Their
//! fail-safe verification is pure and lives in `leash_core::legacy` (`verify_legacy`,
//! `shell_split`).

use crate::store::legacy::{NewAcpxRecord, NewAcpxSession};
use crate::store::{NewLegacyRecord, Store, StoreError};
use leash_core::kind::{HasKind, Kind};
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
    #[error("{path}: {detail}; nothing imported")]
    Input { path: String, detail: String },
    /// The import would make an imported record claim leash's own processes, or give one state
    /// root two gateway ids: refused before anything is written.
    #[error("{0}; nothing imported")]
    Refused(String),
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

/// The largest file `legacy import` reads (64 MiB): a lease file, a gateway id file, a session
/// record or a legacy record file past it is refused, not read. The incumbent keeps one small
/// entry per live lease or session (about 1 KiB each), so 64 MiB is tens of thousands of them;
/// a file reads whole into memory before it is parsed (a 348 MB lease file took 55 s and 928 MB
/// of memory to read and parse).
pub const MAX_IMPORT_FILE_BYTES: u64 = 64 << 20;

/// Reads one input file of `legacy import`: a regular file (a symlink, a device, a FIFO or a
/// directory is refused without being opened for its contents: `O_NOFOLLOW`, then `fstat` on
/// what was opened), no larger than [`MAX_IMPORT_FILE_BYTES`], UTF-8.
pub fn read_input(path: &Path) -> Result<String, LegacyError> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let shown = path.display().to_string();
    let bad = |detail: String| LegacyError::Input {
        path: shown.clone(),
        detail,
    };
    if std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink()) {
        return Err(bad(
            "a symbolic link: leash reads the incumbent's files only as regular files (point              the option at the file itself)"
                .into(),
        ));
    }
    let file = std::fs::OpenOptions::new()
        .read(true)
        // Not blocking on a FIFO, not following a link swapped in since the look above.
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .map_err(|source| LegacyError::Read {
            path: shown.clone(),
            source,
        })?;
    let meta = file.metadata().map_err(|source| LegacyError::Read {
        path: shown.clone(),
        source,
    })?;
    if !meta.is_file() {
        return Err(bad(format!(
            "not a regular file ({}): refused",
            file_kind(&meta)
        )));
    }
    if meta.len() > MAX_IMPORT_FILE_BYTES {
        return Err(bad(format!(
            "{} bytes, more than the {} MiB leash reads from one file: refused (a lease or              session file that large is not the incumbent's; check it, or remove the entries              of leases that ended)",
            meta.len(),
            MAX_IMPORT_FILE_BYTES >> 20
        )));
    }
    let mut buf = Vec::with_capacity(meta.len() as usize);
    file.take(MAX_IMPORT_FILE_BYTES + 1)
        .read_to_end(&mut buf)
        .map_err(|source| LegacyError::Read {
            path: shown.clone(),
            source,
        })?;
    if buf.len() as u64 > MAX_IMPORT_FILE_BYTES {
        return Err(bad(format!(
            "grew past the {} MiB leash reads from one file while it was read: refused",
            MAX_IMPORT_FILE_BYTES >> 20
        )));
    }
    String::from_utf8(buf).map_err(|e| bad(format!("not UTF-8 text: {e}")))
}

/// Refuses an input that is not a regular file (a symlink, a device, a FIFO, a directory),
/// without opening it: what SQLite opens itself (the keyed stores).
pub fn check_regular(path: &Path) -> Result<(), LegacyError> {
    let meta = std::fs::symlink_metadata(path).map_err(|source| LegacyError::Read {
        path: path.display().to_string(),
        source,
    })?;
    if meta.is_file() {
        return Ok(());
    }
    Err(LegacyError::Input {
        path: path.display().to_string(),
        detail: format!("not a regular file ({}): refused", file_kind(&meta)),
    })
}

/// At most the first 64 characters of what a file held, for an error message: enough to
/// recognise a value, never a file's contents.
pub fn shown_value(v: &str) -> String {
    const MAX: usize = 64;
    match v.char_indices().nth(MAX) {
        Some((at, _)) => format!("{:?}… ({} bytes)", &v[..at], v.len()),
        None => format!("{v:?}"),
    }
}

/// What a non-regular file is, in words.
fn file_kind(meta: &std::fs::Metadata) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    let t = meta.file_type();
    if t.is_dir() {
        "a directory"
    } else if t.is_symlink() {
        "a symbolic link"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_socket() {
        "a socket"
    } else {
        "not a regular file"
    }
}

/// Whether anything is at `path` (a symlink counts, whatever it points to): an input that is
/// there must read as a regular file, never be skipped as absent.
pub fn exists_unfollowed(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok()
}

/// Imports records from a JSON file in one transaction: all or nothing.
pub fn import(
    store: &mut Store,
    path: &Path,
    wrapper_root: Option<&Path>,
) -> Result<usize, LegacyError> {
    let shown = path.display().to_string();
    let text = read_input(path)?;
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

// ---- The acpx extension's own state (`leash legacy import --acpx DIR`) ----------------------
//
// The formats, as its source writes them (openclaw/openclaw `extensions/acpx`; docs/acpx-import.md
// lists them with file names). Parsing here is pure: the
// controller reads the files and the SQLite store and hands the text over.

/// The session record schemas (`legacy-session-migration.ts`).
pub const ACPX_SESSION_SCHEMAS: [&str; 2] = ["acpx.session.v1", "openclaw.acpx.session.v1"];

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

#[cfg(test)]
mod tests {
    use super::*;

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
