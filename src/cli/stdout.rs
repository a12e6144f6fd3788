//! The CLI's one way to stdout (`outln!` and the generated pages go through it).

use leash_core::kind::Kind;

/// Writes to stdout. The one place the CLI's output goes through: when the reader went away
/// (EPIPE: `leash close … | head -2`), the command ends as SIGPIPE ends other tools, quietly
/// (`println!` would panic with "Broken pipe" and a backtrace); any other write error is said
/// once on stderr, exit 1. Output is written only after a command's work is done, so nothing is
/// left half-done.
pub(crate) fn write_stdout(args: std::fmt::Arguments<'_>) {
    use std::io::Write;
    if let Err(e) = std::io::stdout().lock().write_fmt(args) {
        stdout_failed(&e)
    }
}

/// See [`write_stdout`].
pub(crate) fn stdout_failed(e: &std::io::Error) -> ! {
    use std::io::Write;
    if e.kind() == std::io::ErrorKind::BrokenPipe {
        crate::sys::die_of_sigpipe()
    }
    let _ = writeln!(std::io::stderr(), "leash: cannot write to stdout: {e}");
    std::process::exit(i32::from(Kind::Internal.exit_code()))
}
