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
//! Cleanup never trusts a stored pid. [`leash_core::verify::verify_owned_tree`] compares a lease
//! with a snapshot of the live process table ([`proc::ProcessTable`]) and proves, process by
//! process, what still belongs to it; [`leash_core::plan`] turns verdicts into signal plans that
//! `reap --dry-run` prints; [`signal`] is the only module that sends signals, re-checking each process through a
//! pidfd right before it does. Intents are distinct: `cancel` never signals, `close` verifies then
//! terminates children first, `reap` starts from open leases whose owner is gone.
//!
//! Where leash can create cgroups ([`cgroup`]: as root or in a delegated subtree; on by default,
//! `--containment off` turns it off), each lease also gets a cgroup of its own, made and recorded
//! (path and id) before the wrapper starts; the wrapper starts the adapter inside it with
//! `clone3(CLONE_INTO_CGROUP)` and stays outside. A process cannot leave it, so a verified cgroup
//! is evidence that outlives pids, groups and markers: teardown ends with `cgroup.kill`, which
//! takes a double-forked, `setsid`, `env -i` escapee too, and `reap` sweeps cgroups no open lease
//! accounts for. [`ps`] reads what each session costs from the same cgroups.
//!
//! `leash serve` ([`daemon`]) is the long-lived supervisor: it spawns each session through
//! `leash exec` as its own child — so it is the wrappers' owner and sessions outlive the gateway
//! that asked for them — and serves clients over a Unix socket (newline-delimited JSON,
//! `docs/protocol.md`): attach with replay by seq, busy tracking, idle close, orderly shutdown.
//!
//! [`controller::verify`] answers `leash verify` (owned / dead / unavailable, never a signal), what a
//! gateway asks before it resumes a stored session; [`reconcile`] decides what the daemon's
//! timer settles between start-ups (orphans by `reap`'s rules, leases whose wrapper is gone),
//! reading only the leases and their processes until there is work.
//!
//! Session rows carry ownership metadata, and [`leash_core::visibility`] decides in one pure check what a
//! requester may see.

// No `unsafe` outside `sys` (a build error, not a convention).
#![deny(unsafe_code)]

pub mod cgroup;
pub mod cli;
pub mod client;
pub mod controller;
pub mod daemon;
pub mod envpolicy;
pub mod install;
pub mod lease;
pub mod legacy;
pub mod logvalue;
pub mod mcp;
pub mod proc;
pub mod protocol;
pub mod ps;
pub mod reconcile;
pub mod report;
pub mod signal;
pub mod state;
pub mod store;
// The one module allowed `unsafe`: the syscalls nix does not wrap, behind safe functions.
#[allow(unsafe_code)]
mod sys;
