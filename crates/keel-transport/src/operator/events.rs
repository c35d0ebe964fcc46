//! A task's or a thread's live events over SSE: first what the durable log holds after the
//! resume point, then each event as it is appended. Both follow the engine's watches
//! ([`Reads::watch_task`](keel_agent::reads::Reads::watch_task),
//! [`Reads::watch_thread`](keel_agent::reads::Reads::watch_thread)), which read the shared
//! store's log: a replica that does not run the task serves its events as well.
//!
//! Each event's SSE `id:` is where to resume after it (`Last-Event-ID`, or `?after=`): on a
//! task's stream its sequence number, on a thread's the thread position (the last sequence
//! number seen of each task), so a resumed stream misses and repeats nothing.
//!
//! A task's stream also carries, live, the model calls of its run in this process
//! (`event: run`, `data: {"run_event": RunEvent}`, no `id:`): the task's log does not hold
//! them, and they reach the store only with the run's report when the run rests. They are
//! a preview: a replica that does not run the task sends none, and the report has them all.

use std::sync::Arc;

use async_trait::async_trait;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::Event;
use axum::response::Response;
use futures::StreamExt;
use keel_agent::reads::{TaskChange, ThreadPosition};
use keel_core::{AgentError, AgentResult, TaskId, ThreadId};
use keel_events::{EventSink, RunEvent};
use serde_json::json;
use tokio::sync::broadcast;

use super::schema::{ErrorBody, EventView, EventsQuery};
use super::{check_id, failure, tri, Asked, Caller, OperatorState};
use crate::sse::sse;
use crate::variables::refuse;

/// The run events a task's stream carries live beside its log.
const LIVE_RUN_EVENTS: [&str; 2] = ["llm.call.started", "llm.call.completed"];

/// How many live run events wait for a slow stream before it misses some (the run's
/// report has them all).
const LIVE_BACKLOG: usize = 1024;

/// The model-call events of this process's runs, handed to the task streams open here: an
/// event sink on each served agent's executor.
#[derive(Clone)]
pub(super) struct LiveRunEvents(broadcast::Sender<Arc<RunEvent>>);

impl LiveRunEvents {
    pub(super) fn new() -> Self {
        Self(broadcast::channel(LIVE_BACKLOG).0)
    }

    /// From now on, the events of `task_id` (on `thread_id`), as `event: run` SSE events.
    fn of_task(
        &self,
        task_id: TaskId,
        thread_id: ThreadId,
    ) -> impl futures::Stream<Item = Event> + Send {
        futures::stream::unfold(self.0.subscribe(), |mut events| async move {
            loop {
                match events.recv().await {
                    Ok(event) => return Some((event, events)),
                    Err(broadcast::error::RecvError::Lagged(_)) => continue,
                    Err(broadcast::error::RecvError::Closed) => return None,
                }
            }
        })
        .filter(move |event| {
            let ours = event.task_id.as_ref() == Some(&task_id)
                && event.thread_id.as_ref() == Some(&thread_id);
            futures::future::ready(ours)
        })
        .map(|event| {
            Event::default()
                .event("run")
                .data(json!({ "run_event": &*event }).to_string())
        })
    }
}

#[async_trait]
impl EventSink for LiveRunEvents {
    async fn emit(&self, event: &RunEvent) -> AgentResult<()> {
        if LIVE_RUN_EVENTS.contains(&event.event_type.as_str()) {
            // No stream open is no error: nobody is watching.
            let _ = self.0.send(Arc::new(event.clone()));
        }
        Ok(())
    }
}

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

/// A task's events, then live ones, until its terminal status; with them, live, its run's
/// model calls in this process.
#[utoipa::path(get, path = "/api/v1/tasks/{task_id}/events", tag = "operator",
    params(
        ("task_id" = String, Path, description = "The task"),
        ("Last-Event-ID" = Option<String>, Header, description = "Resume after this sequence number"),
        EventsQuery,
    ),
    responses(
        (status = 200, content_type = "text/event-stream", body = EventView,
            description = "SSE: each `data:` an EventView, each `id:` its `seq`; `event: run` (no `id:`): `{\"run_event\": RunEvent}`, a model call's start or end, live"),
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
    // Subscribed before the log is read, so that no model call falls in between.
    let live = state.live.of_task(task_id.clone(), task.thread_id.clone());
    let watch = state.reads.watch_task(&auth, &task_id, after);
    let logged = watch.into_stream().map(|item| match item {
        Ok(change) => Event::default()
            .id(change.seq.to_string())
            .data(data(&change)),
        Err(err) => error_event(&err),
    });
    // The log's end (`None`) ends the stream, live events or not.
    let events = futures::stream::select(
        logged
            .map(Some)
            .chain(futures::stream::once(futures::future::ready(None))),
        live.map(Some),
    )
    .take_while(|event| futures::future::ready(event.is_some()))
    .filter_map(futures::future::ready);
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
