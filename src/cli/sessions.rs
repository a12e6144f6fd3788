//! `leash sessions list | history KEY | send KEY LINE | status KEY`, each run as a requester
//! (`--as KEY --visibility V [--a2a on|off] [--a2a-allow FROM:TO]… [--sandboxed]`): the flags,
//! the daemon route, the exit codes (not visible 5, unknown 4) and the rendering. The operations
//! themselves are [`crate::controller::Controller`], shared with the daemon.

use super::exit::Failure;
use crate::controller::sessions::{describe, Listing, ProcState, SessionStatus, View};
use crate::controller::History;
use clap::{Args, Subcommand, ValueEnum};
use leash_core::kind::exitcode;
use leash_core::kind::Kind;
use leash_core::model::LeaseState;
use leash_core::visibility::{A2aPolicy, A2aRule, Scope, Visibility};

#[derive(Debug, Subcommand)]
#[command(defer = true)]
pub enum SessionsCommand {
    /// The sessions the requester may see, with why each is visible
    List(ViewArgs),
    /// A session's lifecycle events, in order
    History {
        /// Session key
        #[arg(value_name = "SESSION", value_parser = super::parse::parse_key)]
        key: String,
        #[command(flatten)]
        view: ViewArgs,
    },
    /// Write LINE to a session's adapter stdin (needs a running `leash serve`)
    Send {
        /// Session key
        #[arg(value_name = "SESSION", value_parser = super::parse::parse_key)]
        key: String,
        /// One line of input for the adapter (no newline inside)
        #[arg(allow_hyphen_values = true)]
        line: String,
        #[command(flatten)]
        view: ViewArgs,
    },
    /// A session's lease state and live processes
    Status {
        /// Session key
        #[arg(value_name = "SESSION", value_parser = super::parse::parse_key)]
        key: String,
        #[command(flatten)]
        view: ViewArgs,
    },
}

impl SessionsCommand {
    /// Was JSON asked for (so errors are JSON too)?
    pub fn json(&self) -> bool {
        match self {
            SessionsCommand::List(v) => v.json,
            SessionsCommand::History { view, .. }
            | SessionsCommand::Send { view, .. }
            | SessionsCommand::Status { view, .. } => view.json,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OnOff {
    On,
    Off,
}

// Who asks, and how far it may see.
// (A plain comment, not a doc comment: clap would take a doc comment on this struct as the
// `about` of every command whose arguments it holds, over that command's own.)
#[derive(Debug, Args)]
pub struct ViewArgs {
    /// Session key of the requester: every answer is what this session may see
    #[arg(long = "as", value_name = "REQUESTER", value_parser = super::parse::parse_key)]
    pub requester: String,
    /// self, tree, agent or all
    #[arg(long, value_name = "V", default_value = "tree", value_parser = parse_visibility)]
    pub visibility: Visibility,
    /// Agent-to-agent policy for `all` [default: off, or on when --a2a-allow is given]
    #[arg(long, value_enum, value_name = "on|off")]
    pub a2a: Option<OnOff>,
    /// With a2a on, allow only these pairs: requesters of agent FROM see sessions of agent TO
    /// (repeatable; `*` is a wildcard; directional)
    #[arg(long = "a2a-allow", value_name = "FROM:TO", value_parser = parse_rule)]
    pub a2a_allow: Vec<A2aRule>,
    /// The requester runs sandboxed: its visibility is clamped to tree
    #[arg(long)]
    pub sandboxed: bool,
    /// Print JSON
    #[arg(long)]
    pub json: bool,
}

fn parse_visibility(s: &str) -> Result<Visibility, String> {
    s.parse()
        .map_err(|e: leash_core::visibility::PolicyError| e.to_string())
}

fn parse_rule(s: &str) -> Result<A2aRule, String> {
    s.parse()
        .map_err(|e: leash_core::visibility::PolicyError| e.to_string())
}

impl ViewArgs {
    pub fn view(&self) -> Result<View, Failure> {
        if self.requester.is_empty() {
            return Err(Failure::new(
                Kind::Usage,
                "--as needs the requester's session key",
            ));
        }
        // The flag's parser checks it already; this keeps the rule for every caller of `view`.
        leash_core::limits::check_key("--as", &self.requester)
            .map_err(|e| Failure::new(Kind::Usage, e.to_string()))?;
        let a2a = match (self.a2a, self.a2a_allow.is_empty()) {
            (Some(OnOff::Off), false) => {
                return Err(Failure::new(
                    Kind::Usage,
                    "--a2a off contradicts --a2a-allow; drop one of them",
                ))
            }
            (Some(OnOff::Off), true) | (None, true) => A2aPolicy::Off,
            (Some(OnOff::On), _) | (None, false) => A2aPolicy::On {
                rules: self.a2a_allow.clone(),
            },
        };
        Ok(View {
            requester: self.requester.clone(),
            scope: Scope::new(self.visibility, a2a, self.sandboxed),
        })
    }
}

/// Runs a `leash sessions` command on the backend of this invocation: through the daemon when
/// one serves the state root, else on the database directly (`send` needs a daemon either way).
/// Either way the answer comes from the same [`crate::controller::Controller`] operations and is
/// rendered here once.
pub(super) fn run(
    b: &mut dyn super::backend::Backend,
    cmd: SessionsCommand,
) -> Result<u8, Failure> {
    match cmd {
        SessionsCommand::List(v) => {
            let out = b.sessions_list(&v.view()?)?;
            if v.json {
                super::output::print_json(&out);
            } else {
                print_listing(&out);
            }
        }
        SessionsCommand::History { key, view } => {
            let out = b.sessions_history(&view.view()?, &key)?;
            if view.json {
                super::output::print_json(&out);
            } else {
                print_history(&out);
            }
        }
        SessionsCommand::Status { key, view } => {
            let out = b.sessions_status(&view.view()?, &key)?;
            if view.json {
                super::output::print_json(&out);
            } else {
                print_status(&out);
            }
        }
        SessionsCommand::Send { key, line, view } => {
            let out = b.sessions_send(&view.view()?, &key, &line)?;
            if view.json {
                super::output::print_json(&out);
            } else {
                outln!("sent {} byte(s) to session {key}", out.bytes);
            }
        }
    }
    Ok(exitcode::OK)
}

fn or_dash(v: Option<&str>) -> &str {
    v.unwrap_or("-")
}

fn print_listing(l: &Listing) {
    let scope = Scope::new(l.visibility, l.a2a.clone(), l.sandboxed);
    outln!(
        "sessions visible to {} (agent {}): visibility {}, a2a {}",
        l.requester,
        or_dash(l.requester_agent.as_deref()),
        describe(&scope),
        l.a2a
    );
    if l.sessions.is_empty() {
        outln!("  none");
        return;
    }
    outln!(
        "{:<28}  {:<10}  {:<24}  {:<24}  {:<7}  VISIBLE AS",
        "SESSION",
        "AGENT",
        "OWNER",
        "SPAWNED BY",
        "LEASE"
    );
    for s in &l.sessions {
        let r = &s.session;
        outln!(
            "{:<28}  {:<10}  {:<24}  {:<24}  {:<7}  {}",
            r.session_key,
            or_dash(r.agent_id.as_deref()),
            or_dash(r.owner_session_key.as_deref()),
            or_dash(r.spawned_by.as_deref()),
            s.lease_state.map_or("-", LeaseState::as_str),
            s.visible_as.as_str()
        );
    }
}

fn print_history(h: &History) {
    outln!(
        "session {} ({} event{}; visible as {})",
        h.session_key,
        h.events.len(),
        if h.events.len() == 1 { "" } else { "s" },
        h.visible_as.as_str()
    );
    for e in &h.events {
        let detail = e.detail.as_ref().map(|d| d.to_string()).unwrap_or_default();
        outln!(
            "{:>4}  {}  {:<9}  {}  {}",
            e.seq,
            utc(e.at),
            e.kind,
            or_dash(e.lease_id.as_deref()),
            detail
        );
    }
}

fn print_status(s: &SessionStatus) {
    let r = &s.session;
    outln!(
        "session {} (agent {}, owner {}, spawned by {}, parent {}; visible as {})",
        r.session_key,
        or_dash(r.agent_id.as_deref()),
        or_dash(r.owner_session_key.as_deref()),
        or_dash(r.spawned_by.as_deref()),
        or_dash(r.parent_session_key.as_deref()),
        s.visible_as.as_str()
    );
    let Some(l) = &s.lease else {
        outln!("lease    none (never leased, or expired)");
        return;
    };
    let ended = l
        .closed_at
        .map(|t| format!(", ended {}", utc(t)))
        .unwrap_or_default();
    outln!(
        "lease    {} {} (started {}{ended}){}",
        l.lease_id,
        l.state,
        utc(l.started_at),
        l.state_reason
            .as_deref()
            .map(|r| format!(" — {r}"))
            .unwrap_or_default()
    );
    let proc_line = |name: &str, p: &Option<ProcState>| match p {
        Some(p) => outln!(
            "{name:<8} pid {} ({}) {}",
            p.pid,
            super::output::started(p.start_time),
            match p.alive {
                Some(true) => "alive",
                Some(false) => "gone",
                None => "unknown (process table unreadable)",
            }
        ),
        None => outln!("{name:<8} not reported"),
    };
    proc_line("root", &s.root);
    proc_line("adapter", &s.adapter);
    if let Some(code) = l.exit_status {
        outln!("exit     {code}");
    }
    if let Some(t) = &s.tree {
        outln!(
            "tree     {}{}",
            t.verdict,
            t.reason
                .as_deref()
                .map(|r| format!(" — {r}"))
                .unwrap_or_default()
        );
        for p in &t.processes {
            let role = serde_json::to_value(p.role).expect("serialisable");
            outln!(
                "  pid {} ({}, {}) {}",
                p.pid,
                role.as_str().unwrap_or("?"),
                super::output::started(p.start_time),
                or_dash(p.argv0.as_deref())
            );
        }
    }
}

/// Milliseconds since the epoch as `YYYY-MM-DD HH:MM:SS.mmm` UTC (civil-from-days, so no date
/// crate is needed for one column).
fn utc(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let milli = ms.rem_euclid(1000);
    let days = secs.div_euclid(86_400);
    let tod = secs.rem_euclid(86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}.{milli:03}",
        tod / 3600,
        tod % 3600 / 60,
        tod % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_formats_known_instants() {
        assert_eq!(utc(0), "1970-01-01 00:00:00.000");
        assert_eq!(utc(951_782_400_123), "2000-02-29 00:00:00.123");
        assert_eq!(utc(1_709_251_199_999), "2024-02-29 23:59:59.999");
    }

    #[test]
    fn a2a_flags_combine() {
        use clap::Parser;
        #[derive(Parser)]
        struct T {
            #[command(flatten)]
            v: ViewArgs,
        }
        let view = |args: &[&str]| {
            let mut argv = vec!["t", "--as", "r"];
            argv.extend_from_slice(args);
            T::try_parse_from(argv).unwrap().v.view()
        };
        assert_eq!(view(&[]).ok().unwrap().scope.a2a, A2aPolicy::Off);
        assert_eq!(
            view(&["--a2a", "on"]).ok().unwrap().scope.a2a,
            A2aPolicy::all_pairs()
        );
        let pairs = view(&["--a2a-allow", "main:codex"]).ok().unwrap();
        assert_eq!(
            pairs.scope.a2a,
            A2aPolicy::On {
                rules: vec!["main:codex".parse().unwrap()]
            }
        );
        assert_eq!(pairs.scope.visibility, Visibility::Tree);
        let clash = view(&["--a2a", "off", "--a2a-allow", "a:b"]);
        assert_eq!(clash.err().unwrap().code, exitcode::USAGE);
    }
}
