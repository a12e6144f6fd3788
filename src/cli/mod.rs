//! The `leash` command line: flags are parsed here, then each subcommand calls the library.
//! Output is for operators by default and JSON with `--json`; exit codes are in
//! [`leash_core::kind::exitcode`].
//!
//! By concern, as each file imports only the files below it (this one declares and re-exports):
//! `args.rs` the clap definitions ([`Cli`], [`Command`]); `parse.rs` the value parsers and
//! [`GraceArg`]; `exit.rs` [`Failure`] and the exit codes; `stdout.rs` the one way to stdout;
//! `usage.rs` a command line clap refused; `run.rs` [`main`] and [`run`], the dispatch to each
//! subcommand; `exec.rs` `leash exec`; `backend.rs` the direct and the daemon path of the other
//! verbs; `output.rs` their rendering; one file per larger subcommand (`serve.rs`,
//! `sessions.rs`, `verify.rs`, `simulate.rs`, `mcp.rs`, `docs.rs`); `logging.rs` the log setup.

/// `println!` for the CLI's stdout ([`stdout::write_stdout`]): a reader that went away ends the
/// command quietly instead of with a panic and a backtrace.
macro_rules! outln {
    () => {
        $crate::cli::stdout::write_stdout(format_args!("\n"))
    };
    ($($t:tt)*) => {
        $crate::cli::stdout::write_stdout(format_args!("{}\n", format_args!($($t)*)))
    };
}

mod args;
mod backend;
mod docs;
mod exec;
mod exit;
pub mod logging;
mod mcp;
mod output;
mod parse;
mod run;
mod serve;
pub mod sessions;
mod simulate;
mod stdout;
mod usage;
mod verify;

pub use args::{
    parse, Cli, CloseArgs, Command, ErrorFormat, ExecArgs, GlobalArgs, JsonArg, LeasesArgs,
    LegacyCommand, ReapArgs, TargetArgs,
};
pub use exit::Failure;
pub use parse::{parse_duration, GraceArg};
pub use run::{main, run};
