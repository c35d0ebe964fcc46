//! What the provider tests share: a scripted local provider (an axum server on 127.0.0.1:0
//! that records each request and answers with the next scripted reply, including SSE bodies
//! written in separate chunks), a client set up to call it, and the requests, tools and
//! attachments the tests send.

#![allow(dead_code)] // Each provider's test file uses a different part.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use futures::stream::{self, StreamExt};
use keel_core::{AgentError, FileContent};
use keel_llm::providers::{HttpOptions, ProviderBuilder};
use keel_llm::{
    collect_stream, Llm, LlmErrorKind, LlmMessage, LlmRequest, LlmResponse, LlmStreamEvent,
    ToolSpec, Usage,
};
use serde_json::{json, Value};

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

impl Reply {
    /// A 200 answer with this JSON body.
    pub fn ok(body: Value) -> Self {
        Self::Json(200, Vec::new(), body)
    }
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

/// `builder` aimed at a scripted server's `base_url`, keyed with `key`, retrying fast.
pub fn scripted<L>(builder: ProviderBuilder<L>, base_url: String, key: &str) -> ProviderBuilder<L> {
    builder
        .with_base_url(base_url)
        .with_api_key(key)
        .with_http_options(fast_retries())
}

/// A request of one user message.
pub fn ask(text: &str) -> LlmRequest {
    LlmRequest::new(vec![LlmMessage::user(text)])
}

/// A request with instructions ("Be brief.") and a user's "Hi".
pub fn brief_hi() -> LlmRequest {
    LlmRequest::new(vec![
        LlmMessage::system("Be brief."),
        LlmMessage::user("Hi"),
    ])
}

/// A request of one user message with these files attached.
pub fn ask_with(text: &str, files: impl IntoIterator<Item = FileContent>) -> LlmRequest {
    let message = files
        .into_iter()
        .fold(LlmMessage::user(text), LlmMessage::with_attachment);
    LlmRequest::new(vec![message])
}

/// The tool the tests offer.
pub fn weather_tool() -> ToolSpec {
    ToolSpec {
        name: "get_weather".into(),
        description: "Current weather for a city".into(),
        parameters: json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}),
    }
}

/// Usage figures.
pub fn usage(input_tokens: u64, output_tokens: u64) -> Usage {
    Usage {
        input_tokens,
        output_tokens,
    }
}

/// The schema of a structured answer naming a city.
pub fn city_schema() -> Value {
    json!({"type": "object", "properties": {"city": {"type": "string"}}})
}

/// Ask "Hi", expect the call to fail with `kind`, and return the error.
pub async fn call_fails(llm: &impl Llm, kind: LlmErrorKind) -> AgentError {
    let err = llm.complete(ask("Hi")).await.unwrap_err();
    assert_eq!(LlmErrorKind::of(&err), Some(kind), "{err}");
    err
}

/// Against a server whose replies are an authentication error, errors worth retrying, "ok",
/// then a context overflow: the first call fails as `Auth` without showing `key`, the next
/// is retried until it answers "ok", and the last fails as `ContextOverflow`.
pub async fn assert_auth_retries_and_overflow(llm: &impl Llm, key: &str) {
    let err = call_fails(llm, LlmErrorKind::Auth).await;
    assert!(!err.to_string().contains(key), "{err}");
    let response = llm.complete(ask("Hi")).await.unwrap();
    assert_eq!(response.content.as_deref(), Some("ok"));
    call_fails(llm, LlmErrorKind::ContextOverflow).await;
}

/// Stream "Hi", expect the stream to fail with `kind`, and return the error.
pub async fn stream_fails(llm: &impl Llm, kind: LlmErrorKind) -> AgentError {
    let err = collect_stream(llm.stream(ask("Hi"))).await.unwrap_err();
    assert_eq!(LlmErrorKind::of(&err), Some(kind), "{err}");
    err
}

/// One call offering [`weather_tool`], over `messages`; the call must succeed.
pub async fn ask_about_weather(llm: &impl Llm, messages: Vec<LlmMessage>) -> LlmResponse {
    let request = LlmRequest::new(messages).with_tools(vec![weather_tool()]);
    llm.complete(request).await.unwrap()
}

/// A server that streams `body` cut short where `cut` says, and the error the stream of
/// `llm` (made for the server's URL) reports: a transport error, whatever the provider.
pub async fn stream_cut_at<L: Llm>(
    body: &str,
    cut: impl FnOnce(&str) -> Option<usize>,
    llm: impl FnOnce(&str) -> L,
) -> AgentError {
    let at = cut(body).expect("the body holds the place to cut at");
    let server = serve(vec![Reply::Chunks(vec![body[..at].to_owned()])]).await;
    stream_fails(&llm(&server.url), LlmErrorKind::Transport).await
}

/// Every event of a stream that must not fail, and the response its final event holds.
pub async fn stream_events(
    llm: &impl Llm,
    request: LlmRequest,
) -> (Vec<LlmStreamEvent>, LlmResponse) {
    let events: Vec<LlmStreamEvent> = llm.stream(request).map(Result::unwrap).collect().await;
    let Some(LlmStreamEvent::Done { response }) = events.last() else {
        panic!("the stream must end with done: {events:?}");
    };
    let response = response.clone();
    (events, response)
}

/// The first bytes of a PNG, base64: what an image attached inline carries.
pub const PNG_B64: &str = "iVBORw0KGgo=";

/// A file attached with its bytes (base64).
pub fn file(name: &str, media_type: &str, base64: &str) -> FileContent {
    FileContent {
        name: Some(name.into()),
        media_type: Some(media_type.into()),
        bytes: Some(base64.into()),
        ..Default::default()
    }
}

/// An image attached with its bytes.
pub fn photo_bytes() -> FileContent {
    file("cat.png", "image/png", PNG_B64)
}

/// An image attached by its public URL.
pub fn photo_url() -> FileContent {
    FileContent {
        name: Some("dog.jpg".into()),
        uri: Some("https://example.com/dog.jpg".into()),
        ..Default::default()
    }
}

/// A request whose last message is the result of the tool `snap` (call `call_1`): the text
/// "here:" with an image (its bytes) and a PDF attached.
pub fn tool_result_with_image() -> LlmRequest {
    let mut call = keel_llm::ToolCall::new("snap", json!({}));
    call.id = "call_1".into();
    let report = file("report.pdf", "application/pdf", "JVBERi0xLjc="); // "%PDF-1.7"
    LlmRequest::new(vec![
        LlmMessage::user("Take a picture."),
        LlmMessage::assistant("", vec![call.clone()]),
        LlmMessage::tool_result(&call, "here:")
            .with_attachment(photo_bytes())
            .with_attachment(report),
    ])
}

/// The JSON body `llm` (made for a scripted server's URL) sends for `request`, the server
/// answering `answer` (a 200 body); the call must succeed. How the request-mapping tests
/// see what a provider writes.
pub async fn body_sent<L: Llm>(
    llm: impl FnOnce(&str) -> L,
    answer: Value,
    request: LlmRequest,
) -> Value {
    exchange(llm, answer, request).await.1.body
}

/// What `llm` (made for a scripted server's URL) answers for `request`, the server answering
/// `answer` (a 200 body), and the request the server saw; the call must succeed.
pub async fn exchange<L: Llm>(
    llm: impl FnOnce(&str) -> L,
    answer: Value,
    request: LlmRequest,
) -> (LlmResponse, Recorded) {
    let server = serve(vec![Reply::ok(answer)]).await;
    let response = llm(&server.url).complete(request).await.unwrap();
    (response, server.requests().remove(0))
}
