//! The callback route of asynchronous tools (seed 004, RAP): `POST /callbacks/{call_id}`
//! with the call's secret in the `x-keel-callback-secret` header and a JSON body
//! `{"output": <any>, "is_error": <bool, default false>}`.
//!
//! The route needs no other credentials and works for every tenant: the call is found by its
//! id alone and the per-call secret proves the caller is the tool that got the invocation, so
//! the result lands in the tenant that dispatched the call (never one the caller names).
//!
//! Answers `202 Accepted` when the result is recorded and its task queued; an unknown call is
//! `404`, a wrong or missing secret `401`, a late or duplicate result `409`, each with a JSON
//! body `{"error": {"code": "...", "message": "..."}}`, and none of them changes anything.

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use keel_agent::{AgentExecutor, CallbackError, CALLBACK_SECRET_HEADER};
use serde::Deserialize;
use serde_json::{json, Value};

/// The body a tool posts back.
#[derive(Debug, Deserialize)]
struct CallbackBody {
    #[serde(default)]
    output: Value,
    #[serde(default)]
    is_error: bool,
}

/// The callback routes for `executor`'s asynchronous tools, for calls of every tenant.
pub fn router(executor: AgentExecutor) -> Router {
    Router::new()
        .route("/callbacks/{call_id}", post(deliver))
        .with_state(executor)
}

fn refuse(status: StatusCode, code: &str, message: String) -> Response {
    (
        status,
        Json(json!({"error": {"code": code, "message": message}})),
    )
        .into_response()
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
            "the body must be JSON: {\"output\": ..., \"is_error\": false}".into(),
        );
    };
    match executor
        .deliver_tool_result(&call_id, secret, body.output, body.is_error)
        .await
    {
        Ok(accepted) => (
            StatusCode::ACCEPTED,
            Json(json!({"call_id": call_id, "task_id": accepted.task_id.as_str(), "status": "accepted"})),
        )
            .into_response(),
        Err(err) => {
            let (status, code) = match &err {
                CallbackError::UnknownCall { .. } => (StatusCode::NOT_FOUND, "unknown_call"),
                CallbackError::Forbidden { .. } => (StatusCode::UNAUTHORIZED, "forbidden"),
                CallbackError::Duplicate { .. } => (StatusCode::CONFLICT, "duplicate"),
                CallbackError::Late { .. } => (StatusCode::CONFLICT, "late"),
                CallbackError::Agent(_) => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
            };
            refuse(status, code, err.to_string())
        }
    }
}
