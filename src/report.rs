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
    /// The lease's report as the wrapper last wrote it, or `None` if there is none yet.
    ///
    /// A report is a file of records, one JSON line each, appended (the wrapper's `Report`): the
    /// start, then the end. The report is the last line that ends in a newline: a line without
    /// one is a record still being written (or cut short by a full disk), and is not read. A
    /// complete line that does not parse is said in the log and the one before it is taken.
    pub fn read(path: &std::path::Path, lease_id: &str) -> Option<WrapperReport> {
        use std::io::Read;
        let mut bytes = Vec::new();
        std::fs::File::open(path)
            .ok()?
            .take(REPORT_READ_LIMIT)
            .read_to_end(&mut bytes)
            .ok()?;
        Self::last_record(&bytes, lease_id)
    }

    /// The last complete record of a report's bytes; see [`WrapperReport::read`].
    fn last_record(bytes: &[u8], lease_id: &str) -> Option<WrapperReport> {
        let end = bytes.iter().rposition(|&b| b == b'\n')?;
        for line in bytes[..end].rsplit(|&b| b == b'\n') {
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            match serde_json::from_slice(line) {
                Ok(r) => return Some(r),
                Err(e) => {
                    tracing::warn!(lease_id, error = %e, "ignoring an unreadable wrapper report record")
                }
            }
        }
        None
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
        let path = root.report_file(&lease.lease_id, lease.report_dir.as_deref())?;
        Self::read_for_at(&path, lease)
    }

    /// [`WrapperReport::read_for`] from `path`, the lease's report file as
    /// [`StateRoot::report_file`] (or [`ReportFiles`]) found it.
    fn read_for_at(path: &std::path::Path, lease: &Lease) -> Option<WrapperReport> {
        let report = Self::read(path, &lease.lease_id)?;
        if report.matches(lease) {
            Some(report)
        } else {
            tracing::warn!(lease_id = %lease.lease_id, "wrapper report names another process; ignored");
            None
        }
    }

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
/// the close or reap that finds it gone (`lost`). Returns how many leases changed state. Writes only
/// what changes a row: with nothing new to fold it is a read, and takes no write lock.
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
        let Some(path) = files.of(root, &lease) else {
            continue;
        };
        let Some(report) = WrapperReport::read_for_at(&path, &lease) else {
            continue;
        };
        if report.fills(&lease) {
            report.apply(store, &lease.lease_id)?;
        }
        if let (Some(code), LeaseState::Open) = (report.exit_status, lease.state) {
            // The wrapper exits only after its whole tree is gone; confirm it is gone too.
            if matches!(table.alive(lease.root()), Ok(false)) {
                let reason = report.end_words(code);
                if store.transition(
                    &lease.lease_id,
                    LeaseState::Open,
                    LeaseState::Ended,
                    None,
                    &reason,
                )? {
                    let _ = std::fs::remove_file(&path);
                    ended += 1;
                }
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
    checked: Vec<(std::path::PathBuf, bool)>,
}

impl ReportFiles {
    /// The report file of `lease` ([`StateRoot::report_file`]).
    pub fn of(&mut self, root: &StateRoot, lease: &Lease) -> Option<std::path::PathBuf> {
        let checked = &mut self.checked;
        let mut usable = |dir: &std::path::Path| match checked.iter().find(|(d, _)| d == dir) {
            Some(&(_, ok)) => ok,
            None => {
                let ok = crate::state::reports_dir_usable(dir);
                checked.push((dir.to_path_buf(), ok));
                ok
            }
        };
        root.report_file_with(&lease.lease_id, lease.report_dir.as_deref(), &mut usable)
    }
}

/// The report of a lease that reached a terminal state is no longer needed. Removed only where
/// [`StateRoot::report_file`] accepts the row's claim of where it is.
pub fn remove_report(root: &StateRoot, lease: &Lease) {
    if let Some(path) = root.report_file(&lease.lease_id, lease.report_dir.as_deref()) {
        let _ = std::fs::remove_file(path);
    }
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
        WrapperReport::last_record(text.as_bytes(), "l").map(|r| (r.wrapper_pid, r.exit_status))
    }

    #[test]
    fn the_report_is_the_last_whole_line() {
        let (start, end) = (rec(10, "null"), rec(10, "3"));
        // One record, as every wrapper before the append wrote it.
        assert_eq!(last(&format!("{start}\n")), Some((10, None)));
        assert_eq!(last(&format!("{start}\n{end}\n")), Some((10, Some(3))));
        // Nothing yet: the file made, its first record not written, or written in part.
        assert_eq!(last(""), None);
        assert_eq!(last(&start), None);
        assert_eq!(last(&start[..20]), None);
        // The end record half written: the start record is the report.
        assert_eq!(last(&format!("{start}\n{}", &end[..30])), Some((10, None)));
        assert_eq!(last(&format!("{start}\n{end}")), Some((10, None)));
    }

    #[test]
    fn a_line_that_does_not_parse_is_passed_over_not_merged() {
        let (start, end) = (rec(10, "null"), rec(10, "3"));
        // A record cut short by a full disk, ended by the wrapper's repair newline.
        assert_eq!(
            last(&format!("{start}\n{}\n", &end[..30])),
            Some((10, None))
        );
        // And the next record after it still counts.
        assert_eq!(
            last(&format!("{start}\n{}\n{end}\n", &end[..30])),
            Some((10, Some(3)))
        );
        assert_eq!(last("garbage\n"), None);
        assert_eq!(last("\n\n"), None);
        assert_eq!(last(&format!("{start}\n\n")), Some((10, None)));
        // Not UTF-8 at all.
        assert_eq!(WrapperReport::last_record(b"\xff\xfe\n", "l"), None);
    }
}
