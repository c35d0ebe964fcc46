//! The WebSocket binding of the client: A2A v1.0 over the server's WebSocket endpoint
//! ([`WS_PATH`]): every operation as JSON-RPC frames, streams as the frames that carry the
//! request's id, and cancellation on a separate control socket.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use futures::stream::{self, StreamExt};
use futures::SinkExt;
use keel_core::{AgentCard, AgentError, AgentResult, TaskId};
use serde_json::{json, Value};
use tokio::sync::{mpsc, OnceCell};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::{HeaderName, HeaderValue};
use tokio_tungstenite::tungstenite::Message as Frame;

use super::binding::{Call, ClientBinding, Failure, Reply, Request, StreamRequest};
use crate::jsonrpc;
use crate::server::AGENT_CARD_PATH;
use crate::stream::StreamEvent;
use crate::transport::TaskEventStream;
use crate::version::VERSION_HEADER;
use crate::wire;
use crate::ws::WS_PATH;

/// Frames queued for the socket before a request waits to send.
const OUTBOX: usize = 64;

/// The WebSocket binding of [`A2aClient`](crate::A2aClient) (`ws://<host>/ws`).
///
/// Requests carry `A2A-Version: 1.0` on the upgrade. Operations share one data socket and run
/// concurrently on it (the server answers each request by its id); a stream is the frames of
/// its request, ending after the final status. CancelTask goes over a second, control socket,
/// so a cancel is never queued behind the frames of the stream it stops. Sockets are opened on
/// first use; a socket the server closed is reopened by the next call (calls in flight on it
/// fail with [`AgentError::Internal`], as a lost HTTP connection does). The card comes from
/// `GET /.well-known/agent-card.json` over HTTP.
pub struct WsBinding {
    base_url: String,
    headers: Vec<(HeaderName, HeaderValue)>,
    http: reqwest::Client,
    next_id: AtomicU64,
    data: Mutex<Option<Arc<Socket>>>,
    control: Mutex<Option<Arc<Socket>>>,
    connect_lock: tokio::sync::Mutex<()>,
    card: OnceCell<AgentCard>,
}

/// One open WebSocket: frames go out through `outbox`, answers come back to the request that
/// waits for their id.
struct Socket {
    outbox: mpsc::Sender<Frame>,
    pending: Arc<Mutex<HashMap<String, mpsc::UnboundedSender<Value>>>>,
    closed: Arc<std::sync::atomic::AtomicBool>,
}

/// Removes a request's entry when its reader goes away.
struct Registration {
    pending: Arc<Mutex<HashMap<String, mpsc::UnboundedSender<Value>>>>,
    id: String,
}

impl Drop for Registration {
    fn drop(&mut self) {
        if let Ok(mut pending) = self.pending.lock() {
            pending.remove(&self.id);
        }
    }
}

impl Socket {
    async fn open(url: &str, headers: &[(HeaderName, HeaderValue)]) -> AgentResult<Socket> {
        let mut request = url
            .into_client_request()
            .map_err(|e| AgentError::internal(format!("bad WebSocket URL {url}: {e}")))?;
        request.headers_mut().insert(
            VERSION_HEADER,
            HeaderValue::from_static(wire::PROTOCOL_VERSION),
        );
        for (name, value) in headers {
            request.headers_mut().insert(name.clone(), value.clone());
        }
        let (socket, _) = tokio_tungstenite::connect_async(request)
            .await
            .map_err(|e| match e {
                tokio_tungstenite::tungstenite::Error::Http(response) => {
                    let status = response.status();
                    let body = response
                        .body()
                        .as_deref()
                        .and_then(|b| serde_json::from_slice::<Value>(b).ok());
                    match body.as_ref().and_then(|b| b.get("error")) {
                        Some(error) => jsonrpc::agent_error_from_rpc(error, None),
                        None => AgentError::internal(format!(
                            "WebSocket upgrade at {url} answered HTTP {status}"
                        )),
                    }
                }
                other => AgentError::Unreachable {
                    url: url.to_string(),
                    cause: other.to_string(),
                },
            })?;
        let (mut sink, mut source) = socket.split();
        let (outbox, mut outgoing) = mpsc::channel::<Frame>(OUTBOX);
        let pending: Arc<Mutex<HashMap<String, mpsc::UnboundedSender<Value>>>> = Arc::default();
        let closed = Arc::new(std::sync::atomic::AtomicBool::new(false));
        tokio::spawn(async move {
            while let Some(frame) = outgoing.recv().await {
                if sink.send(frame).await.is_err() {
                    break;
                }
            }
            let _ = sink.close().await;
        });
        let (readers, done) = (pending.clone(), closed.clone());
        tokio::spawn(async move {
            while let Some(Ok(frame)) = source.next().await {
                let text = match frame {
                    Frame::Text(text) => text.as_str().to_owned(),
                    Frame::Binary(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
                    Frame::Close(_) => break,
                    _ => continue,
                };
                let Ok(answer) = serde_json::from_str::<Value>(&text) else {
                    continue;
                };
                let Some(id) = answer.get("id").and_then(Value::as_str) else {
                    continue;
                };
                let reader = readers.lock().ok().and_then(|p| p.get(id).cloned());
                if let Some(reader) = reader {
                    // Unbounded, so that a stream its holder does not read never holds up the
                    // answers of other requests (the server bounds what one task sends); a
                    // reader that went away (a dropped stream) just misses its frames.
                    let _ = reader.send(answer);
                }
            }
            done.store(true, Ordering::Release);
            // Every request still waiting learns that the socket is gone.
            if let Ok(mut pending) = readers.lock() {
                pending.clear();
            }
        });
        Ok(Socket {
            outbox,
            pending,
            closed,
        })
    }

    fn is_open(&self) -> bool {
        !self.closed.load(Ordering::Acquire) && !self.outbox.is_closed()
    }

    /// Send one request; its answers arrive on the receiver until the registration drops.
    async fn request(
        &self,
        id: String,
        method: &str,
        params: Value,
    ) -> AgentResult<(mpsc::UnboundedReceiver<Value>, Registration)> {
        let (sender, receiver) = mpsc::unbounded_channel();
        self.pending
            .lock()
            .map_err(|_| AgentError::internal("WebSocket client state poisoned"))?
            .insert(id.clone(), sender);
        let registration = Registration {
            pending: self.pending.clone(),
            id: id.clone(),
        };
        let request = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        self.outbox
            .send(Frame::text(request.to_string()))
            .await
            .map_err(|_| {
                AgentError::internal("the WebSocket closed before the request went out")
            })?;
        Ok((receiver, registration))
    }
}

impl WsBinding {
    pub(crate) fn new(base_url: impl Into<String>) -> Self {
        Self {
            base_url: base_url.into().trim_end_matches('/').to_owned(),
            headers: Vec::new(),
            http: reqwest::Client::new(),
            next_id: AtomicU64::new(1),
            data: Mutex::new(None),
            control: Mutex::new(None),
            connect_lock: tokio::sync::Mutex::new(()),
            card: OnceCell::new(),
        }
    }

    pub(crate) fn with_header(mut self, name: &str, value: &str) -> AgentResult<Self> {
        let invalid = |e: &dyn std::fmt::Display| AgentError::InvalidInput {
            field: "header".into(),
            reason: e.to_string(),
        };
        let name = HeaderName::from_bytes(name.as_bytes()).map_err(|e| invalid(&e))?;
        let value = HeaderValue::from_str(value).map_err(|e| invalid(&e))?;
        self.headers.push((name, value));
        Ok(self)
    }

    fn socket_url(&self) -> String {
        let base = if let Some(rest) = self.base_url.strip_prefix("http://") {
            format!("ws://{rest}")
        } else if let Some(rest) = self.base_url.strip_prefix("https://") {
            format!("wss://{rest}")
        } else {
            self.base_url.clone()
        };
        format!("{base}{WS_PATH}")
    }

    fn http_base(&self) -> String {
        if let Some(rest) = self.base_url.strip_prefix("ws://") {
            format!("http://{rest}")
        } else if let Some(rest) = self.base_url.strip_prefix("wss://") {
            format!("https://{rest}")
        } else {
            self.base_url.clone()
        }
    }

    /// The open socket in `slot`, opening one when there is none or it closed.
    async fn socket(&self, slot: &Mutex<Option<Arc<Socket>>>) -> AgentResult<Arc<Socket>> {
        let current = || {
            slot.lock()
                .ok()
                .and_then(|s| s.clone())
                .filter(|s| s.is_open())
        };
        if let Some(socket) = current() {
            return Ok(socket);
        }
        let _connecting = self.connect_lock.lock().await;
        if let Some(socket) = current() {
            return Ok(socket);
        }
        let socket = Arc::new(Socket::open(&self.socket_url(), &self.headers).await?);
        if let Ok(mut slot) = slot.lock() {
            *slot = Some(socket.clone());
        }
        Ok(socket)
    }

    fn next_id(&self) -> String {
        format!("keel-ws-{}", self.next_id.fetch_add(1, Ordering::Relaxed))
    }

    /// A unary call on the socket in `slot`: the one answer's result, or its error typed.
    async fn unary(
        &self,
        slot: &Mutex<Option<Arc<Socket>>>,
        method: &str,
        params: Value,
        task_id: Option<&TaskId>,
    ) -> AgentResult<Value> {
        let socket = self.socket(slot).await?;
        let (mut answers, _registration) = socket.request(self.next_id(), method, params).await?;
        let answer = answers.recv().await.ok_or_else(|| {
            AgentError::internal(format!("the WebSocket closed before {method} was answered"))
        })?;
        result_of(answer, task_id)
    }

    async fn follow(&self, request: StreamRequest) -> AgentResult<TaskEventStream> {
        let method = request.call().method();
        let params = request.params();
        let task_id = request.task_id();
        let socket = self.socket(&self.data).await?;
        let (mut answers, registration) = socket.request(self.next_id(), method, params).await?;
        // The first frame says whether the stream started (an error before it is the call's).
        let first = answers.recv().await.ok_or_else(|| {
            AgentError::internal(format!("the WebSocket closed before {method} was answered"))
        })?;
        let task_id = task_id.cloned();
        let first = decode_event(first, task_id.as_ref())?;
        let done = request.ends_at(&first);
        let rest = stream::unfold(
            (answers, registration, task_id, done, request),
            |(mut answers, registration, task_id, done, request)| async move {
                if done {
                    return None;
                }
                let item = match answers.recv().await {
                    Some(answer) => decode_event(answer, task_id.as_ref()),
                    None => Err(AgentError::internal(
                        "the WebSocket closed before the stream's final status",
                    )),
                };
                let done = item.as_ref().map_or(true, |event| request.ends_at(event));
                Some((item, (answers, registration, task_id, done, request)))
            },
        );
        Ok(stream::once(async move { Ok(first) }).chain(rest).boxed())
    }

    /// The data socket, but the control socket for CancelTask.
    fn slot(&self, call: Call) -> &Mutex<Option<Arc<Socket>>> {
        match call {
            Call::CancelTask => &self.control,
            _ => &self.data,
        }
    }
}

#[async_trait]
impl ClientBinding for WsBinding {
    /// Fetch the agent's card over HTTP (`<base>/.well-known/agent-card.json`, as v1.0).
    async fn card(&self) -> Result<AgentCard, Failure> {
        self.card
            .get_or_try_init(|| async {
                let url = format!("{}{AGENT_CARD_PATH}", self.http_base());
                let mut request = self
                    .http
                    .get(&url)
                    .header(VERSION_HEADER, wire::PROTOCOL_VERSION);
                for (name, value) in &self.headers {
                    request = request.header(name.as_str(), value.as_bytes());
                }
                let failed = |e: reqwest::Error| super::request_error(&url, &e);
                let response = request.send().await.map_err(failed)?;
                let status = response.status();
                if !status.is_success() {
                    let body = response.bytes().await.map_err(failed)?;
                    return Err(super::status_error(&url, status, &body));
                }
                let card: Value = response.json().await.map_err(failed)?;
                Ok(wire::decode_card(card)?.0)
            })
            .await
            .cloned()
            .map_err(Failure::Answer)
    }

    async fn send(&self, request: Request) -> Result<Reply, Failure> {
        let call = request.call();
        let result = self
            .unary(
                self.slot(call),
                call.method(),
                request.params(),
                request.task_id(),
            )
            .await?;
        Ok(request.decode(result)?)
    }

    async fn open_stream(&self, request: StreamRequest) -> AgentResult<TaskEventStream> {
        self.follow(request).await
    }
}

/// The result of one JSON-RPC answer, or its error typed.
fn result_of(mut answer: Value, task_id: Option<&TaskId>) -> AgentResult<Value> {
    if let Some(error) = answer.get("error") {
        return Err(jsonrpc::agent_error_from_rpc(error, task_id));
    }
    answer
        .get_mut("result")
        .map(Value::take)
        .ok_or_else(|| AgentError::internal("a WebSocket answer carries neither result nor error"))
}

fn decode_event(answer: Value, task_id: Option<&TaskId>) -> AgentResult<StreamEvent> {
    wire::decode_stream_event(result_of(answer, task_id)?)
}
