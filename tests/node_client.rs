//! The Node client (`clients/node`) against a real `leash serve` built by cargo: its own test suite
//! (`node --test`: every op and error code, reconnect and replay, JSON-RPC over the stream, resume,
//! spawn) and the TypeScript type-check of its declarations (`tsc --noEmit`). typescript and
//! @types/node are installed on first use under `target/node-deps`.
mod common;
mod node_support;
use node_support::*;
use std::process::Command;

const DEV_DEPS: &[&str] = &["typescript@5.6.3", "@types/node@20.17.6"];

#[test]
fn node_client_type_checks() {
    if let Err(why) = node() {
        common::skip(why);
        return;
    }
    let deps = npm_install("node-deps", DEV_DEPS);
    let pkg = repo().join("clients/node");
    run_ok(
        "tsc --noEmit (clients/node)",
        Command::new(deps.join("node_modules/.bin/tsc"))
            .arg("--noEmit")
            .arg("-p")
            .arg(&pkg)
            .arg("--typeRoots")
            .arg(deps.join("node_modules/@types")),
    );
}

#[test]
fn node_client_suite_passes_against_a_real_daemon() {
    let node = match node() {
        Ok(n) => n,
        Err(why) => {
            common::skip(why);
            return;
        }
    };
    // The binaries cargo built for this run (the wrapper beside leash).
    let _ = common::wrap_bin();
    let files = node_test_files(&repo().join("clients/node/test"));
    assert!(files.len() >= 3, "client tests missing: {files:?}");
    // Each test file's process makes its own cgroup root (test/cgroup-root.mjs); none may make
    // cgroups under the default root a real gateway uses.
    let watch = DefaultRootWatch::start();
    let out = run_ok(
        "node --test clients/node/test/*.test.mjs",
        Command::new(node)
            .arg("--test")
            .arg("--test-concurrency=2")
            .args(&files)
            .current_dir(repo().join("clients/node"))
            .env("LEASH_BIN", common::leash_bin())
            .env_remove("LEASH_STATE_DIR")
            .env_remove("LEASH_LOG"),
    );
    let text = String::from_utf8_lossy(&out.stdout);
    // The TAP summary: some tests ran and none failed or were cancelled.
    assert!(text.contains("# fail 0"), "{text}");
    assert!(text.contains("# cancelled 0"), "{text}");
    assert!(!text.contains("# pass 0"), "{text}");
    watch.assert_unchanged("node --test clients/node/test/*.test.mjs");
}

/// A failure's message starts with the failing subtests' blocks, whole, and nothing of a passing one.
#[test]
fn a_failure_names_its_failing_subtests_first() {
    let tap = "TAP version 13\n# Subtest: fine\nok 1 - fine\n  ---\n  duration_ms: 1\n  ...\n# Subtest: broken\nnot ok 2 - broken\n  ---\n  duration_ms: 2\n  error: 'status went unanswered'\n  stack: |-\n    at x\n  ...\n# Subtest: fine too\nok 3 - fine too\n  ---\n  ...\n";
    let got = failing_subtests(tap);
    assert_eq!(
        got,
        "not ok 2 - broken\n  ---\n  duration_ms: 2\n  error: 'status went unanswered'\n  stack: |-\n    at x\n  ..."
    );
    assert!(failing_subtests("ok 1 - fine\n").starts_with("(no `not ok` line"));
}
