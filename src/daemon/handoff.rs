//! The handoff's format: what a daemon that execs a new program of itself (`upgrade.rs`) passes
//! to it in a memfd, as one JSON document, beside the descriptors it keeps open across the exec
//! (each named here by its number). Versioned: a program reads the formats it lists in
//! [`FORMATS_READ`] (`leash serve --handoff-check` prints them, and the daemon refuses to exec a
//! program that does not list its [`FORMAT`]). A field added with a default keeps the format;
//! anything else is a new format.

use super::session::HandedSession;
use crate::protocol::{Resumable, StartupReap};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::io::{Read, Seek, Write};
use std::os::fd::RawFd;
use std::path::PathBuf;

/// The format this program writes.
pub const FORMAT: u32 = 1;

/// The formats this program reads.
pub const FORMATS_READ: &[u32] = &[1];

/// What `leash serve --handoff-check` prints (one JSON line).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Check {
    pub handoff_formats: Vec<u32>,
    pub version: String,
}

impl Check {
    pub fn of_this_program() -> Check {
        Check {
            handoff_formats: FORMATS_READ.to_vec(),
            version: super::version::version(),
        }
    }
}

/// The connection that asked for the upgrade, answered by whichever program serves after it.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Requester {
    pub fd: RawFd,
    pub id: Value,
}

/// The daemon's counters, carried so that they keep counting from where they were (the
/// histograms and the gauges of the present start again).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Counters {
    pub wrapper_starts: u64,
    pub report_write_failures: u64,
    pub escapees_killed: u64,
    #[serde(default)]
    pub handoffs: u64,
    #[serde(default)]
    pub handoff_failures: u64,
    /// Labelled counters as `(metric, labels, value)`.
    #[serde(default)]
    pub labelled: Vec<(String, Labels, u64)>,
}

/// A series' labels, `(name, value)` each.
pub type Labels = Vec<(String, String)>;

/// One handoff.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Handoff {
    pub format: u32,
    /// The version of the program that handed over.
    pub from_version: String,
    /// `CLOCK_MONOTONIC` (ns) when the upgrade was asked for: the handoff's duration is
    /// measured from it to the new program's first answer.
    pub requested_at_ns: u64,
    /// When the daemon first started (ms since the epoch), across every handoff.
    pub started_at: i64,
    /// The path the next upgrade execs by default.
    pub upgrade_program: PathBuf,
    /// The lock file's descriptor (the `flock` is on its open file, which the exec keeps).
    pub lock_fd: RawFd,
    pub listener_fd: RawFd,
    pub metrics_fd: Option<RawFd>,
    /// The program that handed over, open for a fall-back `fexecve`.
    pub previous_program_fd: RawFd,
    pub socket: PathBuf,
    pub activated: bool,
    pub listener_pid: Option<i32>,
    pub socket_inode: Option<(u64, u64)>,
    pub sessions: Vec<HandedSession>,
    pub resumable: Vec<Resumable>,
    pub startup_reap: StartupReap,
    pub last_reconcile: Value,
    pub counters: Counters,
    pub requester: Option<Requester>,
}

impl Handoff {
    /// Every descriptor the handoff names, to keep open across the exec.
    pub fn fds(&self) -> Vec<RawFd> {
        let mut v = vec![self.lock_fd, self.listener_fd, self.previous_program_fd];
        v.extend(self.metrics_fd);
        v.extend(self.requester.as_ref().map(|r| r.fd));
        for s in &self.sessions {
            v.extend(s.fds.all());
        }
        v
    }

    /// Writes the handoff to a new memfd, rewound for the reader: the JSON document's length (a
    /// little-endian `u64`), the document, then the raw part (the replay buffers' bodies, each
    /// where its session's `replay.rawAt` says).
    pub fn write_memfd(&mut self) -> std::io::Result<std::fs::File> {
        let mut raw = Vec::new();
        for s in &mut self.sessions {
            s.replay.raw_at = raw.len() as u64;
            s.replay.raw_len = s.replay.raw.len() as u64;
            raw.append(&mut s.replay.raw);
        }
        // Encoded in memory first: a writer straight to the file makes a syscall per token.
        let doc = serde_json::to_vec(self)?;
        let mut f = crate::sys::memfd(c"leash-handoff")?;
        f.write_all(&(doc.len() as u64).to_le_bytes())?;
        f.write_all(&doc)?;
        f.write_all(&raw)?;
        f.rewind()?;
        Ok(f)
    }

    /// Reads a handoff from the descriptor it came in (from its start). When it cannot, the
    /// error still carries the previous program's descriptor if the document names it: what a
    /// takeover that fails needs to hand back.
    pub fn read(f: &mut std::fs::File) -> Result<Handoff, Unreadable> {
        let unnamed = |why: String| Unreadable {
            why,
            previous_program_fd: None,
        };
        f.rewind()
            .map_err(|e| unnamed(format!("cannot rewind the handoff: {e}")))?;
        let mut all = Vec::new();
        f.read_to_end(&mut all)
            .map_err(|e| unnamed(format!("cannot read the handoff: {e}")))?;
        let cut = || "the handoff is cut short".to_string();
        let len = all
            .get(..8)
            .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")) as usize)
            .ok_or_else(|| unnamed(cut()))?;
        let text = all.get(8..8 + len).ok_or_else(|| unnamed(cut()))?;
        let raw = &all[8 + len..];
        let v: Value = serde_json::from_slice(text)
            .map_err(|e| unnamed(format!("the handoff is not JSON: {e}")))?;
        let named = |why: String| Unreadable {
            why,
            previous_program_fd: v
                .get("previousProgramFd")
                .and_then(Value::as_i64)
                .and_then(|fd| RawFd::try_from(fd).ok()),
        };
        let format = v.get("format").and_then(Value::as_u64).unwrap_or(0) as u32;
        if !FORMATS_READ.contains(&format) {
            return Err(named(format!(
                "handoff format {format} is not one this program reads ({FORMATS_READ:?})"
            )));
        }
        let mut h = Handoff::deserialize(&v)
            .map_err(|e| named(format!("the handoff does not parse: {e}")))?;
        for s in &mut h.sessions {
            let (at, len) = (s.replay.raw_at as usize, s.replay.raw_len as usize);
            s.replay.raw = raw.get(at..at + len).ok_or_else(|| named(cut()))?.to_vec();
        }
        Ok(h)
    }
}

/// A handoff that could not be read: why, and the previous program's descriptor if it names it.
#[derive(Debug)]
pub struct Unreadable {
    pub why: String,
    pub previous_program_fd: Option<RawFd>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn memfd_of(doc: &[u8], raw: &[u8]) -> std::fs::File {
        let mut f = crate::sys::memfd(c"test-handoff").unwrap();
        f.write_all(&(doc.len() as u64).to_le_bytes()).unwrap();
        f.write_all(doc).unwrap();
        f.write_all(raw).unwrap();
        f
    }

    /// A handoff that cannot be read says why, and names the previous program's descriptor
    /// whenever its document does (what a failed takeover hands back to).
    #[test]
    fn an_unreadable_handoff_still_names_the_previous_program_when_it_can() {
        let e = Handoff::read(&mut memfd_of(b"{not json", b"")).unwrap_err();
        assert!(e.why.contains("not JSON"), "{}", e.why);
        assert_eq!(e.previous_program_fd, None);

        let mut cut = crate::sys::memfd(c"test-handoff").unwrap();
        cut.write_all(&[1, 2, 3]).unwrap();
        let e = Handoff::read(&mut cut).unwrap_err();
        assert!(e.why.contains("cut short"), "{}", e.why);
        assert_eq!(e.previous_program_fd, None);

        let other = serde_json::json!({"format": 999, "previousProgramFd": 7});
        let e = Handoff::read(&mut memfd_of(other.to_string().as_bytes(), b"")).unwrap_err();
        assert!(e.why.contains("format 999"), "{}", e.why);
        assert_eq!(e.previous_program_fd, Some(7));

        let partial = serde_json::json!({"format": FORMAT, "previousProgramFd": 9});
        let e = Handoff::read(&mut memfd_of(partial.to_string().as_bytes(), b"")).unwrap_err();
        assert!(e.why.contains("does not parse"), "{}", e.why);
        assert_eq!(e.previous_program_fd, Some(9));
    }
}
