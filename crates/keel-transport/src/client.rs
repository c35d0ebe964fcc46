//! The A2A v1.0 client (JSON-RPC over reqwest): talks to a Keel agent or any A2A v1.0 agent and
//! answers in Keel's models and errors.

use std::sync::atomic::{AtomicU64, Ordering};

use keel_core::{AgentCard, AgentError, AgentResult, Message, Task, TaskId};
use serde_json::{json, Value};
use tokio::sync::OnceCell;
use tracing::Instrument;

use crate::jsonrpc;
use crate::server::{AGENT_CARD_PATH, VERSION_HEADER};
use crate::wire;

/// How [`A2aClient::send_message`] should behave.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SendMessageOptions {
    /// Ask the agent to answer at once with the submitted task instead of waiting for it to
    /// finish (A2A `returnImmediately`).
    pub return_immediately: bool,
    /// Keep only this many most recent messages in the returned task's history.
    pub history_length: Option<usize>,
}

/// A client for one remote A2A agent.
///
/// The JSON-RPC endpoint is the URL of the `JSONRPC` interface in the agent's card, fetched on
/// first use from `<base_url>/.well-known/agent-card.json`, unless given with
/// [`A2aClient::with_endpoint`]. Requests carry `A2A-Version: 1.0`. JSON-RPC errors come back
/// as typed [`AgentError`]s: -32001 is [`AgentError::TaskNotFound`], -32002
/// [`AgentError::TaskNotCancelable`] (its state is [`keel_core::TaskState::Unspecified`] when
/// the agent does not say), -32602 [`AgentError::InvalidInput`], the "not offered" codes
/// (-32601, -32003, -32004, -32007, -32009) [`AgentError::Unsupported`], and everything else,
/// including transport failures and malformed answers, [`AgentError::Internal`].
///
/// ```no_run
/// use keel_core::Message;
/// use keel_transport::{A2aClient, SendMessageOptions};
/// # async fn demo() -> keel_core::AgentResult<()> {
/// let client = A2aClient::new("http://127.0.0.1:8080");
/// let task = client.send_message(Message::user("hi"), SendMessageOptions::default()).await?;
/// println!("{}: {:?}", task.state(), task.status().message.as_ref().map(Message::text));
/// # Ok(())
/// # }
/// ```
pub struct A2aClient {
    http: reqwest::Client,
    base_url: String,
    endpoint: OnceCell<String>,
    next_id: AtomicU64,
}

impl A2aClient {
    /// A client for the agent served at `base_url` (the origin that holds its well-known card).
    pub fn new(base_url: impl Into<String>) -> Self {
        Self {
            http: reqwest::Client::new(),
            base_url: base_url.into().trim_end_matches('/').to_owned(),
            endpoint: OnceCell::new(),
            next_id: AtomicU64::new(1),
        }
    }

    /// Use this JSON-RPC endpoint instead of discovering it from the card.
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

    async fn fetch_card(&self) -> AgentResult<(AgentCard, Option<String>)> {
        let url = format!("{}{AGENT_CARD_PATH}", self.base_url);
        let response = self
            .http
            .get(&url)
            .send()
            .await
            .map_err(|e| transport_error(&url, e))?;
        let status = response.status();
        if !status.is_success() {
            return Err(AgentError::internal(format!(
                "GET {url} answered HTTP {status}"
            )));
        }
        let card: Value = response
            .json()
            .await
            .map_err(|e| transport_error(&url, e))?;
        wire::decode_card(card)
    }

    async fn endpoint(&self) -> AgentResult<&str> {
        self.endpoint
            .get_or_try_init(|| async {
                let (card, endpoint) = self.fetch_card().await?;
                endpoint.ok_or_else(|| AgentError::Unsupported {
                    what: format!("agent `{}` has no JSONRPC interface in its card", card.name),
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
            .call("SendMessage", params, message.task_id.as_ref())
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
        wire::decode_task(self.call("GetTask", params, Some(task_id)).await?)
    }

    /// Cancel a task; `reason` travels as `metadata.reason`.
    pub async fn cancel_task(&self, task_id: &TaskId, reason: Option<String>) -> AgentResult<Task> {
        let params = wire::encode_cancel_task(task_id, reason.as_deref());
        wire::decode_task(self.call("CancelTask", params, Some(task_id)).await?)
    }

    async fn call(
        &self,
        method: &str,
        params: Value,
        task_id: Option<&TaskId>,
    ) -> AgentResult<Value> {
        let endpoint = self.endpoint().await?;
        let id = format!("keel-{}", self.next_id.fetch_add(1, Ordering::Relaxed));
        let span = tracing::debug_span!("a2a.call", method, id = %id, endpoint);
        let request = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        async {
            let response = self
                .http
                .post(endpoint)
                .header(VERSION_HEADER, wire::PROTOCOL_VERSION)
                .json(&request)
                .send()
                .await
                .map_err(|e| transport_error(endpoint, e))?;
            let status = response.status();
            let body = response
                .bytes()
                .await
                .map_err(|e| transport_error(endpoint, e))?;
            let Ok(mut body) = serde_json::from_slice::<Value>(&body) else {
                return Err(AgentError::internal(format!(
                    "{method} to {endpoint} answered HTTP {status} without a JSON-RPC response"
                )));
            };
            if let Some(error) = body.get("error") {
                return Err(jsonrpc::agent_error_from_rpc(error, task_id));
            }
            match body.get_mut("result").map(Value::take) {
                Some(result) if status.is_success() => Ok(result),
                _ => Err(AgentError::internal(format!(
                    "{method} to {endpoint} answered HTTP {status} without a result"
                ))),
            }
        }
        .instrument(span)
        .await
    }
}

fn transport_error(url: &str, err: reqwest::Error) -> AgentError {
    AgentError::internal(format!("request to {url} failed: {err}"))
}
