//! The scoped-variable completion flow of subagents (Standard Agents §7.5):
//! `GET /threads/{parent_thread_id}/variables/{request_id}` describes which variables a
//! deferred subagent still needs, and `POST` on the same path with a JSON body
//! `{"variables": {"NAME": "value"}}` stores them (sealed, in the new child's thread) and
//! starts the subagent at once. Both also answer under `/{tenant}/`.
//!
//! The caller's tenant comes from its credentials, as on every other route; the request is
//! looked up in that tenant only, so another tenant's request is simply not found. Answers:
//! `200` with the pending request (GET), `201` with the started child (POST), `404` for an
//! unknown or completed request, `400` for a body that is not JSON or lacks a variable,
//! `401` without valid credentials; errors carry `{"error": {"code", "message"}}`. A value is
//! never echoed back.

use std::collections::HashMap;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use keel_agent::reads::Reads;
use keel_agent::AgentExecutor;
use keel_core::{AgentError, ThreadId};
use keel_runtime::AuthContext;
use serde::Deserialize;
use serde_json::json;

use crate::security::{self, Denied, Security};

/// The path of the completion flow.
pub const VARIABLES_PATH: &str = "/threads/{parent_thread_id}/variables/{request_id}";

#[derive(Clone)]
struct VariablesState {
    executor: AgentExecutor,
    reads: Reads,
    security: Option<Security>,
}

/// The body of a `POST`.
#[derive(Debug, Deserialize)]
struct ProvideBody {
    variables: HashMap<String, String>,
}

/// The completion routes for `executor`'s subagents; `security` as the rest of the server.
pub(crate) fn router(executor: AgentExecutor, security: Option<Security>) -> Router {
    Router::new()
        .route(VARIABLES_PATH, get(describe).post(provide))
        .route(
            "/{tenant}/threads/{parent_thread_id}/variables/{request_id}",
            get(describe_in_tenant).post(provide_in_tenant),
        )
        .with_state(VariablesState {
            reads: executor.reads(),
            executor,
            security,
        })
}

pub(crate) fn refuse(status: StatusCode, code: &str, message: impl Into<String>) -> Response {
    (
        status,
        Json(json!({"error": {"code": code, "message": message.into()}})),
    )
        .into_response()
}

fn caller(
    state: &VariablesState,
    headers: &HeaderMap,
    tenant: Option<String>,
) -> Result<AuthContext, Box<Response>> {
    caller_of(&state.reads, state.security.as_ref(), headers, tenant)
}

/// The tenant of a request to one of the server's plain HTTP routes, from its credentials as
/// on every other route, or the answer that refuses it.
pub(crate) fn caller_of(
    reads: &Reads,
    security: Option<&Security>,
    headers: &HeaderMap,
    tenant: Option<String>,
) -> Result<AuthContext, Box<Response>> {
    let credentials = security::credentials(headers, security, tenant);
    match security::authenticate(reads, security, &credentials) {
        Ok(context) => Ok(context),
        Err(Denied::Unauthenticated(reason)) => {
            Err(Box::new(security::unauthorized(security, reason, false)))
        }
        Err(Denied::Failed(error)) => Err(Box::new(refuse(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            error.message,
        ))),
    }
}

fn failure(err: &AgentError) -> Response {
    match err {
        AgentError::InvalidInput { .. } | AgentError::ToolFailed { .. } => refuse(
            StatusCode::BAD_REQUEST,
            "invalid_variables",
            err.to_string(),
        ),
        AgentError::ThreadTerminated { .. } => {
            refuse(StatusCode::CONFLICT, "thread_terminated", err.to_string())
        }
        _ => internal(err, "scoped-variable"),
    }
}

/// `500` for an error a plain HTTP route does not explain to its caller (it goes to the log,
/// naming the `route`).
pub(crate) fn internal(err: &AgentError, route: &str) -> Response {
    tracing::warn!(error = %err, route, "request failed");
    refuse(
        StatusCode::INTERNAL_SERVER_ERROR,
        "internal",
        "the request could not be completed",
    )
}

fn not_found(request_id: &str) -> Response {
    refuse(
        StatusCode::NOT_FOUND,
        "unknown_request",
        format!("there is no pending variable request `{request_id}` on this thread"),
    )
}

async fn describe(
    State(state): State<VariablesState>,
    Path((parent, request_id)): Path<(String, String)>,
    headers: HeaderMap,
) -> Response {
    describe_as(state, headers, None, parent, request_id).await
}

async fn describe_in_tenant(
    State(state): State<VariablesState>,
    Path((tenant, parent, request_id)): Path<(String, String, String)>,
    headers: HeaderMap,
) -> Response {
    describe_as(state, headers, Some(tenant), parent, request_id).await
}

async fn describe_as(
    state: VariablesState,
    headers: HeaderMap,
    tenant: Option<String>,
    parent: String,
    request_id: String,
) -> Response {
    let auth = match caller(&state, &headers, tenant) {
        Ok(auth) => auth,
        Err(response) => return *response,
    };
    match state
        .executor
        .pending_variables(&auth, &ThreadId::from(parent), &request_id)
        .await
    {
        Ok(Some(pending)) => (StatusCode::OK, Json(pending)).into_response(),
        Ok(None) => not_found(&request_id),
        Err(err) => failure(&err),
    }
}

async fn provide(
    State(state): State<VariablesState>,
    Path((parent, request_id)): Path<(String, String)>,
    headers: HeaderMap,
    body: Option<Json<ProvideBody>>,
) -> Response {
    provide_as(state, headers, None, parent, request_id, body).await
}

async fn provide_in_tenant(
    State(state): State<VariablesState>,
    Path((tenant, parent, request_id)): Path<(String, String, String)>,
    headers: HeaderMap,
    body: Option<Json<ProvideBody>>,
) -> Response {
    provide_as(state, headers, Some(tenant), parent, request_id, body).await
}

async fn provide_as(
    state: VariablesState,
    headers: HeaderMap,
    tenant: Option<String>,
    parent: String,
    request_id: String,
    body: Option<Json<ProvideBody>>,
) -> Response {
    // Credentials are checked before the body is looked at.
    let auth = match caller(&state, &headers, tenant) {
        Ok(auth) => auth,
        Err(response) => return *response,
    };
    let Some(Json(body)) = body else {
        return refuse(
            StatusCode::BAD_REQUEST,
            "invalid_body",
            "the body must be JSON: {\"variables\": {\"NAME\": \"value\"}}",
        );
    };
    match state
        .executor
        .provide_variables(&auth, &ThreadId::from(parent), &request_id, &body.variables)
        .await
    {
        Ok(Some(child)) => (
            StatusCode::CREATED,
            Json(json!({
                "request_id": request_id,
                "status": "started",
                "child": {
                    "thread_id": child.thread_id,
                    "name": child.name,
                    "agent": child.agent,
                    "parent_thread_id": child.parent_thread_id,
                },
            })),
        )
            .into_response(),
        Ok(None) => not_found(&request_id),
        Err(err) => failure(&err),
    }
}
