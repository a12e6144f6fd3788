//! The sessions operations' old address: they are the controller's now
//! ([`crate::controller::sessions`]); these names stay for the callers that import
//! `leash::sessions::…`.

pub use crate::controller::sessions::*;
