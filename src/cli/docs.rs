//! `leash completions SHELL` and `leash man [SUBCOMMAND] [--out-dir DIR]`: shell completions and
//! man pages generated from the clap definitions (`clap_complete`, `clap_mangen`), so they can
//! never drift from the flags. Neither needs a state root.

use super::exit::Failure;
use clap::Args;
use leash_core::kind::exitcode;
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

pub(super) fn completions(a: &CompletionsArgs, mut cmd: clap::Command) -> Result<u8, Failure> {
    // Into a buffer first: clap_complete panics when its writer fails (a reader that went away).
    let mut buf = Vec::new();
    clap_complete::generate(a.shell, &mut cmd, "leash", &mut buf);
    write_out(&buf);
    Ok(exitcode::OK)
}

pub(super) fn man(a: &ManArgs, cmd: clap::Command) -> Result<u8, Failure> {
    let io = |e: std::io::Error| {
        Failure::new(
            leash_core::kind::Kind::Internal,
            format!("cannot write the man page: {e}"),
        )
    };
    let mut cmd = cmd.disable_help_subcommand(true);
    cmd.build();
    if let Some(dir) = &a.out_dir {
        write_pages(cmd, dir).map_err(io)?;
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
                    leash_core::kind::Kind::Usage,
                    format!("no subcommand {name:?} (one of: {})", names.join(", ")),
                )
            })?
        }
    };
    let mut buf = Vec::new();
    page_of(page).render(&mut buf).map_err(io)?;
    write_out(&buf);
    Ok(exitcode::OK)
}

/// Writes `bytes` to stdout through the CLI's one output path (a reader that went away ends the
/// command quietly).
fn write_out(bytes: &[u8]) {
    use std::io::Write;
    if let Err(e) = std::io::stdout().lock().write_all(bytes) {
        super::stdout::stdout_failed(&e)
    }
}

/// Every page (leash.1, leash-serve.1, …, as `clap_mangen::generate_to` names them) into `dir`.
/// Man pages are meant to be installed where every user reads them (a `man1` directory), so
/// they are made with explicit modes whatever the umask: 0644 files, 0755 directories (0600
/// under umask 0077 would be unreadable once installed, 0666 under umask 0 writable by all).
/// Each page is written to a temporary file and renamed into place.
fn write_pages(cmd: clap::Command, dir: &std::path::Path) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(dir)?;
    let mut pages = Vec::new();
    fn collect(cmd: clap::Command, out: &mut Vec<clap::Command>) {
        for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()).cloned() {
            collect(sub, out);
        }
        out.push(cmd);
    }
    collect(cmd, &mut pages);
    for page in pages {
        let man = page_of(page);
        let dest = dir.join(man.get_filename());
        let tmp = dir.join(format!(
            ".{}.{}.tmp",
            man.get_filename(),
            std::process::id()
        ));
        let _ = std::fs::remove_file(&tmp);
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&tmp)?;
        // The umask may have cleared bits of 0644 (never added any): set it exactly.
        f.set_permissions(std::fs::Permissions::from_mode(0o644))?;
        let mut buf = Vec::new();
        man.render(&mut buf)?;
        f.write_all(&buf)?;
        drop(f);
        if let Err(e) = std::fs::rename(&tmp, &dest) {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
    }
    Ok(())
}

/// One page. `.TH`'s source field is "leash VERSION" on every page: clap_mangen fills it from
/// the command's own name and version, which for a subcommand is "serve " (no version).
fn page_of(cmd: clap::Command) -> clap_mangen::Man {
    clap_mangen::Man::new(cmd).source(format!("leash {}", env!("CARGO_PKG_VERSION")))
}
