//! [`StepStore`] over SQLite: one persist point of an engine step (thread history under the
//! lease, and the task's log) in one write job.

use async_trait::async_trait;
use keel_core::conversation::LlmMessage;
use keel_core::{AgentError, AgentResult, TaskEvent, TaskId};
use keel_runtime::{AuthContext, Lease, StepStore};

use crate::codec::encode_record;
use crate::leases::check_fence;
use crate::tasks::{append_task_events, encode_events, task_exists};
use crate::threads::append_history_rows;
use crate::SqliteStore;

#[async_trait]
impl StepStore for SqliteStore {
    async fn persist_step(
        &self,
        auth: &AuthContext,
        lease: &Lease,
        history: &[LlmMessage],
        task_id: &TaskId,
        events: &[TaskEvent],
    ) -> AgentResult<()> {
        // Encoded before the job is sent, so an encoding error writes nothing.
        let history = history
            .iter()
            .map(encode_record)
            .collect::<AgentResult<Vec<_>>>()?;
        let events = encode_events(events)?;
        let (tenant, lease, task_id) = (auth.namespace(), lease.clone(), task_id.clone());
        // One job, so one savepoint: the fence, the history and the log entries commit
        // together, and a refusal (checked before writing) leaves nothing behind.
        self.write(move |conn| {
            check_fence(conn, &tenant, &lease)?;
            if !task_exists(conn, &tenant, &task_id)? {
                return Err(AgentError::TaskNotFound { task_id });
            }
            append_history_rows(conn, &tenant, &lease.thread_id, &history)?;
            append_task_events(conn, &tenant, &task_id, &events)
        })
        .await
    }
}
