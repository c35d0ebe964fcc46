//! `keel mcp`: Keel agents served as an MCP server over stdio, one tool per agent, for MCP
//! clients (IDEs, other agent frameworks) to call. Each call runs on the same executors as
//! `keel run`, on the configured store, with each agent's policy and budgets.

use std::process::ExitCode;

use keel::mcp::AgentServer;

use crate::run::{local_tenant, Source};

/// `keel mcp [--agent NAME]`: serve agent `NAME` of the file, else every agent of it (the
/// demo agent without a file), until the client closes stdin. Logs go to stderr: stdout
/// carries the protocol.
pub(crate) async fn serve(source: Source, agent: Option<String>) -> Result<ExitCode, String> {
    let executors = source.executors(agent.as_deref(), true).await?;
    let server = AgentServer::new(executors.clone(), local_tenant()).map_err(|e| e.to_string())?;
    let served = server.serve_stdio().await.map_err(|e| e.to_string());
    for executor in executors {
        executor.shutdown().await;
    }
    served.map(|()| ExitCode::SUCCESS)
}
