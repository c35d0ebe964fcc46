//! The A2A v1.0 server on axum: the agent card at `/.well-known/agent-card.json` and the
//! JSON-RPC endpoint at `/`.

use std::future::Future;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use keel_agent::{AgentExecutor, SendOptions};
use keel_core::AgentError;
use serde_json::Value;
use tracing::Instrument;

use crate::jsonrpc::{
    self, RpcError, EXTENDED_CARD_NOT_CONFIGURED, INVALID_REQUEST, METHOD_NOT_FOUND, PARSE_ERROR,
    PUSH_NOTIFICATION_NOT_SUPPORTED, UNSUPPORTED_OPERATION, VERSION_NOT_SUPPORTED,
};
use crate::wire;

/// The header in which a client names the A2A version it speaks.
pub(crate) const VERSION_HEADER: &str = "A2A-Version";

/// The path of the public agent card.
pub const AGENT_CARD_PATH: &str = "/.well-known/agent-card.json";

/// The default request body limit: 1 MiB.
pub const DEFAULT_BODY_LIMIT: usize = 1024 * 1024;

/// Serves one agent over A2A v1.0 (JSON-RPC binding).
///
/// Routes: `GET /.well-known/agent-card.json` (the card) and `POST /` (JSON-RPC: `SendMessage`,
/// `GetTask`, `CancelTask`). JSON-RPC errors are always answered with HTTP 200, as A2A clients
/// expect. Streaming and push notifications are not offered yet, and the card says so.
///
/// ```
/// use std::sync::Arc;
/// use keel_agent::{Agent, AgentExecutor};
/// use keel_core::AgentCard;
/// use keel_llm::MockLlm;
/// use keel_runtime::InMemoryRuntime;
/// use keel_transport::A2aServer;
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let agent = Agent::builder(AgentCard::new("echo", "Echoes", "http://unused")).build()?;
/// let runtime = Arc::new(InMemoryRuntime::new(Arc::new(MockLlm::new())));
/// let server = A2aServer::new(AgentExecutor::new(agent, runtime));
///
/// let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
/// let base_url = format!("http://{}", listener.local_addr()?);
/// let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
/// let serving = tokio::spawn(server.serve(listener, async move { let _ = stopped.await; }));
///
/// let client = keel_transport::A2aClient::new(base_url);
/// let card = client.get_card().await?;
/// assert_eq!(card.name, "echo");
///
/// let _ = stop.send(());
/// serving.await??;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct A2aServer {
    executor: AgentExecutor,
    public_url: Option<String>,
    body_limit: usize,
}

struct ServerState {
    executor: AgentExecutor,
    card: Value,
}

impl A2aServer {
    /// A server for the agent that `executor` runs.
    pub fn new(executor: AgentExecutor) -> Self {
        Self {
            executor,
            public_url: None,
            body_limit: DEFAULT_BODY_LIMIT,
        }
    }

    /// The base URL that clients use to reach this server (e.g. behind a proxy). Without it,
    /// [`A2aServer::serve`] uses `http://<bound address>`.
    #[must_use]
    pub fn with_public_url(mut self, url: impl Into<String>) -> Self {
        self.public_url = Some(url.into());
        self
    }

    /// The largest request body accepted, in bytes ([`DEFAULT_BODY_LIMIT`] unless set). A
    /// larger body is answered with a JSON-RPC invalid-request error.
    #[must_use]
    pub fn with_body_limit(mut self, bytes: usize) -> Self {
        self.body_limit = bytes;
        self
    }

    /// The executor behind the server.
    pub fn executor(&self) -> &AgentExecutor {
        &self.executor
    }

    /// The card as served: the agent's card with the JSON-RPC interface at
    /// `<public_base_url>/`, protocol version 1.0, and streaming and push notifications off
    /// (not implemented yet; a client that sees streaming on would try to stream).
    fn served_card(&self, public_base_url: &str) -> Value {
        let mut card = self.executor.agent().card().clone();
        card.url = format!("{}/", public_base_url.trim_end_matches('/'));
        card.protocol_version = wire::PROTOCOL_VERSION.into();
        card.capabilities.streaming = false;
        card.capabilities.push_notifications = false;
        wire::encode_card(&card)
    }

    /// The axum router, advertising `public_base_url` in the card. Use it to mount the agent
    /// in a larger application; [`A2aServer::serve`] is the all-in-one alternative.
    pub fn router(&self, public_base_url: impl Into<String>) -> Router {
        let state = Arc::new(ServerState {
            executor: self.executor.clone(),
            card: self.served_card(&public_base_url.into()),
        });
        Router::new()
            .route(AGENT_CARD_PATH, get(agent_card))
            .route("/", post(json_rpc))
            .layer(DefaultBodyLimit::max(self.body_limit))
            .with_state(state)
    }

    /// Serve on `listener` until `shutdown` completes.
    ///
    /// The public URL is [`A2aServer::with_public_url`]'s, or `http://<listener address>`.
    /// When `shutdown` fires, running tasks are canceled (so blocked `SendMessage` calls
    /// answer with a canceled task), the server drains its connections, and this returns
    /// once every task has persisted its final state.
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
        let router = self.router(base_url.clone());
        let executor = self.executor.clone();
        let signal = {
            let executor = executor.clone();
            async move {
                shutdown.await;
                tracing::info!("A2A server shutting down; canceling running tasks");
                // Cancel runs while connections drain, so that blocking requests can finish.
                tokio::spawn(async move { executor.shutdown().await });
            }
        };
        tracing::info!(%address, %base_url, "A2A server listening");
        let served = axum::serve(listener, router)
            .with_graceful_shutdown(signal)
            .await;
        // Runs started by requests that raced the signal are canceled here too.
        executor.shutdown().await;
        served
    }
}

async fn agent_card(State(state): State<Arc<ServerState>>) -> Json<Value> {
    Json(state.card.clone())
}

/// Whether a client's `A2A-Version` is one this server speaks: `1.0` or `1.0.x`.
fn version_supported(version: &str) -> bool {
    let mut parts = version.trim().split('.');
    parts.next() == Some("1")
        && parts.next() == Some("0")
        && parts.all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
}

fn answer(body: Value) -> Response {
    (StatusCode::OK, Json(body)).into_response()
}

fn answer_error(id: Value, error: &RpcError) -> Response {
    answer(jsonrpc::failure(id, error))
}

async fn json_rpc(
    State(state): State<Arc<ServerState>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let body = match body {
        Ok(body) => body,
        Err(rejection) => {
            tracing::debug!(%rejection, "request body rejected");
            let message = if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
                "request body too large"
            } else {
                "request body could not be read"
            };
            return answer_error(Value::Null, &RpcError::new(INVALID_REQUEST, message));
        }
    };
    let request: Value = match serde_json::from_slice(&body) {
        Ok(request) => request,
        Err(err) => {
            return answer_error(
                Value::Null,
                &RpcError::new(PARSE_ERROR, format!("parse error: {err}")),
            )
        }
    };
    let mut request = match request {
        Value::Object(request) => request,
        // Batches are not supported yet: the whole array is one invalid request.
        Value::Array(_) => {
            return answer_error(
                Value::Null,
                &RpcError::new(INVALID_REQUEST, "batch requests are not supported"),
            )
        }
        _ => {
            return answer_error(
                Value::Null,
                &RpcError::new(INVALID_REQUEST, "a request must be a JSON object"),
            )
        }
    };

    // A request without `id` is a notification: processed, answered with no body.
    let id = match request.remove("id") {
        None => None,
        Some(id @ (Value::String(_) | Value::Number(_) | Value::Null)) => Some(id),
        Some(_) => {
            return answer_error(
                Value::Null,
                &RpcError::new(INVALID_REQUEST, "id must be a string, a number or null"),
            )
        }
    };
    let reply_id = id.clone().unwrap_or(Value::Null);
    if request.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return answer_error(
            reply_id,
            &RpcError::new(INVALID_REQUEST, "jsonrpc must be \"2.0\""),
        );
    }
    let Some(Value::String(method)) = request.remove("method") else {
        return answer_error(
            reply_id,
            &RpcError::new(INVALID_REQUEST, "method must be a string"),
        );
    };
    // No header means a v0.3 client. For this first cut such requests are handled by the same
    // v1.0 handlers; the v0.3 compatibility layer (`message/send`, `kind`) comes later.
    if let Some(version) = headers.get(VERSION_HEADER) {
        let version = version.to_str().unwrap_or("");
        if !version_supported(version) {
            return answer_error(
                reply_id,
                &RpcError::new(
                    VERSION_NOT_SUPPORTED,
                    format!("A2A version `{version}` is not supported; this server speaks 1.0"),
                )
                .with("supportedVersions", wire::PROTOCOL_VERSION),
            );
        }
    }
    let params = request.remove("params").unwrap_or(Value::Null);

    let span = tracing::info_span!("a2a.request", method = %method, id = %reply_id);
    let outcome = dispatch(&state, &method, params).instrument(span).await;
    match (id, outcome) {
        (None, _) => StatusCode::NO_CONTENT.into_response(),
        (Some(id), Ok(result)) => answer(jsonrpc::success(id, result)),
        (Some(id), Err(error)) => answer_error(id, &error),
    }
}

async fn dispatch(state: &ServerState, method: &str, params: Value) -> Result<Value, RpcError> {
    let executor = &state.executor;
    let auth = executor.runtime().auth_service().auth_context();
    let agent_error = |err: AgentError| RpcError::from_agent_error(&err);
    match method {
        "SendMessage" => {
            let call = wire::decode_send_message(params).map_err(agent_error)?;
            if call.wants_push_notifications {
                return Err(RpcError::new(
                    PUSH_NOTIFICATION_NOT_SUPPORTED,
                    "push notifications are not supported",
                ));
            }
            let options = SendOptions {
                return_immediately: call.return_immediately,
                history_length: call.history_length,
                run_context: None,
            };
            let task = executor
                .send_message(&auth, call.message, options)
                .await
                .map_err(agent_error)?;
            tracing::debug!(task_id = %task.id, state = %task.state(), "SendMessage answered");
            Ok(wire::encode_send_message_result(&task))
        }
        "GetTask" => {
            let (task_id, history_length) = wire::decode_get_task(params).map_err(agent_error)?;
            let task = executor
                .get_task(&auth, &task_id, history_length)
                .await
                .map_err(agent_error)?;
            Ok(wire::encode_task(&task))
        }
        "CancelTask" => {
            let (task_id, reason) = wire::decode_cancel_task(params).map_err(agent_error)?;
            let task = executor
                .cancel_task(&auth, &task_id, reason)
                .await
                .map_err(agent_error)?;
            Ok(wire::encode_task(&task))
        }
        "SendStreamingMessage" | "SubscribeToTask" => Err(RpcError::new(
            UNSUPPORTED_OPERATION,
            "streaming is not supported by this agent",
        )),
        "ListTasks" => Err(RpcError::new(
            UNSUPPORTED_OPERATION,
            "ListTasks is not supported yet",
        )),
        "CreateTaskPushNotificationConfig"
        | "GetTaskPushNotificationConfig"
        | "ListTaskPushNotificationConfigs"
        | "DeleteTaskPushNotificationConfig" => Err(RpcError::new(
            PUSH_NOTIFICATION_NOT_SUPPORTED,
            "push notifications are not supported",
        )),
        "GetExtendedAgentCard" => Err(RpcError::new(
            EXTENDED_CARD_NOT_CONFIGURED,
            "no extended agent card is configured",
        )),
        other => Err(RpcError::new(
            METHOD_NOT_FOUND,
            format!("method not found: {other}"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_1_0_and_1_0_x_are_supported_others_are_not() {
        for ok in ["1.0", "1.0.0", "1.0.12", " 1.0 "] {
            assert!(version_supported(ok), "{ok}");
        }
        for bad in ["", "1", "1.1", "2.0", "0.9", "0.3", "1.0.", "1.0.x", "9.9"] {
            assert!(!version_supported(bad), "{bad}");
        }
    }
}
