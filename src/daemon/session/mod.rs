//! A supervised session: one `leash exec` child of the daemon (lease committed, then the wrapper,
//! then the adapter), its stdin writer, a thread reading its stdout into a bounded replay buffer,
//! a thread logging its stderr, and a waiter that settles the lease when the wrapper exits.
//!
//! **Seqs.** Output lines and lifecycle events share one per-session, monotonic seq space, the
//! same one the store's `events` table uses. Output is never written to SQLite line by line: the
//! session reserves blocks of [`SEQ_BLOCK`] seqs in the store (one write per block; larger blocks,
//! up to [`MAX_SEQ_BLOCK`], while output floods in to a live attach), and any event
//! recorded meanwhile — by the daemon, by a `Controller`, by another process — gets a seq above
//! the block. Stored events are merged into the stream in seq order whenever a block is reserved
//! and after every lifecycle action, so a client sees every item exactly once, in seq order, and
//! a persisted event has the same seq in the database as in the stream. Seqs may skip (the unused
//! rest of a block); they never repeat or go back, also across daemon restarts.
//!
//! **When the database cannot be written** (disk full, a lock held past the busy timeout) no seq
//! can be reserved, and an output line is never given one that was not: the output thread holds
//! the line and retries (the adapter meets backpressure on its stdout pipe), `status` shows
//! `outputHeld` with the error, and the stream resumes in order once a block is reserved. Seqs
//! handed out are therefore always at or below the store's floor, so later events — and the
//! next lease of the same key — land above everything a client has seen.
//!
//! **Locks.** The store connection is shared by every session of the daemon (one connection, not
//! one per session) behind its own mutex, taken before a session's `inner` lock and never while
//! holding it. `inner` is only ever held for in-memory work, and `status` does not take it at
//! all: every writer of `inner` publishes what `status` shows as it lets go (`shown.rs`), so a
//! niced output reader preempted while holding `inner` delays no health check.
//!
//! **Busy.** A `session/prompt` JSON-RPC request written to the adapter's stdin marks the session
//! busy until a response with the same id appears on its stdout. The classification is pure
//! ([`classify_outgoing`], [`classify_incoming`]).

mod attach;
mod base;
mod busy;
mod freeze;
mod handshake;
mod phase;
mod replay;
mod reserve;
mod seq;
mod settle;
mod shown;
mod spawn;
mod stdio;
mod supervised;

pub use base::{
    LeaseInfo, Limits, Partial, SharedStore, StartFailure, MAX_ADAPTER_LINE, MAX_SEQ_BLOCK,
    MAX_STDERR_LINE, SEQ_BLOCK,
};
pub use busy::{cancel_notification, classify_incoming, classify_outgoing, Incoming, Outgoing};
pub use freeze::{Freeze, NotFrozen};
pub use handshake::{HandshakeFailure, HANDSHAKE_ID};
pub use replay::HandedReplay;
pub use replay::{line_prefix, Batch, Item, LineHead, Run, Slot};
pub(crate) use settle::settle_slot;
pub use spawn::{adopt, Adopted, HandedFds, HandedLife, HandedSession};
pub use spawn::{spawn, SpawnError, SpawnSpec};
pub use supervised::Supervised;
