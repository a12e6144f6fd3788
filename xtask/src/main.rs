//! `cargo xtask dist`: every artifact a release of leash ships, into `target/dist/`:
//!
//! - `leash-<version>-<target>.tar.gz`: the binaries, man pages, shell completions (bash, zsh,
//!   fish), systemd units (and sysusers.d file), README.md, CHANGELOG.md and the licence files;
//! - `leash_<version>-1_<arch>.deb`, made by `cargo-deb` from `[package.metadata.deb]` in
//!   Cargo.toml out of the same staged files (cargo-deb is installed on first use under
//!   `target/tools/`);
//! - the npm packages, packed with `npm pack`: `leash-client-<version>.tgz` and the platform
//!   package `leash-client-<os>-<cpu>-<version>.tgz` holding the static binaries, which the
//!   client lists in `optionalDependencies` (npm installs the one whose `os` and `cpu` match);
//! - `SHA256SUMS` over all of them.
//!
//! The version is the workspace's (Cargo.toml `[workspace.package]`), stamped into every
//! package.json here. The binaries are every `[[bin]]` of the root package (from `cargo
//! metadata`) and `leash-wrap`; man pages and completions come from the built `leash` itself
//! (`leash man --out-dir`, `leash completions SHELL`). See docs/install.md.

use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

/// The cargo-deb release `cargo xtask dist` installs and uses.
const CARGO_DEB_VERSION: &str = "3.8.0";

const USAGE: &str = "\
usage: cargo xtask dist [--target TRIPLE] [--profile PROFILE] [--out-dir DIR]

Builds the release archive, the Debian package, the npm packages and SHA256SUMS.

  --target TRIPLE    build for TRIPLE instead of the host (its standard library and a linker
                     for it must be installed: see docs/install.md)
  --profile PROFILE  the cargo profile to build with (default: release)
  --out-dir DIR      where the artifacts go (default: <target dir>/dist; emptied first)
";

type Result<T> = std::result::Result<T, String>;

struct Opts {
    target: Option<String>,
    profile: String,
    out_dir: Option<PathBuf>,
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let run = match args.first().map(String::as_str) {
        Some("dist") => parse(&args[1..]).and_then(|o| dist(&o)),
        Some("-h" | "--help" | "help") => {
            print!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Some(other) => Err(format!("no task {other:?}\n\n{USAGE}")),
        None => Err(format!("no task given\n\n{USAGE}")),
    };
    match run {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: {e}");
            ExitCode::FAILURE
        }
    }
}

fn parse(args: &[String]) -> Result<Opts> {
    let mut o = Opts {
        target: None,
        profile: "release".into(),
        out_dir: None,
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let (key, inline) = match a.split_once('=') {
            Some((k, v)) if k.starts_with("--") => (k, Some(v.to_string())),
            _ => (a.as_str(), None),
        };
        let mut value = || {
            inline
                .clone()
                .or_else(|| it.next().cloned())
                .filter(|v| !v.is_empty())
                .ok_or_else(|| format!("{key} needs a value\n\n{USAGE}"))
        };
        match key {
            "--target" => o.target = Some(value()?),
            "--profile" => o.profile = value()?,
            "--out-dir" => o.out_dir = Some(PathBuf::from(value()?)),
            "-h" | "--help" => {
                print!("{USAGE}");
                std::process::exit(0);
            }
            _ => return Err(format!("unknown argument {a:?}\n\n{USAGE}")),
        }
    }
    Ok(o)
}

/// What `cargo metadata` says about the workspace.
struct Workspace {
    root: PathBuf,
    target_dir: PathBuf,
    version: String,
    /// Every `[[bin]]` of the root package, then `leash-wrap`.
    bins: Vec<String>,
}

fn workspace() -> Result<Workspace> {
    let out = run_capture(cargo().args(["metadata", "--format-version", "1", "--no-deps"]))?;
    let meta: Value =
        serde_json::from_slice(&out).map_err(|e| format!("cargo metadata: not JSON: {e}"))?;
    let root = PathBuf::from(meta["workspace_root"].as_str().unwrap_or_default());
    let target_dir = PathBuf::from(meta["target_directory"].as_str().unwrap_or_default());
    let packages = meta["packages"].as_array().cloned().unwrap_or_default();
    let package = |name: &str| {
        packages
            .iter()
            .find(|p| p["name"] == name)
            .ok_or_else(|| format!("cargo metadata lists no package {name}"))
    };
    let leash = package("leash")?;
    let wrap = package("leash-wrap")?;
    let version = leash["version"].as_str().unwrap_or_default().to_string();
    if wrap["version"] != leash["version"] {
        return Err(format!(
            "leash is {version} but leash-wrap is {}: both take the workspace's version",
            wrap["version"]
        ));
    }
    let bins_of = |p: &Value| -> Vec<String> {
        p["targets"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|t| {
                t["kind"]
                    .as_array()
                    .is_some_and(|k| k.iter().any(|k| k == "bin"))
            })
            .filter_map(|t| t["name"].as_str().map(String::from))
            .collect()
    };
    let mut bins = bins_of(leash);
    bins.extend(bins_of(wrap).into_iter().filter(|b| b == "leash-wrap"));
    if !bins.iter().any(|b| b == "leash") || !bins.iter().any(|b| b == "leash-wrap") {
        return Err(format!(
            "expected binaries leash and leash-wrap, found {bins:?}"
        ));
    }
    Ok(Workspace {
        root,
        target_dir,
        version,
        bins,
    })
}

fn dist(o: &Opts) -> Result<()> {
    let ws = workspace()?;
    let host = host_target()?;
    let target = o.target.clone().unwrap_or_else(|| host.clone());
    let (os, cpu, deb_arch) = platform_of(&target)?;
    let out = o
        .out_dir
        .clone()
        .unwrap_or_else(|| ws.target_dir.join("dist"));
    let started = std::time::Instant::now();

    // The binaries.
    let mut build = cargo();
    build
        .current_dir(&ws.root)
        .args(["build", "--locked", "--profile", &o.profile])
        .args(["-p", "leash", "-p", "leash-wrap", "--bins"]);
    if let Some(t) = &o.target {
        build.args(["--target", t]);
    }
    run(&mut build)?;
    let profile_dir = match o.profile.as_str() {
        "dev" | "test" => "debug",
        "bench" => "release",
        p => p,
    };
    let bin_dir = match &o.target {
        Some(t) => ws.target_dir.join(t).join(profile_dir),
        None => ws.target_dir.join(profile_dir),
    };
    // Man pages and completions come from a `leash` this machine can run: the one just built,
    // or for another target the host's build of the same profile.
    let docs_leash = if target == host {
        bin_dir.join("leash")
    } else {
        run(cargo().current_dir(&ws.root).args([
            "build",
            "--locked",
            "--profile",
            &o.profile,
            "-p",
            "leash",
            "--bins",
        ]))?;
        ws.target_dir.join(profile_dir).join("leash")
    };

    // The staged tree: what the archive holds, and what Cargo.toml's deb assets name
    // (`target/release/leash-dist/...`, which cargo-deb reads from this profile's directory).
    let stage = bin_dir.join("leash-dist");
    reset_dir(&stage)?;
    let mut files: Vec<(PathBuf, String)> = Vec::new(); // (source, path in the archive)
    for b in &ws.bins {
        let src = bin_dir.join(b);
        check_static(&src)?;
        let dst = stage.join("bin").join(b);
        copy(&src, &dst, 0o755)?;
        files.push((dst, b.clone()));
    }
    let man = stage.join("man/man1");
    run(Command::new(&docs_leash)
        .arg("man")
        .arg("--out-dir")
        .arg(&man))?;
    for page in sorted_files(&man)? {
        let name = file_name(&page);
        files.push((page, format!("man/man1/{name}")));
    }
    for (shell, name) in [
        ("bash", "leash.bash"),
        ("zsh", "_leash"),
        ("fish", "leash.fish"),
    ] {
        let text = run_capture(Command::new(&docs_leash).args(["completions", shell]))?;
        let dst = stage.join("complete").join(name);
        write(&dst, &text, 0o644)?;
        files.push((dst, format!("complete/{name}")));
    }
    // The units and the sysusers.d file, whatever contrib/systemd holds: system units at its
    // top, user units in user/, `*.sysusers.conf` installed as sysusers.d/<name>.conf.
    let contrib = ws.root.join("contrib/systemd");
    for src in sorted_files(&contrib)? {
        let name = file_name(&src);
        let (dir, installed) = match name.strip_suffix(".sysusers.conf") {
            Some(stem) => ("lib/sysusers.d", format!("{stem}.conf")),
            None if is_unit(&name) => ("lib/systemd/system", name.clone()),
            None => continue,
        };
        let dst = stage.join(dir).join(&installed);
        copy(&src, &dst, 0o644)?;
        files.push((dst, format!("{dir}/{installed}")));
    }
    for src in sorted_files(&contrib.join("user"))? {
        let name = file_name(&src);
        if is_unit(&name) {
            let dst = stage.join("lib/systemd/user").join(&name);
            copy(&src, &dst, 0o644)?;
            files.push((dst, format!("lib/systemd/user/{name}")));
        }
    }
    for doc in ["README.md", "CHANGELOG.md", "LICENSE-MIT", "LICENSE-APACHE"] {
        let src = ws.root.join(doc);
        let dst = stage.join("doc").join(doc);
        copy(&src, &dst, 0o644)?;
        files.push((dst, doc.to_string()));
    }
    check_changelog(&ws)?;

    reset_dir(&out)?;
    let mut artifacts = Vec::new();

    // The archive.
    let base = format!("leash-{}-{target}", ws.version);
    let archive = out.join(format!("{base}.tar.gz"));
    // A release is compressed as hard as gzip goes; a check build (CI's) as fast.
    let release = o.profile == "release";
    let level = if release {
        flate2::Compression::best()
    } else {
        flate2::Compression::fast()
    };
    write_archive(&archive, &base, &files, source_date(&ws.root), level)?;
    artifacts.push(archive);

    // The Debian package.
    let cargo_deb = cargo_deb(&ws.target_dir)?;
    let deb = out.join(format!("leash_{}-1_{deb_arch}.deb", ws.version));
    let mut cmd = Command::new(&cargo_deb);
    cmd.current_dir(&ws.root)
        .args(["deb", "-p", "leash", "--no-build", "--no-strip", "--locked"])
        .args(["--profile", &o.profile, "--deb-revision", "1", "--output"])
        .arg(&deb);
    if let Some(t) = &o.target {
        cmd.args(["--target", t]);
    }
    if !release {
        cmd.arg("--fast");
    }
    run(&mut cmd)?;
    if !deb.is_file() {
        return Err(format!("cargo-deb wrote no {}", deb.display()));
    }
    artifacts.push(deb);

    // The npm packages.
    artifacts.extend(npm_packages(&ws, &stage, &out, os, cpu)?);

    // The checksums.
    let mut sums = String::new();
    for a in &artifacts {
        let bytes = fs::read(a).map_err(|e| format!("read {}: {e}", a.display()))?;
        let digest = Sha256::digest(&bytes);
        let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
        sums.push_str(&format!("{hex}  {}\n", file_name(a)));
    }
    write(&out.join("SHA256SUMS"), sums.as_bytes(), 0o644)?;

    eprintln!(
        "xtask: dist for {target} ({}, profile {}) in {:.0} s:",
        ws.version,
        o.profile,
        started.elapsed().as_secs_f64()
    );
    for a in artifacts.iter().chain([&out.join("SHA256SUMS")]) {
        println!("{}", a.display());
    }
    Ok(())
}

/// The npm packages: the client (clients/node, its version and its `optionalDependencies`
/// stamped) and this target's platform package with the staged binaries. Returns the two tarballs.
fn npm_packages(
    ws: &Workspace,
    stage: &Path,
    out: &Path,
    os: &str,
    cpu: &str,
) -> Result<Vec<PathBuf>> {
    let npm_root = stage.with_file_name("leash-dist-npm");
    reset_dir(&npm_root)?;
    let platform_name = format!("leash-client-{os}-{cpu}");

    // The platform package: bin/ with every binary.
    let plat = npm_root.join(&platform_name);
    for b in &ws.bins {
        copy(&stage.join("bin").join(b), &plat.join("bin").join(b), 0o755)?;
    }
    for doc in ["LICENSE-MIT", "LICENSE-APACHE"] {
        copy(&ws.root.join(doc), &plat.join(doc), 0o644)?;
    }
    write(
        &plat.join("README.md"),
        format!(
            "# {platform_name}\n\nThe static `leash` binaries for {os} on {cpu}, for \
             [leash-client](https://www.npmjs.com/package/leash-client), which lists this package \
             in its `optionalDependencies` and finds the binaries here (`binaryPath`, \
             `startDaemon`). Install `leash-client`, not this package.\n"
        )
        .as_bytes(),
        0o644,
    )?;
    let manifest = json!({
        "name": platform_name,
        "version": ws.version,
        "description": format!("The leash binaries (leash, leash-wrap) for {os}-{cpu}, used by leash-client"),
        "license": "MIT OR Apache-2.0",
        "os": [os],
        "cpu": [cpu],
        "files": ["bin/", "LICENSE-MIT", "LICENSE-APACHE", "README.md"],
        "preferUnplugged": true,
    });
    write_json(&plat.join("package.json"), &manifest)?;

    // The client: the files its package.json lists, with the version and the platform packages
    // stamped in.
    let src = ws.root.join("clients/node");
    let client = npm_root.join("leash-client");
    let mut pkg: Value = serde_json::from_slice(
        &fs::read(src.join("package.json"))
            .map_err(|e| format!("clients/node/package.json: {e}"))?,
    )
    .map_err(|e| format!("clients/node/package.json: {e}"))?;
    let listed: Vec<String> = pkg["files"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|f| f.as_str().map(String::from))
        .collect();
    for f in &listed {
        copy_tree(
            &src.join(f.trim_end_matches('/')),
            &client.join(f.trim_end_matches('/')),
        )?;
    }
    for doc in ["LICENSE-MIT", "LICENSE-APACHE"] {
        copy(&ws.root.join(doc), &client.join(doc), 0o644)?;
    }
    pkg["version"] = json!(ws.version);
    pkg["optionalDependencies"] = json!({ platform_name.clone(): ws.version });
    if let Some(files) = pkg["files"].as_array_mut() {
        files.extend([json!("LICENSE-MIT"), json!("LICENSE-APACHE")]);
    }
    write_json(&client.join("package.json"), &pkg)?;

    let mut tarballs = Vec::new();
    for dir in [&client, &plat] {
        let text = run_capture(
            Command::new("npm")
                .args(["pack", "--json", "--ignore-scripts", "--pack-destination"])
                .arg(out)
                .current_dir(dir),
        )?;
        let packed: Value = serde_json::from_slice(&text)
            .map_err(|e| format!("npm pack --json: not JSON ({e})"))?;
        let name = packed[0]["filename"]
            .as_str()
            .ok_or_else(|| format!("npm pack --json named no file: {packed}"))?;
        tarballs.push(out.join(name.trim_start_matches('@').replace('/', "-")));
    }
    for t in &tarballs {
        if !t.is_file() {
            return Err(format!("npm pack wrote no {}", t.display()));
        }
    }
    Ok(tarballs)
}

/// Fails unless `bin` is a statically linked ELF executable (no PT_INTERP program header): the
/// archive, the .deb and the npm platform package promise binaries that run on any Linux of
/// their architecture, whatever its C library.
fn check_static(bin: &Path) -> Result<()> {
    let bytes = fs::read(bin).map_err(|e| format!("read {}: {e}", bin.display()))?;
    let field = |at: usize, len: usize| -> Option<u64> {
        let b = bytes.get(at..at + len)?;
        Some(
            b.iter()
                .rev()
                .fold(0u64, |acc, x| (acc << 8) | u64::from(*x)),
        )
    };
    // A 64-bit little-endian ELF (x86_64, aarch64): e_phoff at 0x20, e_phentsize at 0x36,
    // e_phnum at 0x38; each program header starts with its u32 p_type (PT_INTERP = 3).
    if bytes.get(..6) != Some(b"\x7fELF\x02\x01".as_slice()) {
        return Err(format!(
            "{}: not a 64-bit little-endian ELF file",
            bin.display()
        ));
    }
    let malformed = || format!("{}: malformed ELF program headers", bin.display());
    let phoff = field(0x20, 8).ok_or_else(malformed)? as usize;
    let phentsize = field(0x36, 2).ok_or_else(malformed)? as usize;
    let phnum = field(0x38, 2).ok_or_else(malformed)? as usize;
    for i in 0..phnum {
        if field(phoff + i * phentsize, 4).ok_or_else(malformed)? == 3 {
            return Err(format!(
                "{} is linked dynamically (it names an ELF interpreter); the packages ship \
                 static binaries: unset LEASH_WRAP_DYNAMIC and RUSTC_WRAPPER, and install glibc's \
                 static libc.a (see .cargo/rustc-static-wrap.sh)",
                bin.display()
            ));
        }
    }
    Ok(())
}

fn is_unit(name: &str) -> bool {
    [".service", ".socket", ".timer", ".path", ".target"]
        .iter()
        .any(|s| name.ends_with(s))
}

/// The first `## ` heading of CHANGELOG.md must name the version being packed.
fn check_changelog(ws: &Workspace) -> Result<()> {
    let text = fs::read_to_string(ws.root.join("CHANGELOG.md"))
        .map_err(|e| format!("CHANGELOG.md: {e}"))?;
    let first = text
        .lines()
        .find(|l| l.starts_with("## "))
        .ok_or("CHANGELOG.md has no `## <version>` heading")?;
    let named = first[3..].split_whitespace().next().unwrap_or_default();
    if named.trim_start_matches('v') != ws.version {
        return Err(format!(
            "CHANGELOG.md starts at {named:?}, Cargo.toml says {}: add a `## {}` section",
            ws.version, ws.version
        ));
    }
    Ok(())
}

/// `<os>`, `<cpu>` as npm names them, and the Debian architecture, of a Rust target triple.
fn platform_of(target: &str) -> Result<(&'static str, &'static str, &'static str)> {
    if !target.contains("-linux-") {
        return Err(format!("{target}: leash runs on Linux only"));
    }
    match target.split('-').next().unwrap_or_default() {
        "x86_64" => Ok(("linux", "x64", "amd64")),
        "aarch64" => Ok(("linux", "arm64", "arm64")),
        arch => Err(format!(
            "{target}: no npm cpu / Debian architecture known for {arch} (x86_64 and aarch64 are)"
        )),
    }
}

fn host_target() -> Result<String> {
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let out = run_capture(Command::new(rustc).arg("-vV"))?;
    String::from_utf8_lossy(&out)
        .lines()
        .find_map(|l| l.strip_prefix("host: ").map(String::from))
        .ok_or_else(|| "rustc -vV names no host".into())
}

/// cargo-deb, installed on first use into `<target dir>/tools` (never assumed on PATH).
fn cargo_deb(target_dir: &Path) -> Result<PathBuf> {
    let root = target_dir.join("tools");
    let bin = root.join("bin/cargo-deb");
    let have = Command::new(&bin)
        .arg("--version")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned());
    if have.is_some_and(|v| v.contains(CARGO_DEB_VERSION)) {
        return Ok(bin);
    }
    eprintln!(
        "xtask: installing cargo-deb {CARGO_DEB_VERSION} into {}",
        root.display()
    );
    run(cargo()
        .args([
            "install",
            "cargo-deb",
            "--locked",
            "--version",
            CARGO_DEB_VERSION,
            "--root",
        ])
        .arg(&root)
        // Its own build: not through this workspace's rustc wrapper or target directory.
        .env_remove("CARGO_TARGET_DIR")
        .env_remove("RUSTC_WRAPPER")
        .env_remove("CARGO_BUILD_RUSTC_WRAPPER"))?;
    Ok(bin)
}

/// The archive's timestamps: SOURCE_DATE_EPOCH, else the last commit's time, else 0; so that
/// the same sources make the same archive.
fn source_date(root: &Path) -> u64 {
    if let Some(t) = std::env::var("SOURCE_DATE_EPOCH")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        return t;
    }
    Command::new("git")
        .args(["log", "-1", "--format=%ct"])
        .current_dir(root)
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        .unwrap_or(0)
}

/// A gzipped tar of `files` under the directory `base/`: owner root, mode 0755 for executables
/// else 0644, one mtime, directories first.
fn write_archive(
    dest: &Path,
    base: &str,
    files: &[(PathBuf, String)],
    mtime: u64,
    level: flate2::Compression,
) -> Result<()> {
    let f = fs::File::create(dest).map_err(|e| format!("create {}: {e}", dest.display()))?;
    let gz = flate2::write::GzEncoder::new(f, level);
    let mut tar = tar::Builder::new(gz);
    let mut dirs: Vec<String> = vec![base.to_string()];
    for (_, path) in files {
        let mut p = Path::new(path).parent();
        while let Some(d) = p.filter(|d| !d.as_os_str().is_empty()) {
            dirs.push(format!("{base}/{}", d.display()));
            p = d.parent();
        }
    }
    dirs.sort();
    dirs.dedup();
    let err = |e: std::io::Error| format!("write {}: {e}", dest.display());
    for d in &dirs {
        let mut h = header(tar::EntryType::Directory, 0o755, 0, mtime);
        tar.append_data(&mut h, format!("{d}/"), std::io::empty())
            .map_err(err)?;
    }
    for (src, path) in files {
        let bytes = fs::read(src).map_err(|e| format!("read {}: {e}", src.display()))?;
        let mode = if executable(src) { 0o755 } else { 0o644 };
        let mut h = header(tar::EntryType::Regular, mode, bytes.len() as u64, mtime);
        tar.append_data(&mut h, format!("{base}/{path}"), bytes.as_slice())
            .map_err(err)?;
    }
    tar.into_inner()
        .and_then(|gz| gz.finish())
        .and_then(|f| f.sync_all())
        .map_err(err)
}

fn header(kind: tar::EntryType, mode: u32, size: u64, mtime: u64) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(kind);
    h.set_mode(mode);
    h.set_size(size);
    h.set_mtime(mtime);
    h.set_uid(0);
    h.set_gid(0);
    let _ = h.set_username("root");
    let _ = h.set_groupname("root");
    h
}

fn executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    fs::metadata(p).is_ok_and(|m| m.permissions().mode() & 0o111 != 0)
}

fn cargo() -> Command {
    Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
}

fn describe(cmd: &Command) -> String {
    std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(|a| a.to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(" ")
}

/// Runs `cmd` with its output shown; fails unless it succeeds.
fn run(cmd: &mut Command) -> Result<()> {
    eprintln!("xtask: {}", describe(cmd));
    let status = cmd
        .status()
        .map_err(|e| format!("{}: cannot run: {e}", describe(cmd)))?;
    if !status.success() {
        return Err(format!("{} failed ({status})", describe(cmd)));
    }
    Ok(())
}

/// Runs `cmd` and returns its stdout (its stderr shown); fails unless it succeeds.
fn run_capture(cmd: &mut Command) -> Result<Vec<u8>> {
    let out = cmd
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|e| format!("{}: cannot run: {e}", describe(cmd)))?;
    if !out.status.success() {
        return Err(format!("{} failed ({})", describe(cmd), out.status));
    }
    Ok(out.stdout)
}

fn reset_dir(dir: &Path) -> Result<()> {
    match fs::remove_dir_all(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(format!("remove {}: {e}", dir.display())),
    }
    fs::create_dir_all(dir).map_err(|e| format!("create {}: {e}", dir.display()))
}

fn copy(src: &Path, dst: &Path, mode: u32) -> Result<()> {
    let bytes = fs::read(src).map_err(|e| format!("read {}: {e}", src.display()))?;
    write(dst, &bytes, mode)
}

fn write(dst: &Path, bytes: &[u8], mode: u32) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    if let Some(d) = dst.parent() {
        fs::create_dir_all(d).map_err(|e| format!("create {}: {e}", d.display()))?;
    }
    let err = |e: std::io::Error| format!("write {}: {e}", dst.display());
    let mut f = fs::File::create(dst).map_err(err)?;
    f.write_all(bytes).map_err(err)?;
    f.set_permissions(fs::Permissions::from_mode(mode))
        .map_err(err)
}

fn write_json(dst: &Path, v: &Value) -> Result<()> {
    let mut text = serde_json::to_string_pretty(v).map_err(|e| e.to_string())?;
    text.push('\n');
    write(dst, text.as_bytes(), 0o644)
}

/// Copies a file, or a directory's files recursively, keeping executables executable.
fn copy_tree(src: &Path, dst: &Path) -> Result<()> {
    let meta = fs::metadata(src).map_err(|e| format!("{}: {e}", src.display()))?;
    if meta.is_dir() {
        for e in fs::read_dir(src).map_err(|e| format!("read {}: {e}", src.display()))? {
            let e = e.map_err(|e| format!("read {}: {e}", src.display()))?;
            copy_tree(&e.path(), &dst.join(e.file_name()))?;
        }
        Ok(())
    } else {
        copy(src, dst, if executable(src) { 0o755 } else { 0o644 })
    }
}

/// The regular files directly in `dir`, by name (none if it does not exist).
fn sorted_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let rd = match fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(format!("read {}: {e}", dir.display())),
    };
    let mut v: Vec<PathBuf> = rd
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.is_file())
        .collect();
    v.sort();
    Ok(v)
}

fn file_name(p: &Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A dynamically linked executable (this test binary: cargo links tests dynamically) and a
    /// file that is not ELF are refused; the static `leash` binaries pass (checked where
    /// `cargo xtask dist` runs, in tests/dist.rs).
    #[test]
    fn check_static_refuses_dynamic_and_non_elf_files() {
        let me = std::env::current_exe().unwrap();
        let err = check_static(&me).unwrap_err();
        assert!(err.contains("linked dynamically"), "{err}");
        let err = check_static(Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/Cargo.toml"
        )))
        .unwrap_err();
        assert!(err.contains("not a 64-bit little-endian ELF"), "{err}");
    }

    #[test]
    fn platform_names_of_targets() {
        assert_eq!(
            platform_of("x86_64-unknown-linux-gnu").unwrap(),
            ("linux", "x64", "amd64")
        );
        assert_eq!(
            platform_of("aarch64-unknown-linux-musl").unwrap(),
            ("linux", "arm64", "arm64")
        );
        assert!(platform_of("x86_64-apple-darwin").is_err());
        assert!(platform_of("riscv64gc-unknown-linux-gnu").is_err());
    }
}
