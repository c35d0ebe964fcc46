//! The A2A client: [`A2aClient`] writes the A2A operations once, over a binding that carries
//! them (`http`: JSON-RPC or HTTP+JSON over reqwest; `ws`: JSON-RPC over the server's
//! WebSocket; `in_process`: an agent in this process, through the server's handler layer),
//! and retries idempotent calls in one layer around the binding; `blocking` is the same
//! client for code that is not async.

mod binding;
mod blocking;
mod http;
mod in_process;
mod ws;

use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};
use keel_agent::AgentExecutor;
use keel_core::{AgentCard, AgentError, AgentResult, Message, Task, TaskId};
use keel_runtime::AuthContext;
use serde_json::Value;

// Public because it bounds `A2aClient`'s methods, but not exported: the bindings are the
// crate's own.
pub use binding::ClientBinding;
use binding::{Failure, Reply, Request, StreamRequest};
pub use blocking::BlockingClient;
pub use http::{Binding, HttpBinding};
pub use in_process::InProcessBinding;
pub use ws::WsBinding;

use crate::task_list::{TaskList, TaskListQuery};
use crate::transport::{AgentTransport, SendMessageOptions, TaskEventStream};

/// A client for one A2A agent, over a binding: [`HttpBinding`] (the default: JSON-RPC or
/// HTTP+JSON, see [`A2aClient::new`]), [`WsBinding`] ([`A2aClient::ws`]) or
/// [`InProcessBinding`] ([`A2aClient::in_process`]). Every binding answers with the same
/// models and the same typed errors.
///
/// Over HTTP, the endpoint is the URL of the card's interface for the client's [`Binding`]
/// (JSON-RPC unless [`A2aClient::with_binding`] says otherwise), fetched on first use from
/// `<base_url>/.well-known/agent-card.json`, unless given with [`A2aClient::with_endpoint`].
/// Requests carry `A2A-Version: 1.0`. A2A errors come back as typed
/// [`AgentError`](keel_core::AgentError)s on every binding: -32001 (HTTP 404) is
/// `TaskNotFound`, -32002 `TaskNotCancelable` (its state is
/// [`keel_core::TaskState::Unspecified`] when the agent does not say), -32602
/// `InvalidInput`, the "not offered" codes (-32601, -32003, -32004, -32005, -32007, -32009)
/// `Unsupported`, and everything else, including transport failures and malformed answers,
/// `Internal`.
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
#[derive(Debug, Clone)]
pub struct A2aClient<B = HttpBinding> {
    binding: B,
    retry: Retry,
}

/// The client over the server's WebSocket endpoint (see [`WsBinding`]).
pub type A2aWsClient = A2aClient<WsBinding>;

/// The client for an agent in this process (see [`InProcessBinding`]).
pub type InProcessClient = A2aClient<InProcessBinding>;

/// The retry layer: how idempotent calls are tried again after a connection loss.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Retry {
    /// Attempts per call, the first included (at least 1).
    max_attempts: u32,
    /// The wait before the first retry; doubled per further retry.
    base_delay: Duration,
}

impl Retry {
    /// The longest wait between two attempts.
    const MAX_DELAY: Duration = Duration::from_secs(5);

    /// No retries.
    const NONE: Retry = Retry {
        max_attempts: 1,
        base_delay: Duration::ZERO,
    };

    /// The waits between attempts: exponential from `base_delay`, capped at
    /// [`Retry::MAX_DELAY`], half of each random.
    fn backoff(self) -> ExponentialBuilder {
        ExponentialBuilder::default()
            .with_min_delay(self.base_delay / 2)
            .with_max_delay(Self::MAX_DELAY / 2)
            .with_factor(2.0)
            .with_jitter()
            .with_max_times(
                usize::try_from(self.max_attempts.saturating_sub(1)).unwrap_or(usize::MAX),
            )
    }

    /// Run `attempt` until it succeeds, fails for good, or the attempts run out; a lost
    /// connection is tried again only when the call is `idempotent`.
    async fn run<T, F, Fut>(self, what: &str, idempotent: bool, attempt: F) -> AgentResult<T>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, Failure>>,
    {
        attempt
            .retry(self.backoff())
            .when(|failure| failure.is_retryable(idempotent))
            .notify(|failure, wait| {
                tracing::debug!(what, ?wait, ?failure, "connection lost; retrying");
            })
            .await
            .map_err(Failure::into_error)
    }
}

impl<B> A2aClient<B> {
    fn over(binding: B, retry: Retry) -> Self {
        Self { binding, retry }
    }

    /// Retry idempotent calls (GetTask, ListTasks, CancelTask and the card fetch) whose
    /// connection failed or was lost before an answer arrived: up to `max_attempts` attempts
    /// in all (at least 1; 1 turns retries off), waiting `base_delay` before the first retry,
    /// doubled for each further one (capped at 5 s, half of it random). SendMessage is
    /// retried only when nothing was sent (the card fetch that finds the endpoint failed);
    /// the streams never are. An answer, even an error or a non-JSON one, is never retried. Over HTTP the default is
    /// [`A2aClient::DEFAULT_RETRY_ATTEMPTS`] attempts from 100 ms; the other bindings do not
    /// retry by default.
    #[must_use]
    pub fn with_retries(self, max_attempts: u32, base_delay: Duration) -> Self {
        Self {
            retry: Retry {
                max_attempts: max_attempts.max(1),
                base_delay,
            },
            ..self
        }
    }
}

impl A2aClient<HttpBinding> {
    /// How many attempts an idempotent call gets by default over HTTP (the first included).
    pub const DEFAULT_RETRY_ATTEMPTS: u32 = 3;

    /// A client over HTTP for the agent served at `base_url` (the origin that holds its
    /// well-known card).
    pub fn new(base_url: impl Into<String>) -> Self {
        Self::over(
            HttpBinding::new(base_url),
            Retry {
                max_attempts: Self::DEFAULT_RETRY_ATTEMPTS,
                base_delay: Duration::from_millis(100),
            },
        )
    }

    /// The same as [`A2aClient::new`]: a client over HTTP.
    pub fn http(base_url: impl Into<String>) -> Self {
        Self::new(base_url)
    }

    /// Send requests with this reqwest client (for its timeouts, proxy, TLS or pool settings)
    /// instead of a default one.
    #[must_use]
    pub fn with_http_client(self, http: reqwest::Client) -> Self {
        Self::over(self.binding.with_http_client(http), self.retry)
    }

    /// Use this binding (its interface is looked up in the card unless an endpoint is given).
    #[must_use]
    pub fn with_binding(self, binding: Binding) -> Self {
        Self::over(self.binding.with_binding(binding), self.retry)
    }

    /// Use this endpoint (for the client's binding) instead of discovering it from the card.
    #[must_use]
    pub fn with_endpoint(self, endpoint: impl Into<String>) -> Self {
        Self::over(self.binding.with_endpoint(endpoint), self.retry)
    }

    /// Compact a thread's history on the agent's server, as the agent's automatic compaction
    /// would (`POST /x/threads/compact`, which `keel serve` offers on every agent): `request`
    /// names the thread and the strategy. A thread a run holds is
    /// [`AgentError::Overloaded`]; a server without the endpoint answers
    /// [`AgentError::Unsupported`].
    pub async fn compact_thread(
        &self,
        request: &keel_llm::HistoryCompactionRequest,
    ) -> AgentResult<keel_llm::HistoryCompactionResult> {
        let answer = self
            .binding
            .post_endpoint(crate::endpoint::COMPACT_THREAD_PATH, request)
            .await?;
        serde_json::from_value(answer).map_err(|err| {
            AgentError::internal(format!("the compaction answer does not parse: {err}"))
        })
    }
}

impl A2aClient<WsBinding> {
    /// A client over the WebSocket endpoint of the agent served at `base_url`
    /// (`http://host:port` or `ws://host:port`; the socket is at [`WS_PATH`](crate::WS_PATH)
    /// under it).
    ///
    /// ```no_run
    /// use keel_core::Message;
    /// use keel_transport::{A2aClient, SendMessageOptions};
    /// # async fn demo() -> keel_core::AgentResult<()> {
    /// let client = A2aClient::ws("http://127.0.0.1:8080");
    /// let task = client.send_message(Message::user("hi"), SendMessageOptions::default()).await?;
    /// println!("{}", task.state());
    /// # Ok(())
    /// # }
    /// ```
    pub fn ws(base_url: impl Into<String>) -> Self {
        Self::over(WsBinding::new(base_url), Retry::NONE)
    }

    /// Send this header on every upgrade request and card fetch (credentials: `X-API-Key`,
    /// `Authorization`). A name or value HTTP refuses is
    /// [`AgentError::InvalidInput`](keel_core::AgentError::InvalidInput).
    pub fn with_header(self, name: &str, value: &str) -> AgentResult<Self> {
        Ok(Self::over(
            self.binding.with_header(name, value)?,
            self.retry,
        ))
    }
}

impl A2aClient<InProcessBinding> {
    /// A client for the agent that `executor` runs in this process, as the tenant the
    /// runtime's auth service grants a caller without credentials (an error when it grants
    /// none).
    ///
    /// ```
    /// use std::sync::Arc;
    /// use keel_agent::{Agent, AgentExecutor};
    /// use keel_core::{AgentCard, Message, TaskState};
    /// use keel_llm::MockLlm;
    /// use keel_runtime::Services;
    /// use keel_transport::{A2aClient, SendMessageOptions};
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> keel_core::AgentResult<()> {
    /// let agent = Agent::builder(AgentCard::new("echo", "Echoes", "http://unused")).build()?;
    /// let runtime = Arc::new(Services::in_memory(Arc::new(MockLlm::new())));
    /// let client = A2aClient::in_process(AgentExecutor::new(agent, runtime))?;
    /// let task = client.send_message(Message::user("hi"), SendMessageOptions::default()).await?;
    /// assert_eq!(task.state(), TaskState::Completed);
    /// # Ok(())
    /// # }
    /// ```
    pub fn in_process(executor: AgentExecutor) -> AgentResult<Self> {
        Ok(Self::over(InProcessBinding::new(executor)?, Retry::NONE))
    }

    /// A client for the agent that `executor` runs in this process, calling as the tenant
    /// `auth`.
    pub fn with_auth(executor: AgentExecutor, auth: AuthContext) -> Self {
        Self::over(InProcessBinding::with_auth(executor, auth), Retry::NONE)
    }

    /// The executor behind the client.
    pub fn executor(&self) -> &AgentExecutor {
        self.binding.executor()
    }

    /// The tenant the client calls as.
    pub fn auth(&self) -> &AuthContext {
        self.binding.auth()
    }
}

impl<B: ClientBinding> A2aClient<B> {
    /// The agent's card (over HTTP, from `<base_url>/.well-known/agent-card.json`; in
    /// process, the card as the agent defines it, without a server's interfaces).
    pub async fn get_card(&self) -> AgentResult<AgentCard> {
        self.retry
            .run("agent card", true, || self.binding.card())
            .await
    }

    /// Send a message: start a task (or continue the one named by `message.task_id`). Blocks
    /// until the task finishes unless `options.return_immediately`.
    pub async fn send_message(
        &self,
        message: Message,
        options: SendMessageOptions,
    ) -> AgentResult<Task> {
        self.send(Request::SendMessage { message, options })
            .await?
            .into_task()
    }

    /// A task, with its last `history_length` messages when given.
    pub async fn get_task(
        &self,
        task_id: &TaskId,
        history_length: Option<usize>,
    ) -> AgentResult<Task> {
        self.send(Request::GetTask {
            task_id: task_id.clone(),
            history_length,
        })
        .await?
        .into_task()
    }

    /// One page of the agent's tasks, most recently updated first.
    pub async fn list_tasks(&self, query: &TaskListQuery) -> AgentResult<TaskList> {
        self.send(Request::ListTasks(query.clone()))
            .await?
            .into_tasks()
    }

    /// Cancel a task; `reason` travels as `metadata.reason`.
    pub async fn cancel_task(&self, task_id: &TaskId, reason: Option<String>) -> AgentResult<Task> {
        self.send(Request::CancelTask {
            task_id: task_id.clone(),
            reason,
        })
        .await?
        .into_task()
    }

    /// Send a message and follow its task: the stream starts with the task, carries its status
    /// and artifact updates, and ends after its final (terminal or interrupted) status.
    pub async fn send_streaming_message(&self, message: Message) -> AgentResult<TaskEventStream> {
        self.binding
            .open_stream(StreamRequest::SendStreamingMessage(message))
            .await
    }

    /// Follow a task that is not terminal: the stream starts with the task as it stands, then
    /// carries its updates until its final status. A terminal task is
    /// [`AgentError::Unsupported`](keel_core::AgentError::Unsupported) (A2A's
    /// UnsupportedOperationError).
    pub async fn subscribe(&self, task_id: &TaskId) -> AgentResult<TaskEventStream> {
        self.binding
            .open_stream(StreamRequest::Subscribe(task_id.clone()))
            .await
    }

    /// A unary request through the retry layer.
    async fn send(&self, request: Request) -> AgentResult<Reply> {
        let call = request.call();
        self.retry
            .run(call.method(), call.is_idempotent(), || {
                self.binding.send(request.clone())
            })
            .await
    }
}

#[async_trait::async_trait]
impl<B: ClientBinding> AgentTransport for A2aClient<B> {
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

/// A request that got no answer, as the error a user can act on: a URL that cannot be
/// requested is the caller's input; anything else (refused, unresolved, timed out, cut off)
/// names the URL and the innermost cause, which is what says what happened.
pub(crate) fn request_error(url: &str, err: &reqwest::Error) -> AgentError {
    let cause = keel_core::ErrorSource::innermost(err);
    if err.is_builder() {
        return AgentError::invalid_input(
            "url",
            format!("`{url}` cannot be requested ({cause}); write it as http://host:port/..."),
        );
    }
    let cause = if err.is_timeout() {
        "no answer in time".to_owned()
    } else {
        cause
    };
    AgentError::Unreachable {
        url: url.to_owned(),
        cause,
    }
}

/// An HTTP error answer that carries no A2A error. `404` means no agent is there, which is
/// the caller's URL to fix; any other status is the server's. The server's own words (`error`
/// as text, or `error.message`) are kept: they may say which agents it has.
pub(crate) fn status_error(url: &str, status: reqwest::StatusCode, body: &[u8]) -> AgentError {
    let said = serde_json::from_slice::<Value>(body).ok().and_then(|body| {
        let error = body.get("error")?;
        error
            .as_str()
            .or_else(|| error.get("message")?.as_str())
            .map(str::to_owned)
    });
    let said = said.map(|said| format!(": {said}")).unwrap_or_default();
    if status == reqwest::StatusCode::NOT_FOUND {
        return AgentError::invalid_input(
            "url",
            format!("no A2A agent answers at {url} (HTTP 404{said})"),
        );
    }
    AgentError::Unreachable {
        url: url.to_owned(),
        cause: format!("answered HTTP {status}{said}"),
    }
}

#[cfg(test)]
mod tests {
    use backon::BackoffBuilder;

    use super::*;

    #[test]
    fn retry_waits_double_with_half_of_each_random_and_are_capped() {
        let retry = Retry {
            max_attempts: 12,
            base_delay: Duration::from_millis(100),
        };
        for _ in 0..50 {
            let waits: Vec<Duration> = retry.backoff().build().collect();
            assert_eq!(
                waits.len(),
                11,
                "one wait between each two of the 12 attempts"
            );
            assert!(
                waits[0] >= Duration::from_millis(50) && waits[0] <= Duration::from_millis(100)
            );
            assert!(
                waits[1] >= Duration::from_millis(100) && waits[1] <= Duration::from_millis(200)
            );
            assert!(waits.iter().all(|w| *w <= Retry::MAX_DELAY));
            assert!(waits[10] >= Retry::MAX_DELAY / 2, "capped, not shrunk");
        }
        assert_eq!(Retry::NONE.backoff().build().count(), 0);
    }
}
