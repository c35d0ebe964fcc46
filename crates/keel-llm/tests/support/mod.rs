//! A scripted local provider: an axum server on 127.0.0.1:0 that records each request and
//! answers with the next scripted reply, including SSE bodies written in separate chunks.

#![allow(dead_code)] // Each provider's test file uses a different part.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use futures::stream::{self, StreamExt};
use keel_llm::providers::HttpOptions;
use serde_json::Value;

/// One request the server received.
#[derive(Debug, Clone)]
pub struct Recorded {
    /// Path and query.
    pub uri: String,
    /// Its headers.
    pub headers: HeaderMap,
    /// Its JSON body.
    pub body: Value,
}

impl Recorded {
    /// A header's value, or "".
    pub fn header(&self, name: &str) -> &str {
        self.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
    }
}

/// One scripted answer.
pub enum Reply {
    /// A JSON body with a status and extra headers.
    Json(u16, Vec<(&'static str, String)>, Value),
    /// An SSE body written as these separate chunks (each flushed before the next).
    Chunks(Vec<String>),
    /// An SSE body written as these chunks, then the connection is aborted.
    ChunksThenAbort(Vec<String>),
}

/// A running scripted server.
pub struct Server {
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    requests: Arc<Mutex<Vec<Recorded>>>,
}

impl Server {
    /// Every request received so far.
    pub fn requests(&self) -> Vec<Recorded> {
        self.requests.lock().unwrap().clone()
    }
}

/// Start a server that plays `replies` in order (a 500 once they run out).
pub async fn serve(replies: Vec<Reply>) -> Server {
    let replies = Arc::new(Mutex::new(VecDeque::from(replies)));
    let requests = Arc::new(Mutex::new(Vec::new()));
    let recorded = Arc::clone(&requests);
    let app = axum::Router::new().fallback(move |request: Request| {
        let replies = Arc::clone(&replies);
        let recorded = Arc::clone(&recorded);
        async move {
            let (parts, body) = request.into_parts();
            let bytes = axum::body::to_bytes(body, usize::MAX).await.unwrap();
            recorded.lock().unwrap().push(Recorded {
                uri: parts.uri.to_string(),
                headers: parts.headers,
                body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
            });
            let reply = replies.lock().unwrap().pop_front();
            respond(reply)
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    Server { url, requests }
}

fn respond(reply: Option<Reply>) -> Response {
    match reply {
        None => Response::builder()
            .status(500)
            .body(Body::from("script exhausted"))
            .unwrap(),
        Some(Reply::Json(status, headers, body)) => {
            let mut response = Response::builder()
                .status(StatusCode::from_u16(status).unwrap())
                .header("content-type", "application/json");
            for (name, value) in headers {
                response = response.header(name, value);
            }
            response.body(Body::from(body.to_string())).unwrap()
        }
        Some(Reply::Chunks(chunks)) => sse(chunks, false),
        Some(Reply::ChunksThenAbort(chunks)) => sse(chunks, true),
    }
}

fn sse(chunks: Vec<String>, abort: bool) -> Response {
    // Yield between chunks so each goes out as its own write: the client must reassemble
    // frames split across reads.
    let body = stream::iter(chunks)
        .then(|chunk| async move {
            tokio::task::yield_now().await;
            Ok::<_, std::io::Error>(chunk)
        })
        .chain(stream::iter(abort.then(|| {
            Err(std::io::Error::new(
                std::io::ErrorKind::ConnectionReset,
                "dropped",
            ))
        })));
    Response::builder()
        .header("content-type", "text/event-stream")
        .body(Body::from_stream(body))
        .unwrap()
}

/// SSE `data:` frames for these JSON values (with `event:` lines when named).
pub fn frames(events: &[(Option<&str>, Value)]) -> String {
    events
        .iter()
        .map(|(name, data)| match name {
            Some(name) => format!("event: {name}\ndata: {data}\n\n"),
            None => format!("data: {data}\n\n"),
        })
        .collect()
}

/// Split `text` into chunks at these byte offsets (clamped to char boundaries).
pub fn split_at(text: &str, cuts: &[usize]) -> Vec<String> {
    let mut chunks = Vec::new();
    let mut start = 0;
    for &cut in cuts {
        let mut cut = cut.min(text.len());
        while !text.is_char_boundary(cut) {
            cut += 1;
        }
        if cut > start {
            chunks.push(text[start..cut].to_owned());
            start = cut;
        }
    }
    chunks.push(text[start..].to_owned());
    chunks
}

/// Fast retries for tests: tiny backoff, three attempts.
pub fn fast_retries() -> HttpOptions {
    HttpOptions::default()
        .with_max_attempts(3)
        .with_backoff(Duration::from_millis(1), Duration::from_millis(5))
        .with_timeouts(Duration::from_secs(5), Duration::from_secs(30))
}
