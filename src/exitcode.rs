//! Exit codes of the `leash` binary. They are part of the interface: gateways branch on them.

/// Success.
pub const OK: u8 = 0;
/// An error that fits no other code (I/O, a corrupt or locked database, ...). The message says
/// what failed.
pub const FAILURE: u8 = 1;
/// Bad usage (unknown flag, missing argument).
pub const USAGE: u8 = 2;
/// The request conflicts with the current state: the session already has a live lease, the
/// lease is not open, or another process holds it for closing.
pub const CONFLICT: u8 = 3;
/// No such lease or session.
pub const NOT_FOUND: u8 = 4;
/// The requester may not see that session.
pub const NOT_VISIBLE: u8 = 5;
/// Ownership could not be verified, so nothing was signalled (the reason is printed and recorded).
pub const UNVERIFIED: u8 = 6;
/// The operation needs a running daemon (`leash serve`) and none serves this state root.
pub const DAEMON_NEEDED: u8 = 7;
/// `leash verify`: ownership of the lease is disproven (its wrapper is gone, or its pid names
/// another process now). Do not resume the session.
pub const DEAD: u8 = 8;
/// `leash exec` could not start the wrapper (the reason is on stderr). Any other status of
/// `leash exec` is the adapter's, as the wrapper reports it.
pub const EXEC_FAILED: u8 = 125;
/// `leash exec`: the adapter command exists but could not be executed (not executable, a bad
/// interpreter, permission denied). The lease is recorded `ended` with the reason. As env(1),
/// timeout(1) and tini.
pub const ADAPTER_NOT_EXECUTABLE: u8 = 126;
/// `leash exec`: the adapter command was not found (not on PATH, no such file). The lease is
/// recorded `ended` with the reason.
pub const ADAPTER_NOT_FOUND: u8 = 127;
