//! Shell completions and man pages are generated from the clap definitions without error, and
//! leash(1) names every subcommand (its SUBCOMMANDS section links leash-NAME(1)).
mod common;
use clap::CommandFactory;
use common::*;

fn leash_out(args: &[&str]) -> (Option<i32>, String, String) {
    // No state root is needed (nor created) for these.
    let tmp = TempDir::new("docs");
    let out = leash(&tmp.join("state")).args(args).output().unwrap();
    assert!(!tmp.join("state").exists(), "{args:?} created a state root");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn completions_for_each_shell() {
    for (shell, marker) in [
        ("bash", "complete -F"),
        ("zsh", "#compdef leash"),
        ("fish", "complete -c leash"),
    ] {
        let (code, out, err) = leash_out(&["completions", shell]);
        assert_eq!(code, Some(0), "{shell}: {err}");
        assert!(out.contains(marker), "{shell}: {out}");
        assert!(out.contains("verify") && out.contains("serve"), "{shell}");
    }
    let (code, _, err) = leash_out(&["completions", "tcsh"]);
    assert_eq!(code, Some(2), "{err}");
}

#[test]
fn the_man_page_names_every_subcommand() {
    let (code, page, err) = leash_out(&["man"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        page.starts_with(".ie") || page.contains(".TH leash 1"),
        "{page}"
    );
    let names: Vec<String> = leash::cli::Cli::command()
        .get_subcommands()
        .map(|s| s.get_name().to_string())
        .collect();
    assert!(names.len() >= 12, "{names:?}");
    for name in &names {
        assert!(
            page.contains(&format!("leash\\-{}(1)", name.replace('-', "\\-"))),
            "leash(1) does not name {name}"
        );
    }
    let (code, serve, err) = leash_out(&["man", "serve"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(serve.contains(".TH leash-serve 1"), "{serve}");
    assert!(serve.contains("reconcile\\-interval"), "{serve}");
    let (code, verify, _) = leash_out(&["man", "verify"]);
    assert_eq!(code, Some(0));
    assert!(
        verify.contains("dead"),
        "the exit codes are documented: {verify}"
    );
    let (code, _, err) = leash_out(&["man", "nope"]);
    assert_eq!(code, Some(2));
    assert!(err.contains("no subcommand"), "{err}");

    // --out-dir writes a page per (nested) subcommand.
    let (_tmp, dir) = man_pages("docs-dir");
    for name in names.iter().chain(["sessions-list".to_string()].iter()) {
        assert!(dir.join(format!("leash-{name}.1")).is_file(), "{name}");
    }
}

/// Every page's SYNOPSIS shows each option with its value (`[--state-dir DIR]`, not a bare
/// `[--state-dir]`), and no page (nor so the `--help` it is made from) sends the reader to a
/// path of leash's source tree (`docs/…`), which an installed machine does not have.
#[test]
fn every_page_shows_option_values_and_names_no_source_path() {
    let (_tmp, dir) = man_pages("docs-pages");
    let mut top = leash::cli::Cli::command();
    top.build();
    let mut todo = vec![top];
    let mut pages = 0;
    while let Some(cmd) = todo.pop() {
        todo.extend(
            cmd.get_subcommands()
                .filter(|s| !s.is_hide_set() && s.get_name() != "help")
                .cloned(),
        );
        let name = cmd.get_display_name().unwrap_or(cmd.get_name()).to_string();
        let file = dir.join(format!("{name}.1"));
        let page = std::fs::read_to_string(&file)
            .unwrap_or_else(|e| panic!("{}: {e}", file.display()))
            .replace("\\-", "-");
        let sent = page
            .lines()
            .filter(|l| l.contains("docs/"))
            .collect::<Vec<_>>();
        assert!(sent.is_empty(), "{name}(1) names a source path: {sent:?}");
        let synopsis = page
            .lines()
            .skip_while(|l| *l != ".SH SYNOPSIS")
            .nth(1)
            .unwrap_or_else(|| panic!("{name}(1) has no SYNOPSIS"));
        let mut valued = 0;
        for a in cmd.get_arguments().filter(|a| !a.is_hide_set()) {
            let (Some(long), Some(n)) = (a.get_long(), a.get_num_args()) else {
                continue;
            };
            if !n.takes_values() {
                continue;
            }
            let value = a.get_value_names().map_or_else(
                || a.get_id().as_str().to_uppercase(),
                |v| v[0].as_str().to_string(),
            );
            assert!(
                synopsis.contains(&format!("--{long} {value}")),
                "{name}(1)'s SYNOPSIS shows --{long} without its {value}: {synopsis}"
            );
            valued += 1;
        }
        assert!(valued > 0, "{name}: the global options take values");
        pages += 1;
    }
    assert!(pages >= 20, "{pages} pages read");
}

/// `leash man --out-dir` into a scratch directory: the directory (kept while the guard lives) and
/// the pages' folder.
fn man_pages(tag: &str) -> (TempDir, std::path::PathBuf) {
    let tmp = TempDir::new(tag);
    let dir = tmp.join("man1");
    let out = leash(&tmp.join("state"))
        .args(["man", "--out-dir"])
        .arg(&dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    (tmp, dir)
}
