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
/// the command's own name and version, which for a subcommand is "serve " (no version). The
/// SYNOPSIS is [`synopsis`]'s.
fn page_of(mut cmd: clap::Command) -> clap_mangen::Man {
    cmd.build();
    let synopsis = synopsis(&cmd);
    clap_mangen::Man::new(cmd.override_usage(synopsis))
        .source(format!("leash {}", env!("CARGO_PKG_VERSION")))
}

/// The SYNOPSIS line of a (built) command's page: its name, its options with their values
/// (`[--state-dir DIR]`, `[--unset-env NAME]...`; clap_mangen's own synopsis leaves the values
/// out), the options of which one is required as `{A|B}`, its positionals (`-- CMD...` for the
/// words after `--`) and its subcommand.
fn synopsis(cmd: &clap::Command) -> String {
    let mut words = vec![cmd
        .get_bin_name()
        .unwrap_or_else(|| cmd.get_name())
        .to_string()];
    let groups: Vec<Vec<&clap::Arg>> = cmd
        .get_groups()
        .filter(|g| g.is_required_set())
        .map(|g| {
            cmd.get_arguments()
                .filter(|a| g.get_args().any(|id| id == a.get_id()))
                .collect::<Vec<_>>()
        })
        .filter(|members| !members.is_empty())
        .collect();
    let in_group = |a: &clap::Arg| groups.iter().flatten().any(|m| m.get_id() == a.get_id());
    let mut options: Vec<&clap::Arg> = cmd
        .get_arguments()
        .filter(|a| !a.is_hide_set() && !a.is_positional() && !in_group(a))
        .collect();
    // The command's own options, then the global ones (as `--help` lists them), required last.
    options.sort_by_key(|a| {
        (
            a.is_required_set(),
            a.is_global_set(),
            a.get_display_order(),
        )
    });
    for a in options {
        words.push(optional(a, &synopsis_arg(a)));
    }
    for members in &groups {
        let one_of: Vec<String> = members
            .iter()
            .map(|a| format!("{}{}", synopsis_arg(a), if repeats(a) { "..." } else { "" }))
            .collect();
        words.push(format!("{{{}}}", one_of.join("|")));
    }
    for a in cmd
        .get_positionals()
        .filter(|a| !a.is_hide_set() && !in_group(a))
    {
        let word = synopsis_arg(a);
        words.push(if a.is_last_set() {
            optional(a, &format!("-- {word}"))
        } else {
            optional(a, &word)
        });
    }
    if cmd.has_subcommands() {
        let name = cmd.get_subcommand_value_name().unwrap_or("COMMAND");
        words.push(if cmd.is_subcommand_required_set() {
            name.to_string()
        } else {
            format!("[{name}]")
        });
    }
    words.join(" ")
}

/// `word` in brackets unless `a` is required, then `...` if `a` repeats.
fn optional(a: &clap::Arg, word: &str) -> String {
    let word = if a.is_required_set() {
        word.to_string()
    } else {
        format!("[{word}]")
    };
    format!("{word}{}", if repeats(a) { "..." } else { "" })
}

/// Does `a` take several occurrences (`-vv`, `--unset-env A --unset-env B`) or values (`CMD...`)?
fn repeats(a: &clap::Arg) -> bool {
    matches!(
        a.get_action(),
        clap::ArgAction::Count | clap::ArgAction::Append
    ) || (a.is_positional() && a.get_num_args().is_some_and(|n| n.max_values() > 1))
}

/// One argument as the synopsis shows it: `-v|--verbose`, `--state-dir DIR`, `LEASE`.
fn synopsis_arg(a: &clap::Arg) -> String {
    let value = a.get_num_args().filter(|n| n.takes_values()).map(|n| {
        let names = match a.get_value_names() {
            Some(names) => names
                .iter()
                .map(|n| n.as_str())
                .collect::<Vec<_>>()
                .join(" "),
            None => a.get_id().as_str().to_uppercase(),
        };
        if n.min_values() == 0 {
            format!("[{names}]")
        } else {
            names
        }
    });
    let flag = match (a.get_short(), a.get_long()) {
        (Some(s), Some(l)) => Some(format!("-{s}|--{l}")),
        (Some(s), None) => Some(format!("-{s}")),
        (None, Some(l)) => Some(format!("--{l}")),
        (None, None) => None,
    };
    match (flag, value) {
        (Some(f), Some(v)) => format!("{f} {v}"),
        (Some(f), None) => f,
        (None, Some(v)) => v,
        (None, None) => a.get_id().as_str().to_uppercase(),
    }
}
