//! The Rust client of the daemon, used by the CLI and `leash mcp` (the daemon itself never
//! calls it): `conn.rs` finds the daemon that serves a state root, proves the socket is its, and
//! sends typed requests ([`Client`]); `exec.rs` is `leash exec`'s one-request way to the daemon
//! ([`exec::ExecThroughDaemon`]); `session_input.rs` hands a session's stdin line to the daemon
//! ([`session_input::DaemonInput`]). The wire format is [`crate::protocol`]'s.

mod conn;
pub mod exec;
pub mod session_input;
pub use conn::*;
