//! Several agents on one server: each agent's A2A router under `/agents/{name}/` (card,
//! JSON-RPC, HTTP+JSON, WebSocket, callbacks), and the default agent's also at `/`.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;

use axum::body::Body;
use axum::http::{StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::serve::ListenerExt;
use axum::Router;
use tokio::sync::watch;
use tower::ServiceExt;

use crate::handlers::Handlers;
use crate::operator::OperatorAgent;
use crate::A2aServer;

/// The path under which each agent is served: `/agents/{name}/`.
pub const AGENTS_PATH: &str = "/agents/";

/// Serves several agents, each as its own A2A agent under `/agents/{name}/`: its card at
/// `/agents/{name}/.well-known/agent-card.json` lists interfaces under that path. Requests to
/// any other path go to the default agent (the first added unless
/// [`AgentsServer::with_default`] says otherwise), so its card is also at
/// `/.well-known/agent-card.json` and its JSON-RPC endpoint at `/`.
///
/// ```
/// use std::sync::Arc;
/// use keel_agent::{Agent, AgentExecutor};
/// use keel_core::AgentCard;
/// use keel_llm::MockLlm;
/// use keel_runtime::Services;
/// use keel_transport::{A2aServer, AgentsServer};
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let runtime = Arc::new(Services::in_memory(Arc::new(MockLlm::new())));
/// let server = |name: &str| -> Result<A2aServer, keel_core::AgentError> {
///     let agent = Agent::builder(AgentCard::new(name, "Echoes", "http://unused")).build()?;
///     Ok(A2aServer::new(AgentExecutor::new(agent, runtime.clone())))
/// };
/// let agents = AgentsServer::new()
///     .with_agent("alpha", server("alpha")?)
///     .with_agent("beta", server("beta")?);
/// let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
/// let base_url = format!("http://{}", listener.local_addr()?);
/// let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
/// let serving = tokio::spawn(agents.serve(listener, async move { let _ = stopped.await; }));
///
/// let card = keel_transport::A2aClient::new(format!("{base_url}/agents/beta")).get_card().await?;
/// assert_eq!(card.name, "beta");
/// let _ = stop.send(());
/// serving.await??;
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Default)]
pub struct AgentsServer {
    agents: Vec<(String, A2aServer)>,
    default: Option<String>,
    public_url: Option<String>,
    connections: crate::ConnectionLimits,
    metrics: Option<crate::MetricsRoute>,
}

impl AgentsServer {
    /// A server with no agents yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Serve `server`'s agent under `/agents/{name}/`.
    #[must_use]
    pub fn with_agent(mut self, name: impl Into<String>, server: A2aServer) -> Self {
        self.agents.push((name.into(), server));
        self
    }

    /// The agent also served at `/` (default: the first added).
    #[must_use]
    pub fn with_default(mut self, name: impl Into<String>) -> Self {
        self.default = Some(name.into());
        self
    }

    /// The base URL clients use (behind a proxy); without it, `http://<bound address>`.
    #[must_use]
    pub fn with_public_url(mut self, url: impl Into<String>) -> Self {
        self.public_url = Some(url.into());
        self
    }

    /// The connection deadlines and cap that [`AgentsServer::serve`] applies (see
    /// [`A2aServer::with_connection_limits`]; the agents' own settings do not apply here,
    /// since their connections are this server's).
    #[must_use]
    pub fn with_connection_limits(mut self, limits: crate::ConnectionLimits) -> Self {
        self.connections = limits;
        self
    }

    /// Serve the process's metrics at `/metrics` ([`crate::MetricsRoute`]); [`Self::serve`]
    /// counts and logs every request either way.
    #[must_use]
    pub fn with_metrics(mut self, route: crate::MetricsRoute) -> Self {
        self.metrics = Some(route);
        self
    }

    /// The base URL of the agent `name` under `public_base_url`.
    pub fn agent_url(public_base_url: &str, name: &str) -> String {
        format!(
            "{}{AGENTS_PATH}{name}/",
            public_base_url.trim_end_matches('/')
        )
    }

    /// The router of every agent, advertising URLs under `public_base_url`.
    pub fn router(&self, public_base_url: &str) -> Router {
        let (_closing, closed) = watch::channel(false);
        let (_stop, stopped) = watch::channel(false);
        self.router_with(public_base_url, closed, stopped)
    }

    fn router_with(
        &self,
        public_base_url: &str,
        closing: watch::Receiver<bool>,
        stopped: watch::Receiver<bool>,
    ) -> Router {
        let default_name = self
            .default
            .clone()
            .or_else(|| self.agents.first().map(|(name, _)| name.clone()));
        let handlers: Vec<Handlers> = self
            .agents
            .iter()
            .map(|(name, server)| {
                let base = Self::agent_url(public_base_url, name);
                server.handlers(&base, closing.clone(), stopped.clone())
            })
            .collect();
        // The operator API of every agent's router lists them all, the default first.
        let mut operator_agents: Vec<OperatorAgent> = self
            .agents
            .iter()
            .zip(&handlers)
            .map(|((name, _), handlers)| {
                let url = Self::agent_url(public_base_url, name);
                OperatorAgent::new(name.clone(), url, handlers.clone())
            })
            .collect();
        if let Some(at) = operator_agents
            .iter()
            .position(|a| Some(a.name()) == default_name.as_deref())
        {
            operator_agents[..=at].rotate_right(1);
        }
        let routers: HashMap<String, Router> = self
            .agents
            .iter()
            .zip(handlers)
            .map(|((name, server), handlers)| {
                let base = Self::agent_url(public_base_url, name);
                let router = server.router_from(&base, handlers, operator_agents.clone());
                (name.clone(), router)
            })
            .collect();
        let default = default_name.and_then(|name| routers.get(&name).cloned());
        let routers = Arc::new(routers);
        Router::new().fallback(move |request: axum::extract::Request| {
            let routers = routers.clone();
            let default = default.clone();
            async move { route(&routers, default, request).await }
        })
    }

    /// Serve on `listener` until `shutdown` completes, as [`A2aServer::serve`] does for one
    /// agent: every agent's executor hands its running tasks on, each within its own drain
    /// timeout, before open streams end.
    pub async fn serve(
        self,
        listener: tokio::net::TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        let address = listener.local_addr()?;
        let base_url = self
            .public_url
            .clone()
            .unwrap_or_else(|| format!("http://{address}"));
        let (closing, closed) = watch::channel(false);
        let (stop_push, push_stopped) = watch::channel(false);
        let router = self.router_with(&base_url, closed, push_stopped);
        let router = crate::observability::observed(router, self.metrics.as_ref());
        let executors: Vec<_> = self
            .agents
            .iter()
            .map(|(_, server)| server.executor().clone())
            .collect();
        let signal = {
            let executors = executors.clone();
            async move {
                shutdown.await;
                tracing::info!("A2A server shutting down; handing running tasks on");
                tokio::spawn(async move {
                    futures::future::join_all(executors.iter().map(|e| e.shutdown())).await;
                    let _ = closing.send(true);
                });
            }
        };
        tracing::info!(%address, %base_url, agents = self.agents.len(), "A2A server listening");
        let listener = listener.tap_io(|stream| {
            // Small answers go out at once (see `A2aServer::serve`).
            let _ = stream.set_nodelay(true);
        });
        let served = crate::conn::serve(listener, router, self.connections, signal).await;
        futures::future::join_all(executors.iter().map(|e| e.shutdown())).await;
        let _ = stop_push.send(true);
        served
    }
}

/// Send `request` to the agent its path names, with the `/agents/{name}` prefix taken off,
/// or to the default agent.
async fn route(
    routers: &HashMap<String, Router>,
    default: Option<Router>,
    mut request: axum::extract::Request,
) -> Response {
    let path = request.uri().path();
    if let Some(rest) = path.strip_prefix(AGENTS_PATH) {
        let (name, inner) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
        let Some(router) = routers.get(name) else {
            // Agents' cards are public, so their names are too: say which there are.
            let mut names: Vec<&str> = routers.keys().map(String::as_str).collect();
            names.sort_unstable();
            let error = format!(
                "no agent is named `{name}`; this server has {}",
                names
                    .iter()
                    .map(|name| format!("`{name}` ({AGENTS_PATH}{name}/)"))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            return (
                StatusCode::NOT_FOUND,
                axum::Json(serde_json::json!({ "error": error })),
            )
                .into_response();
        };
        let inner = if inner.is_empty() { "/" } else { inner };
        let path_and_query = match request.uri().query() {
            Some(query) => format!("{inner}?{query}"),
            None => inner.to_owned(),
        };
        let mut parts = request.uri().clone().into_parts();
        parts.path_and_query = path_and_query.parse().ok();
        if let Ok(uri) = Uri::from_parts(parts) {
            *request.uri_mut() = uri;
        }
        return call(router.clone(), request).await;
    }
    match default {
        Some(router) => call(router, request).await,
        None => StatusCode::NOT_FOUND.into_response(),
    }
}

async fn call(router: Router, request: axum::extract::Request<Body>) -> Response {
    match router.oneshot(request).await {
        Ok(response) => response,
        Err(never) => match never {},
    }
}
