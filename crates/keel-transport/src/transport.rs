//! [`AgentTransport`]: the one typed interface to an A2A agent, whether it is remote
//! ([`A2aClient`](crate::A2aClient), over HTTP) or local
//! ([`InProcessClient`](crate::InProcessClient), no HTTP), so callers such as remote
//! delegation work with either.

use async_trait::async_trait;
use keel_core::{AgentCard, AgentResult, Message, Task, TaskId};

use crate::client::{SendMessageOptions, TaskEventStream};
use crate::task_list::{TaskList, TaskListQuery};

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
