//! The pure parts of `leash`'s front door (the `leash` binary, `src/front/main.rs`).
//!
//! Every `leash` command starts in the front door, a small static program without a C library.
//! For `leash exec` on a state root a `leash serve` serves, it asks the daemon to commit the
//! lease for its own command line (the `execArgv` op, docs/protocol.md) and execs the wrapper the
//! daemon names; for everything else, and whenever anything is not as expected, it execs
//! `leash-main` (the whole program) with the same argv and environment. The daemon decides: it
//! reads the command line and the environment of the process that asked (its socket peer) and
//! parses them with leash's own parser, so the front door holds no rule of the command line but
//! the little it needs to find the daemon.
//!
//! What is here is what the front door computes, each piece free of system calls:
//! [`scan`] (is it `leash exec`, which state directory, `--no-daemon`), [`state_dir`], [`json`]
//! (the lock file and the daemon's answer), [`uuid7`] (the lease id it offers) and
//! [`wrapper_env`] (the wrapper's environment from the front door's own and the daemon's edits).

#![no_std]
extern crate alloc;
#[cfg(test)]
extern crate std;

pub mod json;

use alloc::vec::Vec;

/// What the front door makes of its command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scan<'a> {
    /// `leash [global options] exec [options] -- CMD...`, as far as the front door can tell: the
    /// daemon parses it again, with leash's own parser, before it commits anything.
    Exec {
        /// `--state-dir`, when given.
        state_dir: Option<&'a [u8]>,
        /// `--no-daemon`: work on the database directly (the front door does not ask).
        no_daemon: bool,
    },
    /// Anything else (another command, `--help`, an option it does not know, no `--`):
    /// `leash-main` takes it.
    Other,
}

/// The global options that take a value (leash's `GlobalArgs`).
const GLOBAL_VALUED: &[&[u8]] = &[
    b"--state-dir",
    b"--socket",
    b"--error-format",
    b"--containment",
    b"--cgroup-root",
];
/// The global options that take none.
const GLOBAL_FLAGS: &[&[u8]] = &[b"--verbose", b"--no-daemon"];
/// `leash exec`'s options that take a value (leash's `ExecArgs` and `GraceArg`).
const EXEC_VALUED: &[&[u8]] = &[
    b"--session",
    b"--agent",
    b"--owner",
    b"--spawned-by",
    b"--parent",
    b"--grace",
    b"--grace-ms",
    b"--owner-pid",
    b"--lease-id",
    b"--memory-max",
    b"--pids-max",
    b"--cpu-max",
    b"--unset-env",
    b"--keep-env",
];
/// `leash exec`'s options that take none.
const EXEC_FLAGS: &[&[u8]] = &[b"--clear-env"];

/// Reads a command line (`args[0]` is the program) the way leash's parser would, far enough to
/// know whether it is `leash exec` and where its state directory is named. It errs only towards
/// [`Scan::Other`]: an option it does not know, a second `--state-dir`, a positional argument
/// other than `exec` or a missing `--` all leave the command line to `leash-main`, which says
/// what is wrong with it. Values are taken as given (`--session -x` is the daemon's to refuse).
pub fn scan<'a>(args: &[&'a [u8]]) -> Scan<'a> {
    let mut seen_exec = false;
    let mut state_dir = None;
    let mut no_daemon = false;
    let mut i = 1;
    while i < args.len() {
        let a = args[i];
        if a == b"--" {
            return if seen_exec {
                Scan::Exec {
                    state_dir,
                    no_daemon,
                }
            } else {
                Scan::Other
            };
        }
        if !a.starts_with(b"-") || a == b"-" {
            if !seen_exec && a == b"exec" {
                seen_exec = true;
                i += 1;
                continue;
            }
            return Scan::Other;
        }
        if !a.starts_with(b"--") {
            // Short options: only -v, -vv, ... (leash's one short option but -h and -V).
            if a.len() >= 2 && a[1..].iter().all(|&c| c == b'v') {
                i += 1;
                continue;
            }
            return Scan::Other;
        }
        let (name, inline) = match a.iter().position(|&c| c == b'=') {
            Some(p) => (&a[..p], Some(&a[p + 1..])),
            None => (a, None),
        };
        if GLOBAL_VALUED.contains(&name) || (seen_exec && EXEC_VALUED.contains(&name)) {
            let value = match inline {
                Some(v) => v,
                None => match args.get(i + 1) {
                    Some(v) => *v,
                    None => return Scan::Other,
                },
            };
            i += if inline.is_some() { 1 } else { 2 };
            if name == b"--state-dir" {
                if state_dir.is_some() {
                    return Scan::Other;
                }
                state_dir = Some(value);
            }
            continue;
        }
        if (GLOBAL_FLAGS.contains(&name) || (seen_exec && EXEC_FLAGS.contains(&name)))
            && inline.is_none()
        {
            no_daemon |= name == b"--no-daemon";
            i += 1;
            continue;
        }
        return Scan::Other;
    }
    Scan::Other
}

/// The state directory the front door looks in for a daemon, as leash resolves it: the flag,
/// else `LEASH_STATE_DIR`, else `$XDG_STATE_HOME/leash`, else `$HOME/.local/state/leash` (empty
/// variables do not count, but an empty `LEASH_STATE_DIR` is leash's parser's error: `None`).
/// A relative path is joined to `cwd` (leash makes it absolute the same way, lexically); `cwd`
/// is asked only then. `None`: no directory can be named (leash-main says why).
pub fn state_dir<'e>(
    flag: Option<&[u8]>,
    env: impl Fn(&[u8]) -> Option<&'e [u8]>,
    cwd: impl FnOnce() -> Option<Vec<u8>>,
) -> Option<Vec<u8>> {
    let mut dir: Vec<u8> = match flag {
        Some([]) => return None,
        Some(f) => f.to_vec(),
        None => match env(b"LEASH_STATE_DIR") {
            Some([]) => return None,
            Some(v) => v.to_vec(),
            None => match (
                env(b"XDG_STATE_HOME").filter(|v| !v.is_empty()),
                env(b"HOME").filter(|v| !v.is_empty()),
            ) {
                (Some(x), _) => join(x, b"leash"),
                (None, Some(h)) => join(h, b".local/state/leash"),
                (None, None) => return None,
            },
        },
    };
    if !dir.starts_with(b"/") {
        dir = join(&cwd()?, &dir);
    }
    Some(dir)
}

/// `a/b`, with one slash between them.
pub fn join(a: &[u8], b: &[u8]) -> Vec<u8> {
    let mut p = a.to_vec();
    if !p.ends_with(b"/") {
        p.push(b'/');
    }
    p.extend_from_slice(b);
    p
}

/// The value of `name` in an environment of `NAME=value` entries: the first match, as
/// `getenv(3)` finds it.
pub fn getenv<'a>(envp: &[&'a [u8]], name: &[u8]) -> Option<&'a [u8]> {
    envp.iter().find_map(|e| {
        (e.len() > name.len() && e.starts_with(name) && e[name.len()] == b'=')
            .then(|| &e[name.len() + 1..])
    })
}

/// A UUIDv7 in canonical text (lowercase, hyphenated) from a Unix time in milliseconds and ten
/// random bytes: the lease id the front door offers the daemon.
pub fn uuid7(unix_ms: u64, random: [u8; 10]) -> [u8; 36] {
    let mut b = [0u8; 16];
    b[..6].copy_from_slice(&unix_ms.to_be_bytes()[2..]);
    b[6] = 0x70 | (random[0] & 0x0f);
    b[7] = random[1];
    b[8] = 0x80 | (random[2] & 0x3f);
    b[9..].copy_from_slice(&random[3..]);
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut out = [0u8; 36];
    let mut o = 0;
    for (i, byte) in b.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            out[o] = b'-';
            o += 1;
        }
        out[o] = HEX[usize::from(byte >> 4)];
        out[o + 1] = HEX[usize::from(byte & 0xf)];
        o += 2;
    }
    out
}

/// What the daemon says to do to the front door's environment for the wrapper (leash's
/// `EnvPolicy`, then the lease markers).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EnvEdits<'a> {
    /// First, as `setenv(3)` (a value: the first entry of the name replaced, else one added) and
    /// `unsetenv(3)` (`None`: every entry of the name removed) would change the environment
    /// (leash-main sets its containment settings into its own environment this way).
    pub base: Vec<(&'a [u8], Option<&'a [u8]>)>,
    /// Start from nothing (`--clear-env`): only `keep` passes, then `set`.
    pub clear: bool,
    pub keep: Vec<&'a [u8]>,
    /// Removed (`--unset-env`); ignored with `clear`.
    pub unset: Vec<&'a [u8]>,
    /// Set last, whatever the rest says (the lease markers).
    pub set: Vec<(&'a [u8], &'a [u8])>,
}

/// The wrapper's environment, entry by entry (`NAME=value`), exactly as leash-main's
/// `std::process::Command` would build it from the same environment and edits: the entries
/// parsed as Rust's std parses `environ` (a name runs to the first `=` after its first byte;
/// an entry without one is dropped; of two entries of one name the later wins), `keep`'s values
/// read as `getenv(3)` reads them (the first), and the result ordered by name.
pub fn wrapper_env(envp: &[&[u8]], edits: &EnvEdits<'_>) -> Vec<Vec<u8>> {
    fn named(e: &[u8], k: &[u8]) -> bool {
        e.len() > k.len() && e.starts_with(k) && e[k.len()] == b'='
    }
    fn put<'v>(vars: &mut Vec<(&'v [u8], &'v [u8])>, k: &'v [u8], v: &'v [u8]) {
        match vars.binary_search_by(|(n, _)| (*n).cmp(k)) {
            Ok(i) => vars[i].1 = v,
            Err(i) => vars.insert(i, (k, v)),
        }
    }
    // The base edits, on the entries as they are (duplicates and all).
    let added: Vec<Vec<u8>> = edits
        .base
        .iter()
        .filter_map(|(k, v)| v.map(|v| [*k, b"=", v].concat()))
        .collect();
    let mut added_entries = added.iter();
    let mut based: Vec<&[u8]> = Vec::with_capacity(envp.len() + added.len());
    based.extend(envp.iter().copied());
    for (k, v) in &edits.base {
        if v.is_some() {
            let entry: &[u8] = added_entries.next().map(Vec::as_slice).unwrap_or_default();
            match based.iter().position(|e| named(e, k)) {
                Some(i) => based[i] = entry,
                None => based.push(entry),
            }
        } else {
            based.retain(|e| !named(e, k));
        }
    }
    // Then what `Command` makes of them: a map by name, ordered.
    let mut vars: Vec<(&[u8], &[u8])> = Vec::new();
    if edits.clear {
        for k in &edits.keep {
            if let Some(v) = getenv(&based, k) {
                put(&mut vars, k, v);
            }
        }
    } else {
        for e in &based {
            if e.is_empty() {
                continue;
            }
            if let Some(p) = e[1..].iter().position(|&c| c == b'=') {
                put(&mut vars, &e[..p + 1], &e[p + 2..]);
            }
        }
        vars.retain(|(k, _)| !edits.unset.contains(k));
    }
    for (k, v) in &edits.set {
        put(&mut vars, k, v);
    }
    vars.into_iter()
        .map(|(k, v)| [k, b"=", v].concat())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::vec;

    fn args(s: &[&'static str]) -> Vec<&'static [u8]> {
        s.iter().map(|a| a.as_bytes()).collect()
    }

    #[test]
    fn exec_command_lines_as_leash_writes_them_are_taken() {
        let exec = |state_dir: Option<&'static str>, no_daemon| Scan::Exec {
            state_dir: state_dir.map(str::as_bytes),
            no_daemon,
        };
        let cases: &[(&[&str], Scan)] = &[
            (&["leash", "exec", "--", "true"], exec(None, false)),
            // The Node client's and the daemon's (global options first).
            (
                &[
                    "leash",
                    "--state-dir",
                    "/s",
                    "--error-format",
                    "json",
                    "exec",
                    "--owner-pid",
                    "7",
                    "--session",
                    "k",
                    "--grace-ms",
                    "500",
                    "--",
                    "cmd",
                    "-x",
                ],
                exec(Some("/s"), false),
            ),
            (
                &[
                    "leash",
                    "exec",
                    "--state-dir=/t",
                    "--clear-env",
                    "--keep-env",
                    "PATH",
                    "--",
                    "a",
                ],
                exec(Some("/t"), false),
            ),
            (
                &["leash", "-vv", "exec", "--no-daemon", "--", "a"],
                exec(None, true),
            ),
            // After `--` everything is the command's.
            (
                &["leash", "exec", "--", "x", "--state-dir", "/u"],
                exec(None, false),
            ),
        ];
        for (line, want) in cases {
            assert_eq!(&scan(&args(line)), want, "{line:?}");
        }
    }

    #[test]
    fn anything_else_is_left_to_leash_main() {
        let cases: &[&[&str]] = &[
            &["leash"],
            &["leash", "status"],
            &["leash", "exec"],
            &["leash", "exec", "true"],
            &["leash", "exec", "--help", "--", "x"],
            &["leash", "--version"],
            &["leash", "-V", "exec", "--", "x"],
            &["leash", "exec", "--bogus", "--", "x"],
            // exec's options before `exec` are not global.
            &["leash", "--session", "k", "exec", "--", "x"],
            &["leash", "exec", "--session"],
            &[
                "leash",
                "--state-dir",
                "/a",
                "exec",
                "--state-dir",
                "/b",
                "--",
                "x",
            ],
            &["leash", "exec", "--no-daemon=1", "--", "x"],
            &["leash", "exec", "exec", "--", "x"],
            &["leash", "--", "exec"],
        ];
        for line in cases {
            assert_eq!(scan(&args(line)), Scan::Other, "{line:?}");
        }
    }

    #[test]
    fn the_state_directory_is_resolved_in_leashs_order() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &[u8]| {
                pairs
                    .iter()
                    .find(|(n, _)| n.as_bytes() == k)
                    .map(|(_, v)| v.as_bytes())
            }
        };
        let cwd = || Some(b"/home/u/w".to_vec());
        let all = env(&[
            ("LEASH_STATE_DIR", "/l"),
            ("XDG_STATE_HOME", "/x"),
            ("HOME", "/h"),
        ]);
        assert_eq!(state_dir(Some(b"/f"), all, cwd).unwrap(), b"/f");
        assert_eq!(state_dir(None, all, cwd).unwrap(), b"/l");
        let xdg = env(&[("XDG_STATE_HOME", "/x/"), ("HOME", "/h")]);
        assert_eq!(state_dir(None, xdg, cwd).unwrap(), b"/x/leash");
        let home = env(&[("XDG_STATE_HOME", ""), ("HOME", "/h")]);
        assert_eq!(
            state_dir(None, home, cwd).unwrap(),
            b"/h/.local/state/leash"
        );
        assert_eq!(state_dir(None, env(&[]), cwd), None);
        assert_eq!(state_dir(None, env(&[("LEASH_STATE_DIR", "")]), cwd), None);
        assert_eq!(state_dir(Some(b""), env(&[]), cwd), None);
        assert_eq!(
            state_dir(Some(b"rel/s"), env(&[]), cwd).unwrap(),
            b"/home/u/w/rel/s"
        );
        assert_eq!(
            state_dir(None, env(&[("LEASH_STATE_DIR", "s")]), || None),
            None
        );
    }

    #[test]
    fn a_uuid7_carries_its_time_version_and_variant() {
        let id = uuid7(0x0191_2345_6789, [0xff; 10]);
        let text = core::str::from_utf8(&id).unwrap();
        assert_eq!(text, "01912345-6789-7fff-bfff-ffffffffffff");
        let id = uuid7(1, [0; 10]);
        assert_eq!(
            core::str::from_utf8(&id).unwrap(),
            "00000000-0001-7000-8000-000000000000"
        );
    }

    #[test]
    fn getenv_finds_the_first_entry_of_a_name() {
        let envp = args(&["A=1", "AB=2", "A=3", "B", "=C=4"]);
        assert_eq!(getenv(&envp, b"A"), Some(&b"1"[..]));
        assert_eq!(getenv(&envp, b"AB"), Some(&b"2"[..]));
        assert_eq!(getenv(&envp, b"B"), None);
        assert_eq!(getenv(&envp, b"C"), None);
    }

    #[test]
    fn the_wrappers_environment_is_sorted_deduplicated_and_edited() {
        let envp = args(&[
            "Z=1", "A=1", "M=x=y", "A=2", "NOEQ", "", "=weird=1", "SECRET=s",
        ]);
        let set = vec![(&b"LEASH_LEASE_ID"[..], &b"id"[..])];
        let got = wrapper_env(
            &envp,
            &EnvEdits {
                unset: vec![b"SECRET", b"ABSENT"],
                set: set.clone(),
                ..EnvEdits::default()
            },
        );
        let want: Vec<&[u8]> = vec![b"=weird=1", b"A=2", b"LEASH_LEASE_ID=id", b"M=x=y", b"Z=1"];
        assert_eq!(got, want);
        let got = wrapper_env(
            &envp,
            &EnvEdits {
                clear: true,
                keep: vec![b"A", b"ABSENT", b"M"],
                unset: vec![b"M"],
                set,
                ..EnvEdits::default()
            },
        );
        let want: Vec<&[u8]> = vec![b"A=1", b"LEASH_LEASE_ID=id", b"M=x=y"];
        assert_eq!(
            got, want,
            "keep reads the first A, as getenv does; unset is ignored"
        );
    }

    #[test]
    fn base_edits_are_setenv_and_unsetenv_before_the_rest() {
        let envp = args(&["MODE=x", "ROOT=1", "MODE=y", "ROOT=2", "K=k"]);
        let base = vec![
            (&b"MODE"[..], Some(&b"on"[..])),
            (&b"ROOT"[..], None),
            (&b"NEW"[..], Some(&b"n"[..])),
        ];
        let got = wrapper_env(
            &envp,
            &EnvEdits {
                base: base.clone(),
                ..EnvEdits::default()
            },
        );
        // setenv replaced the first MODE; the later one wins the map, as in std's capture.
        let want: Vec<&[u8]> = vec![b"K=k", b"MODE=y", b"NEW=n"];
        assert_eq!(got, want);
        let got = wrapper_env(
            &args(&["MODE=x", "K=k"]),
            &EnvEdits {
                base,
                clear: true,
                keep: vec![b"MODE", b"ROOT", b"NEW"],
                ..EnvEdits::default()
            },
        );
        let want: Vec<&[u8]> = vec![b"MODE=on", b"NEW=n"];
        assert_eq!(got, want, "keep reads the edited environment");
    }
}
