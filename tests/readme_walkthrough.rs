//! README.md's tour is run as written, so it cannot drift from what leash does: its `sh` blocks
//! in one bash (the exec part, then the daemon started in the background, then the Node client's
//! session and the `kill $daemon` that ends it), from the root of the source tree, with the
//! binaries under test first on PATH and the demo's `/tmp/leash-demo` swapped for a scratch
//! directory. What the commands print is compared with the README's "What it prints" after ids,
//! pids, ages and the cgroup paths are normalised. Between the daemon's start and the Node
//! client, the interactive `socat` session of docs/guide/gateway.md is replayed request by
//! request against the same daemon: every reply and stream item the guide shows comes, with the
//! same fields.
mod common;
mod node_support;
use common::docs::{doc_shell, fenced_blocks, read_doc};
use common::*;
use serde_json::Value;
use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The first block of `lang` after `heading` whose body contains `needle`.
fn block(doc: &str, heading: &str, lang: &str, needle: &str) -> String {
    let at = doc
        .find(heading)
        .unwrap_or_else(|| panic!("no heading {heading:?}"));
    fenced_blocks(&doc[at..])
        .into_iter()
        .find(|(l, b)| l == lang && b.contains(needle))
        .unwrap_or_else(|| panic!("no {lang} block with {needle:?} after {heading:?}"))
        .1
}

/// Output with what differs from run to run replaced: the state and cgroup paths, UUIDs, ages,
/// numbers, runs of blanks.
fn normalise(text: &str, state: &str, cgroot: &str) -> Vec<String> {
    let uuid = uuid_replacer();
    text.lines()
        .filter(|l| !l.starts_with("containment") && !l.trim_start().starts_with("controllers"))
        .map(|l| {
            let mut l = l.replace(state, "/tmp/leash-demo");
            if !cgroot.is_empty() {
                l = l.replace(cgroot, "CGROOT");
            }
            l = l.replace("/sys/fs/cgroup/unified/leash", "CGROOT");
            l = uuid(&l, "ID");
            // The cgroup clause of a contained session's close reason (absent without cgroups).
            if let Some(i) = l.find("; cgroup CGROOT/") {
                if let Some(j) = l[i..].find(" already removed") {
                    l.replace_range(i..i + j + " already removed".len(), "");
                }
            }
            let mut out = String::new();
            let mut chars = l.chars().peekable();
            while let Some(c) = chars.next() {
                if c.is_ascii_digit() {
                    while chars.peek().is_some_and(|d| d.is_ascii_digit()) {
                        chars.next();
                    }
                    // An age: 987ms, 1s, 2m.
                    if chars.peek() == Some(&'m') || chars.peek() == Some(&'s') {
                        while chars.peek().is_some_and(|d| d.is_ascii_alphabetic()) {
                            chars.next();
                        }
                        out.push_str("AGE");
                    } else {
                        out.push('N');
                    }
                } else {
                    out.push(c);
                }
            }
            out.split_whitespace().collect::<Vec<_>>().join(" ")
        })
        .collect()
}

/// Replaces each UUID (lowercase hex groups of 8-4-4-4-12 joined by `-`) in a text; the test needs
/// no regex crate for that.
fn uuid_replacer() -> impl Fn(&str, &str) -> String {
    |s: &str, with: &str| {
        let groups = [8usize, 4, 4, 4, 12];
        let total: usize = groups.iter().sum::<usize>() + 4;
        let b = s.as_bytes();
        let mut out = String::new();
        let mut i = 0;
        while i < b.len() {
            let is_uuid = i + total <= b.len() && {
                let mut k = i;
                groups.iter().enumerate().all(|(g, n)| {
                    let ok = b[k..k + n]
                        .iter()
                        .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(c));
                    k += n;
                    let dash = g == groups.len() - 1 || b.get(k) == Some(&b'-');
                    k += 1;
                    ok && dash
                })
            };
            if is_uuid {
                out.push_str(with);
                i += total;
            } else {
                let c = s[i..].chars().next().unwrap();
                out.push(c);
                i += c.len_utf8();
            }
        }
        out
    }
}

/// The sample's JSON line with its elisions made parseable.
fn sample_json(line: &str) -> Value {
    serde_json::from_str(&line.replace("[…]", "[]"))
        .unwrap_or_else(|e| panic!("sample line is not JSON ({e}): {line}"))
}

fn keys(v: &Value) -> BTreeSet<String> {
    v.as_object()
        .map(|m| m.keys().cloned().collect())
        .unwrap_or_default()
}

/// Lines of a child's stdout, as they come.
fn lines_of(r: impl std::io::Read + Send + 'static) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for l in BufReader::new(r).lines() {
            let Ok(l) = l else { break };
            if tx.send(l).is_err() {
                break;
            }
        }
    });
    rx
}

/// Reads lines into `seen` until one satisfies `done`, within the patience of the tests.
fn read_until(rx: &mpsc::Receiver<String>, seen: &mut Vec<String>, done: impl Fn(&str) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(l) => {
                let hit = done(&l);
                seen.push(l);
                if hit {
                    return;
                }
            }
            Err(_) => panic!("timed out; so far:\n{}", seen.join("\n")),
        }
    }
}

#[test]
fn the_walk_through_runs_as_written() {
    let socat = match apt::tool("socat", "socat") {
        Ok(p) => p,
        Err(why) => {
            skip(format!(
                "the walk-through's socat session needs socat: {why}"
            ));
            return;
        }
    };
    if let Err(why) = node_support::node() {
        skip(format!("the tour's Node client needs node: {why}"));
        return;
    }
    let doc = read_doc("README.md");
    let walk = block(
        &doc,
        "## A one-minute tour",
        "sh",
        "leash exec --session chat-1",
    );
    let shown = block(&doc, "## A one-minute tour", "console", "$ leash status");
    let start = block(&doc, "## A one-minute tour", "sh", "daemon=$!");
    let end = block(&doc, "## A one-minute tour", "sh", "kill $daemon");
    // Every `sh` block of the README is one of the three run here.
    let run: Vec<&String> = vec![&walk, &start, &end];
    for (lang, body) in fenced_blocks(&doc) {
        assert!(
            lang != "sh" || run.contains(&&body),
            "README.md has an `sh` block this test does not run:\n{body}"
        );
    }
    let guide = read_doc("docs/guide/gateway.md");
    let session = block(
        &guide,
        "## The protocol in one page",
        "console",
        "$ socat - UNIX-CONNECT:$LEASH_STATE_DIR/leash.sock",
    );

    let tmp = TempDir::new("readme");
    let demo = tmp.join("leash-demo");
    let demo_s = demo.to_str().unwrap().to_string();
    // `$ cmd` before each command of the walk-through, as its "What it prints" shows them.
    let mut walk_script = String::new();
    for line in walk.lines() {
        let cmd = line.split(" #").next().unwrap().trim_end();
        if cmd.starts_with("leash ") && !cmd.starts_with("leash exec") {
            walk_script.push_str(&format!("echo '$ {cmd}'\n"));
        }
        walk_script.push_str(line);
        walk_script.push('\n');
    }
    let script = format!(
        "set -e\n{walk_script}wait\necho '--- daemon'\n{start}echo READY\nread _\n{end}wait $daemon\necho \"daemon exited $?\"\n"
    )
    .replace("/tmp/leash-demo", &demo_s);
    let mut guard = Guard::new();
    let bash = guard.child(
        doc_shell(&script, &[])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("run bash"),
    );
    let mut bash_in = bash.stdin.take().unwrap();
    let out = lines_of(bash.stdout.take().unwrap());
    let mut printed = Vec::new();
    read_until(&out, &mut printed, |l| l == "READY");
    // The daemon the script started in the background: killed by the guard if the test fails.
    let mut daemon = Guard::new();
    // The daemon names itself in its lock once its start-up reap is done, which on a loaded host
    // can take longer than the walk-through's `sleep 1`: wait for the name, not the sleep.
    let lock_path = demo.join("daemon.lock");
    let read_lock = || {
        std::fs::read_to_string(&lock_path)
            .ok()
            .and_then(|s| serde_json::from_str::<Value>(&s).ok())
    };
    assert!(
        wait_for_within(Duration::from_secs(60), || read_lock().is_some()),
        "the daemon never named itself in {}",
        lock_path.display()
    );
    let lock = read_lock().unwrap();
    daemon.add(Pid::of(lock["pid"].as_i64().unwrap() as i32).expect("the daemon runs"));

    // The exec part printed what the README says it prints.
    let cgroot = std::env::var("LEASH_CGROUP_ROOT").unwrap_or_default();
    let cut = printed.iter().position(|l| l == "--- daemon").unwrap();
    let got = normalise(&printed[..cut].join("\n"), &demo_s, &cgroot);
    let want = normalise(&shown, &demo_s, &cgroot);
    // Close signals the adapter first and the root (the wrapper) after it. The wrapper exits by
    // itself once its adapter is gone; on a loaded host it can be gone before close comes to it
    // (then close prints no line for it, as the README says), or between close's pin and its
    // signal (then the line says so). The root's line is compared up to its outcome, when there.
    const ROOT_LINE: &str = "SIGTERM → pid N (root, started AGE ago): ";
    let is_root = |l: &String| l.starts_with(ROOT_LINE);
    let without_root =
        |v: &[String]| -> Vec<String> { v.iter().filter(|l| !is_root(l)).cloned().collect() };
    assert_eq!(
        want.iter().filter(|l| is_root(l)).count(),
        1,
        "README.md's sample shows the root's SIGTERM: {want:?}"
    );
    assert!(got.iter().filter(|l| is_root(l)).count() <= 1, "{got:?}");
    assert_eq!(
        without_root(&got),
        without_root(&want),
        "README.md's \"What it prints\" differs from the walk-through's output:\n{}",
        printed[..cut].join("\n")
    );
    // The daemon answers `leash status` now.
    assert!(
        printed[cut..].iter().any(|l| l.starts_with("daemon ")),
        "{printed:?}"
    );

    // The gateway guide's socat session, request by request, on the socket the README names.
    let sock = demo.join("leash.sock");
    let mut socat_guard = Guard::new();
    let sc = socat_guard.child(
        Command::new(&socat)
            .arg("-")
            .arg(format!("UNIX-CONNECT:{}", sock.display()))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("run socat"),
    );
    let mut sc_in = sc.stdin.take().unwrap();
    let replies = lines_of(sc.stdout.take().unwrap());
    let sample: Vec<&str> = session.lines().skip(1).collect();
    let mut seen = Vec::new();
    let mut expected: Vec<Value> = Vec::new();
    for (i, line) in sample.iter().enumerate() {
        let v = sample_json(line);
        if v.get("op").is_none() {
            expected.push(v);
            continue;
        }
        writeln!(sc_in, "{line}").unwrap();
        // Wait for what the sample shows before the next request (its reply and items).
        let until: Vec<Value> = sample[i + 1..]
            .iter()
            .map(|l| sample_json(l))
            .take_while(|v| v.get("op").is_none())
            .collect();
        for want in until {
            let matches = |l: &str| {
                let Ok(got) = serde_json::from_str::<Value>(l) else {
                    return false;
                };
                got["id"] == want["id"]
                    && got.get("ok") == want.get("ok")
                    && got.get("type") == want.get("type")
                    && got.get("kind") == want.get("kind")
            };
            if !seen.iter().any(|l: &String| matches(l)) {
                read_until(&replies, &mut seen, matches);
            }
        }
    }
    drop(sc_in);
    let _ = sc.wait();
    // Every line the sample shows came, with the same fields (and the same output line).
    for want in &expected {
        let got = seen
            .iter()
            .map(|l| serde_json::from_str::<Value>(l).unwrap())
            .find(|g| {
                g["id"] == want["id"]
                    && g.get("ok") == want.get("ok")
                    && g.get("type") == want.get("type")
                    && g.get("kind") == want.get("kind")
            })
            .unwrap_or_else(|| panic!("no reply like {want}:\n{}", seen.join("\n")));
        assert_eq!(keys(&got), keys(want), "{got} vs the guide's {want}");
        let (g, w) = (&got["result"], &want["result"]);
        let (g, w) = match (g, w) {
            (Value::Array(g), Value::Array(w)) => (&g[0], &w[0]),
            _ => (g, w),
        };
        assert_eq!(keys(g), keys(w), "{got} vs the guide's {want}");
        if want["type"] == "output" {
            assert_eq!(got["line"], want["line"]);
        }
        if want.get("ok").is_some() && want["result"].get("result").is_some() {
            assert_eq!(g["result"], w["result"], "{got}");
        }
    }

    // The end: the Node client's session and `kill $daemon`.
    writeln!(bash_in, "go").unwrap();
    drop(bash_in);
    read_until(&out, &mut printed, |l| l.starts_with("daemon exited"));
    assert_eq!(printed.last().unwrap(), "daemon exited 0", "{printed:?}");
    // What the README says the client prints.
    for line in ["echoed: hello", "close: closed"] {
        assert!(
            printed.iter().any(|l| l == line),
            "the tour's Node client did not print {line:?}: {printed:?}"
        );
        assert!(
            doc.contains(&format!("`{line}`")),
            "README.md does not show {line:?}"
        );
    }
    let status = bash.wait().unwrap();
    assert!(status.success(), "{status}: {printed:?}");
    assert!(!sock.exists(), "the daemon left its socket");
}

#[test]
fn the_set_up_commands_are_the_ones_ci_and_the_user_unit_use() {
    // README's two set-up commands stay true: the install is `cargo install --locked` of both
    // crates into cargo's default root (where the user unit runs leash) followed by the main job,
    // and the test command is the one `.ci/run` runs.
    let doc = read_doc("README.md");
    let setup = fenced_blocks(&doc[doc.find("## Set up").expect("a set-up section")..])
        .into_iter()
        .find(|(lang, _)| lang == "sh no-run")
        .expect("README's set-up block")
        .1;
    let commands: Vec<&str> = setup
        .lines()
        .filter(|l| !l.trim_start().starts_with('#') && !l.trim().is_empty())
        .collect();
    assert_eq!(
        commands,
        [
            "cargo install --locked --path . && cargo install --locked --path wrapper && leash serve",
            "cargo test --workspace",
        ],
        "README's set-up commands"
    );
    let ci = read_doc(".ci/run");
    assert!(
        ci.lines()
            .any(|l| l.starts_with("cargo test --workspace -- ")
                || l.trim() == "cargo test --workspace"),
        ".ci/run does not run README's test command"
    );
    let unit = read_doc("contrib/systemd/user/leash.service");
    assert!(unit.contains("ExecStart=%h/.cargo/bin/leash"), "{unit}");
}
