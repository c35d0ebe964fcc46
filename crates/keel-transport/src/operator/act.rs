//! The operator API's actions: cancel a task, approve or deny its pending action, send a
//! message to a thread (through the A2A send path) and compact a thread's history.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use keel_agent::SendOutcome;
use keel_core::{AgentError, ApprovalDecision, ApprovalOutcome, Message, TaskId, ThreadId};
use keel_llm::HistoryCompactionRequest;

use super::schema::{CancelBody, Decision, DecisionBody, ErrorBody, MessageBody};
use super::{answer, check_id, failure, tri, Body, Caller, OperatorState, OptionalBody};
use crate::variables::refuse;
use crate::wire::SendMessageCall;

/// Cancel a task.
#[utoipa::path(post, path = "/api/v1/tasks/{task_id}/cancel", tag = "operator",
    params(("task_id" = String, Path, description = "The task")),
    request_body(content = CancelBody, description = "Optional: why"),
    responses(
        (status = 200, body = Object, description = "The canceled task"),
        (status = 400, body = ErrorBody, description = "`invalid_id`, `invalid_body`"),
        (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody, description = "`task_not_found`"),
        (status = 409, body = ErrorBody, description = "`task_not_cancelable`"),
    ))]
pub(super) async fn cancel(
    State(state): State<OperatorState>,
    Caller(auth): Caller,
    Path(task_id): Path<String>,
    OptionalBody(asked): OptionalBody<CancelBody>,
) -> Response {
    let task_id: TaskId = tri!(check_id("task_id", task_id));
    let reason = asked.and_then(|b| b.reason);
    answer(state.executor.cancel_task(&auth, &task_id, reason).await)
}

/// Approve or deny the action a task waits on; answers the task once it rests again.
#[utoipa::path(post, path = "/api/v1/tasks/{task_id}/approvals/{request_id}", tag = "operator",
    params(
        ("task_id" = String, Path, description = "The task that waits"),
        ("request_id" = String, Path, description = "The pending request's `request_id`"),
    ),
    request_body = DecisionBody,
    responses(
        (status = 200, body = Object, description = "The task, once it rests again"),
        (status = 400, body = ErrorBody, description = "`invalid_id`, `invalid_body`"),
        (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody, description = "`task_not_found`, `approval_not_found`"),
        (status = 409, body = ErrorBody, description = "`not_awaiting_approval`"),
    ))]
pub(super) async fn decide(
    State(state): State<OperatorState>,
    Caller(auth): Caller,
    Path((task_id, request_id)): Path<(String, String)>,
    Body(asked): Body<DecisionBody>,
) -> Response {
    let task_id: TaskId = tri!(check_id("task_id", task_id));
    let request_id = tri!(check_id("request_id", request_id));
    let decision = ApprovalDecision {
        request_id,
        outcome: match asked.decision {
            Decision::Approve => ApprovalOutcome::Approved,
            Decision::Deny => ApprovalOutcome::Denied,
        },
        reason: asked.reason,
        decided_by: Some(auth.user_name.clone()),
        decided_at: chrono::Utc::now(),
    };
    match state
        .executor
        .decide_approval(&auth, &task_id, decision)
        .await
    {
        Ok(task) => Json(task).into_response(),
        // The engine names the field it refused: the task (it waits for no approval) or the
        // decision's request id (it waits for another one).
        Err(AgentError::InvalidInput { field, reason }) if field == "task_id" => {
            refuse(StatusCode::CONFLICT, "not_awaiting_approval", reason)
        }
        Err(AgentError::InvalidInput { reason, .. }) => {
            refuse(StatusCode::NOT_FOUND, "approval_not_found", reason)
        }
        Err(err) => failure(&err),
    }
}

/// Send a message to a thread, as A2A `SendMessage` does; answers the task.
#[utoipa::path(post, path = "/api/v1/threads/{thread_id}/messages", tag = "operator",
    params(("thread_id" = String, Path, description = "The thread (started when new)")),
    request_body = MessageBody,
    responses(
        (status = 200, body = Object,
            description = "The task (once its turn rests unless `return_immediately`)"),
        (status = 400, body = ErrorBody,
            description = "`invalid_id`, `invalid_body`, `unknown_agent`, `invalid_argument`"),
        (status = 401, body = ErrorBody),
    ))]
pub(super) async fn message(
    State(state): State<OperatorState>,
    Caller(auth): Caller,
    Path(thread_id): Path<String>,
    Body(asked): Body<MessageBody>,
) -> Response {
    let thread_id: ThreadId = tri!(check_id("thread_id", thread_id));
    if asked.text.trim().is_empty() {
        return refuse(
            StatusCode::BAD_REQUEST,
            "invalid_body",
            "`text` must not be blank",
        );
    }
    let agent = match &asked.agent {
        None => state.agents.first(),
        Some(name) => state.agents.iter().find(|a| &a.name == name),
    };
    let Some(agent) = agent else {
        return refuse(
            StatusCode::BAD_REQUEST,
            "unknown_agent",
            format!(
                "no agent `{}` on this server",
                asked.agent.unwrap_or_default()
            ),
        );
    };
    let mut message = Message::user(asked.text);
    message.thread_id = Some(thread_id);
    let call = SendMessageCall {
        message,
        return_immediately: asked.return_immediately,
        history_length: None,
        push_config: None,
    };
    match agent.handlers.send_admitted(&auth, call).await {
        Ok(SendOutcome::Task(task)) => Json(task).into_response(),
        Ok(SendOutcome::Message(message)) => Json(message).into_response(),
        Err(err) => {
            // The send path speaks A2A's errors: answered with the HTTP+JSON binding's
            // status and its status name as the code.
            let (status, name) = crate::jsonrpc::rest_status(err.code);
            refuse(
                StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
                &name.to_ascii_lowercase(),
                err.message,
            )
        }
    }
}

/// Compact a thread's history (the thread must be idle).
#[utoipa::path(post, path = "/api/v1/threads/{thread_id}/compact", tag = "operator",
    params(("thread_id" = String, Path, description = "The thread")),
    request_body(content = Object,
        description = "Optional: a HistoryCompactionRequest (`strategy`, `max_messages`, ...)"),
    responses(
        (status = 200, body = Object, description = "The HistoryCompactionResult"),
        (status = 400, body = ErrorBody, description = "`invalid_id`, `invalid_body`"),
        (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody, description = "`thread_not_found`"),
        (status = 409, body = ErrorBody, description = "`thread_busy`"),
    ))]
pub(super) async fn compact(
    State(state): State<OperatorState>,
    Caller(auth): Caller,
    Path(thread_id): Path<String>,
    OptionalBody(asked): OptionalBody<HistoryCompactionRequest>,
) -> Response {
    let thread_id: ThreadId = tri!(check_id("thread_id", thread_id));
    let request = asked.unwrap_or_default();
    let compacted = async {
        // Compaction of a thread the tenant has nothing of would answer "nothing removed":
        // it is unknown to this caller, as on every other route.
        state.reads.thread(&auth, &thread_id).await?;
        state
            .executor
            .compact_thread(&auth, &thread_id, &request)
            .await
    };
    answer(compacted.await)
}
