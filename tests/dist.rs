//! The release artifacts of `cargo xtask dist`, installed and run the way users get them: the
//! checksums hold; the npm packages install from their files alone (no registry, no cargo on
//! PATH, an empty HOME) and a 20-line gateway script starts the daemon from the platform
//! package, runs a `cat` session through it and stops it, leaving no process; the archive,
//! extracted anywhere, runs `leash exec`; the `.deb` holds the binaries, units, man pages and
//! completions at their Debian paths, with units that run `/usr/bin/leash`; and every artifact
//! carries the workspace's one version.
//!
//! The xtask builds with `LEASH_DIST_PROFILE` (default `dev`: the binaries `cargo test` built
//! already, so CI pays for the packing only; `cargo xtask dist` itself defaults to release).
//! cargo-deb is installed on first use under the target directory.
mod common;
mod node_support;
use common::TempDir;
use node_support::*;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

fn version() -> &'static str {
    env!("CARGO_PKG_VERSION")
}

/// The tools the artifacts are checked with, or why one is missing.
fn tools() -> Result<PathBuf, String> {
    let node = node()?;
    for tool in ["dpkg-deb", "sha256sum", "tar"] {
        if !Command::new(tool)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
        {
            return Err(format!(
                "{tool} is not installed; the release artifacts are checked with it"
            ));
        }
    }
    Ok(node)
}

/// The directory `cargo xtask dist` wrote into: run once per test binary, shared by its tests.
fn dist() -> &'static Path {
    static DIST: OnceLock<PathBuf> = OnceLock::new();
    DIST.get_or_init(|| {
        let out = std::env::temp_dir().join(format!("leash-test-dist-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&out);
        let profile = std::env::var("LEASH_DIST_PROFILE").unwrap_or_else(|_| "dev".into());
        run_ok(
            "cargo xtask dist",
            Command::new(env!("CARGO"))
                .args(["xtask", "dist", "--profile", &profile, "--out-dir"])
                .arg(&out)
                .current_dir(repo())
                .env("CARGO_TARGET_DIR", target_dir()),
        );
        extern "C" fn cleanup() {
            let _ = std::fs::remove_dir_all(
                std::env::temp_dir().join(format!("leash-test-dist-{}", std::process::id())),
            );
        }
        // SAFETY: registers a plain extern "C" fn; the test harness exits through exit(3).
        unsafe { libc::atexit(cleanup) };
        out
    })
}

fn artifact(name: &str) -> PathBuf {
    let p = dist().join(name);
    assert!(
        p.is_file(),
        "cargo xtask dist wrote no {name}; it wrote: {:?}",
        std::fs::read_dir(dist()).map(|d| d.flatten().map(|e| e.file_name()).collect::<Vec<_>>())
    );
    p
}

fn archive_name() -> String {
    format!("leash-{}-{}.tar.gz", version(), common::host_triple())
}

fn npm_cpu() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "x64",
        "aarch64" => "arm64",
        other => panic!("no npm cpu for {other}"),
    }
}

fn deb_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => panic!("no Debian architecture for {other}"),
    }
}

/// The programs every artifact ships: the one `leash` program and its wrapper
/// (tests/install_layout.rs pins that the workspace builds these and no other shipped program).
const BINARIES: [&str; 2] = ["leash", "leash-wrap"];

fn file_names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// The environment of the commands run as a user would: nothing but PATH=/usr/bin:/bin, an
/// empty HOME, and this test's own state, reports directory and cgroup root.
fn bare_env(cmd: &mut Command, home: &Path, cgroup: Option<&common::CgroupRoot>) {
    cmd.env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("HOME", home)
        .env("LEASH_RUNTIME_DIR", common::test_runtime_dir());
    match cgroup {
        Some(root) => cmd
            .env("LEASH_CGROUP_ROOT", root.path())
            .env("LEASH_CONTAINMENT", "on"),
        None => cmd.env("LEASH_CONTAINMENT", "off"),
    };
}

#[test]
fn checksums_names_and_versions_agree() {
    if let Err(why) = tools() {
        common::skip(why);
        return;
    }
    let v = version();
    let expected = {
        let mut e = vec![
            archive_name(),
            format!("leash_{v}-1_{}.deb", deb_arch()),
            format!("leash-client-{v}.tgz"),
            format!("leash-client-linux-{}-{v}.tgz", npm_cpu()),
            "SHA256SUMS".to_string(),
        ];
        e.sort();
        e
    };
    assert_eq!(file_names(dist()), expected);
    // sha256sum -c over every artifact but itself.
    let out = run_ok(
        "sha256sum -c SHA256SUMS",
        Command::new("sha256sum")
            .args(["-c", "--strict", "SHA256SUMS"])
            .current_dir(dist()),
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(text.matches(": OK").count(), 4, "{text}");

    // One version: the .deb's control, CHANGELOG.md's first section, the checkout's
    // package.json (what `npm install clients/node` gets), and the packed ones.
    let deb = artifact(&format!("leash_{v}-1_{}.deb", deb_arch()));
    let out = run_ok(
        "dpkg-deb -f",
        Command::new("dpkg-deb")
            .arg("-f")
            .arg(&deb)
            .args(["Package", "Version", "Architecture"]),
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!(
            "Package: leash\nVersion: {v}-1\nArchitecture: {}\n",
            deb_arch()
        )
    );
    let changelog = std::fs::read_to_string(repo().join("CHANGELOG.md")).unwrap();
    let first = changelog.lines().find(|l| l.starts_with("## ")).unwrap();
    assert!(
        first.starts_with(&format!("## {v} ")) || first == format!("## {v}"),
        "{first}"
    );
    let checkout: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(repo().join("clients/node/package.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(checkout["version"], v, "clients/node/package.json");

    let tmp = TempDir::new("dist-ver");
    for tgz in [
        format!("leash-client-{v}.tgz"),
        format!("leash-client-linux-{}-{v}.tgz", npm_cpu()),
    ] {
        run_ok(
            "tar xzf",
            Command::new("tar")
                .arg("xzf")
                .arg(artifact(&tgz))
                .arg("-C")
                .arg(tmp.path()),
        );
        let pkg: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(tmp.join("package/package.json")).unwrap(),
        )
        .unwrap();
        assert_eq!(pkg["version"], v, "{tgz}");
        if tgz.starts_with("leash-client-linux") {
            assert_eq!(pkg["os"], serde_json::json!(["linux"]));
            assert_eq!(pkg["cpu"], serde_json::json!([npm_cpu()]));
            for b in BINARIES {
                assert!(
                    tmp.join("package/bin").join(b).is_file(),
                    "{tgz} lacks bin/{b}"
                );
            }
        } else {
            assert_eq!(
                pkg["optionalDependencies"],
                serde_json::json!({ format!("leash-client-linux-{}", npm_cpu()): v })
            );
        }
        std::fs::remove_dir_all(tmp.join("package")).unwrap();
    }
}

/// The ~20-line gateway script: the daemon from the platform package, a `cat` session, a line
/// out and back, the close, the stop. Prints the pids it saw, for the test to check they ended.
const GATEWAY_SCRIPT: &str = r#"
import { startDaemon, connect, binaryPath } from 'leash-client';
import { readFileSync } from 'node:fs';
const stateDir = process.argv[2];
const bin = binaryPath('leash');
if (!bin.includes('/node_modules/leash-client-linux-')) throw new Error(`leash is ${bin}, not the platform package's`);
const daemon = await startDaemon({ stateDir });
const leash = await connect({ stateDir });
await leash.ensure('hello', { argv: ['cat'] });
await leash.send('hello', 'hi there');
let line = null;
for await (const item of leash.attach('hello', { since: 0 })) {
  if (item.type === 'output') { line = item.line; break; }
}
if (line !== 'hi there') throw new Error(`read back ${JSON.stringify(line)}`);
const { rootPid } = (await leash.status()).daemon.sessions.find((s) => s.sessionKey === 'hello');
const adapter = Number(readFileSync(`/proc/${rootPid}/task/${rootPid}/children`, 'utf8').trim().split(' ')[0]);
await leash.close('hello');
await leash.disconnect();
await daemon.stop();
console.log(JSON.stringify({ bin, daemon: daemon.pid, wrapper: rootPid, adapter }));
"#;

#[test]
fn npm_packages_install_offline_and_run_a_session() {
    let node = match tools() {
        Ok(n) => n,
        Err(why) => {
            common::skip(why);
            return;
        }
    };
    let v = version();
    let client = artifact(&format!("leash-client-{v}.tgz"));
    let platform = artifact(&format!("leash-client-linux-{}-{v}.tgz", npm_cpu()));
    let tmp = TempDir::new("dist-npm");
    let (app, home, state) = (tmp.join("app"), tmp.join("home"), tmp.join("state"));
    for d in [&app, &home] {
        std::fs::create_dir(d).unwrap();
    }
    let cgroup = if common::containment_available() {
        common::CgroupRoot::new("dist-npm")
    } else {
        None
    };

    // Local files only: --offline fails any fetch instead of making it.
    let mut install = Command::new("npm");
    bare_env(&mut install, &home, cgroup.as_ref());
    run_ok(
        "npm install <leash-client tgz> <platform tgz>",
        install
            .args([
                "install",
                "--offline",
                "--no-audit",
                "--no-fund",
                "--loglevel=error",
            ])
            .arg(&client)
            .arg(&platform)
            .current_dir(&app),
    );
    assert!(app
        .join(format!(
            "node_modules/leash-client-linux-{}/bin/leash-wrap",
            npm_cpu()
        ))
        .is_file());

    std::fs::write(app.join("gateway.mjs"), GATEWAY_SCRIPT).unwrap();
    assert!(GATEWAY_SCRIPT.trim().lines().count() <= 22);
    let mut script = Command::new(&node);
    bare_env(&mut script, &home, cgroup.as_ref());
    let out = run_ok(
        "node gateway.mjs",
        script.arg("gateway.mjs").arg(&state).current_dir(&app),
    );
    let seen: serde_json::Value = serde_json::from_slice(
        out.stdout
            .split(|b| *b == b'\n')
            .rfind(|l| !l.is_empty())
            .unwrap_or_default(),
    )
    .unwrap_or_else(|e| panic!("the script's last line is not JSON ({e}): {out:?}"));
    // Nothing it started is left: the daemon, the wrapper and the adapter are gone (the daemon
    // was reaped by the script; the session's processes by their parents) and no cgroup under
    // this test's root holds a process.
    for who in ["daemon", "wrapper", "adapter"] {
        let pid = seen[who]
            .as_i64()
            .unwrap_or_else(|| panic!("no {who} pid: {seen}")) as i32;
        assert!(pid > 1, "{who} pid {pid}");
        assert!(
            common::wait_for(|| !Path::new(&format!("/proc/{pid}")).exists()
                || common::stat_fields(pid).is_some_and(|f| f[0] == "Z")),
            "the {who} (pid {pid}) outlived the script"
        );
    }
    if let Some(root) = &cgroup {
        assert!(
            common::wait_for(|| !common::cgroup_populated(root.path())),
            "processes are left in {}",
            root.path().display()
        );
    }
}

#[test]
fn archive_runs_leash_exec_anywhere() {
    if let Err(why) = tools() {
        common::skip(why);
        return;
    }
    let tmp = TempDir::new("dist-tar");
    let anywhere = tmp.join("some/where");
    std::fs::create_dir_all(&anywhere).unwrap();
    run_ok(
        "tar xzf <archive>",
        Command::new("tar")
            .arg("xzf")
            .arg(artifact(&archive_name()))
            .arg("-C")
            .arg(&anywhere),
    );
    let top = anywhere.join(archive_name().trim_end_matches(".tar.gz"));
    let mut listed = file_names(&top);
    listed.retain(|n| !BINARIES.contains(&n.as_str()));
    assert_eq!(
        listed,
        [
            "CHANGELOG.md",
            "LICENSE-APACHE",
            "LICENSE-MIT",
            "README.md",
            "complete",
            "lib",
            "man"
        ]
    );
    for b in BINARIES {
        assert!(top.join(b).is_file(), "the archive lacks {b}");
    }
    assert_eq!(
        file_names(&top.join("complete")),
        ["_leash", "leash.bash", "leash.fish"]
    );
    assert!(top.join("man/man1/leash.1").is_file());
    assert!(top.join("man/man1/leash-serve.1").is_file());
    assert!(top.join("lib/systemd/system/leash.service").is_file());
    assert!(top.join("lib/systemd/user/leash.service").is_file());

    let home = tmp.join("home");
    std::fs::create_dir(&home).unwrap();
    let cgroup = if common::containment_available() {
        common::CgroupRoot::new("dist-tar")
    } else {
        None
    };
    let mut ask = Command::new(top.join("leash"));
    bare_env(&mut ask, &home, cgroup.as_ref());
    let out = run_ok("leash --version", ask.arg("--version"));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("leash {}", version())
    );
    let mut exec = Command::new(top.join("leash"));
    bare_env(&mut exec, &home, cgroup.as_ref());
    run_ok(
        "leash exec -- /bin/true",
        exec.arg("--state-dir")
            .arg(tmp.join("state"))
            .args(["exec", "--", "/bin/true"])
            .current_dir(&home),
    );
    // It ran under a lease, taken and ended by the leash-wrap beside it.
    let mut leases = Command::new(top.join("leash"));
    bare_env(&mut leases, &home, cgroup.as_ref());
    let out = run_ok(
        "leash leases --json",
        leases
            .arg("--state-dir")
            .arg(tmp.join("state"))
            .args(["leases", "--json"]),
    );
    let leases: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let leases = leases.as_array().unwrap();
    assert_eq!(leases.len(), 1, "{leases:?}");
    assert_eq!(leases[0]["command"], serde_json::json!(["/bin/true"]));
    assert_eq!(leases[0]["state"], "ended", "{leases:?}");
    assert_eq!(leases[0]["exitStatus"], 0, "{leases:?}");
}

#[test]
fn deb_holds_the_debian_paths_and_its_units_run_usr_bin_leash() {
    if let Err(why) = tools() {
        common::skip(why);
        return;
    }
    let deb = artifact(&format!("leash_{}-1_{}.deb", version(), deb_arch()));
    let out = run_ok("dpkg-deb -c", Command::new("dpkg-deb").arg("-c").arg(&deb));
    let listing = String::from_utf8_lossy(&out.stdout);
    let paths: Vec<&str> = listing
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .collect();
    let mut wanted: Vec<String> = BINARIES.iter().map(|b| format!("./usr/bin/{b}")).collect();
    wanted.extend(
        [
            "./usr/lib/systemd/system/leash.service",
            "./usr/lib/systemd/system/leash.socket",
            "./usr/lib/systemd/user/leash.service",
            "./usr/lib/systemd/user/leash.socket",
            "./usr/share/man/man1/leash.1",
            "./usr/share/man/man1/leash-serve.1",
            "./usr/share/bash-completion/completions/leash",
            "./usr/share/zsh/vendor-completions/_leash",
            "./usr/share/fish/vendor_completions.d/leash.fish",
            "./usr/share/doc/leash/copyright",
        ]
        .map(String::from),
    );
    for sysusers in std::fs::read_dir(repo().join("contrib/systemd"))
        .unwrap()
        .flatten()
        .filter_map(|e| {
            e.file_name()
                .to_string_lossy()
                .strip_suffix(".sysusers.conf")
                .map(String::from)
        })
    {
        wanted.push(format!("./usr/lib/sysusers.d/{sysusers}.conf"));
    }
    for w in &wanted {
        assert!(
            paths.contains(&w.as_str()),
            "the .deb lacks {w}:\n{listing}"
        );
    }
    // Its postinst makes the sysusers.d users.
    let out = run_ok(
        "dpkg-deb -I",
        Command::new("dpkg-deb").arg("-I").arg(&deb).arg("postinst"),
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("systemd-sysusers"),
        "{out:?}"
    );
    // Every binary is executable.
    for l in listing
        .lines()
        .filter(|l| l.contains("./usr/bin/") && !l.ends_with('/'))
    {
        assert!(l.starts_with("-rwxr-xr-x"), "{l}");
    }

    // The units' commands run the installed leash.
    let tmp = TempDir::new("dist-deb");
    run_ok(
        "dpkg-deb -x",
        Command::new("dpkg-deb").arg("-x").arg(&deb).arg(tmp.path()),
    );
    for unit in [
        "usr/lib/systemd/system/leash.service",
        "usr/lib/systemd/user/leash.service",
    ] {
        let text = std::fs::read_to_string(tmp.join(unit)).unwrap();
        let execs: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("Exec") && !l.ends_with('='))
            .collect();
        assert!(!execs.is_empty(), "{unit} has no Exec line");
        for l in execs {
            let cmd = l
                .split_once('=')
                .unwrap()
                .1
                .trim_start_matches(['-', '@', '+', '!']);
            assert!(
                cmd.starts_with("/usr/bin/leash "),
                "{unit}: {l} does not run /usr/bin/leash"
            );
        }
    }

    // Its postinst, run the way dpkg runs it for an installation into another root (DPKG_ROOT):
    // the package's files in a scratch root, and the users its sysusers.d file declares made in
    // that root's /etc. The host's users and its systemd are not touched.
    postinst_makes_the_units_user_in_a_scratch_root(&deb, &tmp);
}

fn postinst_makes_the_units_user_in_a_scratch_root(deb: &Path, tmp: &TempDir) {
    let sysusers = ["/usr/bin/systemd-sysusers", "/bin/systemd-sysusers"];
    if !sysusers.iter().any(|p| Path::new(p).is_file()) {
        common::skip("systemd-sysusers is not installed: the .deb's postinst is checked with it");
        return;
    }
    let root = tmp.path();
    let control = tmp.join("DEBIAN");
    run_ok(
        "dpkg-deb -e",
        Command::new("dpkg-deb").arg("-e").arg(deb).arg(&control),
    );
    let postinst = control.join("postinst");
    run_ok(
        "sh -n postinst",
        Command::new("sh").arg("-n").arg(&postinst),
    );
    std::fs::create_dir_all(root.join("etc")).unwrap();
    let host_had_leash = || {
        std::fs::read_to_string("/etc/passwd")
            .unwrap_or_default()
            .lines()
            .any(|l| l.starts_with("leash:"))
    };
    let host_before = host_had_leash();
    let configure = || {
        let mut cmd = Command::new("sh");
        cmd.env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .env("DPKG_ROOT", root)
            .arg(&postinst)
            .args(["configure", ""]);
        run_ok("postinst configure", &mut cmd);
        std::fs::read_to_string(root.join("etc/passwd")).unwrap_or_default()
    };
    let passwd = configure();
    let user: Vec<&str> = passwd
        .lines()
        .find(|l| l.starts_with("leash:"))
        .unwrap_or_else(|| panic!("postinst made no user leash in the scratch root:\n{passwd}"))
        .split(':')
        .collect();
    assert!(user[6].ends_with("nologin"), "{user:?}");
    let group = std::fs::read_to_string(root.join("etc/group")).unwrap();
    assert!(group.lines().any(|l| l.starts_with("leash:")), "{group}");
    // Configured again (an upgrade): nothing changes.
    assert_eq!(configure(), passwd);
    // The other actions make nothing.
    let other = TempDir::new("dist-deb-other");
    std::fs::create_dir_all(other.join("etc")).unwrap();
    run_ok(
        "postinst abort-upgrade",
        Command::new("sh")
            .env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .env("DPKG_ROOT", other.path())
            .arg(&postinst)
            .arg("abort-upgrade"),
    );
    assert!(!other.join("etc/passwd").exists());
    assert_eq!(
        host_had_leash(),
        host_before,
        "the host's /etc/passwd changed"
    );
}
