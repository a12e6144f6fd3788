//! `examples/gateway.mjs` runs end to end against the fake agent in the repo: ensure, initialize,
//! session/new, a prompt, a cancelled turn, a daemon SIGKILL (the session dies, its lease settles),
//! the resumable path after a SIGTERM (resume loads the ACP session), close. And
//! `examples/acpx-gateway.mjs`, written only against the design's AcpxLifecycleController (its
//! migration step `importAcpxState` runs `leash legacy import --acpx`): a fake incumbent's state imported and its
//! orphan reaped, two sessions, a prompt, a cancel that keeps the process, two closes, a silent
//! adapter's handshake timeout twice with nothing left, two same-key ensures on one adapter, and
//! a session resumed after a daemon restart with its MCP servers.
mod common;
mod node_support;
use node_support::*;
use std::process::Command;

/// Runs `examples/<script>` against the fake agent with this build's leash (skipped, and
/// recorded, without Node) and checks that its output has every line of `want` (an entry
/// `a|b|c` is met by any one of its alternatives).
fn run_example(script: &str, scratch: &str, want: &[&str]) {
    let node = match node() {
        Ok(n) => n,
        Err(why) => {
            common::skip(why);
            return;
        }
    };
    let _ = common::wrap_bin();
    let tmp = common::TempDir::new(scratch);
    // The run's own cgroup root (removed on drop, also when the run fails), so that the example,
    // written as a gateway that takes leash's default root, makes no cgroup under it here.
    let watch = DefaultRootWatch::start();
    let contained = std::env::var("LEASH_CONTAINMENT").as_deref() != Ok("off")
        && common::containment_available();
    let cg = contained
        .then(|| common::CgroupRoot::new(scratch))
        .flatten();
    let mut cmd = Command::new(node);
    cmd.arg(repo().join("examples").join(script))
        .arg("--leash")
        .arg(common::leash_bin())
        .arg("--state-dir")
        .arg(tmp.join("state"))
        .env_remove("LEASH_STATE_DIR");
    match &cg {
        Some(cg) => cmd
            .env("LEASH_CGROUP_ROOT", cg.path())
            .env("LEASH_CONTAINMENT", "on"),
        None => cmd.env("LEASH_CONTAINMENT", "off"),
    };
    let out = run_ok(&format!("node examples/{script}"), &mut cmd);
    watch.assert_unchanged(&format!("node examples/{script}"));
    let text = String::from_utf8_lossy(&out.stdout);
    for w in want {
        assert!(
            w.split('|').any(|alt| text.contains(alt)),
            "missing {w:?} in:\n{text}"
        );
    }
}

#[test]
fn the_gateway_example_runs_against_the_fake_agent() {
    run_example(
        "gateway.mjs",
        "gateway-example",
        &[
            "[prompt] stopReason end_turn",
            "[prompt] stopReason cancelled",
            "[sigkill] ACP channel ended",
            // After the daemon's SIGKILL the lease is final either way: `ended` when the wrapper
            // took the tree down and reported first, `closed` or `lost` when the next daemon's
            // start-up reap settled it first.
            ": ended (|: closed (|: lost (",
            "[push] resumable: agent:main:acp:demo",
            "loaded; continue prompt: stopReason end_turn",
            "[close] agent:main:acp:demo: closed",
            "[done] ok",
        ],
    );
}

#[test]
fn the_controller_example_runs_against_the_fake_agent() {
    run_example(
        "acpx-gateway.mjs",
        "acpx-gateway-example",
        &[
            "adopted by this fresh root; imported 1 acpx lease(s)",
            "\"verdict\":\"owned\",\"decision\":{\"action\":\"terminate\"}",
            "(the incumbent's)",
            "[reap] startup reap",
            "[reap] the incumbent's orphan is gone",
            "[handshake] attempt 1: handshake_timeout; stderr: mute: loading",
            "[handshake] attempt 2: handshake_timeout; stderr: mute: loading",
            "[same-key] two ensures of agent:main:acp:same: one lease",
            "[prompt] agent:main:acp:one: stopReason end_turn",
            "[cancel] agent:main:acp:two: stopReason cancelled",
            "[cancel] agent:main:acp:two: process kept",
            "[prompt] agent:main:acp:two: after the cancel, stopReason end_turn",
            "[close] agent:main:acp:one: closed",
            "[close] agent:main:acp:two: closed (stored state discarded)",
            "[restart] daemon stopped (SIGTERM) with a turn in flight",
            "in its cwd with MCP servers files, search",
            "[resume] agent:main:acp:three: continue prompt: stopReason end_turn",
            "[close] agent:main:acp:three: closed",
            "[done] ok",
        ],
    );
}
