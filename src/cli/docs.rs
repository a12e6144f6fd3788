//! `leash completions SHELL` and `leash man [SUBCOMMAND] [--out-dir DIR]`: shell completions and
//! man pages generated from the clap definitions (`clap_complete`, `clap_mangen`), so they can
//! never drift from the flags. Neither needs a state root.

use super::{exitcode, Cli, Failure};
use clap::{Args, CommandFactory};
use std::path::PathBuf;

#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// The shell to complete for
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}

#[derive(Debug, Args)]
pub struct ManArgs {
    /// The subcommand whose page to print (e.g. serve, verify); without it, leash(1)
    #[arg(value_name = "SUBCOMMAND")]
    pub subcommand: Option<String>,
    /// Write every page (leash.1, leash-serve.1, …) into DIR instead of printing one
    #[arg(long, value_name = "DIR", conflicts_with = "subcommand")]
    pub out_dir: Option<PathBuf>,
}

pub(super) fn completions(a: &CompletionsArgs) -> Result<u8, Failure> {
    let mut cmd = Cli::command();
    clap_complete::generate(a.shell, &mut cmd, "leash", &mut std::io::stdout());
    Ok(exitcode::OK)
}

pub(super) fn man(a: &ManArgs) -> Result<u8, Failure> {
    let io = |e: std::io::Error| {
        Failure::new(
            crate::kind::Kind::Internal,
            format!("cannot write the man page: {e}"),
        )
    };
    let mut cmd = Cli::command().disable_help_subcommand(true);
    cmd.build();
    if let Some(dir) = &a.out_dir {
        std::fs::create_dir_all(dir).map_err(io)?;
        write_pages(&cmd, dir).map_err(io)?;
        eprintln!("leash: man pages written to {}", dir.display());
        return Ok(exitcode::OK);
    }
    let page = match &a.subcommand {
        None => cmd,
        Some(name) => {
            let names: Vec<String> = cmd
                .get_subcommands()
                .map(|s| s.get_name().to_string())
                .collect();
            cmd.find_subcommand(name).cloned().ok_or_else(|| {
                Failure::new(
                    crate::kind::Kind::Usage,
                    format!("no subcommand {name:?} (one of: {})", names.join(", ")),
                )
            })?
        }
    };
    page_of(page).render(&mut std::io::stdout()).map_err(io)?;
    Ok(exitcode::OK)
}

/// One page. `.TH`'s source field is "leash VERSION" on every page: clap_mangen fills it from
/// the command's own name and version, which for a subcommand is "serve " (no version).
fn page_of(cmd: clap::Command) -> clap_mangen::Man {
    clap_mangen::Man::new(cmd).source(format!("leash {}", env!("CARGO_PKG_VERSION")))
}

/// Every page into `dir` (leash.1, leash-serve.1, …), as `clap_mangen::generate_to` does, with
/// [`page_of`]'s source.
fn write_pages(cmd: &clap::Command, dir: &std::path::Path) -> std::io::Result<()> {
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        write_pages(sub, dir)?;
    }
    page_of(cmd.clone()).generate_to(dir).map(|_| ())
}
