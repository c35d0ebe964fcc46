//! The in-process transport (seed 001's `runtime` transport type): [`InProcessClient`] calls a
//! local [`AgentExecutor`] through the same handler layer the A2A server uses, with no HTTP,
//! so its answers and errors are those a remote [`A2aClient`](crate::A2aClient) gets.

use async_trait::async_trait;
use futures::StreamExt;
use keel_agent::AgentExecutor;
use keel_core::{AgentCard, AgentError, AgentResult, Message, Task, TaskId};
use keel_runtime::{AuthContext, Credentials};
use tokio::sync::watch;

use crate::client::{SendMessageOptions, TaskEventStream};
use crate::handlers::Handlers;
use crate::jsonrpc::{self, RpcError};
use crate::push::{Push, RetryPolicy};
use crate::task_list::{TaskList, TaskListQuery};
use crate::transport::AgentTransport;
use crate::wire::SendMessageCall;

/// A client for an agent running in this process: every call goes through the server's
/// handler layer (the code both HTTP bindings share) straight to the [`AgentExecutor`], so the
/// semantics (blocking, `historyLength`, list order and paging, cancel rules, stream framing
/// and its end) and the typed errors are exactly the remote client's, without HTTP or JSON.
///
/// Calls run as one tenant: by default the one the runtime's auth service grants a caller
/// without credentials (as the server does for an unauthenticated request), or the one given
/// with [`InProcessClient::with_auth`].
///
/// ```
/// use std::sync::Arc;
/// use keel_agent::{Agent, AgentExecutor};
/// use keel_core::{AgentCard, Message, TaskState};
/// use keel_llm::MockLlm;
/// use keel_runtime::Services;
/// use keel_transport::{AgentTransport, InProcessClient, SendMessageOptions};
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> keel_core::AgentResult<()> {
/// let agent = Agent::builder(AgentCard::new("echo", "Echoes", "http://unused")).build()?;
/// let runtime = Arc::new(Services::in_memory(Arc::new(MockLlm::new())));
/// let client = InProcessClient::new(AgentExecutor::new(agent, runtime))?;
/// let task = client.send_message(Message::user("hi"), SendMessageOptions::default()).await?;
/// assert_eq!(task.state(), TaskState::Completed);
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct InProcessClient {
    handlers: Handlers,
    executor: AgentExecutor,
    auth: AuthContext,
    /// Held so that streams never see the server closing: they end with their task.
    _closing: watch::Sender<bool>,
    /// Held so that push deliveries are never told to stop.
    _push_stop: watch::Sender<bool>,
}

impl std::fmt::Debug for InProcessClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InProcessClient")
            .field("agent", &self.executor.agent().card().name)
            .field("auth", &self.auth)
            .finish_non_exhaustive()
    }
}

impl InProcessClient {
    /// A client for the agent that `executor` runs, as the tenant the runtime's auth service
    /// grants a caller without credentials (an error when it grants none).
    pub fn new(executor: AgentExecutor) -> AgentResult<Self> {
        let auth = executor
            .runtime()
            .auth_service()
            .authenticate(&Credentials::default())?
            .ok_or_else(|| AgentError::Unsupported {
                what: "an anonymous caller (the runtime's auth service accepts none; use \
                       InProcessClient::with_auth)"
                    .into(),
            })?;
        Ok(Self::with_auth(executor, auth))
    }

    /// A client for the agent that `executor` runs, calling as the tenant `auth`.
    pub fn with_auth(executor: AgentExecutor, auth: AuthContext) -> Self {
        let (closing, closed) = watch::channel(false);
        let (push_stop, push_stopped) = watch::channel(false);
        let push = Push::new(
            executor.clone(),
            false,
            RetryPolicy::default(),
            push_stopped,
        );
        Self {
            handlers: Handlers::new(executor.clone(), closed, None, None, push),
            executor,
            auth,
            _closing: closing,
            _push_stop: push_stop,
        }
    }

    /// The executor behind the client.
    pub fn executor(&self) -> &AgentExecutor {
        &self.executor
    }

    /// The tenant the client calls as.
    pub fn auth(&self) -> &AuthContext {
        &self.auth
    }

    /// The agent's card (as the agent defines it; a server adds its interfaces).
    pub fn get_card(&self) -> AgentCard {
        self.executor.agent().card().clone()
    }

    /// Send a message: start a task (or continue the one named by `message.task_id`). Blocks
    /// until the task finishes unless `options.return_immediately`.
    pub async fn send_message(
        &self,
        message: Message,
        options: SendMessageOptions,
    ) -> AgentResult<Task> {
        let task_id = message.task_id.clone();
        let call = SendMessageCall {
            message,
            return_immediately: options.return_immediately,
            history_length: options.history_length,
            push_config: None,
        };
        self.handlers
            .send_message(&self.auth, call)
            .await
            .map_err(|e| typed(&e, task_id.as_ref()))
    }

    /// A task, with its last `history_length` messages when given.
    pub async fn get_task(
        &self,
        task_id: &TaskId,
        history_length: Option<usize>,
    ) -> AgentResult<Task> {
        self.handlers
            .get_task(&self.auth, task_id, history_length)
            .await
            .map_err(|e| retyped(&e, Some(task_id)))
    }

    /// One page of the agent's tasks, most recently updated first.
    pub async fn list_tasks(&self, query: &TaskListQuery) -> AgentResult<TaskList> {
        self.handlers
            .list_tasks(&self.auth, query.clone())
            .await
            .map_err(|e| retyped(&e, None))
    }

    /// Cancel a task, with an optional reason.
    pub async fn cancel_task(&self, task_id: &TaskId, reason: Option<String>) -> AgentResult<Task> {
        self.handlers
            .cancel_task(&self.auth, task_id, reason)
            .await
            .map_err(|e| retyped(&e, Some(task_id)))
    }

    /// Send a message and follow its task: the stream starts with the task, carries its status
    /// and artifact updates, and ends after its final (terminal or interrupted) status.
    pub async fn send_streaming_message(&self, message: Message) -> AgentResult<TaskEventStream> {
        let task_id = message.task_id.clone();
        let call = SendMessageCall {
            message,
            return_immediately: false,
            history_length: None,
            push_config: None,
        };
        let events = self
            .handlers
            .send_streaming_message(&self.auth, call)
            .await
            .map_err(|e| typed(&e, task_id.as_ref()))?;
        Ok(retyped_stream(events, task_id))
    }

    /// Follow a task that is not terminal until its final status; a terminal task is
    /// [`AgentError::Unsupported`].
    pub async fn subscribe(&self, task_id: &TaskId) -> AgentResult<TaskEventStream> {
        let events = self
            .handlers
            .subscribe(&self.auth, task_id)
            .await
            .map_err(|e| typed(&e, Some(task_id)))?;
        Ok(retyped_stream(events, Some(task_id.clone())))
    }
}

/// An A2A error as the remote client types it (through its JSON-RPC error object), so both
/// clients answer the same [`AgentError`] variants.
fn typed(error: &RpcError, task_id: Option<&TaskId>) -> AgentError {
    jsonrpc::agent_error_from_rpc(&error.to_json(), task_id)
}

/// An engine error as the remote client types it: the same variant, keeping the engine's own
/// error (and its message) when the wire would not change its variant.
fn retyped(error: &AgentError, task_id: Option<&TaskId>) -> AgentError {
    let remote = typed(&RpcError::from_agent_error(error), task_id);
    if std::mem::discriminant(&remote) == std::mem::discriminant(error) {
        error.clone()
    } else {
        remote
    }
}

fn retyped_stream(
    events: crate::handlers::EventStream,
    task_id: Option<TaskId>,
) -> TaskEventStream {
    events
        .map(move |item| item.map_err(|e| retyped(&e, task_id.as_ref())))
        .boxed()
}

#[async_trait]
impl AgentTransport for InProcessClient {
    async fn get_card(&self) -> AgentResult<AgentCard> {
        Ok(InProcessClient::get_card(self))
    }

    async fn send_message(
        &self,
        message: Message,
        options: SendMessageOptions,
    ) -> AgentResult<Task> {
        InProcessClient::send_message(self, message, options).await
    }

    async fn get_task(&self, task_id: &TaskId, history_length: Option<usize>) -> AgentResult<Task> {
        InProcessClient::get_task(self, task_id, history_length).await
    }

    async fn list_tasks(&self, query: &TaskListQuery) -> AgentResult<TaskList> {
        InProcessClient::list_tasks(self, query).await
    }

    async fn cancel_task(&self, task_id: &TaskId, reason: Option<String>) -> AgentResult<Task> {
        InProcessClient::cancel_task(self, task_id, reason).await
    }

    async fn send_streaming_message(&self, message: Message) -> AgentResult<TaskEventStream> {
        InProcessClient::send_streaming_message(self, message).await
    }

    async fn subscribe(&self, task_id: &TaskId) -> AgentResult<TaskEventStream> {
        InProcessClient::subscribe(self, task_id).await
    }
}
