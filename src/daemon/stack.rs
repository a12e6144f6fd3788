//! The stack size of the daemon's short threads, below every file that starts one.

/// Stack of the daemon's short helper threads (and of each session's threads, see `session`):
/// they run no deep recursion, and a thousand sessions must not reserve 2 MiB each.
pub(crate) const SMALL_STACK: usize = 256 * 1024;
