//! [`StepStore`] over PostgreSQL: one persist point of an engine step as one statement, so
//! the fence, the history entries and the task's log entries commit together or not at all.

use async_trait::async_trait;
use keel_core::conversation::LlmMessage;
use keel_core::{AgentError, AgentResult, TaskEvent, TaskId};
use keel_runtime::{AuthContext, Lease, StepStore};

use crate::changes::notify;
use crate::codec::{encode_all, query_one};
use crate::leases::{fence, fence_args};
use crate::threads::append_history;
use crate::PostgresStore;

/// Under the fence, number `$7` in task `$5`'s log (its row lock orders appenders) and append
/// `$6` to the thread's history; whether the fence held and whether the task exists. Nothing
/// is written unless both do: the log entries and history rows come from the `task` row,
/// which exists only past the fence. Listeners hear of the log's growth ([`notify!`]).
const PERSIST_STEP: &str = concat!(
    "WITH ",
    fence!(),
    ", task AS (
    UPDATE tasks SET last_event = last_event + cardinality($7::text[])
    WHERE tenant = $1 AND task_id = $5 AND EXISTS (SELECT 1 FROM lease)
    RETURNING last_event
), events AS (
    INSERT INTO task_events (tenant, task_id, seq, body)
    SELECT $1, $5, task.last_event - cardinality($7::text[]) + e.ord, e.body
    FROM task, unnest($7::text[]) WITH ORDINALITY AS e(body, ord)
), history AS (",
    append_history!("$6", "task"),
    "), notified AS (SELECT ",
    notify!("t", "$1", "$5"),
    " FROM task WHERE cardinality($7::text[]) > 0)
SELECT EXISTS (SELECT 1 FROM lease), EXISTS (SELECT 1 FROM task),
    (SELECT count(*) FROM notified)"
);

#[async_trait]
impl StepStore for PostgresStore {
    async fn persist_step(
        &self,
        auth: &AuthContext,
        lease: &Lease,
        history: &[LlmMessage],
        task_id: &TaskId,
        events: &[TaskEvent],
    ) -> AgentResult<()> {
        // Encoded first, so an encoding error writes nothing.
        let history = encode_all(history)?;
        let events = encode_all(events)?;
        let (tenant, thread, token, now) = fence_args(auth, lease);
        let _in_order = self.order.shared(&tenant, &thread).await;
        let client = self.client().await?;
        let row = query_one(
            &client,
            PERSIST_STEP,
            &[
                &tenant,
                &thread,
                &token,
                &now,
                &task_id.as_str(),
                &history,
                &events,
            ],
            "persisting a step",
        )
        .await?;
        if !row.get::<_, bool>(0) {
            return Err(lease.lost());
        }
        if !row.get::<_, bool>(1) {
            return Err(AgentError::TaskNotFound {
                task_id: task_id.clone(),
            });
        }
        Ok(())
    }
}
