//! A command line clap refused: the exit code (2, or 125 for `leash exec`), the error as text or
//! as one JSON line, and the hint when `leash exec`'s command is not after `--`.

use super::exit::Failure;
use leash_core::kind::exitcode;
use leash_core::kind::Kind;
use std::ffi::OsString;
use std::process::ExitCode;

/// A command line clap refused: help and version go out as clap prints them; errors exit 2, or
/// 125 for `leash exec` (every failure of exec itself is 125, so it never collides with an
/// adapter's status), as one JSON line when JSON errors were asked for.
pub(super) fn usage_error(e: clap::Error, args: &[OsString]) -> ExitCode {
    use clap::error::ErrorKind;
    if matches!(
        e.kind(),
        ErrorKind::DisplayHelp
            | ErrorKind::DisplayVersion
            | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
    ) {
        let _ = e.print();
        return ExitCode::from(
            if e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
                Kind::Usage.exit_code()
            } else {
                exitcode::OK
            },
        );
    }
    let (exec, json) = scan_args(args);
    let code = if exec {
        Kind::SpawnFailed.exit_code()
    } else {
        Kind::Usage.exit_code()
    };
    // `leash exec sleep 1`: the adapter command goes after `--` (so its own flags are never
    // taken for leash's); say so instead of clap's "unexpected argument".
    let hint = (exec && !args.iter().any(|a| a == "--") && exec_missing_dashdash(&e)).then(|| {
        "the adapter command goes after `--`: leash exec [OPTIONS] -- CMD [ARGS...]".to_string()
    });
    // clap quotes the refused value whole: a 100 KB key would come back whole.
    let rendered = shorten_long_words(e.render().to_string(), args);
    if json {
        let mut message = rendered
            .lines()
            .next()
            .unwrap_or("bad usage")
            .trim_start_matches("error: ")
            .to_string();
        if let Some(h) = &hint {
            message = format!("{message}; {h}");
        }
        let f = Failure {
            code,
            message,
            cause: Kind::Usage.cause().to_string(),
        };
        eprintln!("{}", f.to_json());
    } else {
        eprint!("{rendered}");
        if let Some(h) = &hint {
            eprintln!("leash: {h}");
        }
    }
    ExitCode::from(code)
}

/// Did clap refuse `leash exec` because the command was not after `--` (a word it took for an
/// unexpected argument, or no command at all)?
fn exec_missing_dashdash(e: &clap::Error) -> bool {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    match e.kind() {
        ErrorKind::MissingRequiredArgument => true,
        ErrorKind::UnknownArgument => match e.get(ContextKind::InvalidArg) {
            Some(ContextValue::String(a)) => !a.starts_with('-'),
            _ => false,
        },
        _ => false,
    }
}

/// `text` with every command-line word longer than [`leash_core::limits::MAX_KEY_BYTES`] replaced by
/// its shortened form ([`leash_core::limits::show_key`]).
fn shorten_long_words(mut text: String, args: &[OsString]) -> String {
    for a in args.iter().skip(1) {
        let w = a.to_string_lossy();
        if w.len() > leash_core::limits::MAX_KEY_BYTES && text.contains(w.as_ref()) {
            text = text.replace(w.as_ref(), &leash_core::limits::show_key(&w));
        }
    }
    text
}

/// From a command line clap refused: is it `leash exec`, and were JSON errors asked for
/// (`--error-format json`, or `--json`)? Global options with a value are skipped; the first
/// other word is the subcommand.
fn scan_args(args: &[OsString]) -> (bool, bool) {
    let words: Vec<String> = args
        .iter()
        .skip(1)
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let mut subcommand = None;
    let mut json = false;
    let mut i = 0;
    while i < words.len() {
        let w = words[i].as_str();
        match w {
            "--" => break,
            "--json" => json = true,
            "--error-format=json" => json = true,
            "--error-format" => {
                json = words.get(i + 1).map(String::as_str) == Some("json");
                i += 1;
            }
            "--state-dir" | "--socket" if subcommand.is_none() => i += 1,
            _ if !w.starts_with('-') && subcommand.is_none() => subcommand = Some(w.to_string()),
            _ => {}
        }
        i += 1;
    }
    (subcommand.as_deref() == Some("exec"), json)
}
