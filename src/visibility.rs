//! Session visibility: which session rows a requester may see, decided by one pure check over row
//! metadata. The check lives in the pure core (`leash-core`, `core/src/visibility.rs`, where its
//! rules and the decisions taken where the seed is silent are written down); this module keeps
//! its path in the library.

pub use leash_core::visibility::*;
