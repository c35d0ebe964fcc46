//! Keel's MCP client: the tools of Model Context Protocol servers (a stdio process, or a
//! streamable HTTP endpoint) as Keel [`keel_agent::Tool`]s, through the official Rust SDK,
//! `rmcp`; and its MCP server, [`AgentServer`], which offers Keel agents as tools.
//!
//! [`McpServer::start`] starts a server from its [`ServerSpec`] and runs the MCP handshake;
//! [`McpTool::list`] makes its tools (named `{server}_{tool}`, flags from their annotations
//! and the spec's overrides), which an agent takes like any tool; an [`McpToolSet`] holds an
//! agent's tools of all its servers and follows their `notifications/tools/list_changed`,
//! so that the agent's next step offers the new list. A call is a normal tool
//! call of the engine; it has a timeout, is canceled with its run (rmcp then sends
//! `notifications/cancelled`), and finds a server that went away started again.
//!
//! ```no_run
//! # async fn demo() -> Result<(), keel_mcp::McpError> {
//! use keel_mcp::{McpServer, McpTool, ServerSpec, TransportSpec};
//! let spec = ServerSpec::new(
//!     "everything",
//!     TransportSpec::Stdio {
//!         command: "mcp-server-everything".into(),
//!         args: Vec::new(),
//!         env: Vec::new(),
//!         cwd: None,
//!     },
//!     "mcp-server-everything",
//! );
//! let server = McpServer::start(spec).await?;
//! let tools = McpTool::list(&server, &mut Default::default()).await?;
//! # let _ = tools;
//! # Ok(())
//! # }
//! ```

mod http_client;
mod names;
mod serve;
mod server;
mod spec;
mod tool;
mod toolset;

use std::time::Duration;

pub use names::{sanitize, tool_name, MAX_TOOL_NAME};
pub use serve::{AgentServer, HttpService, CANCELED_BY_CLIENT, META_TASK, META_THREAD};
pub use server::McpServer;
pub use spec::{
    FlagOverrides, Header, ServerSpec, ToolFlags, TransportSpec, DEFAULT_CALL_TIMEOUT,
    DEFAULT_STARTUP_TIMEOUT,
};
pub use tool::{output, McpTool};
pub use toolset::McpToolSet;

/// What goes wrong with an MCP server.
#[derive(Debug, thiserror::Error)]
pub enum McpError {
    /// The server could not be started or did not complete the handshake.
    #[error("MCP server `{server}` ({shown}) did not start: {reason}{}", stderr_text(.stderr))]
    NotStarted {
        /// The server's name.
        server: String,
        /// Its command line or URL, secrets masked.
        shown: String,
        /// Why.
        reason: String,
        /// The last lines it wrote on stderr (a stdio server), or empty.
        stderr: String,
    },
    /// A request failed (an MCP error answer, or the transport).
    #[error("MCP server `{server}`: {reason}")]
    Request {
        /// The server's name.
        server: String,
        /// Why.
        reason: String,
    },
    /// A call took longer than the server's call timeout.
    #[error("MCP server `{server}`: `{tool}` gave no result within {}s", .after.as_secs_f64())]
    Timeout {
        /// The server's name.
        server: String,
        /// The MCP tool.
        tool: String,
        /// The timeout.
        after: Duration,
    },
    /// The server went away during a call that is not retried (a tool that is not
    /// idempotent); the next call starts it again.
    #[error(
        "MCP server `{server}` stopped during the call of `{tool}`; it is started again on the next call"
    )]
    Stopped {
        /// The server's name.
        server: String,
        /// The MCP tool.
        tool: String,
    },
}

impl McpError {
    /// The name of the server it is about.
    pub fn server(&self) -> &str {
        match self {
            Self::NotStarted { server, .. }
            | Self::Request { server, .. }
            | Self::Timeout { server, .. }
            | Self::Stopped { server, .. } => server,
        }
    }
}

fn stderr_text(stderr: &str) -> String {
    if stderr.is_empty() {
        String::new()
    } else {
        format!("; it printed:\n{stderr}")
    }
}
