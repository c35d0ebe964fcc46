//! Callers waiting on a task: until it rests with an answer, until a cancel took, or until
//! any condition holds. A local save wakes a waiter at once (`Notices`); a task run by
//! another process is looked at every poll interval.

use std::sync::Arc;

use keel_core::{AgentError, AgentResult, Task, TaskId, TaskState};
use keel_runtime::AuthContext;

use super::notices::{RestWaiter, Saved};
use super::state::*;

impl Inner {
    /// The stored task, or [`AgentError::TaskNotFound`].
    pub(super) async fn stored_task(
        &self,
        auth: &AuthContext,
        task_id: &TaskId,
    ) -> AgentResult<Task> {
        crate::reads::stored_task(self.runtime.as_ref(), auth, task_id).await
    }

    /// Wait until the task rests with an answer ([`answered`]).
    pub(super) async fn wait_until_resting(
        &self,
        auth: &AuthContext,
        task_id: &TaskId,
    ) -> AgentResult<()> {
        self.wait_until(auth, task_id, answered).await.map(|_| ())
    }

    /// Wait until a task asked to cancel rests, at most the lease TTL and a few poll
    /// intervals. A run in another process sees the cancel within a poll interval; a task
    /// left working by a dead process is ended here as soon as its thread's lease lapses
    /// (looked at every poll interval); past the bound the caller gets
    /// [`AgentError::CancelPending`].
    pub(super) async fn wait_until_canceled(
        &self,
        auth: &AuthContext,
        task_id: &TaskId,
        reason: &str,
    ) -> AgentResult<()> {
        let deadline =
            tokio::time::Instant::now() + self.config.lease_ttl + 10 * self.config.poll_interval;
        let key = (auth.namespace(), task_id.clone());
        let mut waiter = self.notices.rest_waiter(auth, task_id);
        loop {
            waiter.receiver.borrow_and_update();
            let task = self.stored_task(auth, task_id).await?;
            if answered(&task) {
                return Ok(());
            }
            if task.state() == TaskState::Working
                && !self.driver.active.contains_key(&key)
                && self.cancel_unheld(auth, &task, reason).await?
            {
                continue;
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(AgentError::CancelPending {
                    task_id: task_id.clone(),
                });
            }
            let next_look = (tokio::time::Instant::now() + self.config.poll_interval).min(deadline);
            tokio::select! {
                _ = waiter.receiver.changed() => {}
                () = tokio::time::sleep_until(next_look) => {}
            }
        }
    }

    /// End a working task whose thread nobody holds (its process died, or it waits for an
    /// asynchronous tool): take the thread's lease, cancel the task, and let the thread's
    /// queue go on here. `false` when another process holds the thread.
    async fn cancel_unheld(
        &self,
        auth: &AuthContext,
        task: &Task,
        reason: &str,
    ) -> AgentResult<bool> {
        let threads = self.runtime.thread_store();
        let Some(lease) = threads
            .acquire_lease(
                auth,
                &task.thread_id,
                &self.config.holder,
                self.config.lease_ttl,
            )
            .await?
        else {
            return Ok(false);
        };
        let result = self.cancel_at_rest(auth, &task.id, reason).await;
        threads.release_lease(auth, &lease).await?;
        self.schedule(auth, &task.thread_id);
        result.map(|()| true)
    }

    /// A front door's wait for a task (`wait`), cut short once a shutdown has handed this
    /// executor's work on: the caller is then answered with the task as stored, unfinished,
    /// rather than held until another process finishes it (which would hold the server's
    /// shutdown up too). Only for callers outside the engine: a run waiting for another task
    /// (a subagent's parent) must see it rest, and is itself stopped by the shutdown.
    pub(super) async fn answer_unless_handed_on(
        &self,
        auth: &AuthContext,
        task_id: &TaskId,
        wait: impl std::future::Future<Output = AgentResult<Task>>,
    ) -> AgentResult<Task> {
        tokio::select! {
            answer = wait => answer,
            () = self.driver.handed_over.cancelled() => self.stored_task(auth, task_id).await,
        }
    }

    /// [`Self::wait_until_resting`] for a task the caller has just queued, with a waiter
    /// taken before queueing it: until a save of the task wakes it (or a poll interval goes
    /// by, for a run in another process), there is nothing new to read.
    pub(super) async fn wait_until_queued_task_rests(
        &self,
        mut waiter: RestWaiter<'_>,
        auth: &AuthContext,
        task_id: &TaskId,
    ) -> AgentResult<Task> {
        let first = if waiter.receiver.has_changed().unwrap_or(true) {
            waiter.receiver.borrow_and_update().clone()
        } else {
            self.next_save(&mut waiter).await
        };
        self.wait_from(waiter, auth, task_id, first, answered).await
    }

    /// Wait until the stored task satisfies `done`, and answer it. Local saves of this task
    /// wake the waiter at once; a task run by another process is looked at every poll
    /// interval.
    pub(super) async fn wait_until(
        &self,
        auth: &AuthContext,
        task_id: &TaskId,
        done: impl Fn(&Task) -> bool,
    ) -> AgentResult<Task> {
        // A new waiter has seen the signal's current value: it starts from the store.
        let waiter = self.notices.rest_waiter(auth, task_id);
        self.wait_from(waiter, auth, task_id, None, done).await
    }

    /// The snapshot of the next local save of the waiter's task, or `None` (read the store)
    /// when a poll interval went by first or the change was heard from another process.
    async fn next_save(&self, waiter: &mut RestWaiter<'_>) -> Saved {
        tokio::select! {
            changed = waiter.receiver.changed() => match changed {
                Ok(()) => waiter.receiver.borrow_and_update().clone(),
                Err(_) => None,
            },
            () = tokio::time::sleep(self.config.poll_interval) => None,
        }
    }

    /// [`Self::wait_until`] from `saved`, the snapshot that woke the waiter (the task as this
    /// process has just written it), or from a read of the store when there is none.
    async fn wait_from(
        &self,
        mut waiter: RestWaiter<'_>,
        auth: &AuthContext,
        task_id: &TaskId,
        mut saved: Saved,
        done: impl Fn(&Task) -> bool,
    ) -> AgentResult<Task> {
        loop {
            let task = match saved.take() {
                Some(task) => Arc::unwrap_or_clone(task),
                None => self.stored_task(auth, task_id).await?,
            };
            if done(&task) {
                return Ok(task);
            }
            saved = self.next_save(&mut waiter).await;
        }
    }
}
