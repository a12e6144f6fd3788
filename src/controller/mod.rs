//! The controller: one `Controller` per state root that every verb runs on, with one file per
//! verb: [`exec`] (`exec/`, the one verb that runs without a controller: see there),
//! [`cancel`](Controller::cancel) (`cancel.rs`), [`close`](Controller::close) (`close.rs`),
//! [`reap`](Controller::reap) with its plan and the stray-cgroup sweep (`reap.rs`), legacy
//! records' cleanup (`legacy.rs`), [`leases`](Controller::leases) (`leases.rs`), the state root's
//! [`status`](Controller::root_status) (`status.rs`), [`events`](Controller::events) and
//! [`history`](Controller::history) (`events.rs`), the sessions queries and `send`
//! (`sessions.rs`), [`verify`](Controller::verify) (`verify.rs`), [`ps`](Controller::ps)
//! (`ps.rs`), [`snapshot`](Controller::snapshot) of what a decision reads (`snapshot.rs`) and
//! its replay through the verbs on the recording signaller ([`simulate`], `simulate.rs`), legacy records' [`import`](Controller::legacy_import) and
//! [`list`](Controller::legacy_records) (`legacy.rs`), and the TERM → grace → KILL
//! engine they share (`terminate.rs`). `base.rs`
//! holds what every verb needs: opening the store and the machine (process table, signaller,
//! clock, containment), naming leases ([`LeaseRef`]), folding the wrappers' reports in
//! ([`Controller::ingest_reports_marking_ended_lost`]), and claiming leases for closing,
//! exclusively across processes (the store) and across the threads of one (`HeldClaims`).
//!
//! One controller serves many threads: every verb takes `&self`, and the store connection sits
//! behind a mutex taken for one database step at a time — never across a grace, a signal or a
//! wait. The daemon holds one for its whole life (every request, settle and reconcile pass calls
//! the same functions the CLI calls); the CLI opens one per process.
//!
//! The three intents stay distinct:
//!
//! - `cancel` records the intent and signals nothing; the lease stays open (the ACP turn itself
//!   is cancelled by whoever holds the adapter's stdin: the daemon).
//! - `close` claims the lease (`open → closing`), verifies the live tree against it, SIGTERMs
//!   members children first, waits the grace, SIGKILLs survivors, and marks it `closed`; `lost`
//!   when nothing was alive; back to `open` with the reason when ownership could not be proven.
//!   Closing many leases runs their grace periods concurrently.
//! - `reap` starts from this gateway's open and closing leases whose owner is gone, never from a
//!   search of command lines, and does the same per lease; it also handles legacy records and
//!   expires old closed/lost leases.
//!
//! Every signal goes through a [`crate::signal::Signaller`] (live: pidfds, which re-check the
//! process before signalling it); `tests/controller_simulator.rs` runs the verbs over the
//! recording one.

mod base;
mod cancel;
mod close;
mod events;
pub mod exec;
mod leases;
mod legacy;
mod ps;
mod reap;
pub mod session_input;
pub mod sessions;
pub mod simulate;
pub mod snapshot;
mod status;
pub mod terminate;
pub mod verify;

pub use base::{Controller, LeaseRef, LifecycleError};
pub use cancel::CancelOutcome;
pub use close::{CloseOutcome, CloseResult};
pub use events::{EventsError, History};
pub use legacy::{AcpxSources, LegacyOutcome};
pub use reap::{ReapReport, SweptCgroup};
pub use status::{store_status, store_status_with, StoreStatus};
