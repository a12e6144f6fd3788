//! leash-core: the decisions of leash that need nothing but their arguments. [`visibility`]
//! decides which session rows a requester may see; [`guard`] holds the hard refusals every
//! signal passes (pid ≤ 1, leash's own pid and process group, another uid) and the only signals
//! leash may send.
//!
//! That this code is pure is a compile-time fact, not a convention: the crate depends on serde
//! alone (no rusqlite, nix or libc, so it cannot name the database, a pidfd or kill(2)), forbids
//! `unsafe` (so it cannot call the kernel by hand), and its `clippy.toml` makes the file system,
//! processes, the environment and the clock clippy errors. The `leash` crate re-exports both
//! modules (`leash::visibility`, `leash::signal::{Caller, Sig, Refusal}`), so their paths are
//! unchanged. The verifier and the planner move here next (docs/architecture.md).

#![forbid(unsafe_code)]

pub mod guard;
pub mod kind;
pub mod model;
pub mod visibility;
