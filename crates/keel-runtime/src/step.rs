//! One persist point of an engine step, written together.

use async_trait::async_trait;
use keel_core::conversation::LlmMessage;
use keel_core::stored::JsonText;
use keel_core::{AgentError, AgentResult, Task, TaskEvent};
use serde_json::Value;

use crate::{AuthContext, Lease, QueuedItem, RunRecord};

/// What a persist point saves of its task besides the entries it appends to the task's log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskWrite {
    /// The log entries only: the task's id and thread are read (the thread, so that the log's
    /// entries can leave it out, decision 269) and its snapshot is not saved. An engine
    /// step's message or tool result.
    LogOnly,
    /// The task's snapshot too (without its history, as
    /// [`TaskManager::save_task`](crate::TaskManager::save_task) does), saved before the log
    /// entries are appended: a run's new status and what the run took in with it, in one
    /// write. A store that cannot fold it answers [`AgentError::Unsupported`], and the engine
    /// then makes the writes one after the other.
    SnapshotAndLog,
}

/// Writes what the engine persists at one point of a step (the assistant's message, or a
/// tool's result): thread history entries under the thread's lease and the matching entries
/// of the task's log, together. A backend that can do this in one round trip (Redis: one
/// script; SQLite: one write job) implements it and is handed to the engine through
/// [`Runtime::step_store`](crate::Runtime::step_store); without one the engine makes the two
/// writes separately.
///
/// The other methods fold more of a request's writes into one (decision 260); their defaults
/// are [`AgentError::Unsupported`], and the engine then makes the writes they stand for one
/// after the other, as it does without a step store.
#[async_trait]
pub trait StepStore: Send + Sync {
    /// Append `history` to the lease's thread and `events` to `task`'s log, and save what
    /// else `write` names of the task, atomically. The task must exist already: a stale or
    /// expired lease is [`AgentError::LeaseLost`](keel_core::AgentError::LeaseLost) and an
    /// unknown task [`AgentError::TaskNotFound`](keel_core::AgentError::TaskNotFound), and in
    /// both cases nothing is written.
    async fn persist_step(
        &self,
        auth: &AuthContext,
        lease: &Lease,
        history: &[LlmMessage],
        task: &Task,
        write: TaskWrite,
        events: &[TaskEvent],
    ) -> AgentResult<()>;

    /// Save `task` with `events` appended to its log, as
    /// [`TaskManager::save_task_with_events`](crate::TaskManager::save_task_with_events)
    /// does, and add `payload` at the back of its thread's queue, in one write: a task
    /// accepted and queued for its run, so that neither is there without the other.
    async fn save_task_and_queue(
        &self,
        auth: &AuthContext,
        task: &Task,
        events: &[TaskEvent],
        payload: Value,
    ) -> AgentResult<QueuedItem> {
        let _ = (auth, task, events, payload);
        Err(unsupported("save_task_and_queue"))
    }

    /// Save `task` with `events` appended to its log, as
    /// [`TaskManager::save_task_with_events`](crate::TaskManager::save_task_with_events)
    /// does, and store `record` with `report` as its report, as
    /// [`RunStore::save_run_report_json`](crate::RunStore::save_run_report_json) does, in one
    /// write: a run comes to rest (its final status) with its report, so that whoever finds
    /// the task at rest finds its run reported, and the two cost one write instead of two.
    async fn save_task_and_run(
        &self,
        auth: &AuthContext,
        task: &Task,
        events: &[TaskEvent],
        record: &RunRecord,
        report: &JsonText,
    ) -> AgentResult<()> {
        let _ = (auth, task, events, record, report);
        Err(unsupported("save_task_and_run"))
    }

    /// Acknowledge `ids` on the lease's thread and release the lease, in one write: the
    /// thread's last queued item is done. The acknowledgement is fenced as
    /// [`ThreadQueue::ack_queue`](crate::ThreadQueue::ack_queue)'s is (under a stale lease it
    /// is [`AgentError::LeaseLost`] and removes nothing); the release frees the thread only
    /// while `lease` is its current one, as
    /// [`ThreadLeases::release_lease`](crate::ThreadLeases::release_lease) does, and happens
    /// either way.
    async fn ack_and_release(
        &self,
        auth: &AuthContext,
        lease: &Lease,
        ids: &[String],
    ) -> AgentResult<()> {
        let _ = (auth, lease, ids);
        Err(unsupported("ack_and_release"))
    }
}

fn unsupported(method: &str) -> AgentError {
    AgentError::Unsupported {
        what: format!("`StepStore::{method}` on this store"),
    }
}
