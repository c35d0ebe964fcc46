//! [`AgentTransport`]: the one typed interface to an A2A agent, whether it is remote
//! ([`A2aClient`](crate::A2aClient), over HTTP) or local
//! ([`InProcessClient`](crate::InProcessClient), no HTTP), so callers such as remote
//! delegation work with either.

use async_trait::async_trait;
use futures::stream::BoxStream;
use keel_core::{AgentCard, AgentResult, Message, Task, TaskId};

use crate::stream::StreamEvent;
use crate::task_list::{TaskList, TaskListQuery};

/// How [`AgentTransport::send_message`] should behave.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SendMessageOptions {
    /// Ask the agent to answer at once with the submitted task instead of waiting for it to
    /// finish (A2A `returnImmediately`).
    pub return_immediately: bool,
    /// Keep only this many most recent messages in the returned task's history.
    pub history_length: Option<usize>,
}

/// A stream of task events from [`AgentTransport::send_streaming_message`] or
/// [`AgentTransport::subscribe`]. It ends after the final event; an error ends it too.
pub type TaskEventStream = BoxStream<'static, AgentResult<StreamEvent>>;

/// The A2A operations on one agent, in Keel's models and errors.
///
/// Implemented by [`A2aClient`](crate::A2aClient) (JSON-RPC or HTTP+JSON to a remote agent)
/// and by [`InProcessClient`](crate::InProcessClient) (a local
/// [`AgentExecutor`](keel_agent::AgentExecutor) through the server's own handler layer), with
/// the same semantics and the same typed errors; it is object safe, so a caller can hold an
/// `Arc<dyn AgentTransport>`.
#[async_trait]
pub trait AgentTransport: Send + Sync {
    /// The agent's card.
    async fn get_card(&self) -> AgentResult<AgentCard>;

    /// Send a message: start a task (or continue the one named by `message.task_id`). Blocks
    /// until the task finishes unless `options.return_immediately`.
    async fn send_message(
        &self,
        message: Message,
        options: SendMessageOptions,
    ) -> AgentResult<Task>;

    /// A task, with its last `history_length` messages when given.
    async fn get_task(&self, task_id: &TaskId, history_length: Option<usize>) -> AgentResult<Task>;

    /// One page of the agent's tasks, most recently updated first.
    async fn list_tasks(&self, query: &TaskListQuery) -> AgentResult<TaskList>;

    /// Cancel a task, with an optional reason.
    async fn cancel_task(&self, task_id: &TaskId, reason: Option<String>) -> AgentResult<Task>;

    /// Send a message and follow its task until its final status.
    async fn send_streaming_message(&self, message: Message) -> AgentResult<TaskEventStream>;

    /// Follow a task that is not terminal until its final status; a terminal task is
    /// [`AgentError::Unsupported`](keel_core::AgentError::Unsupported).
    async fn subscribe(&self, task_id: &TaskId) -> AgentResult<TaskEventStream>;
}
