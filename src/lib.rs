//! leash: a lease-based process supervisor and reaper for agent gateways.
//!
//! # Theory of operation
//!
//! A gateway starts each ACP adapter through `leash exec -- CMD…`. That process commits a
//! **lease** to the state root's SQLite database (its own pid and start time as the root, its
//! parent as the owner, the adapter argv's hash, this gateway's instance id) and then execs the
//! installed **wrapper** (`leash-wrap`) in place. The wrapper runs the adapter in its own process
//! group with the lease id and gateway id in its environment, forwards termination signals to that
//! group, and when its parent (the owner) dies it terminates the whole tree (SIGTERM, grace,
//! SIGKILL) before exiting. It reports the adapter's pid, group and exit status through a file
//! under `run/`, never through stdout, which belongs to the adapter.
//!
//! Cleanup never trusts a stored pid. [`verify::verify_owned_tree`] compares a lease with a
//! snapshot of the live process table ([`proc::ProcessTable`]) and proves, process by process,
//! what still belongs to it; [`plan`] turns verdicts into signal plans that `reap --dry-run`
//! prints; [`signal`] is the only module that sends signals, re-checking each process through a
//! pidfd right before it does. Intents are distinct: `cancel` never signals, `close` verifies then
//! terminates children first, `reap` starts from open leases whose owner is gone.
//!
//! `leash serve` ([`daemon`]) is the long-lived supervisor: it spawns each session through
//! `leash exec` as its own child — so it is the wrappers' owner and sessions outlive the gateway
//! that asked for them — and serves clients over a Unix socket (newline-delimited JSON,
//! `docs/protocol.md`): attach with replay by seq, busy tracking, idle close, orderly shutdown.
//!
//! Session rows carry ownership metadata, and [`visibility`] decides in one pure check what a
//! requester may see.

pub mod cli;
pub mod daemon;
pub mod exec;
pub mod exitcode;
pub mod install;
pub mod lease;
pub mod legacy;
pub mod lifecycle;
pub mod mcp;
pub mod plan;
pub mod proc;
pub mod report;
pub mod sessions;
pub mod signal;
pub mod state;
pub mod store;
mod sys;
pub mod verify;
pub mod visibility;
