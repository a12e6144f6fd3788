//! `leash mcp`: the session tools for agents, as a Model Context Protocol server over stdio.
//!
//! A gateway starts one server per agent session: `leash mcp --as KEY [--visibility …] [--a2a …]
//! [--sandboxed]`. The requester and its scope are fixed here, at start, and no message can
//! change them. The agent gets four tools — `sessions_list`, `sessions_history`,
//! `sessions_send`, `session_status` — which run the same [`crate::controller::Controller`]
//! operations as `leash sessions`, through the same pure visibility check.
//!
//! Layers: [`jsonrpc`] frames and classifies lines (pure), [`server`] answers MCP methods
//! (pure over a [`tools::Tools`]), [`tools`] describes and validates the tools (pure), and
//! [`effects`] implements them over the store and the daemon. [`serve`] is the loop: read a line
//! of at most [`jsonrpc::MAX_LINE`] bytes, answer it, flush, until EOF.
//!
//! stdout carries only JSON-RPC messages, one per line, each flushed; logs go to stderr. The
//! framing is written here rather than taken from the `rmcp` crate: see docs/guide/agents.md for
//! the measurements behind that choice.

pub mod effects;
pub mod jsonrpc;
pub mod server;
pub mod tools;

use crate::protocol::{Frame, LineReader};
use leash_core::kind::{HasKind, Kind};
use std::io::{self, Read, Write};

#[derive(Debug, thiserror::Error)]
pub enum McpError {
    #[error("cannot read stdin: {0}")]
    Read(#[source] io::Error),
    #[error("cannot write to stdout (the client went away?): {0}")]
    Write(#[source] io::Error),
}

impl HasKind for McpError {
    /// stdin or stdout of `leash mcp` failed.
    fn kind(&self) -> Kind {
        Kind::Internal
    }
}

/// Serves MCP on `input`/`output` until `input` ends (`Ok`), or a read or write fails.
pub fn serve(
    tools: &mut dyn tools::Tools,
    requester: &str,
    input: impl Read,
    mut output: impl Write,
) -> Result<(), McpError> {
    let mut server = server::Server::new(tools, requester);
    let mut reader = LineReader::new(input, jsonrpc::MAX_LINE);
    loop {
        let reply = match reader.next_frame().map_err(McpError::Read)? {
            None => return Ok(()),
            Some(Frame::TooLong) => {
                tracing::warn!(
                    limit = jsonrpc::MAX_LINE,
                    "refused a line longer than the limit"
                );
                Some(jsonrpc::too_long())
            }
            Some(Frame::Line(line)) => server.handle(jsonrpc::classify(&line)),
        };
        if let Some(msg) = reply {
            output
                .write_all(&jsonrpc::render(&msg))
                .and_then(|()| output.flush())
                .map_err(McpError::Write)?;
        }
    }
}
