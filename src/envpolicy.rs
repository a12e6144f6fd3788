//! What an adapter's environment is made of: the credential scrub. The incumbent
//! prefixes every harness command with `env -u ANTHROPIC_API_KEY …` so that an adapter never
//! inherits the gateway's provider credentials; leash takes the same decision as data: a list
//! of variables to remove (`--unset-env`, `unsetEnv`), or an empty start plus an allow-list
//! (`--clear-env` with `--keep-env`, `clearEnv` with `keepEnv`).
//!
//! `leash exec` applies the policy to the wrapper's [`Command`] just before its `exec` (no extra
//! process, no `env` binary: the hot path stays one exec). The lease markers
//! (`OPENCLAW_ACPX_LEASE_ID`, `OPENCLAW_GATEWAY_INSTANCE_ID`) are set after the policy, so they
//! always survive. The daemon's default (docs/security.md) removes
//! [`PROVIDER_CREDENTIALS`] from its own environment unless an ensure keeps them; the command
//! line removes nothing unless asked (the caller composed that environment itself). Pure but for
//! [`EnvPolicy::apply`], which reads the current environment for the names it keeps.

use std::ffi::OsStr;
use std::process::Command;

/// The provider credentials the incumbent removes from a harness's environment
/// (`extensions/acpx/src/provider-env-scrub.ts`: the union of its per-harness table, what it
/// strips for an unknown harness). The daemon removes these from its own environment before it
/// hands it to an adapter, unless an ensure keeps one (`keepEnv`) or sets it (`env`).
pub const PROVIDER_CREDENTIALS: &[&str] = &[
    "ANTHROPIC_API_KEY",
    "ANTHROPIC_AUTH_TOKEN",
    "OPENAI_API_KEY",
    "OPENAI_AUTH_TOKEN",
    "GEMINI_API_KEY",
    "GOOGLE_API_KEY",
    "GOOGLE_AUTH_TOKEN",
    "CURSOR_API_KEY",
    "OPENROUTER_API_KEY",
];

/// How the adapter's environment is derived from the environment of `leash exec`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EnvPolicy {
    /// Removed (`--unset-env`). Ignored with `clear`.
    pub unset: Vec<String>,
    /// Start from an empty environment (`--clear-env`): only `keep` passes.
    pub clear: bool,
    /// With `clear`: the names that pass (`--keep-env`).
    pub keep: Vec<String>,
}

/// A variable name that cannot be one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnvNameError {
    #[error("{what}: an environment variable name must not be empty")]
    Empty { what: &'static str },
    #[error("{what}: {shown} is not an environment variable name (it contains '=' or NUL)")]
    Bad { what: &'static str, shown: String },
    #[error("{} has no effect with {}: an empty start already removes every variable; name the ones that pass with {}", .0.unset, .0.clear, .0.keep)]
    UnsetWithClear(Labels),
    #[error("{name} is both removed ({}) and kept ({}); name it in one of them", .labels.unset, .labels.keep)]
    Contradiction { name: String, labels: Labels },
}

/// What the edge calls the three settings in its messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Labels {
    pub unset: &'static str,
    pub clear: &'static str,
    pub keep: &'static str,
}

/// The command line's names.
pub const CLI: Labels = Labels {
    unset: "--unset-env",
    clear: "--clear-env",
    keep: "--keep-env",
};

/// The daemon protocol's names (`ensure`).
pub const ENSURE: Labels = Labels {
    unset: "unsetEnv",
    clear: "clearEnv",
    keep: "keepEnv",
};

/// Checks one name: non-empty, no `=`, no NUL (what `execve` could not carry).
pub fn check_name(what: &'static str, name: &str) -> Result<(), EnvNameError> {
    if name.is_empty() {
        return Err(EnvNameError::Empty { what });
    }
    if name.contains(['=', '\0']) {
        return Err(EnvNameError::Bad {
            what,
            shown: format!("{name:?}"),
        });
    }
    Ok(())
}

impl EnvPolicy {
    /// The edge's check (CLI and daemon alike): every name valid, no removal list with an empty
    /// start, no name both removed and kept. (`keep` without `clear` means nothing on the command
    /// line, which clap refuses; in an ensure it spares names from the daemon's default scrub.)
    pub fn validate(&self, labels: Labels) -> Result<(), EnvNameError> {
        for n in &self.unset {
            check_name(labels.unset, n)?;
        }
        for n in &self.keep {
            check_name(labels.keep, n)?;
        }
        if self.clear && !self.unset.is_empty() {
            return Err(EnvNameError::UnsetWithClear(labels));
        }
        if let Some(n) = self.unset.iter().find(|n| self.keep.contains(n)) {
            return Err(EnvNameError::Contradiction {
                name: n.clone(),
                labels,
            });
        }
        Ok(())
    }

    pub fn is_empty(&self) -> bool {
        self.unset.is_empty() && !self.clear && self.keep.is_empty()
    }

    /// The `leash exec` flags that carry this policy (the daemon runs `leash exec`).
    pub fn to_args(&self) -> Vec<String> {
        let mut args = Vec::new();
        if self.clear {
            args.push("--clear-env".to_string());
            for k in &self.keep {
                args.extend(["--keep-env".to_string(), k.clone()]);
            }
        } else {
            for u in &self.unset {
                args.extend(["--unset-env".to_string(), u.clone()]);
            }
        }
        args
    }

    /// Applies the policy to `cmd`, whose environment is otherwise this process's: the markers
    /// the caller sets afterwards are not touched.
    pub fn apply(&self, cmd: &mut Command) {
        if self.clear {
            let kept: Vec<(&str, std::ffi::OsString)> = self
                .keep
                .iter()
                .filter_map(|k| std::env::var_os(k).map(|v| (k.as_str(), v)))
                .collect();
            cmd.env_clear();
            for (k, v) in kept {
                cmd.env(k, v);
            }
        } else {
            for u in &self.unset {
                cmd.env_remove(OsStr::new(u));
            }
        }
    }

    /// The daemon's policy for one ensure: `clearEnv` starts empty with `keepEnv` and the names
    /// the ensure sets itself (`env`, which the daemon puts into `leash exec`'s environment);
    /// otherwise `unsetEnv` plus [`PROVIDER_CREDENTIALS`], minus what the ensure keeps or sets.
    pub fn for_ensure<'a>(
        unset: &[String],
        clear: bool,
        keep: &[String],
        set: impl Iterator<Item = &'a String>,
    ) -> EnvPolicy {
        let set: Vec<&String> = set.collect();
        if clear {
            let mut keep: Vec<String> = keep.to_vec();
            for s in set {
                if !keep.contains(s) {
                    keep.push(s.clone());
                }
            }
            return EnvPolicy {
                unset: Vec::new(),
                clear: true,
                keep,
            };
        }
        let mut out: Vec<String> = Vec::new();
        for n in unset
            .iter()
            .map(String::as_str)
            .chain(PROVIDER_CREDENTIALS.iter().copied())
        {
            let spared = keep.iter().any(|k| k == n) || set.iter().any(|s| *s == n);
            if !spared && !out.iter().any(|o| o == n) {
                out.push(n.to_string());
            }
        }
        EnvPolicy {
            unset: out,
            clear: false,
            keep: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn names_are_checked_at_the_edge() {
        assert!(check_name("--unset-env", "A_B").is_ok());
        assert!(check_name("--unset-env", "").is_err());
        assert!(check_name("--unset-env", "A=B").is_err());
        assert!(check_name("--unset-env", "A\0").is_err());
        let p = EnvPolicy {
            unset: s(&["X"]),
            clear: true,
            keep: s(&["Y"]),
        };
        assert!(matches!(
            p.validate(CLI),
            Err(EnvNameError::UnsetWithClear(_))
        ));
        let p = EnvPolicy {
            unset: s(&["X"]),
            clear: false,
            keep: s(&["X"]),
        };
        let e = p.validate(ENSURE).unwrap_err();
        assert_eq!(
            e.to_string(),
            "X is both removed (unsetEnv) and kept (keepEnv); name it in one of them"
        );
    }

    #[test]
    fn the_daemon_scrubs_provider_credentials_unless_kept_or_set() {
        let set = s(&["OPENAI_API_KEY"]);
        let p = EnvPolicy::for_ensure(&s(&["MINE"]), false, &s(&["GEMINI_API_KEY"]), set.iter());
        assert!(p.unset.contains(&"MINE".to_string()));
        assert!(p.unset.contains(&"ANTHROPIC_API_KEY".to_string()));
        assert!(!p.unset.contains(&"GEMINI_API_KEY".to_string()));
        assert!(!p.unset.contains(&"OPENAI_API_KEY".to_string()));
        let p = EnvPolicy::for_ensure(&[], true, &s(&["PATH"]), set.iter());
        assert_eq!(p.keep, s(&["PATH", "OPENAI_API_KEY"]));
        assert_eq!(
            p.to_args(),
            s(&[
                "--clear-env",
                "--keep-env",
                "PATH",
                "--keep-env",
                "OPENAI_API_KEY"
            ])
        );
    }
}
