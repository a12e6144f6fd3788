//! How flag values are read: one function per kind of value (a key, a duration, a size, a
//! limit, an environment variable name, a lease state), each checked by the library's one rule
//! ([`leash_core::limits`], [`crate::envpolicy`], [`crate::cgroup`]) before anything is touched; and
//! [`GraceArg`], the grace in either of its two spellings.

use clap::Args;
use leash_core::model::LeaseState;
use std::time::Duration;

/// A session key (or agent id): the one rule of [`leash_core::limits::check_key`].
pub(crate) fn parse_key(s: &str) -> Result<String, String> {
    leash_core::limits::check_key("the key", s)
        .map(|()| s.to_string())
        .map_err(|e| e.to_string())
}

/// A duration flag (humantime, or bare seconds), at most `max_ms`.
fn duration_at_most(
    what: &'static str,
    max_ms: u64,
) -> impl Fn(&str) -> Result<u64, String> + Clone {
    move |s: &str| leash_core::limits::parse_duration_ms(what, s, max_ms).map_err(|e| e.to_string())
}

fn grace_duration(s: &str) -> Result<u64, String> {
    duration_at_most("the grace", leash_core::limits::MAX_GRACE_MS)(s)
}

fn grace_millis(s: &str) -> Result<u64, String> {
    let ms: u64 = s
        .trim()
        .parse()
        .map_err(|_| format!("'{s}' is not a number of milliseconds"))?;
    leash_core::limits::check_grace_ms("the grace", ms).map_err(|e| e.to_string())
}

// The grace between SIGTERM and SIGKILL: `--grace DURATION`, or `--grace-ms N` (milliseconds;
// kept for scripts written before durations).
// (A plain comment, not a doc comment: clap would take a doc comment on this struct as the
// `about` of every command whose arguments it holds, over that command's own.)
#[derive(Debug, Args, Clone, Copy, Default)]
pub struct GraceArg {
    /// Time between SIGTERM and SIGKILL, e.g. 500ms, 3s, 1m (at most 1h) [default: 3s for exec
    /// and serve; each lease's own for close and reap]
    #[arg(long, value_name = "DURATION", value_parser = grace_duration, conflicts_with = "grace_ms")]
    pub grace: Option<u64>,
    /// The same in milliseconds (kept for older scripts)
    #[arg(long, value_name = "MS", value_parser = grace_millis)]
    pub grace_ms: Option<u64>,
}

impl GraceArg {
    /// The grace in milliseconds, if one was given.
    pub fn ms(&self) -> Option<u64> {
        self.grace.or(self.grace_ms)
    }
}

pub(super) fn parse_containment(s: &str) -> Result<crate::cgroup::Requested, String> {
    s.parse()
}

/// An environment variable name, checked before anything (even the state root) is touched.
pub(super) fn parse_env_name(s: &str) -> Result<String, String> {
    match crate::envpolicy::check_name("the name", s) {
        Ok(()) => Ok(s.to_string()),
        Err(crate::envpolicy::EnvNameError::Empty { .. }) => {
            Err("an environment variable name must not be empty".into())
        }
        Err(_) => Err("an environment variable name must not contain '=' or NUL".into()),
    }
}

pub(super) fn parse_memory_max(s: &str) -> Result<u64, String> {
    let bytes = crate::cgroup::parse_size(s).map_err(|e| e.to_string())?;
    // The daemon's `memoryMax` is checked by the same rule.
    leash_core::limits::check_cgroup_limit("--memory-max", bytes).map_err(|e| e.to_string())
}

pub(super) fn parse_pids_max(s: &str) -> Result<u64, String> {
    let n: u64 = s
        .trim()
        .parse()
        .map_err(|_| format!("'{s}' is not a number of processes"))?;
    // The daemon's `pidsMax` is checked by the same rule.
    leash_core::limits::check_cgroup_limit("--pids-max", n).map_err(|e| e.to_string())
}

pub(super) fn parse_cpu_max(s: &str) -> Result<String, String> {
    crate::cgroup::parse_cpu_max(s).map_err(|e| e.to_string())
}

/// `open`, `closing`, `closed` or `lost`, listed in `--help` and in the error.
pub(super) fn state_parser() -> impl clap::builder::TypedValueParser<Value = LeaseState> {
    use clap::builder::TypedValueParser;
    clap::builder::PossibleValuesParser::new(LeaseState::ALL.map(LeaseState::as_str))
        .map(|s| s.parse::<LeaseState>().expect("one of the listed states"))
}

/// Parses a duration (humantime syntax: `7d`, `12h`, `30m`, `45s`, `500ms`; a bare number is
/// seconds).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    leash_core::limits::parse_duration(s).map_err(|e| e.to_string())
}

pub(super) fn parse_retention(s: &str) -> Result<Duration, String> {
    duration_at_most("the retention", leash_core::limits::MAX_RETENTION_MS)(s)
        .map(Duration::from_millis)
}
