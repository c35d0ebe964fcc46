//! Cancellation: a caller's cancel of a task wherever it is, the durable flag through which
//! a run in another process hears of it, and the watcher that reads that flag for a run here.

use std::sync::Arc;
use std::time::Duration;

use keel_core::{AgentError, AgentResult, Task, TaskId, TaskState, ThreadId};
use keel_runtime::{AuthContext, MemoryService};
use serde_json::json;

use super::state::*;

/// How long a cancel request stays in the store: far longer than any run takes to look.
const FLAG_TTL: Duration = Duration::from_secs(86_400);

impl AgentExecutor {
    /// Cancel a task wherever it is: queued, waiting for input, running here (stopped live),
    /// running in another process sharing the store (whose run sees the request within a
    /// poll interval, and stops at once), or left working by a process that died (ended here
    /// once that process's thread lease lapses). Ends `canceled` with `reason`; a terminal
    /// task is [`AgentError::TaskNotCancelable`], an unknown one
    /// [`AgentError::TaskNotFound`]. The answer comes within the lease TTL and a few poll
    /// intervals: a run that has not stopped by then is [`AgentError::CancelPending`] (the
    /// cancel stays recorded and takes effect when that run next looks).
    pub async fn cancel_task(
        &self,
        auth: &AuthContext,
        task_id: &TaskId,
        reason: Option<String>,
    ) -> AgentResult<Task> {
        let inner = &self.inner;
        let task = inner.stored_task(auth, task_id).await?;
        if task.state().is_terminal() {
            return Err(AgentError::TaskNotCancelable {
                task_id: task_id.clone(),
                state: task.state(),
            });
        }
        let reason = reason.unwrap_or_else(|| "canceled by request".into());
        // The durable flag reaches a run in any process through the run's watcher, which
        // reads it every poll interval.
        inner
            .runtime
            .memory_service()
            .save_serialized_with_ttl(auth, &cancel_key(task_id), json!(reason), FLAG_TTL)
            .await?;
        let local = inner
            .driver
            .active
            .get(&(auth.namespace(), task_id.clone()))
            .map(|a| a.clone());
        if let Some(run) = local {
            run.cancel(reason.clone());
        } else if task.state() != TaskState::Working {
            // Queued or waiting for input: no run holds it, so end it here. A worker that
            // picks its queue item up later skips it.
            inner.cancel_at_rest(auth, task_id, &reason).await?;
        }
        inner.wait_until_canceled(auth, task_id, &reason).await?;
        let task = self.get_task(auth, task_id, None).await?;
        if task.state() != TaskState::Canceled {
            return Err(AgentError::TaskNotCancelable {
                task_id: task_id.clone(),
                state: task.state(),
            });
        }
        Ok(task)
    }
}

impl Inner {
    /// Cancel a task no run holds.
    pub(super) async fn cancel_at_rest(
        &self,
        auth: &AuthContext,
        task_id: &TaskId,
        reason: &str,
    ) -> AgentResult<()> {
        let Some(mut task) = self.runtime.task_manager().get_task(auth, task_id).await? else {
            return Ok(());
        };
        if task.state().is_terminal() {
            return Ok(());
        }
        mark_canceled(&mut task, reason)?;
        // Subagents: a background child canceled before it ran still reports to its parent.
        self.agent.hooks.on_rest(self, auth, &task).await;
        self.persist_status(auth, &task).await
    }

    pub(crate) fn cancel_thread_runs(
        &self,
        auth: &AuthContext,
        thread_id: &ThreadId,
        reason: &str,
    ) {
        let namespace = auth.namespace();
        for run in self.driver.active.iter() {
            if run.key().0 == namespace && &run.thread_id == thread_id {
                run.cancel(reason.to_owned());
            }
        }
    }

    /// Watch the store for a cancel of `run` accepted by another process, while a model or
    /// tool call is in flight, so that the call is dropped at once (every poll interval,
    /// until the run ends or is canceled). Abort the handle when the run ends.
    pub(super) fn watch_cancel_flag(
        &self,
        auth: &AuthContext,
        run: Arc<ActiveRun>,
    ) -> tokio::task::JoinHandle<()> {
        let (memory, auth) = (self.runtime.memory_service(), auth.clone());
        let period = self.config.poll_interval;
        tokio::spawn(async move {
            while !run.token.is_cancelled() {
                tokio::select! {
                    () = run.token.cancelled() => return,
                    () = tokio::time::sleep(period) => {}
                }
                cancel_if_flagged(memory.as_ref(), &auth, &run).await;
            }
        })
    }
}

/// Cancel `run` when the store holds a cancel request for it; answers the reason if so.
pub(super) async fn cancel_if_flagged(
    memory: &dyn MemoryService,
    auth: &AuthContext,
    run: &ActiveRun,
) -> Option<String> {
    let reason = memory.load_serialized(auth, &run.cancel_key).await.ok()??;
    let reason = reason.as_str().unwrap_or("canceled by request").to_owned();
    run.cancel(reason.clone());
    Some(reason)
}
