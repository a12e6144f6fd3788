//! The real range of every numeric input and the one rule for session keys, in one place. The
//! CLI's value parsers, the daemon's protocol validation, `leash exec` and the store all check
//! against these, so a value accepted at one edge is accepted at all of them, and every value
//! that is stored reads back (a grace of 2^64-1 ms once became a negative row that nothing could
//! read, close, or reap). Pure: no I/O.

use crate::kind::{HasKind, Kind};
use std::fmt;
use std::time::Duration;

/// The grace between SIGTERM and SIGKILL when none is given.
pub const DEFAULT_GRACE_MS: u64 = 3_000;

/// The longest grace between SIGTERM and SIGKILL: one hour. A tree whose owner died must be gone
/// in bounded time; an hour is far beyond any adapter's clean shutdown. `leash-wrap` caps its
/// `--grace-ms` at the same value.
pub const MAX_GRACE_MS: u64 = 3_600_000;

/// The longest retention of closed and lost leases: 100 years (i.e. "keep them"), far inside the
/// i64 milliseconds the store computes with.
pub const MAX_RETENTION_MS: u64 = 100 * 365 * 86_400_000;

/// The longest `--idle-close`: one year.
pub const MAX_IDLE_CLOSE_MS: u64 = 365 * 86_400_000;

/// The longest `ensure` watch for an adapter's first output line (`waitMs`): one minute. An
/// ensure holds its key's admission slot while it waits, so a larger wait is refused rather than
/// cut short silently.
pub const MAX_ENSURE_WAIT_MS: u64 = 60_000;

/// The longest an `ensure` waits behind an ensure of the same key in flight
/// (`queueTimeoutMs`): ten minutes.
pub const MAX_ENSURE_QUEUE_MS: u64 = 600_000;

/// The longest handshake deadline an `ensure` may ask for (`handshakeTimeoutMs`): ten minutes.
pub const MAX_HANDSHAKE_TIMEOUT_MS: u64 = 600_000;

/// The handshake deadline of an `ensure` that gives `initialize` without `handshakeTimeoutMs`.
pub const DEFAULT_HANDSHAKE_TIMEOUT_MS: u64 = 30_000;

/// A value outside its range, or a duration that does not parse.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ValueError {
    TooLarge {
        what: &'static str,
        max: String,
        max_ms: u64,
        got: String,
    },
    NotADuration(String),
    Zero {
        what: &'static str,
    },
    EmptyKey {
        what: &'static str,
    },
    ControlInKey {
        what: &'static str,
        shown: String,
    },
    KeyTooLong {
        what: &'static str,
        len: usize,
        shown: String,
    },
}

impl fmt::Display for ValueError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ValueError::TooLarge {
                what,
                max,
                max_ms,
                got,
            } => write!(f, "{what} must be at most {max} ({max_ms} ms), got {got}"),
            ValueError::NotADuration(s) => write!(
                f,
                "'{s}' is not a duration: use a number with a unit, e.g. 500ms, 3s, 30m, 12h, 7d \
                 (a bare number is seconds)"
            ),
            ValueError::Zero { what } => write!(
                f,
                "{what} must be at least 1, got 0 (a limit of 0 would stop the adapter before it \
                 starts; leave the limit out for none)"
            ),
            ValueError::EmptyKey { what } => write!(f, "{what} must not be empty"),
            ValueError::ControlInKey { what, shown } => write!(
                f,
                "{what} must not contain control characters (newlines, tabs, NUL, ...): {shown}"
            ),
            ValueError::KeyTooLong { what, len, shown } => write!(
                f,
                "{what} is {len} bytes, longer than the limit of {MAX_KEY_BYTES}: {shown}"
            ),
        }
    }
}

impl std::error::Error for ValueError {}

/// A bad value at an edge (a duration, a grace, a key) is bad usage.
impl HasKind for ValueError {
    fn kind(&self) -> Kind {
        Kind::Usage
    }
}

/// Checks a grace in milliseconds: `0..=MAX_GRACE_MS`.
pub fn check_grace_ms(what: &'static str, ms: u64) -> Result<u64, ValueError> {
    at_most(what, ms, MAX_GRACE_MS)
}

/// Checks a retention in milliseconds: `0..=MAX_RETENTION_MS`.
pub fn check_retention_ms(what: &'static str, ms: u64) -> Result<u64, ValueError> {
    at_most(what, ms, MAX_RETENTION_MS)
}

/// Checks `waitMs` of an `ensure`: `0..=MAX_ENSURE_WAIT_MS`.
pub fn check_ensure_wait_ms(what: &'static str, ms: u64) -> Result<u64, ValueError> {
    at_most(what, ms, MAX_ENSURE_WAIT_MS)
}

/// Checks `queueTimeoutMs` of an `ensure`: `0..=MAX_ENSURE_QUEUE_MS`.
pub fn check_ensure_queue_ms(what: &'static str, ms: u64) -> Result<u64, ValueError> {
    at_most(what, ms, MAX_ENSURE_QUEUE_MS)
}

/// Checks `handshakeTimeoutMs` of an `ensure`: `1..=MAX_HANDSHAKE_TIMEOUT_MS` (0 would fail
/// every handshake before the adapter could read the request).
pub fn check_handshake_ms(what: &'static str, ms: u64) -> Result<u64, ValueError> {
    if ms == 0 {
        return Err(ValueError::Zero { what });
    }
    at_most(what, ms, MAX_HANDSHAKE_TIMEOUT_MS)
}

/// The one rule for a session cgroup's numeric limits (`memory.max` in bytes, `pids.max`), for
/// `leash exec --memory-max/--pids-max` and the daemon's `memoryMax`/`pidsMax` alike: at least 1.
pub fn check_cgroup_limit(what: &'static str, v: u64) -> Result<u64, ValueError> {
    if v == 0 {
        return Err(ValueError::Zero { what });
    }
    Ok(v)
}

fn at_most(what: &'static str, v: u64, max: u64) -> Result<u64, ValueError> {
    if v > max {
        return Err(ValueError::TooLarge {
            what,
            max: humantime::format_duration(Duration::from_millis(max)).to_string(),
            max_ms: max,
            got: format!("{v} ms"),
        });
    }
    Ok(v)
}

/// How long closed, ended and lost leases are kept before `reap` deletes them, when nobody says:
/// written once for `leash reap --retention`, `leash serve --retention` and the daemon's `reap`
/// op (which takes it in milliseconds, [`default_retention_ms`]).
pub const DEFAULT_RETENTION: &str = "7d";

/// [`DEFAULT_RETENTION`] in milliseconds.
pub fn default_retention_ms() -> u64 {
    let d = parse_duration(DEFAULT_RETENTION).expect("DEFAULT_RETENTION is a duration");
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Parses a duration: humantime syntax (`500ms`, `3s`, `1m 30s`, `12h`, `7d`), or a bare number
/// of seconds (what the CLI always accepted for `--retention` and `--idle-close`).
pub fn parse_duration(s: &str) -> Result<Duration, ValueError> {
    let t = s.trim();
    if !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()) {
        return t
            .parse::<u64>()
            .map(Duration::from_secs)
            .map_err(|_| ValueError::NotADuration(s.to_string()));
    }
    humantime::parse_duration(t).map_err(|_| ValueError::NotADuration(s.to_string()))
}

/// Parses a duration no longer than `max_ms`, returning whole milliseconds.
pub fn parse_duration_ms(what: &'static str, s: &str, max_ms: u64) -> Result<u64, ValueError> {
    let d = parse_duration(s)?;
    let ms = u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    at_most(what, ms, max_ms)
}

/// The longest key, in bytes. Gateway session keys are short (`agent:main:subagent:<uuid>` is
/// under 100 bytes); 1 KiB leaves room for any naming scheme while keeping every listing, log
/// line and error message that carries a key small.
pub const MAX_KEY_BYTES: usize = 1024;

/// How many characters of a key an error message or log line shows before it shortens it.
pub const SHOWN_KEY_CHARS: usize = 64;

/// The one rule for session keys (and the other keys that name sessions, requesters, agents,
/// clients and ACP sessions): not empty, at most [`MAX_KEY_BYTES`], no control characters. A
/// newline in a key would break every line-based listing (`leases`), and a 100 KB key would be
/// copied into every row, event and message that names it; `leash exec`, `leash sessions`,
/// `leash mcp`, the store and the daemon all check this one function.
pub fn check_key(what: &'static str, v: &str) -> Result<(), ValueError> {
    if v.is_empty() {
        return Err(ValueError::EmptyKey { what });
    }
    if v.len() > MAX_KEY_BYTES {
        return Err(ValueError::KeyTooLong {
            what,
            len: v.len(),
            shown: show_key(v),
        });
    }
    if v.chars().any(char::is_control) {
        return Err(ValueError::ControlInKey {
            what,
            shown: show_key(v),
        });
    }
    Ok(())
}

/// A key as an error message shows it: quoted and escaped (a control character is visible, never
/// printed raw), and, when longer than [`SHOWN_KEY_CHARS`] characters, cut there with a marker
/// that says how long it was. A message never echoes a long key whole.
pub fn show_key(v: &str) -> String {
    match v.char_indices().nth(SHOWN_KEY_CHARS) {
        None => format!("{v:?}"),
        Some((cut, _)) => format!("{:?}… ({} bytes, shortened)", &v[..cut], v.len()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_take_units_or_bare_seconds() {
        assert_eq!(
            parse_duration("7d").unwrap(),
            Duration::from_secs(7 * 86400)
        );
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("30").unwrap(), Duration::from_secs(30));
        assert_eq!(parse_duration("1m 30s").unwrap(), Duration::from_secs(90));
        assert!(parse_duration("x").is_err());
        assert!(parse_duration("5 parsecs").is_err());
        assert!(parse_duration("").is_err());
        assert!(parse_duration("99999999999999999999999").is_err());
    }

    #[test]
    fn cgroup_limits_and_the_ensure_wait_have_one_range() {
        assert!(check_cgroup_limit("pidsMax", 0).is_err());
        assert_eq!(check_cgroup_limit("pidsMax", 1), Ok(1));
        assert_eq!(check_ensure_wait_ms("waitMs", 60_000), Ok(60_000));
        let e = check_ensure_wait_ms("waitMs", 60_001)
            .unwrap_err()
            .to_string();
        assert!(e.contains("60000 ms"), "{e}");
    }

    #[test]
    fn ranges_name_their_limit() {
        assert_eq!(check_grace_ms("grace", MAX_GRACE_MS), Ok(MAX_GRACE_MS));
        let e = check_grace_ms("grace", u64::MAX).unwrap_err().to_string();
        assert!(e.contains("at most 1h") && e.contains("3600000 ms"), "{e}");
        assert!(parse_duration_ms("grace", "2h", MAX_GRACE_MS).is_err());
        assert_eq!(parse_duration_ms("grace", "2s", MAX_GRACE_MS), Ok(2000));
        assert!(check_retention_ms("retention", u64::MAX).is_err());
        assert!(MAX_RETENTION_MS < i64::MAX as u64);
    }

    #[test]
    fn keys_refuse_empty_and_control_characters() {
        assert!(check_key("session", "agent:main:1").is_ok());
        assert!(check_key("session", "é ü").is_ok());
        assert!(check_key("session", "").is_err());
        assert!(check_key("session", "a\nb").is_err());
        assert!(check_key("session", "a\0b").is_err());
        assert!(check_key("session", "a\tb").is_err());
        assert!(check_key("session", &"k".repeat(MAX_KEY_BYTES)).is_ok());
        let long = format!("{}\n", "k".repeat(100_000));
        let e = check_key("session", &long).unwrap_err().to_string();
        assert!(e.contains("100001 bytes") && e.len() < 300, "{e}");
    }

    #[test]
    fn a_shown_key_is_escaped_and_shortened() {
        assert_eq!(show_key("a\nb"), "\"a\\nb\"");
        let s = show_key(&"é".repeat(1000));
        assert!(s.ends_with("… (2000 bytes, shortened)"), "{s}");
        assert_eq!(s.matches('é').count(), SHOWN_KEY_CHARS);
    }

    #[test]
    fn the_retention_default_is_seven_days() {
        assert_eq!(default_retention_ms(), 7 * 24 * 3600 * 1000);
    }
}
