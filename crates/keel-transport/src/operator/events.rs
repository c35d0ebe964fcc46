//! A task's or a thread's live events over SSE: first what the durable log holds after the
//! resume point, then each event as it is appended. Both follow the engine's watches
//! ([`Reads::watch_task`](keel_agent::reads::Reads::watch_task),
//! [`Reads::watch_thread`](keel_agent::reads::Reads::watch_thread)), which read the shared
//! store's log: a replica that does not run the task serves its events as well.
//!
//! Each event's SSE `id:` is where to resume after it (`Last-Event-ID`, or `?after=`): on a
//! task's stream its sequence number, on a thread's the thread position (the last sequence
//! number seen of each task), so a resumed stream misses and repeats nothing.

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::Event;
use axum::response::Response;
use futures::StreamExt;
use keel_agent::reads::{TaskChange, ThreadPosition};
use keel_core::{AgentError, TaskId, ThreadId};
use serde_json::json;

use super::schema::{ErrorBody, EventView, EventsQuery};
use super::{check_id, failure, tri, Asked, Caller, OperatorState};
use crate::sse::sse;
use crate::variables::refuse;

/// The position a request resumes after (`Last-Event-ID` wins over `?after=`; blank is the
/// start), read by `parse`; else `400 invalid_position` saying it is no event id of `what`.
fn resume_point<P>(
    headers: &HeaderMap,
    asked: EventsQuery,
    what: &str,
    parse: impl FnOnce(&str) -> Option<P>,
) -> Result<Option<P>, Box<Response>> {
    let point = match headers.get("last-event-id") {
        Some(value) => value
            .to_str()
            .map_err(|_| Box::new(bad_position("`Last-Event-ID` is not text")))?
            .trim()
            .to_owned(),
        None => asked.after.unwrap_or_default(),
    };
    if point.is_empty() {
        return Ok(None);
    }
    parse(&point).map(Some).ok_or_else(|| {
        Box::new(bad_position(format!(
            "`{point}` is not an event id of {what} stream"
        )))
    })
}

fn bad_position(message: impl Into<String>) -> Response {
    refuse(StatusCode::BAD_REQUEST, "invalid_position", message)
}

/// The `data:` of one event.
fn data(change: &TaskChange) -> String {
    let view = EventView {
        task_id: change.task_id.to_string(),
        seq: change.seq,
        event: serde_json::to_value(&change.event).unwrap_or_default(),
    };
    serde_json::to_string(&view).unwrap_or_default()
}

/// The event that ends a stream on an error (the client resumes from its last id).
fn error_event(err: &AgentError) -> Event {
    let code = match err {
        AgentError::TaskNotFound { .. } => "task_not_found",
        _ => "internal",
    };
    let body = json!({"error": {"code": code, "message": err.to_string()}});
    Event::default().event("error").data(body.to_string())
}

/// `events` until the server shuts down: a stream that never ends by itself must not hold
/// the server's shutdown up (the client resumes elsewhere from its last id).
fn until_closing<S>(state: &OperatorState, events: S) -> impl futures::Stream<Item = Event> + Send
where
    S: futures::Stream<Item = Event> + Send,
{
    let closing = state.agents.first().map(|agent| agent.handlers.closing());
    events.take_until(async move {
        let Some(mut closing) = closing else {
            return std::future::pending().await;
        };
        if closing.wait_for(|closed| *closed).await.is_err() {
            // A server that never closes (its sender is gone): the stream is the client's.
            std::future::pending::<()>().await;
        }
    })
}

/// A task's events, then live ones, until its terminal status.
#[utoipa::path(get, path = "/api/v1/tasks/{task_id}/events", tag = "operator",
    params(
        ("task_id" = String, Path, description = "The task"),
        ("Last-Event-ID" = Option<String>, Header, description = "Resume after this sequence number"),
        EventsQuery,
    ),
    responses(
        (status = 200, content_type = "text/event-stream", body = EventView,
            description = "SSE: each `data:` an EventView, each `id:` its `seq`"),
        (status = 400, body = ErrorBody, description = "`invalid_id`, `invalid_position`"),
        (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody, description = "`task_not_found`"),
    ))]
pub(super) async fn task_events(
    State(state): State<OperatorState>,
    Caller(auth): Caller,
    Path(task_id): Path<String>,
    Asked(asked): Asked<EventsQuery>,
    headers: HeaderMap,
) -> Response {
    let task_id: TaskId = tri!(check_id("task_id", task_id));
    let after = tri!(resume_point(&headers, asked, "a task's", |p| p
        .parse()
        .ok()));
    let after = after.unwrap_or(0);
    // Unknown (or another tenant's) tasks answer 404 before a stream opens.
    let task = match state.reads.task(&auth, &task_id).await {
        Ok(task) => task,
        Err(err) => return failure(&err),
    };
    // A watch from past a finished task's last event would wait for nothing.
    if task.state().is_terminal() {
        match state.reads.task_events(&auth, &task_id).await {
            Ok(events) if after >= events.len() as u64 => return sse(futures::stream::empty()),
            Ok(_) => {}
            Err(err) => return failure(&err),
        }
    }
    let watch = state.reads.watch_task(&auth, &task_id, after);
    let events = watch.into_stream().map(|item| match item {
        Ok(change) => Event::default()
            .id(change.seq.to_string())
            .data(data(&change)),
        Err(err) => error_event(&err),
    });
    sse(until_closing(&state, events))
}

/// Every task's events of a thread, then live ones; the stream does not end by itself.
#[utoipa::path(get, path = "/api/v1/threads/{thread_id}/events", tag = "operator",
    params(
        ("thread_id" = String, Path, description = "The thread"),
        ("Last-Event-ID" = Option<String>, Header, description = "Resume after this position"),
        EventsQuery,
    ),
    responses(
        (status = 200, content_type = "text/event-stream", body = EventView,
            description = "SSE: each `data:` an EventView, each `id:` the thread position after it"),
        (status = 400, body = ErrorBody, description = "`invalid_id`, `invalid_position`"),
        (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody, description = "`thread_not_found`"),
    ))]
pub(super) async fn thread_events(
    State(state): State<OperatorState>,
    Caller(auth): Caller,
    Path(thread_id): Path<String>,
    Asked(asked): Asked<EventsQuery>,
    headers: HeaderMap,
) -> Response {
    let thread_id: ThreadId = tri!(check_id("thread_id", thread_id));
    let from = tri!(resume_point(&headers, asked, "a thread's", |p| {
        ThreadPosition::parse(p).ok()
    }));
    let from = from.unwrap_or_default();
    if let Err(err) = state.reads.thread(&auth, &thread_id).await {
        return failure(&err);
    }
    let mut position = from.clone();
    let watch = state.reads.watch_thread(&auth, &thread_id, from);
    // A store error ends the stream (the client resumes from its last id) rather than being
    // retried here at once, again and again.
    let events = watch
        .into_stream()
        .scan(false, |failed, item| {
            let out = if *failed { None } else { Some(item) };
            *failed = out.as_ref().is_some_and(Result::is_err);
            futures::future::ready(out)
        })
        .map(move |item| match item {
            Ok(change) => {
                position.advance(&change);
                Event::default().id(position.token()).data(data(&change))
            }
            Err(err) => error_event(&err),
        });
    sse(until_closing(&state, events))
}
