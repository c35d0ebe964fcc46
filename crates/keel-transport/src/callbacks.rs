//! The callback route of asynchronous tools (seed 004, RAP): `POST /callbacks/{call_id}`
//! with the call's secret in the `x-keel-callback-secret` header and a JSON body, either the
//! call's one result `{"kind": "result", "output": <any>, "is_error": <bool, default false>}`
//! (`kind` may be left out) or, any number of times before it, a progress report
//! `{"kind": "event", "event": <any>}`, which the task's stream subscribers receive as a
//! `working` status update and the run's event sinks as `tool.async.progress`, or a
//! subscription event `{"kind": "subscription", "event": <any>}`, before or after the result,
//! which is queued as input to the call's thread and wakes the model (seed 004).
//!
//! The route needs no other credentials and works for every tenant: the call is found by its
//! id alone and the per-call secret proves the caller is the tool that got the invocation, so
//! the result lands in the tenant that dispatched the call (never one the caller names).
//!
//! Answers `202 Accepted` when the result is recorded and its task queued; an unknown call is
//! `404`, a wrong or missing secret `401`, a late or duplicate result `409`, progress after the
//! result `409` (`result_delivered`), an unknown `kind` `400`, each with a JSON body
//! `{"error": {"code": "...", "message": "..."}}`, and none of them changes anything.
//!
//! [`HttpCallbacks`] is the other half, for the engine (which knows no HTTP): it names this
//! route as the callback address of each call, and POSTs invocations to tools' endpoints.

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use axum::{Json, Router};
use keel_agent::{
    AgentExecutor, AsyncInvocation, CallbackAddress, CallbackDispatcher, CallbackError,
    InvocationSender, CALLBACK_SECRET_HEADER,
};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::variables::refuse;

/// The body a tool posts back.
#[derive(Debug, Deserialize)]
struct CallbackBody {
    /// `result` (the default), `event` or `subscription`.
    #[serde(default)]
    kind: Option<String>,
    #[serde(default)]
    output: Value,
    #[serde(default)]
    is_error: bool,
    /// A progress report (kind `event`) or a subscription event (kind `subscription`).
    #[serde(default)]
    event: Value,
}

/// The callback routes for `executor`'s asynchronous tools, for calls of every tenant.
pub fn router(executor: AgentExecutor) -> Router {
    Router::new()
        .route("/callbacks/{call_id}", post(deliver))
        .with_state(executor)
}

async fn deliver(
    State(executor): State<AgentExecutor>,
    Path(call_id): Path<String>,
    headers: HeaderMap,
    body: Option<Json<CallbackBody>>,
) -> Response {
    let Some(secret) = headers
        .get(CALLBACK_SECRET_HEADER)
        .and_then(|v| v.to_str().ok())
    else {
        return refuse(
            StatusCode::UNAUTHORIZED,
            "forbidden",
            format!("the `{CALLBACK_SECRET_HEADER}` header is missing"),
        );
    };
    let Some(Json(body)) = body else {
        return refuse(
            StatusCode::BAD_REQUEST,
            "invalid_body",
            "the body must be JSON: {\"output\": ..., \"is_error\": false}",
        );
    };
    let kind = body.kind.as_deref().unwrap_or("result");
    let delivered = match kind {
        "result" => {
            executor
                .deliver_tool_result(&call_id, secret, body.output, body.is_error)
                .await
        }
        "event" => {
            executor
                .deliver_tool_progress(&call_id, secret, body.event)
                .await
        }
        "subscription" => {
            executor
                .deliver_subscription_event(&call_id, secret, body.event)
                .await
        }
        other => {
            return refuse(
                StatusCode::BAD_REQUEST,
                "invalid_kind",
                format!("`kind` is `result`, `event` or `subscription`, not `{other}`"),
            )
        }
    };
    match delivered {
        Ok(accepted) => (
            StatusCode::ACCEPTED,
            Json(json!({
                "call_id": call_id,
                "task_id": accepted.task_id.as_str(),
                "kind": kind,
                "status": "accepted",
            })),
        )
            .into_response(),
        Err(err) => {
            let (status, code) = match &err {
                CallbackError::UnknownCall { .. } => (StatusCode::NOT_FOUND, "unknown_call"),
                CallbackError::Forbidden { .. } => (StatusCode::UNAUTHORIZED, "forbidden"),
                CallbackError::Duplicate { .. } => (StatusCode::CONFLICT, "duplicate"),
                CallbackError::Late { .. } => (StatusCode::CONFLICT, "late"),
                CallbackError::AfterResult { .. } => (StatusCode::CONFLICT, "result_delivered"),
                CallbackError::Agent(_) => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
            };
            refuse(status, code, err.to_string())
        }
    }
}

/// How long a tool's endpoint has to acknowledge an invocation.
const DISPATCH_TIMEOUT: Duration = Duration::from_secs(30);

/// Asynchronous tools over HTTP, for
/// [`ExecutorConfig::callbacks`](keel_agent::ExecutorConfig::callbacks): each call's callback
/// address is `{base}/callbacks/{call_id}` (the route [`router`] serves under `base`), and
/// each invocation is POSTed as JSON to the tool's endpoint, which must answer 2xx at once.
///
/// ```
/// use keel_agent::ExecutorConfig;
/// use keel_transport::callbacks::HttpCallbacks;
/// let config = ExecutorConfig {
///     callbacks: Some(HttpCallbacks::shared("http://127.0.0.1:8080")),
///     ..ExecutorConfig::default()
/// };
/// # let _ = config;
/// ```
#[derive(Debug, Clone)]
pub struct HttpCallbacks {
    base: String,
    client: reqwest::Client,
}

impl HttpCallbacks {
    /// Callbacks to the server at `base` (the URL [`router`] is served under).
    pub fn new(base: impl Into<String>) -> Self {
        Self {
            base: base.into().trim_end_matches('/').to_owned(),
            client: reqwest::Client::new(),
        }
    }

    /// [`HttpCallbacks::new`], shared as an executor's configuration takes it.
    pub fn shared(base: impl Into<String>) -> Arc<dyn CallbackDispatcher> {
        Arc::new(Self::new(base))
    }
}

impl CallbackAddress for HttpCallbacks {
    fn callback_url(&self, call_id: &str) -> String {
        format!("{}/callbacks/{call_id}", self.base)
    }
}

#[async_trait]
impl InvocationSender for HttpCallbacks {
    async fn send(&self, endpoint: &str, invocation: &AsyncInvocation) -> Result<(), String> {
        let response = self
            .client
            .post(endpoint)
            .json(invocation)
            .timeout(DISPATCH_TIMEOUT)
            .send()
            .await
            .map_err(|err| format!("dispatch to {endpoint} failed: {err}"))?;
        if !response.status().is_success() {
            return Err(format!(
                "{endpoint} did not acknowledge the call: HTTP {}",
                response.status()
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_callback_address_is_the_route_under_the_base() {
        let callbacks = HttpCallbacks::new("http://keel.example/api/");
        assert_eq!(
            callbacks.callback_url("acall-1"),
            "http://keel.example/api/callbacks/acall-1"
        );
    }
}
