//! The operator API beside A2A, under `/api/v1`: what an operator reads to watch runs and
//! what it does to steer them (docs/operator-api.md lists every route). Lists (agents,
//! threads, tasks, approvals, runs) and one thread, task or run are in `lists`; approving,
//! canceling, sending a message and compacting a thread in `act`; a task's or a thread's
//! live events over SSE in `events`; the bodies and answers as types, from which the OpenAPI
//! document at `/api/v1/openapi.json` is derived, in `schema`.
//!
//! The caller's tenant comes from its credentials, as on every other route (see
//! `threads.rs`); another tenant's ids answer `404`, the same as ids that never existed.
//! Everything is read through the engine's read-and-watch API ([`Reads`]) and done through
//! the executor, never a store. Errors carry `{"error": {"code", "message"}}`.

mod act;
mod events;
mod lists;
mod schema;

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Json, Query, Request};
use axum::handler::Handler;
use axum::http::request::Parts;
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, MethodRouter};
use axum::Router;
use keel_agent::reads::Reads;
use keel_agent::AgentExecutor;
use keel_core::AgentError;
use keel_runtime::AuthContext;
use serde::de::DeserializeOwned;
use serde::Serialize;
use utoipa::OpenApi;

use crate::handlers::Handlers;
use crate::security::Security;
use crate::threads::input_or_thread_refusal;
use crate::variables::{caller_of, internal, refuse};

/// The longest id a route takes.
const MAX_ID_BYTES: usize = 256;

/// An agent the operator API lists and sends messages to: its name on the server, the URL
/// it is served at and the A2A operations over its executor.
#[derive(Clone)]
pub(crate) struct OperatorAgent {
    name: String,
    url: String,
    handlers: Handlers,
}

impl OperatorAgent {
    /// The agent served as `name` at `url` through `handlers`.
    pub(crate) fn new(name: impl Into<String>, url: impl Into<String>, handlers: Handlers) -> Self {
        Self {
            name: name.into(),
            url: url.into(),
            handlers,
        }
    }

    /// Its name on the server.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }
}

#[derive(Clone)]
struct OperatorState {
    reads: Reads,
    security: Option<Security>,
    executor: AgentExecutor,
    /// The server's agents, the default first.
    agents: Arc<Vec<OperatorAgent>>,
    /// Their runs' model calls, for the task streams.
    live: events::LiveRunEvents,
}

impl OperatorState {
    /// The caller's tenant, or the `401` answer.
    fn caller(&self, headers: &HeaderMap) -> Result<AuthContext, Box<Response>> {
        caller_of(&self.reads, self.security.as_ref(), headers, None)
    }
}

/// The OpenAPI document of the operator routes, derived from the handlers' annotations.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "Keel operator API",
        description = "Watch and steer a Keel server's runs: see docs/operator-api.md."
    ),
    paths(
        lists::agents,
        lists::threads,
        lists::thread,
        lists::tasks,
        lists::task,
        lists::task_messages,
        lists::approvals,
        lists::runs,
        lists::run,
        act::cancel,
        act::decide,
        act::message,
        act::compact,
        events::task_events,
        events::thread_events,
        openapi,
    ),
    components(schemas(schema::ErrorBody, schema::EventView))
)]
struct OperatorDoc;

/// One route: its method, its path (OpenAPI's syntax is axum's) and its handler.
struct Route {
    // Read by the test that checks the document: the router takes it from the handler.
    #[cfg_attr(not(test), allow(dead_code))]
    method: Method,
    path: &'static str,
    handler: MethodRouter<OperatorState>,
}

fn reading<H: Handler<T, OperatorState>, T: 'static>(path: &'static str, handler: H) -> Route {
    Route {
        method: Method::GET,
        path,
        handler: get(handler),
    }
}

fn acting<H: Handler<T, OperatorState>, T: 'static>(path: &'static str, handler: H) -> Route {
    Route {
        method: Method::POST,
        path,
        handler: post(handler),
    }
}

/// Every operator route: the router is built from this list only, so the test that finds
/// each of them in [`OperatorDoc`] covers the router.
fn routes() -> Vec<Route> {
    vec![
        reading("/api/v1/agents", lists::agents),
        reading("/api/v1/threads", lists::threads),
        reading("/api/v1/threads/{thread_id}", lists::thread),
        reading("/api/v1/tasks", lists::tasks),
        reading("/api/v1/tasks/{task_id}", lists::task),
        reading("/api/v1/tasks/{task_id}/messages", lists::task_messages),
        reading("/api/v1/approvals", lists::approvals),
        reading("/api/v1/runs", lists::runs),
        reading("/api/v1/runs/{run_id}", lists::run),
        acting("/api/v1/tasks/{task_id}/cancel", act::cancel),
        acting(
            "/api/v1/tasks/{task_id}/approvals/{request_id}",
            act::decide,
        ),
        acting("/api/v1/threads/{thread_id}/messages", act::message),
        acting("/api/v1/threads/{thread_id}/compact", act::compact),
        reading("/api/v1/tasks/{task_id}/events", events::task_events),
        reading("/api/v1/threads/{thread_id}/events", events::thread_events),
        reading("/api/v1/openapi.json", openapi),
    ]
}

/// The operator routes over `executor`'s stores; `agents` are the server's agents, the
/// default (`executor`'s) first; `security` as the rest of the server.
pub(crate) fn router(
    executor: &AgentExecutor,
    security: Option<Security>,
    agents: Vec<OperatorAgent>,
) -> Router {
    let live = events::LiveRunEvents::new();
    // The default agent is the first of `agents`; a server that lists none serves `executor`.
    if agents.is_empty() {
        executor.add_event_sink(Arc::new(live.clone()));
    }
    for agent in &agents {
        agent
            .handlers
            .executor()
            .add_event_sink(Arc::new(live.clone()));
    }
    let state = OperatorState {
        reads: executor.reads(),
        security,
        executor: executor.clone(),
        agents: Arc::new(agents),
        live,
    };
    routes()
        .into_iter()
        .fold(Router::new(), |router, r| router.route(r.path, r.handler))
        .with_state(state)
}

/// The OpenAPI document of the operator API.
#[utoipa::path(get, path = "/api/v1/openapi.json", tag = "operator",
    responses((status = 200, description = "The OpenAPI 3.1 document", body = Object)))]
async fn openapi() -> Response {
    Json(OperatorDoc::openapi()).into_response()
}

/// The answer to an engine error.
fn failure(err: &AgentError) -> Response {
    match err {
        AgentError::TaskNotFound { .. } => {
            refuse(StatusCode::NOT_FOUND, "task_not_found", err.to_string())
        }
        AgentError::TaskNotCancelable { .. } => {
            refuse(StatusCode::CONFLICT, "task_not_cancelable", err.to_string())
        }
        AgentError::Overloaded { .. } => {
            refuse(StatusCode::CONFLICT, "thread_busy", err.to_string())
        }
        _ => input_or_thread_refusal(err).unwrap_or_else(|| internal(err, "operator")),
    }
}

/// The typed id a route takes when it is not blank, at most [`MAX_ID_BYTES`] and free of
/// control characters; else `400 invalid_id` naming which id.
fn check_id<Id: From<String>>(which: &str, id: String) -> Result<Id, Box<Response>> {
    if id.trim().is_empty() || id.len() > MAX_ID_BYTES || id.chars().any(char::is_control) {
        return Err(Box::new(refuse(
            StatusCode::BAD_REQUEST,
            "invalid_id",
            format!("`{which}` must be 1 to {MAX_ID_BYTES} bytes without control characters"),
        )));
    }
    Ok(Id::from(id))
}

/// The caller's tenant, from its credentials: the first extractor of every handler, so a
/// request without valid ones answers `401` before anything else is looked at.
struct Caller(AuthContext);

impl FromRequestParts<OperatorState> for Caller {
    type Rejection = Response;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &OperatorState,
    ) -> Result<Self, Response> {
        state.caller(&parts.headers).map(Caller).map_err(|r| *r)
    }
}

/// The query string as `T`, or `400 invalid_query` saying why.
struct Asked<T>(T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for Asked<T> {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Response> {
        match Query::<T>::from_request_parts(parts, state).await {
            Ok(Query(asked)) => Ok(Asked(asked)),
            Err(rejection) => Err(refuse(
                StatusCode::BAD_REQUEST,
                "invalid_query",
                format!("the query is malformed: {}", rejection.body_text()),
            )),
        }
    }
}

/// The JSON body as `T`, or `400 invalid_body` saying why.
struct Body<T>(T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for Body<T> {
    type Rejection = Response;

    async fn from_request(request: Request, state: &S) -> Result<Self, Response> {
        parse_body(&body_bytes(request, state).await?)
            .map(Body)
            .map_err(|r| *r)
    }
}

/// An optional JSON body: `None` when empty, else `T` or `400 invalid_body`.
struct OptionalBody<T>(Option<T>);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for OptionalBody<T> {
    type Rejection = Response;

    async fn from_request(request: Request, state: &S) -> Result<Self, Response> {
        let bytes = body_bytes(request, state).await?;
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(OptionalBody(None));
        }
        parse_body(&bytes)
            .map(|body| OptionalBody(Some(body)))
            .map_err(|r| *r)
    }
}

async fn body_bytes<S: Send + Sync>(request: Request, state: &S) -> Result<Bytes, Response> {
    Bytes::from_request(request, state)
        .await
        .map_err(IntoResponse::into_response)
}

fn parse_body<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, Box<Response>> {
    serde_json::from_slice(bytes).map_err(|err| {
        Box::new(refuse(
            StatusCode::BAD_REQUEST,
            "invalid_body",
            format!("the body is not the JSON this route takes: {err}"),
        ))
    })
}

/// An engine answer as JSON, or its error's answer.
fn answer<T: Serialize>(result: Result<T, AgentError>) -> Response {
    match result {
        Ok(value) => Json(value).into_response(),
        Err(err) => failure(&err),
    }
}

/// Unwraps a step's answer, returning the refusal from the handler.
macro_rules! tri {
    ($e:expr) => {
        match $e {
            Ok(value) => value,
            Err(response) => return *response,
        }
    };
}
pub(crate) use tri;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_route_of_the_router_is_in_the_openapi_document() {
        let doc = OperatorDoc::openapi();
        for r in routes() {
            let item = doc
                .paths
                .paths
                .get(r.path)
                .unwrap_or_else(|| panic!("{} is not in the document", r.path));
            let operation = match r.method {
                Method::GET => item.get.as_ref(),
                Method::POST => item.post.as_ref(),
                _ => None,
            };
            assert!(
                operation.is_some(),
                "{} {} is not documented",
                r.method,
                r.path
            );
        }
        assert_eq!(
            doc.paths.paths.len(),
            routes().len(),
            "no documented route is unserved"
        );
    }
}
