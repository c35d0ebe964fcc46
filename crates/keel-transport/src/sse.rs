//! Server-Sent Events answers: how both HTTP bindings stream a task's events.

use std::convert::Infallible;

use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::{Stream, StreamExt};
use serde_json::Value;

/// A Server-Sent Events response, one `data:` line of JSON per item.
pub(crate) fn sse(events: impl Stream<Item = Event> + Send + 'static) -> Response {
    // Counted as an open subscriber for as long as the body (and so this stream) lives.
    let subscriber = crate::observability::SseSubscriber::open();
    Sse::new(events.map(move |event| {
        let _open = &subscriber;
        Ok::<_, Infallible>(event)
    }))
    .keep_alive(KeepAlive::default())
    .into_response()
}

/// An SSE event carrying one JSON value.
pub(crate) fn sse_json(value: &Value) -> Event {
    Event::default().data(value.to_string())
}
