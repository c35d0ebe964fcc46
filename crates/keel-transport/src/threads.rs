//! A thread over plain HTTP beside A2A (Standard Agents: state, messages and queue "from
//! endpoints"): `GET /threads/{thread_id}` reads its state, `GET /threads/{thread_id}/messages`
//! its history, `POST` on the same path queues a message (`{"text": "..."}`) as
//! `ThreadState::queue_message` does, and `GET /threads/{thread_id}/queue` lists the work
//! waiting for it. Every route also answers under `/{tenant}/`.
//!
//! The caller's tenant comes from its credentials, as on every other route, and the thread
//! is looked up in that tenant only: a thread another tenant owns is `404`, the same answer
//! as one that never existed, so ids do not leak across tenants. A thread exists once it has
//! history, queued work or stored values. Answers: `200` (reads), `202` with the queued item
//! (POST), `400` for a bad query or body, `401` without valid credentials, `404` for an
//! unknown thread, `409` for a terminated one (POST); errors carry
//! `{"error": {"code", "message"}}`. History entries and queued items are Keel's own JSON
//! (`HistoryEntry`, `QueuedItem`), not A2A.

use axum::extract::{FromRequestParts, Path, Query, State};
use axum::http::request::Parts;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use keel_agent::reads::Reads;
use keel_agent::AgentExecutor;
use keel_core::{AgentError, ThreadId};
use keel_runtime::AuthContext;
use serde::Deserialize;
use serde_json::json;

use crate::operator::tri;
use crate::security::Security;
use crate::variables::{caller_of, internal, refuse};

/// The path of a thread's state.
pub const THREAD_PATH: &str = "/threads/{thread_id}";
/// The path of a thread's messages (its history).
pub const THREAD_MESSAGES_PATH: &str = "/threads/{thread_id}/messages";
/// The path of a thread's queue.
pub const THREAD_QUEUE_PATH: &str = "/threads/{thread_id}/queue";

/// How many history entries or queued items one read returns unless it asks for fewer.
const DEFAULT_PAGE: usize = 100;
/// The most one read may ask for.
const MAX_PAGE: usize = 1000;

#[derive(Clone)]
struct ThreadsState {
    executor: AgentExecutor,
    reads: Reads,
    security: Option<Security>,
}

/// `?after=&limit=` of a read.
#[derive(Debug, Deserialize)]
struct Page {
    #[serde(default)]
    after: u64,
    limit: Option<usize>,
}

impl Page {
    fn limit(&self) -> Result<usize, Box<Response>> {
        match self.limit {
            None => Ok(DEFAULT_PAGE),
            Some(limit) if (1..=MAX_PAGE).contains(&limit) => Ok(limit),
            Some(limit) => Err(Box::new(refuse(
                StatusCode::BAD_REQUEST,
                "invalid_limit",
                format!("limit must be between 1 and {MAX_PAGE}, not {limit}"),
            ))),
        }
    }
}

/// The body of a `POST .../messages`.
#[derive(Debug, Deserialize)]
struct QueueBody {
    text: String,
}

/// The thread routes for `executor`'s threads; `security` as the rest of the server. Each
/// handler serves both forms of its path, with and without the tenant.
pub(crate) fn router(executor: AgentExecutor, security: Option<Security>) -> Router {
    Router::new()
        .route(THREAD_PATH, get(thread_state))
        .route(THREAD_MESSAGES_PATH, get(messages).post(queue))
        .route(THREAD_QUEUE_PATH, get(queue_list))
        .route("/{tenant}/threads/{thread_id}", get(thread_state))
        .route(
            "/{tenant}/threads/{thread_id}/messages",
            get(messages).post(queue),
        )
        .route("/{tenant}/threads/{thread_id}/queue", get(queue_list))
        .with_state(ThreadsState {
            reads: executor.reads(),
            executor,
            security,
        })
}

/// A thread route's path parameters: the tenant only in the `/{tenant}/threads/...` form.
#[derive(Debug, Deserialize)]
struct ThreadPath {
    tenant: Option<String>,
    thread_id: String,
}

/// Who asks, and the thread the path names once it is known to be theirs: the extractor
/// of every thread route, which answers for it otherwise. It runs before a handler's body
/// is read, so credentials and the thread are checked before the body is looked at.
struct Opened {
    auth: AuthContext,
    thread_id: ThreadId,
}

impl FromRequestParts<ThreadsState> for Opened {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &ThreadsState) -> Result<Self, Response> {
        let Path(path) = Path::<ThreadPath>::from_request_parts(parts, state)
            .await
            .map_err(IntoResponse::into_response)?;
        let thread_id = ThreadId::from(path.thread_id);
        let auth = caller_of(
            &state.reads,
            state.security.as_ref(),
            &parts.headers,
            path.tenant,
        )
        .map_err(|r| *r)?;
        match state.reads.thread_exists(&auth, &thread_id).await {
            Ok(true) => Ok(Self { auth, thread_id }),
            Ok(false) => Err(failure(&AgentError::ThreadNotFound { thread_id })),
            Err(err) => Err(failure(&err)),
        }
    }
}

fn failure(err: &AgentError) -> Response {
    if let AgentError::ThreadTerminated { .. } = err {
        return refuse(StatusCode::CONFLICT, "thread_terminated", err.to_string());
    }
    input_or_thread_refusal(err).unwrap_or_else(|| internal(err, "thread"))
}

/// The answer to bad input (`400 invalid_input`) or an unknown thread (`404
/// thread_not_found`), which the thread and operator routes give alike; `None` for any other
/// error, which each explains itself.
pub(crate) fn input_or_thread_refusal(err: &AgentError) -> Option<Response> {
    let (status, code) = match err {
        AgentError::InvalidInput { .. } => (StatusCode::BAD_REQUEST, "invalid_input"),
        AgentError::ThreadNotFound { .. } => (StatusCode::NOT_FOUND, "thread_not_found"),
        _ => return None,
    };
    Some(refuse(status, code, err.to_string()))
}

async fn thread_state(
    State(state): State<ThreadsState>,
    Opened { auth, thread_id }: Opened,
) -> Response {
    let read = async {
        let thread = state.reads.thread(&auth, &thread_id).await?;
        let children: Vec<_> = thread
            .children
            .into_iter()
            .map(|child| {
                json!({
                    "thread_id": child.thread_id,
                    "name": child.name,
                    "agent": child.agent,
                    "status": child.status,
                    "resumable": child.resumable,
                })
            })
            .collect();
        Ok::<_, AgentError>(json!({
            "thread_id": thread_id,
            "terminated": thread.terminated_at.is_some(),
            "terminated_at": thread.terminated_at,
            "parent_thread_id": thread.parent_thread_id,
            "children": children,
            "queued": thread.queued,
        }))
    };
    answer(read.await)
}

async fn messages(
    State(state): State<ThreadsState>,
    Query(page): Query<Page>,
    Opened { auth, thread_id }: Opened,
) -> Response {
    let limit = tri!(page.limit());
    let entries = state
        .reads
        .thread_messages(&auth, &thread_id, page.after, limit)
        .await;
    answer(entries.map(|entries| json!({"thread_id": thread_id, "messages": entries})))
}

async fn queue(
    State(state): State<ThreadsState>,
    Opened { auth, thread_id }: Opened,
    body: Option<Json<QueueBody>>,
) -> Response {
    let Some(Json(body)) = body.filter(|Json(b)| !b.text.trim().is_empty()) else {
        return refuse(
            StatusCode::BAD_REQUEST,
            "invalid_body",
            "the body must be JSON with a non-empty text: {\"text\": \"...\"}",
        );
    };
    match state
        .executor
        .thread(&auth, thread_id)
        .queue_message(body.text)
        .await
    {
        Ok(item) => (StatusCode::ACCEPTED, Json(item)).into_response(),
        Err(err) => failure(&err),
    }
}

async fn queue_list(
    State(state): State<ThreadsState>,
    Query(page): Query<Page>,
    Opened { auth, thread_id }: Opened,
) -> Response {
    let limit = tri!(page.limit());
    let items = state.reads.thread_queue(&auth, &thread_id, limit).await;
    answer(items.map(|items| json!({"thread_id": thread_id, "items": items})))
}

/// A read's answer: `200` with its JSON, or the error's.
fn answer(read: Result<serde_json::Value, AgentError>) -> Response {
    match read {
        Ok(body) => (StatusCode::OK, Json(body)).into_response(),
        Err(err) => failure(&err),
    }
}
