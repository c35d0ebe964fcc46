//! The operator API's test server and readers: the approval agent behind two tenants' keys,
//! JSON calls answering `(status, body)`, and an SSE reader that follows a live stream.

use std::sync::atomic::AtomicUsize;
use std::sync::Arc;

use keel_agent::AgentExecutor;
use keel_llm::MockLlm;
use keel_transport::Security;
use reqwest::StatusCode;
use serde_json::Value;

use super::TestServer;

/// A prompt that makes the offline model call the tool that needs approval.
pub const WRITE: &str = "/write_record {\"id\": \"r1\"}";

/// The `records` agent ([`super::records_agent`]) served with [`super::ALICE`]'s and
/// [`super::BOB`]'s keys; routes are named from `/api/v1` on.
pub struct Operator {
    pub server: TestServer,
    /// How many times `write_record` ran.
    pub writes: Arc<AtomicUsize>,
}

impl Operator {
    pub async fn start() -> Self {
        let writes = Arc::new(AtomicUsize::new(0));
        let agent = super::records_agent(writes.clone());
        let runtime = super::two_tenant_runtime(MockLlm::new());
        let executor = AgentExecutor::new(agent, runtime);
        let server = TestServer::start_with_executor(executor, |server| {
            server.with_security(Security::api_key_and_bearer())
        })
        .await;
        Self { server, writes }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}/api/v1{path}", self.server.base)
    }

    /// GET `path` as the tenant of `key` (none: no credentials).
    pub async fn get(&self, key: Option<&str>, path: &str) -> (StatusCode, Value) {
        super::get_as(&self.server.http, &self.url(path), key).await
    }

    /// POST `body` (none: no body) to `path` as the tenant of `key`.
    pub async fn post(
        &self,
        key: Option<&str>,
        path: &str,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        let mut request = self.server.http.post(self.url(path));
        if let Some(key) = key {
            request = request.header("X-API-Key", key);
        }
        if let Some(body) = body {
            request = request.json(&body);
        }
        super::status_and_json(request).await
    }

    /// Open the event stream at `path` as `key`, resuming after `last_event_id` when given.
    pub async fn events(&self, key: &str, path: &str, last_event_id: Option<&str>) -> SseReader {
        let mut request = self
            .server
            .http
            .get(self.url(path))
            .header("X-API-Key", key);
        if let Some(id) = last_event_id {
            request = request.header("Last-Event-ID", id);
        }
        let response = request.send().await.unwrap();
        assert_eq!(response.status(), StatusCode::OK, "{response:?}");
        SseReader {
            response,
            buffer: String::new(),
        }
    }

    /// POST `body` to `path` as Alice, which must be answered `200`; the answer.
    pub async fn post_ok(&self, path: &str, body: Value) -> Value {
        let (status, answer) = self.post(Some(super::ALICE), path, Some(body)).await;
        assert_eq!(status, StatusCode::OK, "{answer}");
        answer
    }

    /// Send `text` to `thread` as Alice (blocking); the task.
    pub async fn send(&self, thread: &str, text: &str) -> Value {
        let path = format!("/threads/{thread}/messages");
        self.post_ok(&path, serde_json::json!({ "text": text }))
            .await
    }

    pub async fn stop(self) {
        self.server.stop().await;
    }
}

/// One SSE event: its `id:`, its `event:` name and its `data:` as JSON.
#[derive(Debug, Clone)]
pub struct SseEvent {
    pub id: Option<String>,
    pub name: String,
    pub data: Value,
}

/// Reads a live SSE answer event by event (comment lines, the keep-alives, are skipped).
pub struct SseReader {
    response: reqwest::Response,
    buffer: String,
}

impl SseReader {
    /// The next event; `None` once the stream ended.
    pub async fn next(&mut self) -> Option<SseEvent> {
        loop {
            if let Some(end) = self.buffer.find("\n\n") {
                let block: String = self.buffer.drain(..end + 2).collect();
                if let Some(event) = parse(&block) {
                    return Some(event);
                }
                continue;
            }
            let chunk = self.response.chunk().await.unwrap()?;
            self.buffer.push_str(&String::from_utf8_lossy(&chunk));
        }
    }

    /// The next `n` events (the stream must hold them).
    pub async fn take(&mut self, n: usize) -> Vec<SseEvent> {
        let mut events = Vec::new();
        while events.len() < n {
            events.push(self.next().await.expect("the stream ended early"));
        }
        events
    }

    /// Every event until the stream ends.
    pub async fn rest(&mut self) -> Vec<SseEvent> {
        let mut events = Vec::new();
        while let Some(event) = self.next().await {
            events.push(event);
        }
        events
    }
}

fn parse(block: &str) -> Option<SseEvent> {
    let mut id = None;
    let mut name = "message".to_owned();
    let mut data = Vec::new();
    for line in block.lines() {
        if let Some(v) = line.strip_prefix("id:") {
            id = Some(v.trim_start().to_owned());
        } else if let Some(v) = line.strip_prefix("event:") {
            name = v.trim().to_owned();
        } else if let Some(v) = line.strip_prefix("data:") {
            data.push(v.trim_start().to_owned());
        }
    }
    (!data.is_empty()).then(|| SseEvent {
        id,
        name,
        data: serde_json::from_str(&data.join("\n")).unwrap(),
    })
}
