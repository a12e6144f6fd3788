//! One documented install gives a working set. `cargo install --path . && cargo install --path
//! wrapper` puts `leash` (the front door), `leash-main` and `leash-wrap` in the same directory
//! (~/.cargo/bin); `leash` finds `leash-main` and its wrapper there, and when the wrapper is
//! missing it says how to install it. (The test copies the built binaries into such a directory
//! instead of running `cargo install`, which would rebuild the workspace in release mode.)
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
    copy(&leash_main_bin(), &pair);
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
    copy(&leash_main_bin(), &alone);
    let out = exec_from(&alone, &tmp.join("state-b"));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{err}");
    assert!(err.contains("cargo install --path wrapper"), "{err}");
}
