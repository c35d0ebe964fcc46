//! [`StepStore`] over SQLite: the writes of one persist point of an engine step (thread
//! history under the lease, the task's log, and its snapshot, its queue item or its run's
//! report; or a thread's acknowledgement and release) in one write job, so one savepoint of
//! the writer's shared transaction (decision 260).

use async_trait::async_trait;
use keel_core::conversation::LlmMessage;
use keel_core::stored::JsonText;
use keel_core::{AgentError, AgentResult, Task, TaskEvent};
use keel_runtime::{
    encode_task_events, AuthContext, Lease, QueuedItem, RunRecord, StepStore, TaskWrite,
};
use serde_json::Value;

use crate::codec::encode_record;
use crate::leases::check_fence;
use crate::runs::RecordRow;
use crate::tasks::{append_task_events, task_exists, SnapshotRow, TaskRows};
use crate::threads::{append_history_rows, QueueRow};
use crate::SqliteStore;

#[async_trait]
impl StepStore for SqliteStore {
    /// Every row is encoded before the job is sent, so an encoding error writes nothing, and
    /// the fence and the task are checked before anything is written in the job's savepoint.
    async fn persist_step(
        &self,
        auth: &AuthContext,
        lease: &Lease,
        history: &[LlmMessage],
        task: &Task,
        write: TaskWrite,
        events: &[TaskEvent],
    ) -> AgentResult<()> {
        let tenant = self.tenant(auth).await?;
        let snapshot = match write {
            TaskWrite::SnapshotAndLog => Some(SnapshotRow::new(tenant.clone(), task)?),
            TaskWrite::LogOnly => None,
        };
        let history = history
            .iter()
            .map(encode_record)
            .collect::<AgentResult<Vec<_>>>()?;
        let events = encode_task_events(events, &task.id, Some(&task.thread_id))?;
        let (lease, task_id) = (lease.clone(), task.id.clone());
        self.write(move |conn| {
            check_fence(conn, &tenant, &lease)?;
            if !task_exists(conn, &tenant, &task_id)? {
                return Err(AgentError::TaskNotFound { task_id });
            }
            if let Some(snapshot) = &snapshot {
                snapshot.upsert(conn)?;
            }
            append_history_rows(conn, &tenant, &lease.thread_id, &history)?;
            append_task_events(conn, &tenant, &task_id, &events)
        })
        .await
    }

    async fn save_task_and_queue(
        &self,
        auth: &AuthContext,
        task: &Task,
        events: &[TaskEvent],
        payload: Value,
    ) -> AgentResult<QueuedItem> {
        let tenant = self.tenant(auth).await?;
        let rows = TaskRows::new(tenant.clone(), task, events)?;
        let item = QueueRow::new(tenant, &task.thread_id, &payload)?;
        // One job: the task, its log entries and its queue item commit together.
        self.write(move |conn| {
            rows.save(conn)?;
            item.push(conn, payload)
        })
        .await
    }

    async fn save_task_and_run(
        &self,
        auth: &AuthContext,
        task: &Task,
        events: &[TaskEvent],
        record: &RunRecord,
        report: &JsonText,
    ) -> AgentResult<()> {
        let tenant = self.tenant(auth).await?;
        let rows = TaskRows::new(tenant.clone(), task, events)?;
        let run = RecordRow::run(tenant, record, record.text_with_report(report)?);
        // One job: the task at rest, its last log entries and its run's report commit together.
        self.write(move |conn| {
            rows.save(conn)?;
            run.insert(conn)
        })
        .await
    }

    async fn ack_and_release(
        &self,
        auth: &AuthContext,
        lease: &Lease,
        ids: &[String],
    ) -> AgentResult<()> {
        self.acknowledge(auth, lease, ids, true).await
    }
}
