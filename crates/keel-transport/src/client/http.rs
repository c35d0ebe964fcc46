//! The HTTP binding of the client: A2A v1.0 over JSON-RPC or HTTP+JSON (reqwest), streams over
//! Server-Sent Events; talks to a Keel agent or any A2A v1.0 agent.

use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;
use eventsource_stream::Eventsource;
use futures::stream::{self, StreamExt};
use keel_core::{AgentCard, AgentError, AgentResult, TaskId, TraceParent};
use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use serde_json::{json, Map, Value};
use tokio::sync::OnceCell;
use tracing::Instrument;

use super::binding::{Call, ClientBinding, Failure, Reply, Request, StreamRequest};
use crate::jsonrpc;
use crate::server::AGENT_CARD_PATH;
use crate::stream::StreamEvent;
use crate::transport::TaskEventStream;
use crate::version::VERSION_HEADER;
use crate::wire;

/// The protocol binding an HTTP client uses.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Binding {
    /// JSON-RPC 2.0 (the card's `JSONRPC` interface).
    #[default]
    JsonRpc,
    /// HTTP+JSON, A2A's REST binding (the card's `HTTP+JSON` interface).
    HttpJson,
}

/// The HTTP binding of [`A2aClient`](crate::A2aClient): JSON-RPC or HTTP+JSON to one remote
/// agent, its endpoint found in the agent's card unless given.
#[derive(Debug)]
pub struct HttpBinding {
    http: reqwest::Client,
    base_url: String,
    binding: Binding,
    endpoint: OnceCell<String>,
    next_id: AtomicU64,
}

impl HttpBinding {
    pub(crate) fn new(base_url: impl Into<String>) -> Self {
        Self {
            http: reqwest::Client::new(),
            base_url: base_url.into().trim_end_matches('/').to_owned(),
            binding: Binding::default(),
            endpoint: OnceCell::new(),
            next_id: AtomicU64::new(1),
        }
    }

    /// POST `body` to the agent's custom endpoint at `path` (under
    /// [`ENDPOINTS_PATH`](crate::ENDPOINTS_PATH)) and read its JSON answer. Its errors are
    /// `{"error": {"code", "message"}}` with the HTTP status saying which.
    pub(crate) async fn post_endpoint(
        &self,
        path: &str,
        body: &impl serde::Serialize,
    ) -> AgentResult<Value> {
        let url = format!("{}{}{path}", self.base_url, crate::ENDPOINTS_PATH);
        let request = self
            .http
            .post(&url)
            .header(VERSION_HEADER, wire::PROTOCOL_VERSION)
            .json(body);
        let (status, body) = exchange(request, &url).await.map_err(Failure::into_error)?;
        if status.is_success() {
            return serde_json::from_slice(&body).map_err(|err| {
                AgentError::internal(format!("{url} answered JSON that does not parse: {err}"))
            });
        }
        // An endpoint's errors are A2A's REST errors; a 404 without one is no endpoint at all.
        let error = serde_json::from_slice::<Value>(&body)
            .ok()
            .and_then(|body| Some(rest_error_as_rpc(body.get("error")?)));
        Err(match error {
            Some(error) => jsonrpc::agent_error_from_rpc(&error, None),
            None if status == reqwest::StatusCode::NOT_FOUND => AgentError::Unsupported {
                what: format!("{url} (the server offers no such endpoint)"),
            },
            None => super::status_error(&url, status, &body),
        })
    }

    pub(crate) fn with_http_client(self, http: reqwest::Client) -> Self {
        Self { http, ..self }
    }

    pub(crate) fn with_binding(self, binding: Binding) -> Self {
        Self { binding, ..self }
    }

    pub(crate) fn with_endpoint(self, endpoint: impl Into<String>) -> Self {
        Self {
            endpoint: OnceCell::new_with(Some(endpoint.into())),
            ..self
        }
    }

    async fn fetch_card(&self) -> Result<(AgentCard, wire::Endpoints), Failure> {
        let url = format!("{}{AGENT_CARD_PATH}", self.base_url);
        let request = self
            .http
            .get(&url)
            .header(VERSION_HEADER, wire::PROTOCOL_VERSION);
        let (status, body) = exchange(request, &url).await?;
        if !status.is_success() {
            return Err(Failure::Answer(super::status_error(&url, status, &body)));
        }
        let card: Value = serde_json::from_slice(&body).map_err(|e| {
            Failure::Answer(AgentError::internal(format!(
                "GET {url} answered a card that is not JSON: {e}"
            )))
        })?;
        Ok(wire::decode_card(card)?)
    }

    /// The endpoint of the client's binding; a card fetch that failed on its connection sent
    /// nothing, so any call may try again.
    async fn endpoint(&self) -> Result<&str, Failure> {
        self.endpoint
            .get_or_try_init(|| async {
                let (card, endpoints) =
                    self.fetch_card().await.map_err(|failure| match failure {
                        Failure::Connection(err) => Failure::NotSent(err),
                        other => other,
                    })?;
                let (endpoint, name) = match self.binding {
                    Binding::JsonRpc => (endpoints.jsonrpc, "JSONRPC"),
                    Binding::HttpJson => (endpoints.http_json, "HTTP+JSON"),
                };
                endpoint.ok_or_else(|| {
                    Failure::Answer(AgentError::Unsupported {
                        what: format!("agent `{}` has no {name} interface in its card", card.name),
                    })
                })
            })
            .await
            .map(String::as_str)
    }

    /// The HTTP request of a call on the client's binding.
    async fn request(
        &self,
        call: Call,
        params: Value,
        trace: Option<(TraceParent, Option<String>)>,
    ) -> Result<(reqwest::RequestBuilder, String), Failure> {
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
        let mut http = builder.0.header(VERSION_HEADER, wire::PROTOCOL_VERSION);
        if let Some((parent, state)) = trace {
            http = http.header(TraceParent::HEADER, parent.to_string());
            if let Some(state) = state {
                http = http.header(TraceParent::STATE_HEADER, state);
            }
        }
        Ok((http, builder.1))
    }

    /// The error in an answer, as a JSON-RPC error object (`code`, `message`, `data`).
    fn error_of(&self, body: &Value) -> Option<Value> {
        let error = body.get("error")?;
        match self.binding {
            Binding::JsonRpc => Some(error.clone()),
            Binding::HttpJson => Some(rest_error_as_rpc(error)),
        }
    }
}

#[async_trait]
impl ClientBinding for HttpBinding {
    async fn card(&self) -> Result<AgentCard, Failure> {
        Ok(self.fetch_card().await?.0)
    }

    async fn send(&self, request: Request) -> Result<Reply, Failure> {
        let call = request.call();
        let method = call.method();
        let task_id = request.task_id();
        let (http_request, url) = self
            .request(call, request.params(), request.trace())
            .await?;
        let span = tracing::debug_span!("a2a.call", method, url = %url);
        let result = async {
            let (status, body) = exchange(http_request, &url).await?;
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
        .await?;
        Ok(request.decode(result)?)
    }

    async fn open_stream(&self, request: StreamRequest) -> AgentResult<TaskEventStream> {
        let call = request.call();
        let method = call.method();
        let (http_request, url) = self
            .request(call, request.params(), request.trace())
            .await
            .map_err(Failure::into_error)?;
        let response = http_request
            .header("accept", "text/event-stream")
            .send()
            .await
            .map_err(|e| super::request_error(&url, &e))?;
        let status = response.status();
        let is_sse = response
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"));
        let task_id = request.task_id().cloned();
        if !is_sse {
            // An error before the stream started comes as a plain JSON answer.
            let body = response
                .bytes()
                .await
                .map_err(|e| super::request_error(&url, &e))?;
            let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            return Err(match self.error_of(&body) {
                Some(error) => jsonrpc::agent_error_from_rpc(&error, task_id.as_ref()),
                None => AgentError::internal(format!(
                    "{method} to {url} answered HTTP {status} without an event stream"
                )),
            });
        }
        let binding = self.binding;
        let request = std::sync::Arc::new(request);
        let events = response.bytes_stream().eventsource();
        let state = (events.boxed(), false);
        Ok(stream::unfold(state, move |(mut events, done)| {
            let task_id = task_id.clone();
            let request = request.clone();
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
                    let done = item.as_ref().map_or(true, |event| request.ends_at(event));
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

/// What a path segment keeps as it is: RFC 3986's unreserved characters.
const PATH_SEGMENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

fn percent_encode(segment: &str) -> String {
    utf8_percent_encode(segment, PATH_SEGMENT).to_string()
}

/// A failed request: a connection that could not be made or was lost (or timed out) before
/// the whole answer arrived is a connection failure; anything else (a bad URL, a redirect
/// loop) is final.
/// Send `request` to `url` and read its whole answer: its status and body. A failure on the
/// way either way is the connection's.
async fn exchange(
    request: reqwest::RequestBuilder,
    url: &str,
) -> Result<(reqwest::StatusCode, axum::body::Bytes), Failure> {
    let response = request
        .send()
        .await
        .map_err(|e| connection_failure(url, e))?;
    let status = response.status();
    let body = response
        .bytes()
        .await
        .map_err(|e| connection_failure(url, e))?;
    Ok((status, body))
}

fn connection_failure(url: &str, err: reqwest::Error) -> Failure {
    let lost = err.is_connect() || err.is_request() || err.is_body() || err.is_timeout();
    let err = super::request_error(url, &err);
    if lost {
        Failure::Connection(err)
    } else {
        Failure::Answer(err)
    }
}
