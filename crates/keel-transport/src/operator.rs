//! The operator API beside A2A, under `/api/v1`: what an operator reads to watch runs.
//! `GET /api/v1/tasks` lists tasks (`thread_id`, `state`, `agent`, `page_size`,
//! `page_token`, paged by the engine), `GET /api/v1/approvals` the actions waiting for a
//! decision, `GET /api/v1/runs/{run_id}` one run's report, redacted as persisted, and
//! `POST /api/v1/tasks/{task_id}/cancel` (body optional: `{"reason": "..."}`) cancels a
//! task (`409` once it is finished).
//!
//! The caller's tenant comes from its credentials, as on every other route (see
//! `threads.rs`); another tenant's run answers `404`, the same as one that never existed.
//! Bad queries answer `400`; errors carry `{"error": {"code", "message"}}`.

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use keel_agent::reads::{Reads, TaskQuery};
use keel_agent::AgentExecutor;
use keel_core::{AgentError, RunId, TaskId, TaskState, ThreadId};
use serde::Deserialize;
use serde_json::json;

use crate::security::Security;
use crate::variables::{caller_of, internal, refuse};

#[derive(Clone)]
struct OperatorState {
    reads: Reads,
    security: Option<Security>,
    executor: AgentExecutor,
}

/// The optional body of `POST /api/v1/tasks/{task_id}/cancel`.
#[derive(Debug, Deserialize)]
struct CancelBody {
    reason: Option<String>,
}

/// The query of `GET /api/v1/tasks` and `GET /api/v1/approvals`.
#[derive(Debug, Deserialize)]
struct ListQuery {
    thread_id: Option<String>,
    state: Option<String>,
    agent: Option<String>,
    page_size: Option<u32>,
    page_token: Option<String>,
}

/// The operator routes over `executor`'s stores; `security` as the rest of the server.
pub(crate) fn router(executor: &AgentExecutor, security: Option<Security>) -> Router {
    Router::new()
        .route("/api/v1/tasks", get(tasks))
        .route("/api/v1/approvals", get(approvals))
        .route("/api/v1/runs/{run_id}", get(run))
        .route("/api/v1/tasks/{task_id}/cancel", post(cancel))
        .with_state(OperatorState {
            reads: executor.reads(),
            security,
            executor: executor.clone(),
        })
}

fn failure(err: &AgentError) -> Response {
    match err {
        AgentError::InvalidInput { .. } => {
            refuse(StatusCode::BAD_REQUEST, "invalid_input", err.to_string())
        }
        AgentError::TaskNotFound { .. } => {
            refuse(StatusCode::NOT_FOUND, "task_not_found", err.to_string())
        }
        AgentError::TaskNotCancelable { .. } => {
            refuse(StatusCode::CONFLICT, "task_not_cancelable", err.to_string())
        }
        _ => internal(err, "operator"),
    }
}

/// Who asks, and what a list route was asked: the caller's tenant and the query, or the
/// answer (`401`, or `400 invalid_query`).
fn open_list(
    state: &OperatorState,
    headers: &HeaderMap,
    query: Result<Query<ListQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<(keel_runtime::AuthContext, ListQuery), Box<Response>> {
    let auth = caller_of(&state.reads, state.security.as_ref(), headers, None)?;
    let Ok(Query(query)) = query else {
        return Err(Box::new(refuse(
            StatusCode::BAD_REQUEST,
            "invalid_query",
            "the query is malformed",
        )));
    };
    Ok((auth, query))
}

async fn tasks(
    State(state): State<OperatorState>,
    headers: HeaderMap,
    query: Result<Query<ListQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let (auth, query) = match open_list(&state, &headers, query) {
        Ok(opened) => opened,
        Err(response) => return *response,
    };
    let task_state = match query.state.as_deref().map(str::parse::<TaskState>) {
        None => None,
        Some(Ok(parsed)) => Some(parsed),
        Some(Err(_)) => {
            return refuse(
                StatusCode::BAD_REQUEST,
                "invalid_state",
                format!("unknown task state {:?}", query.state.unwrap_or_default()),
            )
        }
    };
    let task_query = TaskQuery {
        thread_id: query.thread_id.map(ThreadId::from),
        state: task_state,
        agent: query.agent,
        page_size: query.page_size,
        page_token: query.page_token,
        ..TaskQuery::default()
    };
    match state.reads.tasks(&auth, &task_query).await {
        Ok(page) => Json(json!({
            "tasks": page.items,
            "next_page_token": page.next_page_token,
            "total_size": page.total_size,
        }))
        .into_response(),
        Err(err) => failure(&err),
    }
}

async fn approvals(
    State(state): State<OperatorState>,
    headers: HeaderMap,
    query: Result<Query<ListQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let (auth, query) = match open_list(&state, &headers, query) {
        Ok(opened) => opened,
        Err(response) => return *response,
    };
    let thread_id = query.thread_id.map(ThreadId::from);
    match state
        .reads
        .pending_approvals(&auth, thread_id.as_ref(), query.page_size, query.page_token)
        .await
    {
        Ok(page) => {
            let items: Vec<_> = page
                .items
                .into_iter()
                .map(|p| json!({"task_id": p.task_id, "thread_id": p.thread_id, "request": p.request}))
                .collect();
            Json(json!({
                "approvals": items,
                "next_page_token": page.next_page_token,
                "total_size": page.total_size,
            }))
            .into_response()
        }
        Err(err) => failure(&err),
    }
}

async fn run(
    State(state): State<OperatorState>,
    Path(run_id): Path<String>,
    headers: HeaderMap,
) -> Response {
    let auth = match caller_of(&state.reads, state.security.as_ref(), &headers, None) {
        Ok(auth) => auth,
        Err(response) => return *response,
    };
    if run_id.trim().is_empty() {
        return refuse(
            StatusCode::BAD_REQUEST,
            "invalid_run_id",
            "the run id is empty",
        );
    }
    match state.reads.run(&auth, &RunId::from(run_id)).await {
        Ok(Some(record)) => Json(record).into_response(),
        Ok(None) => refuse(StatusCode::NOT_FOUND, "run_not_found", "no such run"),
        Err(err) => failure(&err),
    }
}

async fn cancel(
    State(state): State<OperatorState>,
    Path(task_id): Path<String>,
    headers: HeaderMap,
    body: Option<Json<CancelBody>>,
) -> Response {
    let auth = match caller_of(&state.reads, state.security.as_ref(), &headers, None) {
        Ok(auth) => auth,
        Err(response) => return *response,
    };
    let reason = body.and_then(|Json(body)| body.reason);
    match state
        .executor
        .cancel_task(&auth, &TaskId::from(task_id), reason)
        .await
    {
        Ok(task) => Json(task).into_response(),
        Err(err) => failure(&err),
    }
}
