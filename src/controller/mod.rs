//! The controller room: the verbs' machinery that is shared between them. Today it holds the
//! TERM → grace → KILL engine ([`terminate`]), which `close`, `reap` (leases, escapees, legacy
//! records) all run through; the verbs themselves are still in `lifecycle.rs` and their own
//! files (docs/architecture.md says what is still to move).

pub mod terminate;
