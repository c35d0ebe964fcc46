//! `keel mcp`: Keel agents served as an MCP server over stdio, one tool per agent, for MCP
//! clients (IDEs, other agent frameworks) to call. Each call runs on the same executors as
//! `keel run`, on the configured store, with each agent's policy and budgets. `keel serve`
//! offers the same server over streamable HTTP at [`MCP_PATH`], behind its A2A credentials.

use std::process::ExitCode;

use keel::agent::AgentExecutor;
use keel::mcp::AgentServer;
use keel::transport::A2aServer;
use tokio_util::sync::CancellationToken;

use crate::run::{local_tenant, Source};

/// Where `keel serve` offers its agents to MCP clients (streamable HTTP).
pub(crate) const MCP_PATH: &str = "/mcp";

/// `server` with every one of `executors` offered as an MCP tool at [`MCP_PATH`], with the
/// server's credentials and each caller's tenant. Besides loopback names, the `Host` a
/// request may carry is `public_url`'s host (DNS rebinding protection); sessions end when
/// `stop` fires.
pub(crate) fn mount(
    server: A2aServer,
    executors: Vec<AgentExecutor>,
    public_url: &str,
    stop: CancellationToken,
) -> Result<A2aServer, String> {
    let hosts = reqwest::Url::parse(public_url)
        .ok()
        .and_then(|url| url.host_str().map(str::to_owned));
    let service = AgentServer::new(executors, local_tenant())
        .map_err(|e| e.to_string())?
        .http_service(hosts, stop);
    Ok(server.with_authenticated(MCP_PATH, axum::Router::new().fallback_service(service)))
}

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
