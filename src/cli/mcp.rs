//! `leash mcp --as KEY [--visibility V] [--a2a on|off] [--a2a-allow FROM:TO]… [--sandboxed]`:
//! the flags of the MCP server and its start. The requester and its scope are taken from the
//! flags exactly as `leash sessions` takes them ([`ViewArgs::view`]), once, before the first
//! message is read; the server itself is [`crate::mcp`].

use super::exit::Failure;
use super::sessions::{OnOff, ViewArgs};
use crate::mcp::effects::SessionTools;
use crate::state::StateRoot;
use clap::Args;
use leash_core::kind::exitcode;
use leash_core::visibility::{A2aRule, Visibility};

pub(super) const MCP_ABOUT: &str = "Serve the session tools (sessions_list, sessions_history, \
sessions_send, session_status) to an agent as a Model Context Protocol server on stdin/stdout \
(JSON-RPC 2.0, one message per line; lines up to 1 MiB). Every answer is what the session named \
by --as may see under the given visibility, decided by the same check as `leash sessions`; no \
tool argument can change the requester or its scope. sessions_send and the adapter output in \
sessions_history need a running `leash serve` for the state root. stdout carries only JSON-RPC; \
logs go to stderr. Exits 0 when stdin ends.";

// The requester and its scope, fixed for the server's lifetime (the flags of `leash sessions`,
// without `--json`: the output is always JSON-RPC).
// (A plain comment, not a doc comment: clap would take a doc comment on this struct as the
// `about` of every command whose arguments it holds, over that command's own.)
#[derive(Debug, Args)]
pub struct McpArgs {
    /// Session key of the requester: the agent session this server answers for
    #[arg(long = "as", value_name = "KEY", value_parser = super::parse::parse_key)]
    pub requester: String,
    /// self, tree, agent or all
    #[arg(long, value_name = "V", default_value = "tree",
          value_parser = |s: &str| s.parse::<Visibility>().map_err(|e| e.to_string()))]
    pub visibility: Visibility,
    /// Agent-to-agent policy for `all` [default: off, or on when --a2a-allow is given]
    #[arg(long, value_enum, value_name = "on|off")]
    pub a2a: Option<OnOff>,
    /// With a2a on, allow only these pairs: requesters of agent FROM see sessions of agent TO
    /// (repeatable; `*` is a wildcard; directional)
    #[arg(long = "a2a-allow", value_name = "FROM:TO",
          value_parser = |s: &str| s.parse::<A2aRule>().map_err(|e| e.to_string()))]
    pub a2a_allow: Vec<A2aRule>,
    /// The requester runs sandboxed: its visibility is clamped to tree
    #[arg(long)]
    pub sandboxed: bool,
}

pub(super) fn run(root: StateRoot, a: McpArgs) -> Result<u8, Failure> {
    let view = ViewArgs {
        requester: a.requester,
        visibility: a.visibility,
        a2a: a.a2a,
        a2a_allow: a.a2a_allow,
        sandboxed: a.sandboxed,
        json: false,
    }
    .view()?;
    tracing::info!(requester = %view.requester, scope = crate::logvalue::json(&view.scope), "leash mcp serving on stdio");
    let requester = view.requester.clone();
    let mut tools = SessionTools::new(root, view);
    match crate::mcp::serve(
        &mut tools,
        &requester,
        std::io::stdin().lock(),
        std::io::stdout().lock(),
    ) {
        // The client closed its end of stdout: it is gone, as when it closes stdin (exit 0).
        Err(crate::mcp::McpError::Write(e)) if e.kind() == std::io::ErrorKind::BrokenPipe => {
            tracing::debug!("the client closed stdout; leash mcp ends");
            Ok(exitcode::OK)
        }
        Err(e) => Err(Failure::from(e)),
        Ok(()) => Ok(exitcode::OK),
    }
}
