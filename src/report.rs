//! The wrapper's side-channel report (`<reports dir>/<lease>.json`: the lease row's
//! `report_dir`, else `<state-dir>/run/`), and folding it into the
//! lease row: the adapter pid, its start time and group id after spawn, the exit status at the
//! end. A report is trusted only when it names the lease's own wrapper (pid and start time), and
//! it only fills in fields the row does not have yet.

use crate::proc::ProcessTable;
use crate::state::StateRoot;
use crate::store::{ReportUpdate, Store, StoreError};
use leash_core::model::{Lease, LeaseState};
use serde::Deserialize;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WrapperReport {
    pub wrapper_pid: i32,
    pub wrapper_start_time: u64,
    pub adapter_pid: Option<i32>,
    pub adapter_start_time: Option<u64>,
    pub process_group_id: Option<i32>,
    pub exit_status: Option<i32>,
    pub end_reason: Option<String>,
    /// Why the adapter could not be started (`end_reason` `cannot-start`, exit status 127 or
    /// 126), in words: "the adapter could not be started: nosuchcmd: not found on PATH".
    #[serde(default)]
    pub start_error: Option<String>,
}

/// The most a report is read of. A record is a few hundred bytes (a start error names the
/// command, at most a path's length), and a wrapper writes at most two; a larger file is not
/// one a wrapper wrote, and its first 64 KiB are as good a claim as any.
const REPORT_READ_LIMIT: u64 = 64 * 1024;

impl WrapperReport {
    /// The report in file `path`, or `None` if there is none yet.
    ///
    /// A report is a file of at most two records, one JSON line each (the wrapper's `Report`):
    /// the start, then the end, written at the wrapper's own offset. The report is the first
    /// line, or the second when the first has no exit status and the second names the same
    /// wrapper; a line without its newline is a record still being written (or cut short by a
    /// full disk), and is not read. Lines after the second are not the wrapper's: a line
    /// another process adds is never believed over the wrapper's end record.
    pub fn read(path: &Path, lease_id: &str) -> Option<WrapperReport> {
        use std::io::Read;
        let mut bytes = Vec::new();
        std::fs::File::open(path)
            .ok()?
            .take(REPORT_READ_LIMIT)
            .read_to_end(&mut bytes)
            .ok()?;
        Self::record(&bytes, lease_id)
    }

    /// The record of a report's bytes; see [`WrapperReport::read`].
    fn record(bytes: &[u8], lease_id: &str) -> Option<WrapperReport> {
        let end = bytes.iter().rposition(|&b| b == b'\n')?;
        let mut lines = bytes[..end].split(|&b| b == b'\n');
        let parse = |line: &[u8]| match serde_json::from_slice::<WrapperReport>(line) {
            Ok(r) => Some(r),
            Err(e) => {
                tracing::warn!(lease_id, error = %e, "ignoring an unreadable wrapper report record");
                None
            }
        };
        let first = parse(lines.next()?)?;
        if first.exit_status.is_some() {
            return Some(first);
        }
        match lines.next().and_then(parse) {
            Some(end)
                if end.wrapper_pid == first.wrapper_pid
                    && end.wrapper_start_time == first.wrapper_start_time =>
            {
                Some(end)
            }
            _ => Some(first),
        }
    }

    fn matches(&self, lease: &Lease) -> bool {
        self.wrapper_pid == lease.root_pid
            && self.wrapper_start_time == lease.root_start_time
            && self.adapter_pid.is_none_or(|p| p > 1)
            && self.process_group_id.is_none_or(|p| p > 1)
    }

    /// The lease's report, if there is one and it names the lease's own wrapper; a report that
    /// names another process is ignored (and said so in the log).
    pub fn read_for(root: &StateRoot, lease: &Lease) -> Option<WrapperReport> {
        ReportPaths::of(root, lease).read_for(lease)
    }
}

/// Where a lease's report may be: the file in the reports directory its row names (`None`:
/// the row's claim of one was refused, [`StateRoot::report_file`]), and the state root's
/// `run/<lease>.json`, where its wrapper puts the records that file cannot take (a full or
/// missing reports directory; the same file when the row names no directory).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReportPaths {
    pub primary: Option<PathBuf>,
    pub fallback: PathBuf,
}

impl ReportPaths {
    pub fn of(root: &StateRoot, lease: &Lease) -> ReportPaths {
        Self::with(
            root,
            lease,
            root.report_file(&lease.lease_id, lease.report_dir.as_deref()),
        )
    }

    fn with(root: &StateRoot, lease: &Lease, primary: Option<PathBuf>) -> ReportPaths {
        ReportPaths {
            primary,
            fallback: root.report_path(&lease.lease_id),
        }
    }

    /// The fallback file, when it is another file than the primary one.
    fn other(&self) -> Option<&Path> {
        Some(self.fallback.as_path()).filter(|f| self.primary.as_deref() != Some(*f))
    }

    /// The report as its wrapper wrote it, from either file: the one with an exit status, else
    /// the one there is (the primary first); `filter` says which records may be taken. The
    /// flag says it came from the fallback.
    pub fn read_where(
        &self,
        lease_id: &str,
        filter: impl Fn(&WrapperReport) -> bool,
    ) -> Option<(WrapperReport, bool)> {
        let primary = self
            .primary
            .as_deref()
            .and_then(|p| WrapperReport::read(p, lease_id))
            .filter(&filter);
        if primary.as_ref().is_some_and(|r| r.exit_status.is_some()) {
            return primary.map(|r| (r, false));
        }
        let fallback = self
            .other()
            .and_then(|p| WrapperReport::read(p, lease_id))
            .filter(&filter);
        match (primary, fallback) {
            (Some(p), Some(f)) if f.exit_status.is_none() => Some((p, false)),
            (_, Some(f)) => Some((f, true)),
            (p, None) => p.map(|r| (r, false)),
        }
    }

    /// The lease's report if it names the lease's own wrapper; a report that names another
    /// process is ignored (and said so in the log).
    pub fn read_for(&self, lease: &Lease) -> Option<WrapperReport> {
        let mine = |r: &WrapperReport| {
            let ok = r.matches(lease);
            if !ok {
                tracing::warn!(lease_id = %lease.lease_id, "wrapper report names another process; ignored");
            }
            ok
        };
        self.read_where(&lease.lease_id, mine).map(|(r, _)| r)
    }

    /// Removes both files (what is not there is no error).
    pub fn remove(&self) {
        for path in self
            .primary
            .iter()
            .map(PathBuf::as_path)
            .chain(self.other())
        {
            let _ = std::fs::remove_file(path);
        }
    }
}

impl WrapperReport {
    /// Whether this report has a field the row lacks: the one case [`WrapperReport::apply`]
    /// changes the row. Checked on the row as read, so a reader (`leash leases` every 20 ms)
    /// takes the write lock only when there is something to fold, never on every call.
    pub fn fills(&self, lease: &Lease) -> bool {
        (lease.process_group_id.is_none() && self.process_group_id.is_some())
            || (lease.adapter_pid.is_none() && self.adapter_pid.is_some())
            || (lease.adapter_start_time.is_none() && self.adapter_start_time.is_some())
            || (lease.exit_status.is_none() && self.exit_status.is_some())
    }

    /// Fills in the lease row from this report (only fields it does not have yet).
    pub fn apply(&self, store: &mut Store, lease_id: &str) -> Result<bool, StoreError> {
        store.apply_report(
            lease_id,
            &ReportUpdate {
                process_group_id: self.process_group_id,
                adapter_pid: self.adapter_pid,
                adapter_start_time: self.adapter_start_time,
                exit_status: self.exit_status,
            },
        )
    }
}

/// Folds every active lease's report into its row. A lease whose wrapper reported its end and is
/// no longer alive becomes `ended` (leash saw the adapter end: its exit status, or why it could
/// not be started, is recorded); a lease whose wrapper vanished without that report is left for
/// the close or reap that finds it gone (`lost`). An exit status is believed only once the
/// wrapper is gone: while it runs, the wrapper has written no end record, and a line claiming
/// one is not its. Returns how many leases changed state. Writes only what changes a row: with
/// nothing new to fold it is a read, and takes no write lock.
pub fn ingest_reports(
    root: &StateRoot,
    store: &mut Store,
    table: &dyn ProcessTable,
) -> Result<usize, StoreError> {
    let mut ended = 0;
    let mut files = ReportFiles::default();
    for lease in store
        .leases(&[LeaseState::Open, LeaseState::Closing])?
        .into_iter()
        .flatten()
    {
        let paths = files.of(root, &lease);
        let Some(mut report) = paths.read_for(&lease) else {
            continue;
        };
        // The wrapper exits only after its whole tree is gone; confirm it is gone too.
        if report.exit_status.is_some() && !matches!(table.alive(lease.root()), Ok(false)) {
            report.exit_status = None;
        }
        if report.fills(&lease) {
            report.apply(store, &lease.lease_id)?;
        }
        if let (Some(code), LeaseState::Open) = (report.exit_status, lease.state) {
            let reason = report.end_words(code);
            if store.transition(
                &lease.lease_id,
                LeaseState::Open,
                LeaseState::Ended,
                None,
                &reason,
            )? {
                paths.remove();
                ended += 1;
            }
        }
    }
    Ok(ended)
}

impl WrapperReport {
    /// The lease's state reason for a reported end, in words.
    pub fn end_words(&self, code: i32) -> String {
        if let Some(why) = &self.start_error {
            return format!("{why}; nothing ran (exit status {code})");
        }
        match self.end_reason.as_deref() {
            Some("adapter-exited") => format!("the adapter exited with status {code}"),
            Some("parent-died") => format!(
                "the owner exited; the wrapper took the tree down (adapter exit status {code})"
            ),
            Some("owner-gone") => {
                format!("the owner was gone before the adapter could start; nothing ran (exit status {code})")
            }
            Some("cannot-start") => {
                format!("the wrapper could not start the adapter; nothing ran (exit status {code})")
            }
            other => format!(
                "the wrapper ended ({}), adapter exit status {code}",
                other.unwrap_or("unknown reason")
            ),
        }
    }
}

/// The report files of many leases (a pass over the active ones, reap's expired ones): each
/// reports directory a row names is checked once ([`StateRoot::report_file_with`]), not once per
/// lease, since they share one or two.
#[derive(Default)]
pub struct ReportFiles {
    checked: Vec<(PathBuf, bool)>,
}

impl ReportFiles {
    /// The report files of `lease` ([`ReportPaths::of`]).
    pub fn of(&mut self, root: &StateRoot, lease: &Lease) -> ReportPaths {
        let checked = &mut self.checked;
        let mut usable = |dir: &Path| match checked.iter().find(|(d, _)| d == dir) {
            Some(&(_, ok)) => ok,
            None => {
                let ok = crate::state::reports_dir_usable(dir);
                checked.push((dir.to_path_buf(), ok));
                ok
            }
        };
        let primary =
            root.report_file_with(&lease.lease_id, lease.report_dir.as_deref(), &mut usable);
        ReportPaths::with(root, lease, primary)
    }
}

/// The report of a lease that reached a terminal state is no longer needed, read or not: both
/// its files go. The reports directory's file only where [`StateRoot::report_file`] accepts
/// the row's claim of where it is.
pub fn remove_report(root: &StateRoot, lease: &Lease) {
    ReportPaths::of(root, lease).remove();
}

#[cfg(test)]
mod tests {
    use super::WrapperReport;

    fn rec(pid: i32, exit: &str) -> String {
        format!(
            "{{\"wrapperPid\":{pid},\"wrapperStartTime\":7,\"adapterPid\":{a},\"adapterStartTime\":8,\
             \"processGroupId\":{a},\"exitStatus\":{exit},\"endReason\":null,\"startError\":null}}",
            a = pid + 1
        )
    }

    fn last(text: &str) -> Option<(i32, Option<i32>)> {
        WrapperReport::record(text.as_bytes(), "l").map(|r| (r.wrapper_pid, r.exit_status))
    }

    #[test]
    fn the_report_is_the_start_record_then_the_end_record() {
        let (start, end) = (rec(10, "null"), rec(10, "3"));
        assert_eq!(last(&format!("{start}\n")), Some((10, None)));
        assert_eq!(last(&format!("{start}\n{end}\n")), Some((10, Some(3))));
        // Nothing yet: the file made, its first record not written, or written in part.
        assert_eq!(last(""), None);
        assert_eq!(last(&start), None);
        assert_eq!(last(&start[..20]), None);
        // The end record half written: the start record is the report.
        assert_eq!(last(&format!("{start}\n{}", &end[..30])), Some((10, None)));
        assert_eq!(last(&format!("{start}\n{end}")), Some((10, None)));
        // A single end record (nothing ran) is the report.
        assert_eq!(last(&format!("{end}\n")), Some((10, Some(3))));
    }

    #[test]
    fn lines_after_the_wrappers_are_not_believed() {
        let (start, end) = (rec(10, "null"), rec(10, "143"));
        let forged = rec(10, "0");
        // A line added after the end record does not replace it.
        assert_eq!(
            last(&format!("{start}\n{end}\n{forged}\n")),
            Some((10, Some(143)))
        );
        // Nor after a single end record.
        assert_eq!(last(&format!("{end}\n{forged}\n")), Some((10, Some(143))));
        // A second line naming another wrapper is not this report's end.
        assert_eq!(
            last(&format!("{start}\n{}\n", rec(11, "0"))),
            Some((10, None))
        );
        // The wrapper's end record written over a longer forged line: what is left of the
        // forgery after the end record's newline is a third line, not read.
        let long = format!("{forged}{}", " ".repeat(40));
        let mut bytes = format!("{start}\n{long}\n").into_bytes();
        let at = start.len() + 1;
        bytes[at..at + end.len() + 1].copy_from_slice(format!("{end}\n").as_bytes());
        assert_eq!(
            WrapperReport::record(&bytes, "l").map(|r| r.exit_status),
            Some(Some(143))
        );
    }

    #[test]
    fn a_line_that_does_not_parse_is_passed_over_not_merged() {
        let (start, end) = (rec(10, "null"), rec(10, "3"));
        // A record cut short by a full disk and ended by a newline.
        assert_eq!(
            last(&format!("{start}\n{}\n", &end[..30])),
            Some((10, None))
        );
        assert_eq!(last("garbage\n"), None);
        assert_eq!(last("\n\n"), None);
        assert_eq!(last(&format!("{start}\n\n")), Some((10, None)));
        // Not UTF-8 at all.
        assert_eq!(WrapperReport::record(b"\xff\xfe\n", "l"), None);
    }
}
