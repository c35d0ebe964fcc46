//! [`StepStore`] over PostgreSQL: one persist point of an engine step as one statement, so
//! the fence, the history entries and the task's log entries (and its snapshot, its queue
//! item or its run's report) commit together or not at all (decisions 260, 278).

use async_trait::async_trait;
use keel_core::conversation::LlmMessage;
use keel_core::stored::JsonText;
use keel_core::{AgentError, AgentResult, Task, TaskEvent};
use keel_runtime::{
    encode_task_events, AuthContext, Lease, QueuedItem, RunRecord, StepStore, TaskWrite,
};
use serde_json::Value;
use tokio_postgres::types::ToSql;

use crate::codec::encode_all;
use crate::leases::fence;
use crate::runs::{record_columns, save_run_report};
use crate::tasks::{save_with_events, snapshot_columns, SnapshotArgs};
use crate::threads::{append_history, NewItem, ACK_AND_RELEASE};
use crate::PostgresStore;

/// Under the fence, number `$7` in task `$5`'s log (its row lock orders appenders) and append
/// `$6` to the thread's history; whether the fence held and whether the task exists. Nothing
/// is written unless both do: the log entries and history rows come from the `task` row,
/// which exists only past the fence. When `$8` (state), `$9` (`updated_at`) and `$10` (body)
/// are given, the task's snapshot takes them in the same update.
const PERSIST_STEP: &str = concat!(
    "WITH ",
    fence!(),
    ", task AS (
    UPDATE tasks SET last_event = last_event + cardinality($7::text[]),
        state = COALESCE($8, state), updated_at = COALESCE($9, updated_at),
        body = COALESCE($10, body)
    WHERE tenant = $1 AND task_id = $5 AND EXISTS (SELECT 1 FROM lease)
    RETURNING last_event
), events AS (
    INSERT INTO task_events (tenant, task_id, seq, body)
    SELECT $1, $5, task.last_event - cardinality($7::text[]) + e.ord, e.body
    FROM task, unnest($7::text[]) WITH ORDINALITY AS e(body, ord)
), history AS (",
    append_history!("$6", "task"),
    ")
SELECT EXISTS (SELECT 1 FROM lease), EXISTS (SELECT 1 FROM task)"
);

/// Save task `$2` with `$7` appended to its log ([`save_with_events!`]) and add item `$8`
/// (payload `$9`, queued at `$10`) at the back of thread `$3`'s queue; the item's seq.
const SAVE_AND_QUEUE: &str = concat!(
    "WITH ",
    save_with_events!(),
    ", counter AS (
    INSERT INTO threads (tenant, thread_id, last_queue_seq) VALUES ($1, $3, 1)
    ON CONFLICT (tenant, thread_id) DO UPDATE SET last_queue_seq = threads.last_queue_seq + 1
    RETURNING last_queue_seq
), queued AS (
    INSERT INTO thread_queue (tenant, thread_id, seq, id, payload, enqueued_at)
    SELECT $1, $3, last_queue_seq, $8, $9, $10 FROM counter RETURNING seq
)
SELECT (SELECT seq FROM queued)"
);

/// Save task `$2` with `$7` appended to its log ([`save_with_events!`]) and its run's report:
/// the record's index columns `$8` to `$12`, its time `$13` and its text `$14`.
const SAVE_AND_REPORT: &str = concat!(
    "WITH ",
    save_with_events!(),
    ", run AS (",
    save_run_report!("($1, $8, $9, $10, $11, $12, $13, $14)"),
    ")\nSELECT 1"
);

#[async_trait]
impl StepStore for PostgresStore {
    /// Sets the task's snapshot columns in the same statement when `write` names them.
    async fn persist_step(
        &self,
        auth: &AuthContext,
        lease: &Lease,
        history: &[LlmMessage],
        task: &Task,
        write: TaskWrite,
        events: &[TaskEvent],
    ) -> AgentResult<()> {
        // Encoded first, so an encoding error writes nothing.
        let history = encode_all(history)?;
        let task_id = &task.id;
        let events = encode_task_events(events, task_id, Some(&task.thread_id))?;
        let columns = Some(task)
            .filter(|_| write == TaskWrite::SnapshotAndLog)
            .map(snapshot_columns);
        let (state, updated_at, body) = match columns.transpose()? {
            Some((state, updated_at, body)) => (Some(state), Some(updated_at), Some(body)),
            None => (None, None, None),
        };
        let row = self
            .fenced_row(
                auth,
                lease,
                PERSIST_STEP,
                &[
                    &task_id.as_str(),
                    &history,
                    &events,
                    &state,
                    &updated_at,
                    &body,
                ],
                "persisting a step",
            )
            .await?;
        if !row.get::<_, bool>(1) {
            return Err(AgentError::TaskNotFound {
                task_id: task_id.clone(),
            });
        }
        if !events.is_empty() {
            self.announce_task_events(auth, task_id);
        }
        Ok(())
    }

    async fn save_task_and_queue(
        &self,
        auth: &AuthContext,
        task: &Task,
        events: &[TaskEvent],
        payload: Value,
    ) -> AgentResult<QueuedItem> {
        let args = SnapshotArgs::new(auth, task, events)?;
        let item = NewItem::of(payload)?;
        let mut params: Vec<&(dyn ToSql + Sync)> = args.params().to_vec();
        params.extend([&item.id as &(dyn ToSql + Sync), &item.text, &item.nanos]);
        let row = self
            .query_one(SAVE_AND_QUEUE, &params, "saving and queueing a task")
            .await?;
        if !events.is_empty() {
            self.announce_task_events(auth, &task.id);
        }
        item.queued(&row)
    }

    async fn save_task_and_run(
        &self,
        auth: &AuthContext,
        task: &Task,
        events: &[TaskEvent],
        record: &RunRecord,
        report: &JsonText,
    ) -> AgentResult<()> {
        let args = SnapshotArgs::new(auth, task, events)?;
        let ((ids, recorded_at), text) = (record_columns(record), record.text_with_report(report)?);
        let mut params: Vec<&(dyn ToSql + Sync)> = args.params().to_vec();
        params.extend(ids.iter().map(|id| id as &(dyn ToSql + Sync)));
        params.extend([&recorded_at as &(dyn ToSql + Sync), &text]);
        self.execute(
            SAVE_AND_REPORT,
            &params,
            "saving a task at rest with its run's report",
        )
        .await?;
        if !events.is_empty() {
            self.announce_task_events(auth, &task.id);
        }
        Ok(())
    }

    async fn ack_and_release(
        &self,
        auth: &AuthContext,
        lease: &Lease,
        ids: &[String],
    ) -> AgentResult<()> {
        let op = "acknowledging queued work and releasing its lease";
        self.fenced(auth, lease, ACK_AND_RELEASE, &[&ids], op, true)
            .await?;
        Ok(())
    }
}
