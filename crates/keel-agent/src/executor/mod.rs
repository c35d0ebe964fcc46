//! The thread engine: runs an [`Agent`] on threads, one flow at a time per thread, with the
//! step cycle of Standard Agents §3, durable queues, stop rules, live cancellation (from any
//! process) and crash recovery.
//!
//! A message creates a task and is queued on its thread (the A2A `contextId`); the thread's
//! worker holds the thread's fenced lease from the store and processes queued work in FIFO
//! order, so a busy thread queues new work instead of running it concurrently, across
//! processes too. Each step drains queued messages and tools, assembles the context from the
//! thread's durable history, calls the model, persists the assistant message, runs the tool
//! calls in order persisting each result, and evaluates the stop rules.

mod async_tools;
mod cancel;
mod compaction;
pub(crate) mod config;
mod context;
mod direct;
mod driver;
mod features;
mod heard;
mod host;
mod notices;
mod records;
mod run;
mod slots;
mod state;
mod step;
mod tools;
mod waiting;

pub use compaction::AutoCompaction;
pub use config::{ExecutorConfig, SendOptions, DEFAULT_DRAIN_TIMEOUT};
pub(crate) use context::{is_input, read_back};
pub(crate) use state::is_tagged;
pub use state::{AgentExecutor, META_MESSAGE as MESSAGE_ID_META};

use std::sync::{Arc, RwLock, Weak};

use keel_core::{
    AgentError, AgentResult, Message, Role, RunContext, Task, TaskEvent, TaskId, TaskState,
    ThreadId,
};
use keel_runtime::{attach_history, AuthContext, ListTasksFilter, Runtime};
use serde_json::json;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::approval_part;
use crate::task_meta::{EngineMeta, PENDING_APPROVAL};
use crate::thread_state::ThreadHost;
use crate::{Agent, Negotiation, ThreadState};
use keel_core::{ApprovalDecision, ApprovalRequest};
use keel_events::EventSink;
use state::*;

/// Attach a caller's run context to `task`. On a task that already has one, the context can
/// only narrow: the budget becomes the tighter of the two; permissions left empty keep the
/// task's, and a different non-empty set is refused, since with most-specific-wins rules no
/// merge of two sets is sure to only narrow.
fn adopt_run_context(task: &mut Task, mut incoming: RunContext) -> AgentResult<()> {
    if let Some(existing) = RunContext::from_task(task)? {
        if incoming.permissions.is_empty() {
            incoming.permissions = existing.permissions;
        } else if incoming.permissions != existing.permissions && !existing.permissions.is_empty() {
            return Err(AgentError::invalid_input(
                "message.metadata.run_context.permissions",
                format!(
                    "task {} already runs with other permissions; a continuing task's \
                     permissions cannot change",
                    task.id
                ),
            ));
        }
        incoming.budget = existing.budget.narrowed_by(&incoming.budget);
    }
    incoming.attach_to_task(task)
}

/// What [`AgentExecutor::send`] answers: the task the message created or continued, or the
/// agent's direct reply when it created none (A2A's `SendMessageResponse`).
#[derive(Debug, Clone, PartialEq)]
pub enum SendOutcome {
    /// The task, as `send_message` returns it.
    Task(Box<Task>),
    /// The agent's reply; no task exists for it.
    Message(Box<Message>),
}

/// The agent's direct reply to `incoming`: an agent message in the incoming message's thread
/// (which the engine has already set), belonging to no task.
fn reply_to(incoming: &Message, mut reply: Message) -> Message {
    reply.role = Role::Agent;
    reply.task_id = None;
    reply.thread_id = incoming.thread_id.clone();
    reply
}

/// Refuse a decision that does not answer `task`'s pending approval request, naming `field`.
fn check_answers_pending(task: &Task, decision: &ApprovalDecision, field: &str) -> AgentResult<()> {
    let pending: Option<ApprovalRequest> = EngineMeta::of(&task.metadata).pending_approval;
    match pending {
        Some(pending) if pending.request_id == decision.request_id => Ok(()),
        Some(pending) => Err(AgentError::invalid_input(
            field,
            format!(
                "`{}` does not answer the pending request `{}`",
                decision.request_id, pending.request_id
            ),
        )),
        None => Err(AgentError::invalid_input(
            field,
            format!("task {} has no action waiting for approval", task.id),
        )),
    }
}

impl AgentExecutor {
    /// An executor for `agent`, storing through `runtime`, with the default configuration.
    pub fn new(agent: Agent, runtime: Arc<dyn Runtime>) -> Self {
        Self::with_config(agent, runtime, ExecutorConfig::default())
    }

    /// An executor with explicit tuning.
    pub fn with_config(agent: Agent, runtime: Arc<dyn Runtime>, config: ExecutorConfig) -> Self {
        let executor = Self {
            inner: Arc::new_cyclic(|me| Inner {
                driver: Driver::new(&config),
                agent,
                runtime,
                config,
                me: me.clone(),
                notices: notices::Notices::new(),
                parents: RwLock::new(Vec::new()),
                effects: Default::default(),
            }),
        };
        let host: Weak<dyn ThreadHost> = executor.inner.me.clone();
        executor.inner.agent.hooks.attached(host);
        executor
    }

    /// The agent.
    pub fn agent(&self) -> &Agent {
        &self.inner.agent
    }

    /// The service hub.
    pub fn runtime(&self) -> &Arc<dyn Runtime> {
        &self.inner.runtime
    }

    /// The handle of one thread, for application code.
    pub fn thread(&self, auth: &AuthContext, thread_id: ThreadId) -> ThreadState {
        ThreadState {
            auth: auth.clone(),
            thread_id,
            host: self.inner.clone(),
            cancel: CancellationToken::new(),
        }
    }

    /// Accept a user message: a new task in the message's thread (or a new thread), or the
    /// continuation of the task it names when that task waits for input. A task waiting for
    /// an approval takes only a message whose one part is the approval data part
    /// ([`crate::approval_part()`]); its decision, made by `auth`'s user, resumes the run as
    /// [`Self::decide_approval`] does, and an approval part sent to a task that waits for
    /// none is [`AgentError::InvalidInput`] naming the task's state. The message is
    /// persisted and queued on its thread before this returns; the thread's worker runs it
    /// when the thread is free. Blocking by default: see [`SendOptions`].
    ///
    /// This is [`Self::send`] for callers that expect a task: when the agent answers with a
    /// message and creates no task ([`Negotiation::Reply`]), it is
    /// [`AgentError::Unsupported`] saying so.
    pub async fn send_message(
        &self,
        auth: &AuthContext,
        message: Message,
        options: SendOptions,
    ) -> AgentResult<Task> {
        match self.send(auth, message, options).await? {
            SendOutcome::Task(task) => Ok(*task),
            SendOutcome::Message(_) => Err(AgentError::Unsupported {
                what: format!(
                    "a task from agent `{}`: it answered with a message and created no task",
                    self.inner.agent.card().name
                ),
            }),
        }
    }

    /// Accept a user message as [`Self::send_message`] does, answering with the task, or with
    /// the agent's message when its negotiator replies without a task
    /// ([`Negotiation::Reply`]: nothing is stored, no run starts).
    pub async fn send(
        &self,
        auth: &AuthContext,
        mut message: Message,
        options: SendOptions,
    ) -> AgentResult<SendOutcome> {
        if message.parts.is_empty() {
            return Err(AgentError::invalid_input(
                "message.parts",
                "must contain at least one part",
            ));
        }
        if message.role != Role::User {
            return Err(AgentError::invalid_input(
                "message.role",
                "must be `user` for a message sent to an agent",
            ));
        }
        // Only the engine marks a message as an approval decision, or as a queue item's.
        message.metadata.remove(approval_part::DECISION_MESSAGE_KEY);
        message.metadata.remove(META_QUEUE_ITEM);
        let tasks = self.inner.runtime.task_manager();
        let mut task = match message.task_id.clone() {
            Some(task_id) => {
                let mut task = tasks.get_task(auth, &task_id).await?.ok_or_else(|| {
                    AgentError::TaskNotFound {
                        task_id: task_id.clone(),
                    }
                })?;
                let waits_for_approval = task.state() == TaskState::InputRequired
                    && task.metadata.contains_key(PENDING_APPROVAL);
                if !waits_for_approval {
                    if let Some((index, _)) = approval_part::find(&message) {
                        return Err(AgentError::invalid_input(
                            format!("message.parts[{index}]"),
                            format!(
                                "task {task_id} is {} and does not wait for an approval",
                                task.state()
                            ),
                        ));
                    }
                }
                if task.state().is_terminal() {
                    // A2A names this UnsupportedOperation: an ended task takes no more messages.
                    return Err(AgentError::Unsupported {
                        what: format!(
                            "a message to task {task_id}, which is {}: an ended task takes no more messages; omit the task id to start a new task in the same thread",
                            task.state()
                        ),
                    });
                }
                if !matches!(
                    task.state(),
                    TaskState::InputRequired | TaskState::AuthRequired
                ) {
                    return Err(AgentError::invalid_input(
                        "message.task_id",
                        format!(
                            "task {task_id} is {} and does not accept input; omit the task id to start a new task in the same thread",
                            task.state()
                        ),
                    ));
                }
                if message
                    .thread_id
                    .as_ref()
                    .is_some_and(|t| t != &task.thread_id)
                {
                    return Err(AgentError::invalid_input(
                        "message.thread_id",
                        format!("task {task_id} belongs to another thread"),
                    ));
                }
                if waits_for_approval {
                    // The answer continues the task as any input does; the run applies the
                    // decision (and records who made it) before the model sees anything.
                    let decision = approval_part::decision_of(&message, &auth.user_name)?;
                    let field = match approval_part::find(&message) {
                        Some((index, _)) => {
                            format!("message.parts[{index}].data.approval.requestId")
                        }
                        None => "message.parts".to_owned(),
                    };
                    check_answers_pending(&task, &decision, &field)?;
                    message.metadata.insert(
                        approval_part::DECISION_MESSAGE_KEY.into(),
                        json!(decision.request_id),
                    );
                    EngineMeta::update(&mut task, |m| m.approval_decision = Some(decision));
                }
                task
            }
            None => Task::with_id(
                options.task_id.clone().unwrap_or_default(),
                message.thread_id.clone().unwrap_or_default(),
            ),
        };
        self.thread(auth, task.thread_id.clone())
            .ensure_open()
            .await?;
        message.task_id = Some(task.id.clone());
        message.thread_id = Some(task.thread_id.clone());
        match options.run_context {
            Some(ctx) => adopt_run_context(&mut task, ctx)?,
            None => {
                RunContext::ensure_task_context(&mut task)?;
            }
        }
        let continuing = task.state() != TaskState::Submitted;
        if !continuing {
            // Refused before anything is stored; an answer to a waiting task always gets in.
            self.inner.check_queue_room(auth, &task.thread_id).await?;
            let negotiation = self
                .inner
                .agent
                .negotiator_for(self.inner.runtime.as_ref())
                .negotiate(self.inner.agent.card(), &message)
                .await?;
            match negotiation {
                Negotiation::Accept { skill } => {
                    if let Some(skill) = skill {
                        EngineMeta::update(&mut task, |m| m.skill = Some(skill));
                    }
                }
                Negotiation::Reply { message: reply } => {
                    return Ok(SendOutcome::Message(Box::new(reply_to(&message, reply))));
                }
                unstarted => {
                    // The task exists with its message but no run: it waits for an answer
                    // (a message naming it starts it), or it ends rejected.
                    tasks.save_task(auth, &task).await?;
                    tasks
                        .add_task_event(auth, &task.id, &TaskEvent::Message { message })
                        .await?;
                    self.inner
                        .rest_unstarted(auth, &mut task, unstarted)
                        .await?;
                    let task = self
                        .get_task(auth, &task.id, options.history_length)
                        .await?;
                    return Ok(SendOutcome::Task(Box::new(task)));
                }
            }
        }
        if !continuing {
            // Two agents may share a thread (dual_ai): each runs only its own tasks.
            let agent = self.inner.agent.card().name.clone();
            EngineMeta::update(&mut task, |m| m.agent = Some(agent));
        }
        let message = TaskEvent::Message { message };
        // Taken before the task is queued, so that no wake-up of its rest comes before it.
        let waiter =
            (!options.return_immediately).then(|| self.inner.notices.rest_waiter(auth, &task.id));
        if continuing {
            // The answer is in: the task works again (and a blocking caller waits for the run
            // rather than finding the task still waiting for input).
            task.begin()?;
            let status = records::status_event(&task);
            self.inner
                .save_and_enqueue_task(auth, &task, &[message, status])
                .await?;
            self.inner.notices.task_saved_as(auth, &task);
        } else {
            self.inner
                .save_and_enqueue_task(auth, &task, std::slice::from_ref(&message))
                .await?;
        }
        let task = match waiter {
            Some(waiter) => {
                // The snapshot the wait ended on is the answer: only its history is read.
                let task = self
                    .inner
                    .answer_unless_handed_on(
                        auth,
                        &task.id,
                        self.inner
                            .wait_until_queued_task_rests(waiter, auth, &task.id),
                    )
                    .await?;
                attach_history(
                    self.inner.runtime.task_manager().as_ref(),
                    auth,
                    task,
                    options.history_length,
                )
                .await?
            }
            None => {
                self.get_task(auth, &task.id, options.history_length)
                    .await?
            }
        };
        Ok(SendOutcome::Task(Box::new(task)))
    }

    /// The task with its history (the last `history_length` messages when given).
    pub async fn get_task(
        &self,
        auth: &AuthContext,
        task_id: &TaskId,
        history_length: Option<usize>,
    ) -> AgentResult<Task> {
        crate::reads::task_with_history(self.inner.runtime.as_ref(), auth, task_id, history_length)
            .await
    }

    // Subagents: a parent's subagent tools wait for a child's task through this.
    /// Wait until the task rests with an answer (terminal, or waiting for input or approval:
    /// see [`TaskRest::answers`]) and return it.
    pub(crate) async fn wait_for_rest(
        &self,
        auth: &AuthContext,
        task_id: &TaskId,
    ) -> AgentResult<Task> {
        self.inner.wait_until_resting(auth, task_id).await?;
        self.get_task(auth, task_id, None).await
    }

    /// Send every run's normalized events (`keel-events`) to `sink` too, from now on.
    pub fn add_event_sink(&self, sink: Arc<dyn EventSink>) {
        self.inner.notices.add_sink(sink);
    }

    /// Answer an action that waits for approval (the task is `input-required` with
    /// `metadata.pending_approval`). The decision must carry the pending request's id. The
    /// task resumes: an approved action runs, a denied one becomes a tool error the model
    /// sees. This works after a restart too, since the pending request is persisted.
    /// Answers the task once it rests again.
    pub async fn decide_approval(
        &self,
        auth: &AuthContext,
        task_id: &TaskId,
        decision: ApprovalDecision,
    ) -> AgentResult<Task> {
        let tasks = self.inner.runtime.task_manager();
        let mut task = self.inner.stored_task(auth, task_id).await?;
        if task.state() != TaskState::InputRequired || !task.metadata.contains_key(PENDING_APPROVAL)
        {
            return Err(AgentError::invalid_input(
                "task_id",
                format!("task {task_id} has no action waiting for approval"),
            ));
        }
        check_answers_pending(&task, &decision, "approval_decision.request_id")?;
        EngineMeta::update(&mut task, |m| m.approval_decision = Some(decision));
        tasks.save_task(auth, &task).await?;
        self.inner
            .enqueue_task(auth, &task.thread_id, &task.id)
            .await?;
        // Wait for the run to pick the decision up and rest again.
        self.inner
            .answer_unless_handed_on(
                auth,
                task_id,
                self.inner.wait_until(auth, task_id, answered),
            )
            .await?;
        // Answered with its history, like every task this API hands out.
        self.get_task(auth, task_id, None).await
    }

    /// A signal bumped whenever this process appends to a task's event log or changes a
    /// task's status, so that streams can follow tasks without polling the store. Work done
    /// by other processes sharing the store does not bump it: followers of such tasks look
    /// at the store now and then.
    pub fn task_updates(&self) -> watch::Receiver<u64> {
        self.inner.notices.subscribe()
    }

    /// Whether a run of this task is executing in this process.
    pub fn is_running(&self, auth: &AuthContext, task_id: &TaskId) -> bool {
        self.inner
            .driver
            .active
            .contains_key(&(auth.namespace(), task_id.clone()))
    }

    /// Resume what a dead process left behind for this tenant: every task that is queued or
    /// working gets its thread scheduled (a working task resumes at its last persisted step),
    /// and a task whose queue entry was lost is queued again. Meant for a process's start: a
    /// thread whose lease is still held under this executor's own holder name
    /// ([`ExecutorConfig::holder`], stable across restarts when configured so) was this
    /// process's before it restarted and is taken back at once; other threads wait for their
    /// leases to lapse.
    pub async fn recover(&self, auth: &AuthContext) -> AgentResult<usize> {
        let tasks = self.inner.runtime.task_manager();
        let threads = self.inner.runtime.thread_store();
        let mut resumed = 0;
        for task in &unfinished_tasks(tasks.as_ref(), auth).await? {
            let queued = threads
                .peek_queue(auth, &task.thread_id, usize::MAX)
                .await?;
            let in_queue = queued.iter().any(|item| {
                matches!(serde_json::from_value(item.payload.clone()), Ok(QueuedWork::Task { task_id }) if task_id == task.id)
            });
            if !in_queue {
                let payload = serde_json::to_value(QueuedWork::Task {
                    task_id: task.id.clone(),
                })
                .map_err(AgentError::internal)?;
                threads.push_queue(auth, &task.thread_id, payload).await?;
            }
            self.inner.log(
                keel_runtime::LogLevel::Info,
                &format!(
                    "resuming task {} ({}) on thread {}",
                    task.id,
                    task.state(),
                    task.thread_id
                ),
            );
            // A lease still held under this process's holder name was this
            // process's before it restarted: taken back at once.
            self.inner
                .driver
                .reclaim
                .insert((auth.namespace(), task.thread_id.clone()));
            self.inner.schedule(auth, &task.thread_id);
            resumed += 1;
        }
        Ok(resumed)
    }

    /// Resume what a dead process left behind for every tenant the task store knows
    /// ([`TaskManager::tenants`](keel_runtime::TaskManager::tenants)), as
    /// [`AgentExecutor::recover`] does for one; a store that cannot list tenants recovers the
    /// default tenant only. Returns how many tasks were resumed.
    pub async fn recover_all(&self) -> AgentResult<usize> {
        let tenants = match self.inner.runtime.task_manager().tenants().await {
            Ok(tenants) => tenants,
            Err(AgentError::Unsupported { .. }) => {
                vec![self.inner.runtime.auth_service().auth_context()]
            }
            Err(err) => return Err(err),
        };
        let mut resumed = 0;
        for auth in &tenants {
            resumed += self.recover(auth).await?;
        }
        Ok(resumed)
    }

    /// Take over, from now until [`AgentExecutor::shutdown`], the work that other processes
    /// sharing the store leave behind when they die: every quarter to half a lease TTL
    /// (jittered, so that replicas spread their looks), the threads of unfinished tasks
    /// with queued work and a lapsed lease are driven here, their running task resumed at
    /// its last persisted step and their queued tasks after it, as
    /// [`AgentExecutor::recover_all`] does at start; so are the other threads with queued
    /// work and no runner (a message queued on an idle thread by a process that died, a
    /// wake that was lost), where the store can list them. The thread's fenced lease keeps
    /// each thread to one runner across processes. Where the store announces what every
    /// process commits ([`Runtime::change_feed`]), this process also hears at once of other
    /// processes' task events (its watchers wake) and cancel requests (the run stops).
    /// Needs a tokio runtime.
    pub fn start_takeover(&self) {
        self.hear_store_changes();
        let me = Arc::downgrade(&self.inner);
        let stop = self.inner.driver.shutting_down.clone();
        let ttl = self.inner.config.lease_ttl;
        self.inner.driver.tracker.spawn(async move {
            loop {
                let pause = ttl.mul_f64(0.25 + fastrand::f64() / 4.0);
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep(pause) => {}
                }
                let Some(inner) = me.upgrade() else { return };
                match inner.sweep_abandoned().await {
                    Ok(taken) => crate::meter::took_over(taken),
                    Err(err) => inner.log(
                        keel_runtime::LogLevel::Warn,
                        &format!("cannot look for abandoned threads: {err}"),
                    ),
                }
            }
        });
    }

    /// Stop this executor and hand its work on; nothing is canceled (a cancel is only ever
    /// what a caller asked). At once: no new work is taken (messages still sent are stored
    /// and queued, for the next process), the takeover sweep and the effect scheduler stop,
    /// and threads waiting for a work slot are let go. Running tasks go on until their next
    /// step and stop there, everything before it persisted, for at most
    /// [`ExecutorConfig::drain_timeout`]; a run still in a model or tool call after that is
    /// stopped where it is, as a crash would stop it (a resumed run asks the model again, and
    /// runs a tool call again only when the tool is idempotent). Either way each task stays
    /// unfinished with its queue item in place, and its thread's lease is released, so a
    /// replica's takeover sweep or this process restarted ([`AgentExecutor::recover_all`])
    /// resumes it at once. Callers blocked here on a task ([`Self::send`]) are then answered
    /// with the task as it stands. Answers which tasks were handed on, and how; calling it
    /// again answers nothing more.
    pub async fn shutdown(&self) -> HandedOn {
        let driver = &self.inner.driver;
        driver.shutting_down.cancel();
        driver.tracker.close();
        let drain = self.inner.config.drain_timeout;
        if tokio::time::timeout(drain, driver.tracker.wait())
            .await
            .is_err()
        {
            driver.halted.cancel();
            driver.tracker.wait().await;
        }
        // The runs the halt cut off are still registered; their futures are gone, so
        // canceling their tokens ends nothing but their cancel watchers (and tells a tool's
        // own background work, if any, that its run is over).
        let mut interrupted = Vec::new();
        driver.active.retain(|(_, task_id), run| {
            run.token.cancel();
            interrupted.push(task_id.clone());
            false
        });
        let drained =
            std::mem::take(&mut *driver.drained.lock().unwrap_or_else(|p| p.into_inner()));
        driver.handed_over.cancel();
        let handed = HandedOn {
            drained,
            interrupted,
        };
        if !handed.is_empty() {
            self.inner.log(
                keel_runtime::LogLevel::Info,
                &format!(
                    "shutdown: handed on {} task(s) stopped before a step ({}) and {} stopped \
                     in a model or tool call when the {} s drain ran out ({}); they resume \
                     in the next process",
                    handed.drained.len(),
                    ids(&handed.drained),
                    handed.interrupted.len(),
                    drain.as_secs_f64(),
                    ids(&handed.interrupted),
                ),
            );
        }
        handed
    }
}

/// What [`AgentExecutor::shutdown`] handed on: the tasks whose runs it stopped, each left
/// unfinished (not canceled) for the next process to resume.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HandedOn {
    /// Runs that reached their next step within the drain and stopped there: nothing of
    /// them is lost or repeated.
    pub drained: Vec<TaskId>,
    /// Runs still in a model or tool call when the drain ran out, stopped where they were:
    /// the call's answer is lost (see [`AgentExecutor::shutdown`]).
    pub interrupted: Vec<TaskId>,
}

impl HandedOn {
    /// Whether no run was stopped.
    pub fn is_empty(&self) -> bool {
        self.drained.is_empty() && self.interrupted.is_empty()
    }
}

/// Task ids for a log line: the first few, and how many more.
fn ids(tasks: &[TaskId]) -> String {
    const SHOWN: usize = 10;
    let mut text = tasks
        .iter()
        .take(SHOWN)
        .map(TaskId::as_str)
        .collect::<Vec<_>>()
        .join(", ");
    if tasks.len() > SHOWN {
        text.push_str(&format!(" and {} more", tasks.len() - SHOWN));
    }
    text
}

/// The tenant's unfinished tasks (working, then submitted), every page: what recovery and
/// the takeover sweep walk.
pub(super) async fn unfinished_tasks(
    tasks: &dyn keel_runtime::TaskManager,
    auth: &AuthContext,
) -> AgentResult<Vec<keel_core::Task>> {
    let mut unfinished = Vec::new();
    for state in [TaskState::Working, TaskState::Submitted] {
        let filter = ListTasksFilter {
            state: Some(state),
            page_size: Some(100),
            ..Default::default()
        };
        unfinished.extend(keel_runtime::list_all_tasks(tasks, auth, filter).await?);
    }
    Ok(unfinished)
}

#[cfg(test)]
mod tests;
