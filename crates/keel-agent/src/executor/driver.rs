//! The thread driver: one worker per thread holding the thread's fenced lease, working
//! its durable queue in order (a running step takes queued work in: `step.rs`).

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use futures::FutureExt;
use keel_core::{
    AgentError, AgentResult, Message, Part, Role, RunContext, Task, TaskEvent, TaskId, ThreadId,
};
use keel_runtime::{AuthContext, Lease, LogLevel};
use serde::Deserialize;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::state::*;
use super::unfinished_tasks;
use crate::task_meta::EngineMeta;
use crate::thread_state::ThreadHost;

/// How long a caller whose queue is full is asked to wait: a queued task takes at least a
/// model call to leave the queue.
const QUEUE_FULL_RETRY_AFTER: std::time::Duration = std::time::Duration::from_secs(5);

/// The queued work that runs `task_id` (its start, or its resumption).
fn task_work(task_id: &TaskId) -> QueuedWork {
    QueuedWork::Task {
        task_id: task_id.clone(),
    }
}

impl Inner {
    pub(crate) async fn enqueue(
        &self,
        auth: &AuthContext,
        thread_id: &ThreadId,
        work: QueuedWork,
    ) -> AgentResult<()> {
        let payload = serde_json::to_value(&work).map_err(AgentError::internal)?;
        self.runtime
            .thread_store()
            .push_queue(auth, thread_id, payload)
            .await?;
        self.schedule(auth, thread_id);
        Ok(())
    }

    /// Queue a run of `task_id` (its start, or its resumption) on its thread.
    pub(super) async fn enqueue_task(
        &self,
        auth: &AuthContext,
        thread_id: &ThreadId,
        task_id: &TaskId,
    ) -> AgentResult<()> {
        self.enqueue(auth, thread_id, task_work(task_id)).await
    }

    /// Save `task` with `events` appended to its log and queue its run on its thread: one
    /// write where the store can (decision 260), so that neither is there without the other;
    /// otherwise the save and then the queueing (a task saved but never queued is queued by
    /// [`AgentExecutor::recover`](super::AgentExecutor::recover)).
    pub(super) async fn save_and_enqueue_task(
        &self,
        auth: &AuthContext,
        task: &Task,
        events: &[TaskEvent],
    ) -> AgentResult<()> {
        if let Some(steps) = self.runtime.step_store() {
            let payload =
                serde_json::to_value(task_work(&task.id)).map_err(AgentError::internal)?;
            match steps.save_task_and_queue(auth, task, events, payload).await {
                Ok(_) => {
                    self.schedule(auth, &task.thread_id);
                    return Ok(());
                }
                Err(AgentError::Unsupported { .. }) => {}
                Err(err) => return Err(err),
            }
        }
        self.runtime
            .task_manager()
            .save_task_with_events(auth, task, events)
            .await?;
        self.enqueue_task(auth, &task.thread_id, &task.id).await
    }

    /// Refuse a new task when the thread's queue, or the tenant's queues together, hold as
    /// many items as [`ExecutorConfig`](crate::ExecutorConfig) allows. Counted in the store
    /// (both counts at once), not in this process: several processes share one store, and
    /// each would otherwise let a tenant queue its whole limit again. Two concurrent messages
    /// may both pass at the limit: it bounds a flood, it is not a quota.
    pub(super) async fn check_queue_room(
        &self,
        auth: &AuthContext,
        thread_id: &ThreadId,
    ) -> AgentResult<()> {
        let store = self.runtime.thread_store();
        let (thread, tenant) = tokio::join!(
            store.queue_len(auth, thread_id),
            store.tenant_queue_len(auth)
        );
        let overloaded = |limit: &str, max: usize| AgentError::Overloaded {
            limit: limit.into(),
            max: max as u64,
            retry_after: QUEUE_FULL_RETRY_AFTER,
        };
        let max = self.config.max_queued_per_thread;
        // The running task's item stays queued until it ends: `max` may wait besides it.
        if thread? > max {
            return Err(overloaded("tasks queued on this thread", max));
        }
        let max = self.config.max_queued_per_tenant;
        match tenant {
            Ok(queued) if queued >= max => Err(overloaded("tasks queued for this tenant", max)),
            Ok(_) | Err(AgentError::Unsupported { .. }) => Ok(()),
            Err(err) => Err(err),
        }
    }

    /// Make sure a local driver looks after the thread: wake the one that exists or start one.
    pub(crate) fn schedule(&self, auth: &AuthContext, thread_id: &ThreadId) {
        if self.driver.shutting_down.is_cancelled() {
            return;
        }
        let Some(me) = self.me.upgrade() else { return };
        let key = (auth.namespace(), thread_id.clone());
        match self.driver.workers.entry(key.clone()) {
            dashmap::mapref::entry::Entry::Occupied(worker) => worker.get().notify_one(),
            dashmap::mapref::entry::Entry::Vacant(slot) => {
                let notify = Arc::new(Notify::new());
                slot.insert(notify.clone());
                let (auth, thread_id) = (auth.clone(), thread_id.clone());
                let span = tracing::info_span!("thread", thread_id = %thread_id);
                self.driver.tracker.spawn(
                    async move { me.drive_thread(auth, thread_id, key, notify).await }
                        .instrument(span),
                );
            }
        }
    }

    /// Take the thread's lease and work its queue; while another process holds the lease,
    /// look again now and then, so that work is taken over if that process dies.
    pub(super) async fn drive_thread(
        self: Arc<Self>,
        auth: AuthContext,
        thread_id: ThreadId,
        key: ThreadKey,
        notify: Arc<Notify>,
    ) {
        let store = self.runtime.thread_store();
        // A new driver is started for work just queued (or found queued): its first look
        // would only count what is known to be there, and taking the lease is a look too.
        let mut look = false;
        let mut emptied = false;
        loop {
            if self.driver.shutting_down.is_cancelled() {
                break;
            }
            if std::mem::replace(&mut look, true) {
                match store.queue_len(&auth, &thread_id).await {
                    Ok(0) => break,
                    Ok(_) => {}
                    Err(err) => self.log(
                        LogLevel::Warn,
                        &format!("cannot read the thread queue: {err}"),
                    ),
                }
            }
            let (holder, ttl) = (&self.config.holder, self.config.lease_ttl);
            let recovering = self.driver.reclaim.remove(&key).is_some();
            let taken = if recovering {
                store.reclaim_lease(&auth, &thread_id, holder, ttl).await
            } else {
                store.acquire_lease(&auth, &thread_id, holder, ttl).await
            };
            match taken {
                // Recovery found work here that another holder's lease still covers: say how
                // long it may wait, once (the driver keeps looking every poll interval).
                Ok(None) if recovering => self.log(
                    LogLevel::Info,
                    &format!(
                        "thread {thread_id}: its lease is held under another name than this \
                         process's ({holder}); its work resumes here when that lease lapses, \
                         within {} s, unless a live process is working it",
                        ttl.as_secs_f64()
                    ),
                ),
                Ok(Some(lease)) => {
                    let (slot, lease) = match self.wait_for_slot(&auth, lease).await {
                        SlotWait::Taken(slot, lease) => (slot, lease),
                        SlotWait::Closed => break,
                        // Another process has the thread now (or the store was out for a
                        // lease's time): look again like any driver that found it held.
                        SlotWait::LeaseLost => {
                            tokio::select! {
                                () = notify.notified() => {}
                                () = tokio::time::sleep(self.config.poll_interval) => {}
                                () = self.driver.shutting_down.cancelled() => break,
                            }
                            continue;
                        }
                    };
                    let worked = self.work_queue(&auth, lease).await;
                    drop(slot);
                    self.driver.slots.forget_if_idle(&auth);
                    if worked == Worked::LeftForAnotherAgent {
                        // That agent's executor takes the thread (its driver polls for the
                        // lease); looking again here would only take the lease from it.
                        self.driver.workers.remove(&key);
                        return;
                    }
                    // The queue was worked until it was empty (or the lease went): the
                    // look below, after leaving the map, catches whatever came since.
                    emptied = worked == Worked::Emptied;
                    break;
                }
                Ok(None) => {}
                Err(err) => self.log(
                    LogLevel::Warn,
                    &format!("cannot take the thread lease: {err}"),
                ),
            }
            tokio::select! {
                () = notify.notified() => {}
                () = tokio::time::sleep(self.config.poll_interval) => {}
                () = self.driver.shutting_down.cancelled() => break,
            }
        }
        self.driver.workers.remove(&key);
        // Work queued between the last look and the removal must not be stranded, nor work
        // left while the store did not answer: a new driver looks again, every poll interval
        // while the store stays out. Work queued here since the last look has notified this
        // driver; after a queue worked until the store said it was empty, that is all there
        // can be to find (another process's queueing starts its own driver), so the store is
        // asked only when the work stopped short.
        let queued_here = notify.notified().now_or_never().is_some();
        if !self.driver.shutting_down.is_cancelled()
            && (queued_here
                || (!emptied
                    && store
                        .queue_len(&auth, &thread_id)
                        .await
                        .map_or(true, |queued| queued > 0)))
        {
            self.schedule(&auth, &thread_id);
        }
    }

    /// Wait for a work slot for the thread whose lease is `lease`, renewing the lease every
    /// third of its TTL meanwhile: a thread waiting here is alive, and with every slot busy for
    /// longer than a TTL another process would otherwise take it over and run it beside its
    /// waiting driver. The lease is kept rather than released so that the thread keeps its
    /// place in the slots' FIFO. On shutdown the lease is given up.
    async fn wait_for_slot(&self, auth: &AuthContext, mut lease: Lease) -> SlotWait {
        let store = self.runtime.thread_store();
        let ttl = self.config.lease_ttl;
        // Counted in the queue depth while it waits, whichever way the wait ends.
        let _queued = crate::meter::Queued::enter(auth);
        let acquire = self.driver.slots.acquire(auth);
        tokio::pin!(acquire);
        loop {
            tokio::select! {
                slot = &mut acquire => {
                    return match slot {
                        Some(slot) => SlotWait::Taken(slot, lease),
                        None => SlotWait::Closed,
                    };
                }
                () = tokio::time::sleep(ttl / 3) => {
                    match store.renew_lease(auth, &lease, ttl).await {
                        Ok(renewed) => lease = renewed,
                        Err(err) => {
                            self.log(
                                LogLevel::Warn,
                                &format!("thread lease lost while waiting for a work slot: {err}"),
                            );
                            crate::meter::lease_lost();
                            return SlotWait::LeaseLost;
                        }
                    }
                }
                () = self.driver.shutting_down.cancelled() => {
                    if let Err(err) = store.release_lease(auth, &lease).await {
                        self.log(
                            LogLevel::Warn,
                            &format!("cannot release the thread lease: {err}"),
                        );
                    }
                    return SlotWait::Closed;
                }
            }
        }
    }

    /// One takeover sweep over every tenant: the threads of unfinished tasks that have queued
    /// work, no worker here and a free lease (their process died, or let the thread go) are
    /// driven here, as [`AgentExecutor::recover_all`] would at start; then the other threads
    /// the store lists with queued work ([`ThreadQueue::queued_threads`]), under the same
    /// conditions. The stores index tasks by state and threads by queued work, so finished
    /// tasks and idle threads cost a sweep nothing. Answers how many threads it took.
    ///
    /// [`ThreadQueue::queued_threads`]: keel_runtime::ThreadQueue::queued_threads
    pub(super) async fn sweep_abandoned(&self) -> AgentResult<usize> {
        let tasks = self.runtime.task_manager();
        let threads = self.runtime.thread_store();
        let tenants = match tasks.tenants().await {
            Ok(tenants) => tenants,
            Err(AgentError::Unsupported { .. }) => vec![self.runtime.auth_service().auth_context()],
            Err(err) => return Err(err),
        };
        let mut taken = 0;
        for auth in &tenants {
            let mut seen = HashSet::new();
            for task in &unfinished_tasks(tasks.as_ref(), auth).await? {
                let key = (auth.namespace(), task.thread_id.clone());
                // Another agent's task is its executor's to take.
                let theirs = EngineMeta::of(&task.metadata)
                    .agent
                    .is_some_and(|agent| agent != self.agent.card().name);
                if self.driver.shutting_down.is_cancelled()
                    || theirs
                    || !seen.insert(task.thread_id.clone())
                    || self.driver.workers.contains_key(&key)
                    || threads.queue_len(auth, &task.thread_id).await? == 0
                {
                    continue;
                }
                if self.drive_if_free(auth, &task.thread_id).await? {
                    taken += 1;
                }
            }
            // Threads with queued work but no unfinished task: a message or tool queued on an
            // idle thread, an effect, work whose wake was lost. Stores that cannot list them
            // leave such work to a restart's recovery.
            let queued = match threads.queued_threads(auth).await {
                Ok(queued) => queued,
                Err(AgentError::Unsupported { .. }) => Vec::new(),
                Err(err) => return Err(err),
            };
            for thread_id in queued {
                let key = (auth.namespace(), thread_id.clone());
                if self.driver.shutting_down.is_cancelled()
                    || seen.contains(&thread_id)
                    || self.driver.workers.contains_key(&key)
                    || self.front_is_another_agents(auth, &thread_id).await?
                {
                    continue;
                }
                if self.drive_if_free(auth, &thread_id).await? {
                    taken += 1;
                }
            }
        }
        Ok(taken)
    }

    /// Drive the thread here when nobody holds its lease (a lease taken here is free: nobody
    /// works the thread; the driver takes it again for itself). Answers whether it did.
    async fn drive_if_free(&self, auth: &AuthContext, thread_id: &ThreadId) -> AgentResult<bool> {
        let threads = self.runtime.thread_store();
        let Some(lease) = threads
            .acquire_lease(auth, thread_id, &self.config.holder, self.config.lease_ttl)
            .await?
        else {
            return Ok(false);
        };
        threads.release_lease(auth, &lease).await?;
        self.schedule(auth, thread_id);
        Ok(true)
    }

    /// Whether the work at the front of the thread's queue is a task of another agent, which
    /// that agent's executor takes. Queued messages, tools and effects have no owner: any
    /// agent's executor on the store may take them, as at start.
    async fn front_is_another_agents(
        &self,
        auth: &AuthContext,
        thread_id: &ThreadId,
    ) -> AgentResult<bool> {
        let front = self
            .runtime
            .thread_store()
            .peek_queue(auth, thread_id, 1)
            .await?;
        let Some(Ok(QueuedWork::Task { task_id })) = front
            .first()
            .map(|item| QueuedWork::deserialize(&item.payload))
        else {
            return Ok(false);
        };
        let task = self.runtime.task_manager().get_task(auth, &task_id).await?;
        Ok(task.is_some_and(|task| {
            EngineMeta::of(&task.metadata)
                .agent
                .is_some_and(|agent| agent != self.agent.card().name)
        }))
    }

    /// Acknowledge the thread's last item and release its lease: one write where the step
    /// store folds them, else the two calls sent together. Answers how each went; a folded
    /// write has one answer, given for the acknowledgement (a fence refusal still released
    /// this token's lease; after a store error the lease lapses by its TTL).
    async fn ack_and_release(
        &self,
        auth: &AuthContext,
        lease: &Lease,
        ids: &[String],
    ) -> (AgentResult<()>, AgentResult<()>) {
        if let Some(steps) = self.runtime.step_store() {
            match steps.ack_and_release(auth, lease, ids).await {
                Err(AgentError::Unsupported { .. }) => {}
                acked => return (acked, Ok(())),
            }
        }
        let store = self.runtime.thread_store();
        tokio::join!(
            store.ack_queue(auth, lease, ids),
            store.release_lease(auth, lease)
        )
    }

    /// Holding the lease: process queued work in FIFO order until the queue is empty, or
    /// until the next item is a task of another agent sharing the thread.
    pub(super) async fn work_queue(&self, auth: &AuthContext, lease: Lease) -> Worked {
        let store = self.runtime.thread_store();
        let flow = Flow {
            auth: auth.clone(),
            thread_id: lease.thread_id.clone(),
            lease: Arc::new(RwLock::new(Arc::new(lease))),
            lost: CancellationToken::new(),
            handed_on: AtomicBool::new(false),
        };
        let renewer = {
            let (store, auth, lease, lost) = (
                store.clone(),
                auth.clone(),
                flow.lease.clone(),
                flow.lost.clone(),
            );
            let logging = self.runtime.logging_service();
            let period = self.config.lease_ttl / 3;
            let ttl = self.config.lease_ttl;
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(period).await;
                    let current = lease.read().unwrap_or_else(|p| p.into_inner()).clone();
                    match store.renew_lease(&auth, &current, ttl).await {
                        Ok(renewed) => {
                            *lease.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(renewed)
                        }
                        Err(err) => {
                            logging.log(
                                LogLevel::Warn,
                                &format!("thread lease lost; stopping the flow: {err}"),
                            );
                            crate::meter::lease_lost();
                            lost.cancel();
                            return;
                        }
                    }
                }
            })
        };
        let mut worked = Worked::Done;
        let mut released = false;
        let items = async {
            loop {
                if flow.lost.is_cancelled() || self.driver.shutting_down.is_cancelled() {
                    break;
                }
                // Two: whether anything waits behind this item decides how it is acknowledged.
                let items = match store.peek_queue(auth, &flow.thread_id, 2).await {
                    Ok(items) => items,
                    Err(err) => {
                        self.log(
                            LogLevel::Error,
                            &format!("cannot read the thread queue: {err}"),
                        );
                        break;
                    }
                };
                let last = items.len() < 2;
                let Some(item) = items.into_iter().next() else {
                    worked = Worked::Emptied;
                    break;
                };
                let result = match serde_json::from_value::<QueuedWork>(item.payload.clone()) {
                    Err(err) => {
                        self.log(
                            LogLevel::Error,
                            &format!("dropping malformed queued work {}: {err}", item.id),
                        );
                        Ok(())
                    }
                    Ok(QueuedWork::Task { task_id }) => {
                        match self.runtime.task_manager().get_task(auth, &task_id).await {
                            Ok(Some(task)) => {
                                if self.owned_by_another_agent(&flow, &task).await {
                                    worked = Worked::LeftForAnotherAgent;
                                    break;
                                }
                                self.run_loaded_task(&flow, task).await
                            }
                            Ok(None) => Ok(()),
                            Err(err) => Err(err),
                        }
                    }
                    Ok(QueuedWork::Message { message }) => {
                        self.start_turn(&flow, message, &item.id).await
                    }
                    Ok(QueuedWork::Tool { call }) => {
                        let message = Message::new(
                            Role::User,
                            vec![Part::tool_call(
                                &call.id,
                                &call.name,
                                call.arguments.clone(),
                            )],
                        )
                        .in_thread(flow.thread_id.clone());
                        self.start_turn(&flow, message, &item.id).await
                    }
                    Ok(QueuedWork::Effect(effect)) => {
                        crate::effects::fire_effect(self, auth, &flow.thread_id, effect).await
                    }
                };
                if let Err(err) = result {
                    if matches!(err, AgentError::LeaseLost { .. }) {
                        break;
                    }
                    if matches!(err, AgentError::StoreUnavailable { .. }) {
                        // Not acknowledged: the item is worked again once the store answers.
                        self.log(
                            LogLevel::Warn,
                            &format!("queued work stopped by the store: {err}"),
                        );
                        break;
                    }
                    self.log(LogLevel::Error, &format!("queued work failed: {err}"));
                }
                // A run handed on at a shutdown is not done: its item stays for the next holder.
                if flow.lost.is_cancelled() || flow.handed_on.load(Ordering::Acquire) {
                    break;
                }
                let lease = flow.lease();
                let ids = std::slice::from_ref(&item.id);
                if last {
                    // Nothing was waiting behind it: acknowledge and let the thread go in one
                    // write where the store can, else in one round trip (sent in that order;
                    // both are fenced by the same lease). Work queued meanwhile is picked up
                    // by the driver's look after the worker leaves.
                    renewer.abort();
                    let (acked, freed) = self.ack_and_release(auth, &lease, ids).await;
                    released = true;
                    if acked.is_ok() && freed.is_ok() {
                        worked = Worked::Emptied;
                    }
                    if let Err(err) = acked {
                        self.log(
                            LogLevel::Warn,
                            &format!("cannot acknowledge queued work: {err}"),
                        );
                    }
                    if let Err(err) = freed {
                        self.log(
                            LogLevel::Warn,
                            &format!("cannot release the thread lease: {err}"),
                        );
                    }
                    break;
                }
                if let Err(err) = store.ack_queue(auth, &lease, ids).await {
                    self.log(
                        LogLevel::Warn,
                        &format!("cannot acknowledge queued work: {err}"),
                    );
                    break;
                }
            }
        };
        // A shutdown whose drain ran out drops the run where it is, as a crash would (its
        // persisted steps stay; a call in flight is lost); the lease is released below all
        // the same, so the next process resumes the thread at once.
        tokio::select! {
            biased;
            () = self.driver.halted.cancelled() => {}
            () = items => {}
        }
        renewer.abort();
        if !released {
            if let Err(err) = store.release_lease(auth, &flow.lease()).await {
                self.log(
                    LogLevel::Warn,
                    &format!("cannot release the thread lease: {err}"),
                );
            }
        }
        worked
    }

    /// Whether the task was sent to another agent's executor on this thread (a task with no
    /// recorded owner is anyone's). The owner is in the task's metadata; tasks stored before
    /// it was kept there have it in a thread key.
    pub(super) async fn owned_by_another_agent(&self, flow: &Flow, task: &Task) -> bool {
        let mine = self.agent.card().name.as_str();
        if let Some(owner) = EngineMeta::of(&task.metadata).agent {
            return owner != mine;
        }
        match self
            .runtime
            .thread_store()
            .kv_get(&flow.auth, &flow.thread_id, &owner_key(&task.id))
            .await
        {
            Ok(Some(owner)) => owner.as_str() != Some(mine),
            _ => false,
        }
    }

    /// Work queued while the thread was idle starts a turn of its own: a task in the thread,
    /// whose id is [`TURN_PREFIX`] and the queue item's id. Its message is tagged with the
    /// item ([`META_QUEUE_ITEM`]), so that a step draining the queue, which finds the item
    /// still at its head, sees it in the history already and only acknowledges it.
    pub(super) async fn start_turn(
        &self,
        flow: &Flow,
        mut message: Message,
        item_id: &str,
    ) -> AgentResult<()> {
        let tasks = self.runtime.task_manager();
        let mut task = Task::new(flow.thread_id.clone());
        // The task id derives from the queue item, so a redelivered item continues its task.
        task.id = TaskId::from(format!("{TURN_PREFIX}{item_id}"));
        if tasks.get_task(&flow.auth, &task.id).await?.is_none() {
            RunContext::ensure_task_context(&mut task)?;
            message.task_id = Some(task.id.clone());
            message.thread_id = Some(task.thread_id.clone());
            message
                .metadata
                .insert(META_QUEUE_ITEM.into(), serde_json::json!(item_id));
            tasks.save_task(&flow.auth, &task).await?;
            tasks
                .add_task_event(&flow.auth, &task.id, &TaskEvent::Message { message })
                .await?;
        }
        self.run_task(flow, &task.id).await
    }
}

/// How [`Inner::wait_for_slot`] ended.
enum SlotWait {
    /// A slot, and the thread's lease as renewed while waiting.
    Taken(super::slots::Slot, Lease),
    /// The executor is shutting down (the lease was released).
    Closed,
    /// The lease could not be renewed; the thread may be another process's now.
    LeaseLost,
}
