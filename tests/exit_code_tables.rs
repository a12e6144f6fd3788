//! The one error vocabulary stays one: docs/cli.md's exit-code table is the code's exit-code table
//! (`leash_core::kind::KINDS`, row for row, meaning for meaning), `leash --help` lists the same codes,
//! and docs/protocol.md's error-code table names exactly the wire codes of the code's table
//! (`leash_core::kind::CODES`). A code added on one side and not the other fails here.

use leash_core::kind::CODES;
use leash_core::kind::{KINDS, SUCCESS_MEANING};
use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

fn read(rel: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

/// The rows of the first Markdown table after `heading`: each row's cells, trimmed, header and
/// separator rows left out.
fn table_after(doc: &str, heading: &str) -> Vec<Vec<String>> {
    let start = doc
        .find(heading)
        .unwrap_or_else(|| panic!("no heading {heading:?}"));
    doc[start..]
        .lines()
        .skip(1)
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .skip(2)
        .map(|l| {
            l.trim()
                .trim_matches('|')
                .split('|')
                .map(|c| c.trim().to_string())
                .collect()
        })
        .collect()
}

#[test]
fn cli_doc_exit_code_table_is_the_codes_table() {
    let doc = read("docs/cli.md");
    let rows = table_after(&doc, "## Exit codes");
    let mut expected: Vec<(u8, String)> = vec![(0, SUCCESS_MEANING.to_string())];
    expected.extend(KINDS.iter().map(|r| (r.code, r.meaning.to_string())));
    expected.sort();
    let mut found: Vec<(u8, String)> = rows
        .iter()
        .map(|r| {
            let code = r[0]
                .parse::<u8>()
                .unwrap_or_else(|_| panic!("docs/cli.md exit-code row {r:?}: not a code"));
            (code, r[1].clone())
        })
        .collect();
    found.sort();
    // Rendered from the code's table, for the message: what docs/cli.md should say.
    let rendered: String = expected
        .iter()
        .map(|(c, m)| format!("| {c} | {m} |\n"))
        .collect();
    assert_eq!(
        found, expected,
        "docs/cli.md's exit-code table differs from leash_core::kind::KINDS; it should read:\n{rendered}"
    );
}

#[test]
fn help_lists_the_same_exit_codes() {
    let out = Command::new(env!("CARGO_BIN_EXE_leash"))
        .arg("--help")
        .output()
        .expect("run leash --help");
    assert!(out.status.success());
    let help = String::from_utf8(out.stdout).unwrap();
    let block = help
        .split("Exit codes:")
        .nth(1)
        .expect("--help has an Exit codes block");
    let listed: BTreeSet<u8> = block
        .lines()
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .filter_map(|l| l.split_whitespace().next()?.parse().ok())
        .collect();
    let mut expected: BTreeSet<u8> = KINDS.iter().map(|r| r.code).collect();
    expected.insert(0);
    assert_eq!(listed, expected, "leash --help's exit codes:\n{block}");
}

#[test]
fn protocol_doc_names_every_wire_code_and_no_other() {
    let doc = read("docs/protocol.md");
    let documented: BTreeSet<String> = table_after(&doc, "## Error codes")
        .iter()
        .map(|r| r[0].trim_matches('`').to_string())
        .collect();
    let coded: BTreeSet<String> = CODES.iter().map(|r| r.1.to_string()).collect();
    assert_eq!(documented, coded, "docs/protocol.md's error codes vs CODES");
}

#[test]
fn a_daemon_error_exits_as_its_direct_twin() {
    // The CLI's JSON error causes that are not wire codes are the kinds only the CLI has; every
    // other cause is a wire code whose kind is the row's own.
    let doc = read("docs/cli.md");
    for row in KINDS {
        match CODES.iter().find(|c| c.1 == row.cause) {
            Some(c) => assert_eq!(c.2, row.kind, "{}", row.cause),
            None => assert!(
                row.cause == "dead" || doc.contains(&format!("`{}`", row.cause)),
                "the CLI-only cause {} is not documented in docs/cli.md",
                row.cause
            ),
        }
    }
}
