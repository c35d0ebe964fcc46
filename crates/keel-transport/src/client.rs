//! The A2A v1.0 client (JSON-RPC or HTTP+JSON over reqwest, streams over Server-Sent Events):
//! talks to a Keel agent or any A2A v1.0 agent and answers in Keel's models and errors.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use eventsource_stream::Eventsource;
use futures::stream::{self, StreamExt};
use keel_core::{AgentCard, AgentError, AgentResult, Message, Task, TaskId};
use serde_json::{json, Map, Value};
use tokio::sync::OnceCell;
use tracing::Instrument;

use crate::jsonrpc;
use crate::server::AGENT_CARD_PATH;
use crate::stream::StreamEvent;
use crate::task_list::{TaskList, TaskListQuery};
use crate::transport::{SendMessageOptions, TaskEventStream};
use crate::version::VERSION_HEADER;
use crate::wire;

/// The protocol binding a client uses.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Binding {
    /// JSON-RPC 2.0 (the card's `JSONRPC` interface).
    #[default]
    JsonRpc,
    /// HTTP+JSON, A2A's REST binding (the card's `HTTP+JSON` interface).
    HttpJson,
}

/// A client for one remote A2A agent.
///
/// The endpoint is the URL of the card's interface for the client's [`Binding`] (JSON-RPC
/// unless [`A2aClient::with_binding`] says otherwise), fetched on first use from
/// `<base_url>/.well-known/agent-card.json`, unless given with [`A2aClient::with_endpoint`].
/// Requests carry `A2A-Version: 1.0`. A2A errors come back as typed [`AgentError`]s on either
/// binding: -32001 (HTTP 404) is [`AgentError::TaskNotFound`], -32002
/// [`AgentError::TaskNotCancelable`] (its state is [`keel_core::TaskState::Unspecified`] when
/// the agent does not say), -32602 [`AgentError::InvalidInput`], the "not offered" codes
/// (-32601, -32003, -32004, -32005, -32007, -32009) [`AgentError::Unsupported`], and
/// everything else, including transport failures and malformed answers,
/// [`AgentError::Internal`].
///
/// ```no_run
/// use futures::StreamExt;
/// use keel_core::Message;
/// use keel_transport::{A2aClient, SendMessageOptions, StreamEvent};
/// # async fn demo() -> keel_core::AgentResult<()> {
/// let client = A2aClient::new("http://127.0.0.1:8080");
/// let task = client.send_message(Message::user("hi"), SendMessageOptions::default()).await?;
/// println!("{}: {:?}", task.state(), task.status().message.as_ref().map(Message::text));
///
/// let mut events = client.send_streaming_message(Message::user("and now?")).await?;
/// while let Some(event) = events.next().await {
///     if let StreamEvent::StatusUpdate { status, .. } = event? {
///         println!("now {}", status.state);
///     }
/// }
/// # Ok(())
/// # }
/// ```
pub struct A2aClient {
    http: reqwest::Client,
    base_url: String,
    binding: Binding,
    endpoint: OnceCell<String>,
    next_id: AtomicU64,
    retry: ClientRetry,
}

/// How an [`A2aClient`] retries idempotent calls after a connection loss.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ClientRetry {
    /// Attempts per call, the first included (at least 1).
    max_attempts: u32,
    /// The wait before the first retry; doubled per further retry.
    base_delay: Duration,
}

impl ClientRetry {
    /// The longest wait between two attempts.
    const MAX_DELAY: Duration = Duration::from_secs(5);

    /// The wait after failed attempt `attempt` (from 1): exponential, capped, half of it
    /// random.
    fn backoff(self, attempt: u32) -> Duration {
        let exponential = self
            .base_delay
            .saturating_mul(1u32 << attempt.saturating_sub(1).min(20))
            .min(Self::MAX_DELAY);
        let millis = u64::try_from(exponential.as_millis()).unwrap_or(u64::MAX);
        Duration::from_millis(millis / 2 + fastrand::u64(0..=millis / 2))
    }
}

impl Default for ClientRetry {
    fn default() -> Self {
        Self {
            max_attempts: A2aClient::DEFAULT_RETRY_ATTEMPTS,
            base_delay: Duration::from_millis(100),
        }
    }
}

/// Why one attempt failed: a lost or refused connection (worth another attempt when the call
/// is idempotent) or an answer (final).
enum Failure {
    Connection(AgentError),
    Answer(AgentError),
}

impl Failure {
    fn into_error(self) -> AgentError {
        match self {
            Failure::Connection(err) | Failure::Answer(err) => err,
        }
    }
}

impl From<AgentError> for Failure {
    fn from(err: AgentError) -> Self {
        Failure::Answer(err)
    }
}

/// One operation, as each binding names it.
#[derive(Debug, Clone, Copy)]
enum Call {
    SendMessage,
    SendStreamingMessage,
    GetTask,
    ListTasks,
    CancelTask,
    SubscribeToTask,
}

impl Call {
    fn method(self) -> &'static str {
        match self {
            Call::SendMessage => "SendMessage",
            Call::SendStreamingMessage => "SendStreamingMessage",
            Call::GetTask => "GetTask",
            Call::ListTasks => "ListTasks",
            Call::CancelTask => "CancelTask",
            Call::SubscribeToTask => "SubscribeToTask",
        }
    }

    /// Whether repeating the call cannot do anything twice: reads and cancel (canceling a
    /// canceled task changes nothing). SendMessage is not: a lost answer may hide a
    /// delivered message.
    fn is_idempotent(self) -> bool {
        matches!(self, Call::GetTask | Call::ListTasks | Call::CancelTask)
    }
}

impl A2aClient {
    /// A client for the agent served at `base_url` (the origin that holds its well-known card).
    pub fn new(base_url: impl Into<String>) -> Self {
        Self {
            http: reqwest::Client::new(),
            base_url: base_url.into().trim_end_matches('/').to_owned(),
            binding: Binding::default(),
            endpoint: OnceCell::new(),
            next_id: AtomicU64::new(1),
            retry: ClientRetry::default(),
        }
    }

    /// Send requests with this reqwest client (for its timeouts, proxy, TLS or pool settings)
    /// instead of a default one.
    #[must_use]
    pub fn with_http_client(self, http: reqwest::Client) -> Self {
        Self { http, ..self }
    }

    /// How many attempts an idempotent call gets by default (the first included).
    pub const DEFAULT_RETRY_ATTEMPTS: u32 = 3;

    /// Retry idempotent calls (GetTask, ListTasks, CancelTask and the card fetch) whose
    /// connection failed or was lost before an answer arrived: up to `max_attempts` attempts
    /// in all (at least 1; 1 turns retries off), waiting `base_delay` before the first retry,
    /// doubled for each further one (capped at 5 s, half of it random). SendMessage and the
    /// streams are never retried. The default is [`A2aClient::DEFAULT_RETRY_ATTEMPTS`]
    /// attempts from 100 ms. An answer, even an error or a non-JSON one, is never retried.
    #[must_use]
    pub fn with_retries(self, max_attempts: u32, base_delay: Duration) -> Self {
        Self {
            retry: ClientRetry {
                max_attempts: max_attempts.max(1),
                base_delay,
            },
            ..self
        }
    }

    /// Run `attempt` up to the retry policy's count while it fails on the connection.
    async fn retrying<T, F, Fut>(&self, what: &str, mut attempt: F) -> AgentResult<T>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, Failure>>,
    {
        let mut tried = 1;
        loop {
            match attempt().await {
                Ok(value) => return Ok(value),
                Err(Failure::Connection(err)) if tried < self.retry.max_attempts => {
                    let wait = self.retry.backoff(tried);
                    tracing::debug!(what, attempt = tried, ?wait, error = %err, "connection lost; retrying");
                    tokio::time::sleep(wait).await;
                    tried += 1;
                }
                Err(failure) => return Err(failure.into_error()),
            }
        }
    }

    /// Use this binding (its interface is looked up in the card unless an endpoint is given).
    #[must_use]
    pub fn with_binding(self, binding: Binding) -> Self {
        Self { binding, ..self }
    }

    /// Use this endpoint (for the client's binding) instead of discovering it from the card.
    #[must_use]
    pub fn with_endpoint(self, endpoint: impl Into<String>) -> Self {
        Self {
            endpoint: OnceCell::new_with(Some(endpoint.into())),
            ..self
        }
    }

    /// Fetch the agent's card from `<base_url>/.well-known/agent-card.json`.
    pub async fn get_card(&self) -> AgentResult<AgentCard> {
        Ok(self.fetch_card().await?.0)
    }

    async fn fetch_card(&self) -> AgentResult<(AgentCard, wire::Endpoints)> {
        let url = format!("{}{AGENT_CARD_PATH}", self.base_url);
        let card = self
            .retrying("agent card", || self.fetch_card_once(&url))
            .await?;
        wire::decode_card(card)
    }

    async fn fetch_card_once(&self, url: &str) -> Result<Value, Failure> {
        let response = self
            .http
            .get(url)
            .header(VERSION_HEADER, wire::PROTOCOL_VERSION)
            .send()
            .await
            .map_err(|e| connection_failure(url, e))?;
        let status = response.status();
        if !status.is_success() {
            return Err(Failure::Answer(AgentError::internal(format!(
                "GET {url} answered HTTP {status}"
            ))));
        }
        let body = response
            .bytes()
            .await
            .map_err(|e| connection_failure(url, e))?;
        serde_json::from_slice(&body).map_err(|e| {
            Failure::Answer(AgentError::internal(format!(
                "GET {url} answered a card that is not JSON: {e}"
            )))
        })
    }

    async fn endpoint(&self) -> AgentResult<&str> {
        self.endpoint
            .get_or_try_init(|| async {
                let (card, endpoints) = self.fetch_card().await?;
                let (endpoint, name) = match self.binding {
                    Binding::JsonRpc => (endpoints.jsonrpc, "JSONRPC"),
                    Binding::HttpJson => (endpoints.http_json, "HTTP+JSON"),
                };
                endpoint.ok_or_else(|| AgentError::Unsupported {
                    what: format!("agent `{}` has no {name} interface in its card", card.name),
                })
            })
            .await
            .map(String::as_str)
    }

    /// Send a message: start a task (or continue the one named by `message.task_id`). Blocks
    /// until the task finishes unless `options.return_immediately`.
    pub async fn send_message(
        &self,
        message: Message,
        options: SendMessageOptions,
    ) -> AgentResult<Task> {
        let params =
            wire::encode_send_message(&message, options.return_immediately, options.history_length);
        let result = self
            .unary(Call::SendMessage, params, message.task_id.as_ref())
            .await?;
        wire::decode_send_message_result(result)
    }

    /// A task, with its last `history_length` messages when given.
    pub async fn get_task(
        &self,
        task_id: &TaskId,
        history_length: Option<usize>,
    ) -> AgentResult<Task> {
        let params = wire::encode_get_task(task_id, history_length);
        wire::decode_task(self.unary(Call::GetTask, params, Some(task_id)).await?)
    }

    /// One page of the agent's tasks, most recently updated first.
    pub async fn list_tasks(&self, query: &TaskListQuery) -> AgentResult<TaskList> {
        let params = wire::encode_list_tasks(query);
        wire::decode_list_tasks_result(self.unary(Call::ListTasks, params, None).await?)
    }

    /// Cancel a task; `reason` travels as `metadata.reason`.
    pub async fn cancel_task(&self, task_id: &TaskId, reason: Option<String>) -> AgentResult<Task> {
        let params = wire::encode_cancel_task(task_id, reason.as_deref());
        wire::decode_task(self.unary(Call::CancelTask, params, Some(task_id)).await?)
    }

    /// Send a message and follow its task: the stream starts with the task, carries its status
    /// and artifact updates, and ends after its final (terminal or interrupted) status.
    pub async fn send_streaming_message(&self, message: Message) -> AgentResult<TaskEventStream> {
        let params = wire::encode_send_message(&message, false, None);
        self.open_stream(Call::SendStreamingMessage, params, message.task_id.as_ref())
            .await
    }

    /// Follow a task that is not terminal: the stream starts with the task as it stands, then
    /// carries its updates until its final status. A terminal task is
    /// [`AgentError::Unsupported`] (A2A's UnsupportedOperationError).
    pub async fn subscribe(&self, task_id: &TaskId) -> AgentResult<TaskEventStream> {
        let params = wire::encode_subscribe(task_id);
        self.open_stream(Call::SubscribeToTask, params, Some(task_id))
            .await
    }

    /// The HTTP request of a call on the client's binding.
    async fn request(
        &self,
        call: Call,
        params: Value,
    ) -> AgentResult<(reqwest::RequestBuilder, String)> {
        let endpoint = self.endpoint().await?;
        let builder = match self.binding {
            Binding::JsonRpc => {
                let id = format!("keel-{}", self.next_id.fetch_add(1, Ordering::Relaxed));
                let request =
                    json!({"jsonrpc": "2.0", "id": id, "method": call.method(), "params": params});
                (self.http.post(endpoint).json(&request), endpoint.to_owned())
            }
            Binding::HttpJson => {
                let base = endpoint.trim_end_matches('/');
                let mut params = match params {
                    Value::Object(map) => map,
                    _ => Map::new(),
                };
                let mut id = || {
                    params
                        .remove("id")
                        .and_then(|v| v.as_str().map(percent_encode))
                        .unwrap_or_default()
                };
                let (method, path) = match call {
                    Call::SendMessage => (reqwest::Method::POST, "/message:send".to_owned()),
                    Call::SendStreamingMessage => {
                        (reqwest::Method::POST, "/message:stream".to_owned())
                    }
                    Call::GetTask => (reqwest::Method::GET, format!("/tasks/{}", id())),
                    Call::ListTasks => (reqwest::Method::GET, "/tasks".to_owned()),
                    Call::CancelTask => (reqwest::Method::POST, format!("/tasks/{}:cancel", id())),
                    Call::SubscribeToTask => {
                        (reqwest::Method::GET, format!("/tasks/{}:subscribe", id()))
                    }
                };
                let url = format!("{base}{path}");
                let builder = if method == reqwest::Method::GET {
                    let query: Vec<(String, String)> = params
                        .into_iter()
                        .map(|(k, v)| {
                            let v = match v {
                                Value::String(s) => s,
                                other => other.to_string(),
                            };
                            (k, v)
                        })
                        .collect();
                    self.http.get(&url).query(&query)
                } else {
                    self.http
                        .post(&url)
                        .header("content-type", "application/a2a+json")
                        .body(Value::Object(params).to_string())
                };
                (builder, url)
            }
        };
        Ok((
            builder.0.header(VERSION_HEADER, wire::PROTOCOL_VERSION),
            builder.1,
        ))
    }

    /// A unary call; an idempotent one is retried when its connection fails.
    async fn unary(
        &self,
        call: Call,
        params: Value,
        task_id: Option<&TaskId>,
    ) -> AgentResult<Value> {
        if !call.is_idempotent() {
            return self
                .unary_once(call, params, task_id)
                .await
                .map_err(Failure::into_error);
        }
        self.retrying(call.method(), || {
            self.unary_once(call, params.clone(), task_id)
        })
        .await
    }

    async fn unary_once(
        &self,
        call: Call,
        params: Value,
        task_id: Option<&TaskId>,
    ) -> Result<Value, Failure> {
        let method = call.method();
        let (request, url) = self.request(call, params).await?;
        let span = tracing::debug_span!("a2a.call", method, url = %url);
        async {
            let response = request
                .send()
                .await
                .map_err(|e| connection_failure(&url, e))?;
            let status = response.status();
            let body = response
                .bytes()
                .await
                .map_err(|e| connection_failure(&url, e))?;
            let Ok(mut body) = serde_json::from_slice::<Value>(&body) else {
                return Err(Failure::Answer(AgentError::internal(format!(
                    "{method} to {url} answered HTTP {status} without JSON"
                ))));
            };
            if let Some(error) = self.error_of(&body) {
                return Err(Failure::Answer(jsonrpc::agent_error_from_rpc(
                    &error, task_id,
                )));
            }
            let result = match self.binding {
                Binding::JsonRpc => body.get_mut("result").map(Value::take),
                Binding::HttpJson => Some(body),
            };
            match result {
                Some(result) if status.is_success() => Ok(result),
                _ => Err(Failure::Answer(AgentError::internal(format!(
                    "{method} to {url} answered HTTP {status} without a result"
                )))),
            }
        }
        .instrument(span)
        .await
    }

    /// The error in an answer, as a JSON-RPC error object (`code`, `message`, `data`).
    fn error_of(&self, body: &Value) -> Option<Value> {
        let error = body.get("error")?;
        match self.binding {
            Binding::JsonRpc => Some(error.clone()),
            Binding::HttpJson => Some(rest_error_as_rpc(error)),
        }
    }

    async fn open_stream(
        &self,
        call: Call,
        params: Value,
        task_id: Option<&TaskId>,
    ) -> AgentResult<TaskEventStream> {
        let method = call.method();
        let (request, url) = self.request(call, params).await?;
        let response = request
            .header("accept", "text/event-stream")
            .send()
            .await
            .map_err(|e| transport_error(&url, e))?;
        let status = response.status();
        let is_sse = response
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"));
        if !is_sse {
            // An error before the stream started comes as a plain JSON answer.
            let body = response
                .bytes()
                .await
                .map_err(|e| transport_error(&url, e))?;
            let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            return Err(match self.error_of(&body) {
                Some(error) => jsonrpc::agent_error_from_rpc(&error, task_id),
                None => AgentError::internal(format!(
                    "{method} to {url} answered HTTP {status} without an event stream"
                )),
            });
        }
        let binding = self.binding;
        let task_id = task_id.cloned();
        let events = response.bytes_stream().eventsource();
        let state = (events.boxed(), false);
        Ok(stream::unfold(state, move |(mut events, done)| {
            let task_id = task_id.clone();
            async move {
                if done {
                    return None;
                }
                loop {
                    let event = match events.next().await? {
                        Ok(event) => event,
                        Err(err) => {
                            let err =
                                AgentError::internal(format!("the event stream broke: {err}"));
                            return Some((Err(err), (events, true)));
                        }
                    };
                    if event.data.trim().is_empty() {
                        continue;
                    }
                    let item = decode_sse(binding, &event.event, &event.data, task_id.as_ref());
                    let done = item.as_ref().map_or(true, StreamEvent::is_final);
                    return Some((item, (events, done)));
                }
            }
        })
        .boxed())
    }
}

/// One SSE event of a stream on `binding`.
fn decode_sse(
    binding: Binding,
    name: &str,
    data: &str,
    task_id: Option<&TaskId>,
) -> AgentResult<StreamEvent> {
    let value: Value = serde_json::from_str(data)
        .map_err(|e| AgentError::internal(format!("a stream event is not JSON: {e}")))?;
    match binding {
        Binding::JsonRpc => {
            if let Some(error) = value.get("error") {
                return Err(jsonrpc::agent_error_from_rpc(error, task_id));
            }
            let result = value.get("result").cloned().ok_or_else(|| {
                AgentError::internal("a stream event carries neither result nor error")
            })?;
            wire::decode_stream_event(result)
        }
        Binding::HttpJson => {
            if name == "error" || value.get("error").is_some() {
                let error = value.get("error").map_or(Value::Null, rest_error_as_rpc);
                return Err(jsonrpc::agent_error_from_rpc(&error, task_id));
            }
            wire::decode_stream_event(value)
        }
    }
}

/// A REST error object (`google.rpc.Status` JSON) as a JSON-RPC error object: the code comes
/// from the `ErrorInfo` reason.
fn rest_error_as_rpc(error: &Value) -> Value {
    let details = error.get("details").cloned().unwrap_or(Value::Null);
    let code = details
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|d| d.get("reason").and_then(Value::as_str))
        .find_map(jsonrpc::code_from_reason)
        .unwrap_or(jsonrpc::INTERNAL_ERROR);
    json!({"code": code, "message": error.get("message").cloned().unwrap_or(Value::Null), "data": details})
}

fn percent_encode(segment: &str) -> String {
    segment
        .bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                char::from(b).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// A failed request: a connection that could not be made or was lost (or timed out) before
/// the whole answer arrived is a connection failure; anything else (a bad URL, a redirect
/// loop) is final.
fn connection_failure(url: &str, err: reqwest::Error) -> Failure {
    let lost = err.is_connect() || err.is_request() || err.is_body() || err.is_timeout();
    let err = transport_error(url, err);
    if lost {
        Failure::Connection(err)
    } else {
        Failure::Answer(err)
    }
}

fn transport_error(url: &str, err: reqwest::Error) -> AgentError {
    AgentError::internal(format!("request to {url} failed: {err}"))
}

#[async_trait::async_trait]
impl crate::transport::AgentTransport for A2aClient {
    async fn get_card(&self) -> AgentResult<AgentCard> {
        A2aClient::get_card(self).await
    }

    async fn send_message(
        &self,
        message: Message,
        options: SendMessageOptions,
    ) -> AgentResult<Task> {
        A2aClient::send_message(self, message, options).await
    }

    async fn get_task(&self, task_id: &TaskId, history_length: Option<usize>) -> AgentResult<Task> {
        A2aClient::get_task(self, task_id, history_length).await
    }

    async fn list_tasks(&self, query: &TaskListQuery) -> AgentResult<TaskList> {
        A2aClient::list_tasks(self, query).await
    }

    async fn cancel_task(&self, task_id: &TaskId, reason: Option<String>) -> AgentResult<Task> {
        A2aClient::cancel_task(self, task_id, reason).await
    }

    async fn send_streaming_message(&self, message: Message) -> AgentResult<TaskEventStream> {
        A2aClient::send_streaming_message(self, message).await
    }

    async fn subscribe(&self, task_id: &TaskId) -> AgentResult<TaskEventStream> {
        A2aClient::subscribe(self, task_id).await
    }
}
