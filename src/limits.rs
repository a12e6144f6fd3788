//! The real range of every numeric input and the one rule for session keys: the core's
//! ([`leash_core::limits`], pure), under the address the CLI, the protocol, `leash exec` and the
//! store check against.

pub use leash_core::limits::*;
