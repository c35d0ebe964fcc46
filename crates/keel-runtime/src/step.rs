//! One persist point of an engine step, written together.

use async_trait::async_trait;
use keel_core::conversation::LlmMessage;
use keel_core::{AgentResult, TaskEvent, TaskId};

use crate::{AuthContext, Lease};

/// Writes what the engine persists at one point of a step (the assistant's message, or a
/// tool's result): thread history entries under the thread's lease and the matching entries
/// of the task's log, together. A backend that can do this in one round trip (Redis: one
/// script; SQLite: one write job) implements it and is handed to the engine through
/// [`Runtime::step_store`](crate::Runtime::step_store); without one the engine makes the two
/// writes separately.
#[async_trait]
pub trait StepStore: Send + Sync {
    /// Append `history` to the lease's thread and `events` to `task_id`'s log, atomically: a
    /// stale or expired lease is [`AgentError::LeaseLost`](keel_core::AgentError::LeaseLost)
    /// and an unknown task [`AgentError::TaskNotFound`](keel_core::AgentError::TaskNotFound),
    /// and in both cases nothing is written.
    async fn persist_step(
        &self,
        auth: &AuthContext,
        lease: &Lease,
        history: &[LlmMessage],
        task_id: &TaskId,
        events: &[TaskEvent],
    ) -> AgentResult<()>;
}
