//! leash-core: the model of leash and every decision it makes, as functions of their arguments.
//!
//! - [`model`]: the plain data (a lease and its states, a process and a snapshot of the process
//!   table with its walks, what was seen of a cgroup, a legacy record).
//! - [`verify`]: does the live tree still belong to this lease? One checklist, with the evidence.
//! - [`legacy`]: the fail-safe check of legacy records and the acpx extension's leases, and the
//!   shell tokeniser their stored commands need.
//! - [`plan`]: what `close` and `reap` would do to each lease and each process (what
//!   `reap --dry-run` prints), through [`guard`].
//! - [`answer`]: `leash verify`'s answer for a gateway (owned, dead, unavailable), with its
//!   evidence, from the verifier's verdict and the signalling guards.
//! - [`reconcile`]: what a reconcile pass of the daemon does with each lease, from the few facts
//!   it read of its processes.
//! - [`guard`]: the hard refusals every signal passes (pid ≤ 1, leash's own pid and process
//!   group, another uid) and the only signals leash may send.
//! - [`visibility`]: which session rows a requester may see.
//! - [`limits`]: the real range of every numeric input and the one rule for keys, checked at
//!   every edge.
//! - [`kind`]: the error vocabulary and its two tables, exit codes and wire codes.
//! - [`lease_builder`]: a lease written down field by field, for tests, benchmarks and fuzz
//!   targets.
//!
//! That this code is pure is a compile-time fact, not a convention, and it is about effects:
//! the crate forbids `unsafe` (so it cannot call the kernel by hand), its `clippy.toml` makes
//! the file system, processes, the network, the environment, sleeping and the clock clippy
//! errors, and it depends only on crates that do none of those (serde; sha2 for
//! `command_hash`; uuid, without its default features, for a lease id's text and time; shlex
//! for the stored commands of legacy records; humantime for durations as text —
//! `tests/pure_core.rs` holds its whole dependency
//! tree to that list). No rusqlite, nix or libc: it cannot name the database, a pidfd or
//! kill(2). Reading `/proc`, the cgroup files and the store, and sending signals, are the
//! `leash` crate's.

#![forbid(unsafe_code)]

pub mod answer;
pub mod guard;
pub mod kind;
pub mod lease_builder;
pub mod legacy;
pub mod limits;
pub mod model;
pub mod plan;
pub mod reconcile;
pub mod verify;
pub mod visibility;
