//! Legacy verification: the fail-safe check of processes the old gateway started before leases
//! existed. A legacy record has a stored pid and the command as the old store kept it (possibly
//! shell-quoted), and nothing else, so its cleanup is fail-safe: a live root is required; when a
//! wrapper path is recorded, the live process must run that wrapper and the wrapper must lie under
//! the recorded wrapper root; otherwise the live argv must equal the stored command token for
//! token ([`shell_split`], never as raw strings). A stored pid alone never leads to a signal, and
//! what cannot be verified is left alone. Leases imported from the acpx extension are verified by
//! the evidence its own wrappers carry ([`acpx_command_hash`]).
//!
//! An imported record is a claim; a lease leash committed itself outweighs it. A process that
//! belongs to one of leash's own leases ([`leash_claim`]: in a lease cgroup under leash's
//! cgroup root, a `leash-wrap` or one of its descendants, or carrying the id of a lease a leash
//! store holds) is never part of a legacy record's tree, whatever markers it carries: leash's
//! wrappers and adapters carry the same environment contract as the incumbent's.
//!
//! Pure: the records, the snapshot and the caller are arguments. Importing and storing records
//! is the `leash` crate's (`leash::legacy`).

use crate::guard::Caller;
use crate::kind::{HasKind, Kind};
use crate::model::{LegacyRecord, ProcessInfo, Snapshot, ENV_GATEWAY_ID, ENV_LEASE_ID};
use crate::verify::{Excluded, Expect, Member, OwnedTree, Role};
use std::fmt;
use std::path::Path;

/// Why a stored command line does not split.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenError {
    Unterminated(char),
    TrailingBackslash,
}

impl fmt::Display for TokenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TokenError::Unterminated(q) => write!(f, "unterminated {q} quote"),
            TokenError::TrailingBackslash => f.write_str("trailing backslash"),
        }
    }
}

impl std::error::Error for TokenError {}

/// A stored command that does not split is bad input.
impl HasKind for TokenError {
    fn kind(&self) -> Kind {
        Kind::Usage
    }
}

/// Splits a command line the way a POSIX shell would for plain words, with the `shlex` crate's
/// `split`: spaces, tabs and newlines separate words; single quotes keep everything literally;
/// double quotes keep everything but the `\"`, `\\`, `\$` and `` \` `` escapes and a
/// backslash-newline (dropped); a backslash outside quotes escapes the next character (a newline
/// it drops); a `#` that starts a word starts a comment up to the end of the line. No expansion
/// of any kind is performed. A quote left open or a backslash with nothing after it is an error,
/// never a guess; the error names which ([`unclosed`]).
pub fn shell_split(s: &str) -> Result<Vec<String>, TokenError> {
    shlex::split(s).ok_or_else(|| unclosed(s))
}

/// What a line `shlex::split` refused leaves open: of the three endings that would close a
/// single quote, a double quote or a trailing backslash, the one that makes the line split.
fn unclosed(s: &str) -> TokenError {
    if shlex::split(&format!("{s}x'")).is_some() {
        TokenError::Unterminated('\'')
    } else if shlex::split(&format!("{s}x\"")).is_some() {
        TokenError::Unterminated('"')
    } else {
        TokenError::TrailingBackslash
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LegacyVerdict {
    Owned { tree: OwnedTree, reason: String },
    Gone { reason: String },
    Refused { reason: String },
}

/// The refusals of the live process at a record's stored pid, before its evidence is read: it
/// started after the import (the pid was reused), or it runs as another uid. `imported` names
/// what was imported in the message (a record, an acpx lease).
fn live_root_refusal(
    rec: &LegacyRecord,
    p: &ProcessInfo,
    caller: &Caller,
    imported: &str,
) -> Option<String> {
    if rec.imported_ticks > 0 && p.start_time > rec.imported_ticks {
        return Some(format!(
            "pid {} started after the {imported} was imported: the pid was reused",
            p.pid
        ));
    }
    if p.uid != caller.uid {
        return Some(format!("pid {} runs as uid {}, not ours", p.pid, p.uid));
    }
    None
}

/// The wrapper root a record's wrapper must lie under (the one recorded with it, else the one
/// leash expects), or why the recorded wrapper is refused: it lies outside it. The leash-format
/// and the acpx records' check alike.
fn wrapper_root<'a>(
    rec: &'a LegacyRecord,
    expect: &Expect<'a>,
    wrapper: &str,
) -> Result<&'a Path, String> {
    let root = rec
        .wrapper_root
        .as_deref()
        .map(Path::new)
        .unwrap_or(expect.wrapper_root);
    if !Path::new(wrapper).starts_with(root) {
        return Err(format!(
            "recorded wrapper {wrapper} is outside the wrapper root {}",
            root.display()
        ));
    }
    Ok(root)
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

/// The file name of leash's wrapper binary (a state root installs it as `leash-wrap` or a
/// versioned `leash-wrap-…` copy under its `wrappers/`). The incumbent's wrappers are Node
/// programs: their exe is `node`.
pub const LEASH_WRAPPER_NAME: &str = "leash-wrap";

/// Whether `p` runs leash's wrapper: its exe's file name, or its argv[0]'s, is `leash-wrap` or
/// starts with `leash-wrap-`. (An argv[0] anyone can set only makes more processes leash's, and
/// so fewer signalled.)
fn runs_leash_wrapper(p: &ProcessInfo) -> bool {
    let named = |path: &str| {
        Path::new(path)
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| {
                n == LEASH_WRAPPER_NAME
                    || n.strip_prefix(LEASH_WRAPPER_NAME)
                        .is_some_and(|rest| rest.starts_with('-'))
            })
    };
    p.exe_path().is_some_and(named)
        || p.argv
            .as_deref()
            .and_then(|a| a.first())
            .is_some_and(|a0| named(a0))
}

/// Why `p` belongs to one of leash's own leases (`Some`), so that no legacy record may claim
/// it: it is in a lease cgroup under leash's cgroup root, it is a `leash-wrap` or descends from
/// one (by parent links in the snapshot), or its environment or argv carries the id of a lease
/// a leash store holds ([`crate::model::LeashSeen`]). `None`: nothing of leash's is seen on it.
pub fn leash_claim(p: &ProcessInfo, snap: &Snapshot) -> Option<String> {
    let seen = snap.leash_seen();
    if let Some(path) = seen.cgroup_members.get(&p.pid) {
        return Some(format!("pid {} is in leash's lease cgroup {path}", p.pid));
    }
    if let Some(l) = p
        .env
        .as_ref()
        .and_then(|e| e.lease_id.as_deref())
        .filter(|l| seen.lease_ids.contains(*l))
    {
        return Some(format!(
            "pid {} carries {ENV_LEASE_ID}={l}, a lease a leash store holds",
            p.pid
        ));
    }
    if let Some(l) = p.argv.as_deref().and_then(|a| {
        a.windows(2)
            .find(|w| w[0] == ACPX_LEASE_ARG && seen.lease_ids.contains(&w[1]))
            .map(|w| w[1].clone())
    }) {
        return Some(format!(
            "pid {} carries {ACPX_LEASE_ARG} {l} in its argv, a lease a leash store holds",
            p.pid
        ));
    }
    // Up the parent links (bounded, a cycle ends it) to a leash-wrap.
    let mut cur = Some(p);
    let mut steps = 0;
    while let Some(q) = cur {
        if runs_leash_wrapper(q) {
            return Some(if q.pid == p.pid {
                format!(
                    "pid {} runs leash's wrapper ({})",
                    p.pid,
                    q.exe_path().unwrap_or(LEASH_WRAPPER_NAME)
                )
            } else {
                format!(
                    "pid {} descends from leash's wrapper pid {} ({})",
                    p.pid,
                    q.pid,
                    q.exe_path().unwrap_or(LEASH_WRAPPER_NAME)
                )
            });
        }
        steps += 1;
        if q.ppid <= 1 || steps > snap.len() {
            break;
        }
        cur = snap.get(q.ppid);
    }
    None
}

/// The live `leash-wrap` processes whose environment carries gateway id `gateway`: the wrappers
/// of a state root that uses it (leash sets the markers on its wrapper and its adapter alike).
/// The incumbent's own processes carry the same id but run `node`, never `leash-wrap`.
pub fn leash_wrappers_of<'s>(snap: &'s Snapshot, gateway: &str) -> Vec<&'s ProcessInfo> {
    let mut v: Vec<_> = snap
        .iter()
        .filter(|p| p.state != 'Z' && runs_leash_wrapper(p))
        .filter(|p| {
            p.env
                .as_ref()
                .is_some_and(|e| e.gateway_instance_id.as_deref() == Some(gateway))
        })
        .collect();
    v.sort_by_key(|p| p.pid);
    v
}

/// The refusal of a record's live root that is leash's own.
fn leash_root_refusal(p: &ProcessInfo, snap: &Snapshot) -> Option<String> {
    leash_claim(p, snap).map(|why| {
        format!("{why}: it belongs to a leash lease, never to a legacy record; left alone")
    })
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
    if let Some(why) = live_root_refusal(rec, p, caller, "record") {
        return refuse(why);
    }
    if let Some(why) = leash_root_refusal(p, snap) {
        return refuse(why);
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
            let root = match wrapper_root(rec, expect, wrapper) {
                Ok(root) => root,
                Err(why) => return refuse(why),
            };
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
    p: &ProcessInfo,
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
                Some("started before the root".to_string())
            } else if k.uid != p.uid {
                Some("runs as another uid".into())
            } else if marker.is_some() && marker != own_lease {
                Some("carries another lease's marker".into())
            } else if k.state == 'Z' {
                Some("zombie".into())
            } else {
                leash_claim(k, snap).map(|why| format!("{why}: a leash lease's, not the record's"))
            };
            match why {
                Some(reason) => excluded.push(Excluded {
                    pid: k.pid,
                    start_time: k.start_time,
                    reason,
                }),
                None => {
                    let evidence = match marker {
                        Some(l) => format!("child of {pid}, carries the lease's env marker {l}"),
                        None => format!("child of {pid}"),
                    };
                    members.push(Member::of(k, Role::Descendant, depth + 1, evidence));
                    stack.push((k.pid, depth + 1));
                }
            }
        }
    }
    members.sort_by(|a, b| b.depth.cmp(&a.depth).then(a.pid.cmp(&b.pid)));
    LegacyVerdict::Owned {
        tree: OwnedTree {
            root: Some(Member::of(p, Role::Root, 0, reason.clone())),
            members,
            excluded,
            evidence: vec![reason.clone()],
            member_uid: Some(p.uid),
        },
        reason,
    }
}

// ---- The acpx extension's leases ------------------------------------------------------------

/// `legacy_records.source` of a lease imported from the acpx extension.
pub const ACPX_SOURCE: &str = "acpx";
/// The argv markers its wrapper command ends with (`process-lease.ts`).
pub const ACPX_LEASE_ARG: &str = "--openclaw-acpx-lease-id";
pub const ACPX_GATEWAY_ARG: &str = "--openclaw-gateway-instance-id";
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
        .map(|p| json_string(p))
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

/// A string as `JSON.stringify` (and serde_json) renders it: quoted, with `"`, `\\` and the
/// control characters escaped (the short escapes where JSON has them, else `\u00xx`), nothing
/// else.
fn json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// `commandHash` as the incumbent computes it (`hashAcpxProcessCommand` of the command
/// `withAcpxLeaseEnvironment` built): sha256, in hex, of `env OPENCLAW_ACPX_LEASE_ID=<id>
/// OPENCLAW_GATEWAY_INSTANCE_ID=<gid> <command> --openclaw-acpx-lease-id <id>
/// --openclaw-gateway-instance-id <gid>`, with `<command>` the wrapper command string.
pub fn acpx_command_hash(command: &str, lease_id: &str, gateway_id: &str) -> String {
    let (l, g) = (acpx_quote_env(lease_id), acpx_quote_env(gateway_id));
    let leased = [
        "env".to_string(),
        format!("{}={l}", ENV_LEASE_ID),
        format!("{}={g}", ENV_GATEWAY_ID),
        command.to_string(),
        ACPX_LEASE_ARG.to_string(),
        l.clone(),
        ACPX_GATEWAY_ARG.to_string(),
        g,
    ]
    .join(" ");
    use sha2::Digest;
    format!("{:x}", sha2::Sha256::digest(leased.as_bytes()))
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
) -> Vec<&'s ProcessInfo> {
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
    let pids = |v: &[&ProcessInfo]| {
        v.iter()
            .map(|p| p.pid.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    };
    // Processes of leash's own leases carry the same markers: they are set apart first, and
    // never join the record's tree, whatever else is seen.
    let (candidates, leash_own): (Vec<&ProcessInfo>, Vec<&ProcessInfo>) =
        acpx_candidates(snap, lease, gw, wrapper, caller.uid)
            .into_iter()
            .partition(|p| leash_claim(p, snap).is_none());
    // Processes carrying the lease's environment markers (the wrapper's `env` set them, every
    // descendant inherits them), this root's gateway id, of the caller's uid, started before the
    // import: the lease's escapees once they left the tree (the detached adapter of a wrapper
    // that was SIGKILLed: the incumbent's own leak).
    let marked: Vec<&ProcessInfo> = snap
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
    let (marked, leash_marked): (Vec<&ProcessInfo>, Vec<&ProcessInfo>) = marked
        .into_iter()
        .partition(|m| leash_claim(m, snap).is_none());
    let mut leash_own = leash_own;
    for m in leash_marked {
        if !leash_own.iter().any(|o| o.pid == m.pid) {
            leash_own.push(m);
        }
    }
    leash_own.sort_by_key(|p| p.pid);
    // Why the processes of leash's own leases that carry this lease's markers are left alone.
    let leash_note = || {
        leash_own
            .iter()
            .filter_map(|p| leash_claim(p, snap))
            .collect::<Vec<_>>()
            .join("; ")
    };
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
        if !leash_own.is_empty() {
            // The record's markers are on a leash lease's processes: the record names a lease
            // leash committed (or one whose ids leash's own carry), so nothing it names can be
            // told from leash's own. Left open, with why.
            return refuse(format!(
                "stored pid {} is not running, and pid {} carry lease {lease}'s markers but                  belong to leash's own leases ({}): an imported record never claims a leash                  lease's processes; left alone",
                rec.pid,
                pids(&leash_own),
                leash_note()
            ));
        }
        if candidates.is_empty() && !marked.is_empty() {
            let reason = format!(
                "stored pid {} is gone; pid {} carry {}={lease} and {}={gw} (this root's gateway \
                 id) in their environment and started before the import: the lease's escapees",
                rec.pid,
                pids(&marked),
                ENV_LEASE_ID,
                ENV_GATEWAY_ID
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
    if let Some(why) = live_root_refusal(rec, p, caller, "lease") {
        return refuse(why);
    }
    if let Some(why) = leash_root_refusal(p, snap) {
        return refuse(why);
    }
    if !leash_own.is_empty() {
        return refuse(format!(
            "pid {} carry lease {lease}'s markers but belong to leash's own leases ({}): the              record's markers cannot be told from leash's; left alone",
            pids(&leash_own),
            leash_note()
        ));
    }
    let Some(argv) = &p.argv else {
        return refuse(format!("pid {}: its command line is unreadable", p.pid));
    };
    let root = match wrapper_root(rec, expect, wrapper) {
        Ok(root) => root,
        Err(why) => return refuse(why),
    };
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
                tree.members.push(Member::of(
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
fn escapees_only(marked: &[&ProcessInfo], reason: String) -> LegacyVerdict {
    let mut members: Vec<Member> = marked
        .iter()
        .map(|m| Member::of(m, Role::Marked, 0, reason.clone()))
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
    use proptest::prelude::*;

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

    /// Whatever the input, a refusal names what is open: of the three endings that would close
    /// a single quote, a double quote or a trailing backslash, exactly the one it names makes
    /// the line split.
    fn a_refusal_names_what_is_open(s: &str) -> Result<(), TestCaseError> {
        if let Err(e) = shell_split(s) {
            for (names, ending) in [
                (TokenError::Unterminated('\''), "x'"),
                (TokenError::Unterminated('"'), "x\""),
                (TokenError::TrailingBackslash, "x"),
            ] {
                let closes = shlex::split(&format!("{s}{ending}")).is_some();
                prop_assert_eq!(closes, names == e, "{:?} refused as {:?}", s, e);
            }
        }
        Ok(())
    }

    proptest! {
        /// Lines of the characters the splitter treats specially (and a few it does not).
        #[test]
        fn a_refused_shell_line_names_what_is_open(s in "[ \t\n'\"\\\\#$`ab\r\u{e9}]{0,32}") {
            a_refusal_names_what_is_open(&s)?;
        }

        /// Any text at all.
        #[test]
        fn refused_text_names_what_is_open(s in any::<String>()) {
            a_refusal_names_what_is_open(&s)?;
        }
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

    /// The JSON quoting of a command part is serde_json's (what the incumbent's `JSON.stringify`
    /// writes), for every character below 0x80 and a few beyond.
    #[test]
    fn json_string_quotes_as_serde_json_does() {
        let mut cases: Vec<String> = (0u32..0x80)
            .filter_map(char::from_u32)
            .map(String::from)
            .collect();
        cases.extend(["", "a b", "it's", "é/ü\u{2028}\u{1F600}", "\\\"\u{7f}"].map(String::from));
        for s in cases {
            assert_eq!(json_string(&s), serde_json::to_string(&s).unwrap(), "{s:?}");
        }
    }
    // ---- leash's own leases are never a legacy record's ------------------------------------

    const GW: &str = "11111111-2222-4333-8444-555555555555";
    const LEASE: &str = "L-1";

    fn proc(pid: i32, ppid: i32, start: u64, exe: &str, argv: &[&str], lease: bool) -> ProcessInfo {
        ProcessInfo {
            pid,
            ppid,
            pgid: pid,
            sid: pid,
            uid: 1000,
            start_time: start,
            state: 'S',
            exe: Some(exe.into()),
            argv: Some(argv.iter().map(|a| a.to_string()).collect()),
            env: Some(crate::model::LeaseEnv {
                lease_id: lease.then(|| LEASE.into()),
                gateway_instance_id: lease.then(|| GW.into()),
            }),
            pidfs_ino: None,
        }
    }

    /// An acpx record naming lease `LEASE` of gateway `GW`, whose root pid is gone.
    fn acpx_record() -> LegacyRecord {
        LegacyRecord {
            id: 1,
            session_key: "s".into(),
            pid: 999_993,
            command: "/oc/acpx/codex-acp-wrapper.mjs".into(),
            wrapper_path: Some("/oc/acpx/codex-acp-wrapper.mjs".into()),
            wrapper_root: Some("/oc/acpx".into()),
            state: "open".into(),
            state_reason: None,
            imported_at: 1,
            imported_ticks: 10_000,
            source: Some(ACPX_SOURCE.into()),
            acpx_lease_id: Some(LEASE.into()),
            acpx_gateway_id: Some(GW.into()),
            command_hash: Some("ab".repeat(32)),
            process_group_id: None,
            acpx_started_at: None,
        }
    }

    fn caller() -> Caller {
        Caller {
            pid: 5,
            pgid: 5,
            uid: 1000,
        }
    }

    fn verdict(snap: &Snapshot) -> LegacyVerdict {
        let expect = Expect {
            gateway_instance_id: GW,
            wrapper_root: Path::new("/state/wrappers"),
            cgroup_root: None,
        };
        verify_legacy(&acpx_record(), &expect, snap, &caller())
    }

    fn refused_because(v: &LegacyVerdict, says: &str) {
        match v {
            LegacyVerdict::Refused { reason } => {
                assert!(reason.contains(says), "{reason}");
                assert!(reason.contains("leash"), "{reason}");
            }
            other => panic!("expected a refusal saying {says:?}, got {other:?}"),
        }
    }

    /// A leash session (its `leash-wrap` and its adapter, both carrying the lease's markers, as
    /// leash sets them) is not the escapees of a record that names its lease id and gateway id.
    #[test]
    fn a_leash_wrapper_and_its_adapter_are_never_a_records_escapees() {
        let snap = Snapshot::new([
            proc(
                100,
                50,
                500,
                "/state/wrappers/leash-wrap",
                &[
                    "/state/wrappers/leash-wrap",
                    "--owner-pid",
                    "50",
                    "--",
                    "sleep",
                    "600",
                ],
                true,
            ),
            proc(101, 100, 501, "/usr/bin/sleep", &["sleep", "600"], true),
        ]);
        refused_because(&verdict(&snap), "descends from leash's wrapper pid 100");
    }

    /// The adapter alone (its wrapper gone, re-parented to init) is still leash's when its lease
    /// id is one a leash store holds, or when it is in a lease cgroup under leash's root.
    #[test]
    fn an_orphaned_leash_adapter_is_known_by_its_store_or_its_cgroup() {
        let adapter = proc(101, 1, 501, "/usr/bin/sleep", &["sleep", "600"], true);
        let mut snap = Snapshot::new([adapter.clone()]);
        // Nothing of leash's is seen on it: the incumbent's escapee (the record's own case).
        assert!(
            matches!(verdict(&snap), LegacyVerdict::Owned { ref tree, .. } if tree.root.is_none()),
            "{:?}",
            verdict(&snap)
        );
        snap.set_leash_seen(crate::model::LeashSeen {
            lease_ids: [LEASE.to_string()].into(),
            ..Default::default()
        });
        refused_because(&verdict(&snap), "a lease a leash store holds");
        let mut snap = Snapshot::new([adapter]);
        snap.set_leash_seen(crate::model::LeashSeen {
            cgroup_members: [(101, "/cg/leash/G/L-1".to_string())].into(),
            ..Default::default()
        });
        refused_because(&verdict(&snap), "in leash's lease cgroup /cg/leash/G/L-1");
    }

    /// A live process that carries the record's argv markers but runs under a `leash-wrap` is
    /// refused as the record's root, and a leash-format record's verified root never takes a
    /// `leash-wrap` child into its tree.
    #[test]
    fn a_leash_process_is_never_a_records_root_nor_its_descendant() {
        let marked_argv = [
            "/usr/bin/node",
            "/oc/acpx/codex-acp-wrapper.mjs",
            ACPX_LEASE_ARG,
            LEASE,
            ACPX_GATEWAY_ARG,
            GW,
        ];
        let snap = Snapshot::new([
            proc(
                100,
                50,
                500,
                "/state/wrappers/leash-wrap-1-2",
                &["/state/wrappers/leash-wrap-1-2", "--", "node"],
                true,
            ),
            proc(999_993, 100, 501, "/usr/bin/node", &marked_argv, true),
        ]);
        refused_because(&verdict(&snap), "descends from leash's wrapper pid 100");

        let mut rec = acpx_record();
        rec.source = None;
        rec.wrapper_path = None;
        rec.command = "old-gateway --serve".into();
        rec.pid = 200;
        let snap = Snapshot::new([
            ProcessInfo {
                env: Some(Default::default()),
                ..proc(
                    200,
                    1,
                    400,
                    "/usr/bin/old-gateway",
                    &["old-gateway", "--serve"],
                    false,
                )
            },
            proc(
                201,
                200,
                450,
                "/state/wrappers/leash-wrap",
                &["/state/wrappers/leash-wrap", "--", "x"],
                false,
            ),
            proc(202, 201, 451, "/usr/bin/x", &["x"], false),
            proc(203, 200, 452, "/usr/bin/y", &["y"], false),
        ]);
        let expect = Expect {
            gateway_instance_id: GW,
            wrapper_root: Path::new("/state/wrappers"),
            cgroup_root: None,
        };
        let LegacyVerdict::Owned { tree, .. } = verify_legacy(&rec, &expect, &snap, &caller())
        else {
            panic!("the old gateway's root verifies by its argv");
        };
        let members: Vec<i32> = tree.members.iter().map(|m| m.pid).collect();
        assert_eq!(members, vec![203], "{tree:?}");
        assert!(
            tree.excluded
                .iter()
                .any(|e| e.pid == 201 && e.reason.contains("leash's wrapper")),
            "{tree:?}"
        );
    }
}
