//! One documented install gives a working set. `cargo install --locked --path .` installs
//! `leash` and `cargo install --locked --path wrapper` installs `leash-wrap`, nothing else, in the
//! same directory (~/.cargo/bin); `leash` finds its wrapper there, and when the wrapper is
//! missing it says how to install it. (The test reads the workspace's targets with `cargo
//! metadata` and copies the built binaries into such a directory instead of running `cargo
//! install`, which would rebuild the workspace in release mode.)
mod common;
use common::*;

fn copy(src: &std::path::Path, dir: &std::path::Path) {
    std::fs::create_dir_all(dir).unwrap();
    // cp, not std::fs::copy: see `common::script` (a descriptor held open by this process while
    // another test thread forks would make exec'ing the copy fail with ETXTBSY).
    let ok = std::process::Command::new("cp")
        .arg(src)
        .arg(dir)
        .status()
        .unwrap();
    assert!(ok.success());
}

fn exec_from(bin_dir: &std::path::Path, state: &std::path::Path) -> std::process::Output {
    std::process::Command::new(bin_dir.join("leash"))
        .env_remove("LEASH_WRAP_BIN")
        .env_remove("LEASH_STATE_DIR")
        .arg("--state-dir")
        .arg(state)
        .args(["exec", "--session", "i", "--", "sh", "-c", "exit 7"])
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap()
}

#[test]
fn leash_finds_leash_wrap_installed_beside_it_and_says_how_when_it_is_missing() {
    let tmp = TempDir::new("install");
    let pair = tmp.join("pair/bin");
    copy(&leash_bin(), &pair);
    copy(&wrap_bin(), &pair);
    let out = exec_from(&pair, &tmp.join("state-a"));
    assert_eq!(
        out.status.code(),
        Some(7),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let alone = tmp.join("alone/bin");
    copy(&leash_bin(), &alone);
    let out = exec_from(&alone, &tmp.join("state-b"));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{err}");
    assert!(
        err.contains("cargo install --locked --path wrapper"),
        "{err}"
    );
}

/// The binaries each installable package of the workspace builds: `cargo install --locked --path
/// <package>` installs its own. The xtask crate (`cargo xtask dist`) is the project's automation:
/// unpublished, installed by no one.
#[test]
fn the_workspace_builds_leash_and_leash_wrap_only() {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let out = std::process::Command::new(cargo)
        .args([
            "metadata",
            "--no-deps",
            "--offline",
            "--format-version",
            "1",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let mut bins: Vec<(String, String)> = Vec::new();
    for p in meta["packages"].as_array().unwrap() {
        if p["name"] == "xtask" {
            assert_eq!(
                p["publish"],
                serde_json::json!([]),
                "xtask is publish = false"
            );
            continue;
        }
        for t in p["targets"].as_array().unwrap() {
            if t["kind"].as_array().unwrap().iter().any(|k| k == "bin") {
                let name = |v: &serde_json::Value| v.as_str().unwrap().to_string();
                bins.push((name(&p["name"]), name(&t["name"])));
            }
        }
    }
    bins.sort();
    let want = |p: &str, b: &str| (p.to_string(), b.to_string());
    assert_eq!(
        bins,
        [want("leash", "leash"), want("leash-wrap", "leash-wrap")],
        "the workspace's binaries, by package"
    );
}
