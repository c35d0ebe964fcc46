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

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::{Duration, Instant};

use chrono::Utc;
use dashmap::DashMap;
use keel_core::{
    AgentError, AgentResult, Artifact, Message, Part, PartContent, Role, RunContext, Task,
    TaskEvent, TaskId, TaskState, ThreadId,
};
use keel_llm::{LlmMessage, LlmRequest, LlmRole, ToolCall};
use keel_runtime::{load_task_with_history, AuthContext, Lease, ListTasksFilter, Runtime};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tokio::sync::{watch, Notify, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use crate::agent::{ASK_HUMAN_TOOL, SESSION_FAIL_TOOL, SESSION_STOP_TOOL};
use crate::observe::RunObs;
use crate::{Agent, Negotiation, TaskRest, ThreadState, ToolContext};
use futures::{FutureExt, StreamExt};
use keel_core::{ApprovalDecision, ApprovalOutcome, ApprovalRequest, RunAction};
use keel_events::payload::{
    ActionCompletedPayload, ActionFailedPayload, LlmCallCompletedPayload, LlmCallStartedPayload,
};
use keel_events::{EventSink, EventType, RedactionPolicy, RunEvent};
use keel_llm::{prepare_manifest_reusing, LlmStreamEvent, ManifestEstimates, ManifestIds};
use keel_runtime::{RunRecord, TaskRecord};

/// Metadata keys Keel puts on thread history entries.
const META_TASK: &str = "keel.task_id";
const META_MESSAGE: &str = "keel.message_id";
const META_QUEUE_ITEM: &str = "keel.queue_item";
/// History metadata key: the agent (side) that wrote an assistant or tool entry, so that two
/// agents sharing a thread each see the other as the user (dual_ai, §4).
const META_SIDE: &str = "keel.side";
/// Task metadata keys of an action waiting for approval and of the decision about it.
const META_PENDING_APPROVAL: &str = "pending_approval";
const META_APPROVAL_DECISION: &str = "approval_decision";

/// How [`AgentExecutor::send_message`] should behave.
#[derive(Debug, Clone, Default)]
pub struct SendOptions {
    /// Return the submitted task at once and let the run go on in the background.
    pub return_immediately: bool,
    /// Keep only this many most recent messages in the returned task's history.
    pub history_length: Option<usize>,
    /// The run context to attach (otherwise one is created, or upgraded from legacy keys).
    pub run_context: Option<RunContext>,
}

/// Tuning of an [`AgentExecutor`].
#[derive(Debug, Clone)]
pub struct ExecutorConfig {
    /// How long a thread lease lasts without renewal; a crashed process's threads are taken
    /// over after this long.
    pub lease_ttl: Duration,
    /// How many threads this process runs at once; more wait for a slot.
    pub max_concurrent_threads: usize,
    /// How often to look again at work another process holds (its lease, its task state).
    pub poll_interval: Duration,
    /// This process's name in leases.
    pub holder: String,
    /// Asynchronous tools: the base URL callbacks are POSTed to (`{base}/callbacks/{call_id}`,
    /// the route `keel-transport` serves). Without it asynchronous tools cannot be dispatched.
    pub callback_base_url: Option<String>,
    /// Asynchronous tools: how long a pending call waits for its callback when the tool sets
    /// no timeout of its own.
    pub async_tool_timeout: Duration,
}

impl Default for ExecutorConfig {
    fn default() -> Self {
        Self {
            lease_ttl: Duration::from_secs(30),
            max_concurrent_threads: 64,
            poll_interval: Duration::from_millis(200),
            holder: format!("keel-{}-{}", std::process::id(), uuid_suffix()),
            callback_base_url: None,
            async_tool_timeout: Duration::from_secs(3600),
        }
    }
}

fn uuid_suffix() -> String {
    keel_core::RunId::new()
        .as_str()
        .chars()
        .rev()
        .take(8)
        .collect()
}

/// Work waiting in a thread's durable queue.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub(crate) enum QueuedWork {
    /// Run (or continue) this task.
    Task { task_id: TaskId },
    /// A queued user message (`ThreadState::queue_message`).
    Message { message: Message },
    /// A queued tool call (`ThreadState::queue_tool`).
    Tool { call: ToolCall },
    /// A scheduled effect whose timer fired (see `effects`).
    Effect(crate::effects::QueuedEffect),
}

/// A run in progress in this process.
struct ActiveRun {
    thread_id: ThreadId,
    token: CancellationToken,
    reason: Mutex<Option<String>>,
    /// Where another process leaves a cancel request for this task (`cancel_key`), read at
    /// every checkpoint.
    cancel_key: String,
}

type TaskKey = (String, TaskId);
type ThreadKey = (String, ThreadId);

pub(crate) struct Inner {
    pub(crate) agent: Agent,
    pub(crate) runtime: Arc<dyn Runtime>,
    pub(crate) config: ExecutorConfig,
    pub(crate) me: Weak<Inner>,
    active: DashMap<TaskKey, Arc<ActiveRun>, foldhash::fast::RandomState>,
    workers: DashMap<ThreadKey, Arc<Notify>, foldhash::fast::RandomState>,
    /// Bumped whenever this process persists a task status or a message of a task, to wake
    /// local watchers of a task's events (streams, push delivery).
    changed: watch::Sender<u64>,
    /// Bumped whenever this process saves a task record (its status or metadata), to wake
    /// the callers waiting for a task to rest. Kept apart from `changed` so that a blocking
    /// send is not woken, and does not read its task again, at every persisted message.
    rested: watch::Sender<u64>,
    pub(crate) tracker: TaskTracker,
    /// Where every run's events go (besides its own recorder).
    pub(crate) sinks: RwLock<Vec<Arc<dyn EventSink>>>,
    pub(crate) shutting_down: CancellationToken,
    slots: Arc<Semaphore>,
    /// Subagents: the executors whose agents use this one as a child kind, woken when a
    /// child's result is queued on their thread.
    pub(crate) parents: RwLock<Vec<Weak<Inner>>>,
    /// Scheduled effects: what wakes the scheduler.
    pub(crate) effects: crate::effects::EffectScheduler,
}

/// Runs one [`Agent`] on threads, persisting through a [`Runtime`]. Cheap to clone.
#[derive(Clone)]
pub struct AgentExecutor {
    pub(crate) inner: Arc<Inner>,
}

/// The lease a worker holds, kept fresh by a renewal task.
struct Flow {
    auth: AuthContext,
    thread_id: ThreadId,
    lease: Arc<RwLock<Arc<Lease>>>,
    lost: CancellationToken,
}

impl Flow {
    /// The current lease, shared: every persist point passes it to the store, and copying it
    /// each time (its strings) was an allocation per write.
    fn lease(&self) -> Arc<Lease> {
        self.lease.read().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// How a run ended, before it is written to the task.
enum Outcome {
    /// Completed with this answer; `recorded` says whether the answer message is already in
    /// the task's log.
    Answer {
        text: String,
        reason: &'static str,
        recorded: bool,
    },
    Failed {
        error: AgentError,
        reason: String,
    },
    InputRequired {
        question: String,
    },
    /// An action needs a decision nobody could make in-process: the task waits for
    /// [`AgentExecutor::decide_approval`].
    AwaitingApproval {
        request: Box<ApprovalRequest>,
    },
    Canceled {
        reason: String,
    },
    /// The lease was lost: another process owns the thread now and will finish the task.
    Abandoned,
    /// Asynchronous tools: a call waits for its callback; the task stays working and the
    /// thread is released.
    AwaitingTool {
        call_id: String,
    },
}

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

impl AgentExecutor {
    /// An executor for `agent`, storing through `runtime`, with the default configuration.
    pub fn new(agent: Agent, runtime: Arc<dyn Runtime>) -> Self {
        Self::with_config(agent, runtime, ExecutorConfig::default())
    }

    /// An executor with explicit tuning.
    pub fn with_config(agent: Agent, runtime: Arc<dyn Runtime>, config: ExecutorConfig) -> Self {
        let (changed, _) = watch::channel(0);
        let (rested, _) = watch::channel(0);
        let slots = Arc::new(Semaphore::new(config.max_concurrent_threads.max(1)));
        let executor = Self {
            inner: Arc::new_cyclic(|me| Inner {
                agent,
                runtime,
                config,
                me: me.clone(),
                active: DashMap::default(),
                workers: DashMap::default(),
                changed,
                rested,
                tracker: TaskTracker::new(),
                sinks: RwLock::new(Vec::new()),
                shutting_down: CancellationToken::new(),
                slots,
                parents: RwLock::new(Vec::new()),
                effects: Default::default(),
            }),
        };
        crate::subagents::link_parent(&executor.inner);
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
            inner: self.inner.clone(),
            cancel: CancellationToken::new(),
        }
    }

    /// Accept a user message: a new task in the message's thread (or a new thread), or the
    /// continuation of the task it names when that task waits for input. The message is
    /// persisted and queued on its thread before this returns; the thread's worker runs it
    /// when the thread is free. Blocking by default: see [`SendOptions`].
    pub async fn send_message(
        &self,
        auth: &AuthContext,
        mut message: Message,
        options: SendOptions,
    ) -> AgentResult<Task> {
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
        let tasks = self.inner.runtime.task_manager();
        let mut task = match message.task_id.clone() {
            Some(task_id) => {
                let task = tasks.get_task(auth, &task_id).await?.ok_or_else(|| {
                    AgentError::TaskNotFound {
                        task_id: task_id.clone(),
                    }
                })?;
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
                task
            }
            None => Task::new(message.thread_id.clone().unwrap_or_default()),
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
            match self
                .inner
                .agent
                .negotiator()
                .negotiate(self.inner.agent.card(), &message)
                .await?
            {
                Negotiation::Accept { skill } => {
                    if let Some(skill) = skill {
                        task.metadata.insert("skill".into(), json!(skill));
                    }
                }
                Negotiation::AskInput { question } => {
                    // The task exists and waits; the answer (a message naming it) starts it.
                    tasks.save_task(auth, &task).await?;
                    tasks
                        .add_task_event(auth, &task.id, &TaskEvent::Message { message })
                        .await?;
                    let ask = self
                        .inner
                        .record_event(auth, &task, vec![Part::text(&question)])
                        .await?;
                    task.require_input(Some(ask))?;
                    task.metadata
                        .insert("stop_reason".into(), json!("negotiation"));
                    self.inner.persist_status(auth, &task).await?;
                    return self.get_task(auth, &task.id, options.history_length).await;
                }
                Negotiation::Reject { reason } => {
                    tasks.save_task(auth, &task).await?;
                    tasks
                        .add_task_event(auth, &task.id, &TaskEvent::Message { message })
                        .await?;
                    task.update_status(TaskState::Rejected, Some(Message::agent(&reason)))?;
                    task.metadata
                        .insert("stop_reason".into(), json!("rejected"));
                    self.inner.persist_status(auth, &task).await?;
                    return self.get_task(auth, &task.id, options.history_length).await;
                }
            }
        }
        tasks.save_task(auth, &task).await?;
        tasks
            .add_task_event(auth, &task.id, &TaskEvent::Message { message })
            .await?;
        if !continuing {
            // Two agents may share a thread (dual_ai): each runs only its own tasks.
            self.inner
                .runtime
                .thread_store()
                .kv_set(
                    auth,
                    &task.thread_id,
                    &owner_key(&task.id),
                    json!(self.inner.agent.card().name),
                )
                .await?;
        }
        if continuing {
            // The answer is in: the task works again (and a blocking caller waits for the run
            // rather than finding the task still waiting for input).
            task.begin()?;
            self.inner.persist_status(auth, &task).await?;
        }
        self.inner
            .enqueue(
                auth,
                &task.thread_id,
                QueuedWork::Task {
                    task_id: task.id.clone(),
                },
            )
            .await?;

        if !options.return_immediately {
            self.inner.wait_until_resting(auth, &task.id).await?;
        }
        self.get_task(auth, &task.id, options.history_length).await
    }

    /// The task with its history (the last `history_length` messages when given).
    pub async fn get_task(
        &self,
        auth: &AuthContext,
        task_id: &TaskId,
        history_length: Option<usize>,
    ) -> AgentResult<Task> {
        load_task_with_history(
            self.inner.runtime.task_manager().as_ref(),
            auth,
            task_id,
            history_length,
        )
        .await?
        .ok_or_else(|| AgentError::TaskNotFound {
            task_id: task_id.clone(),
        })
    }

    /// Cancel a task wherever it is: queued, waiting for input, running here (stopped live),
    /// or running in another process sharing the store (which sees the request at its next
    /// checkpoint). Ends `canceled` with `reason`; a terminal task is
    /// [`AgentError::TaskNotCancelable`], an unknown one [`AgentError::TaskNotFound`].
    pub async fn cancel_task(
        &self,
        auth: &AuthContext,
        task_id: &TaskId,
        reason: Option<String>,
    ) -> AgentResult<Task> {
        let inner = &self.inner;
        let tasks = inner.runtime.task_manager();
        let task =
            tasks
                .get_task(auth, task_id)
                .await?
                .ok_or_else(|| AgentError::TaskNotFound {
                    task_id: task_id.clone(),
                })?;
        if task.state().is_terminal() {
            return Err(AgentError::TaskNotCancelable {
                task_id: task_id.clone(),
                state: task.state(),
            });
        }
        let reason = reason.unwrap_or_else(|| "canceled by request".into());
        // The durable flag reaches a run in any process at its next checkpoint.
        inner
            .runtime
            .memory_service()
            .save_serialized_with_ttl(
                auth,
                &cancel_key(task_id),
                json!(reason),
                Duration::from_secs(86_400),
            )
            .await?;
        let local = inner
            .active
            .get(&(auth.namespace(), task_id.clone()))
            .map(|a| a.clone());
        if let Some(run) = local {
            *run.reason.lock().unwrap_or_else(|p| p.into_inner()) = Some(reason);
            run.token.cancel();
        } else if task.state() != TaskState::Working {
            // Queued or waiting for input: no run holds it, so end it here. A worker that
            // picks its queue item up later skips it.
            inner.cancel_at_rest(auth, task_id, &reason).await?;
        } else if let Some(lease) = inner
            .runtime
            .thread_store()
            .acquire_lease(
                auth,
                &task.thread_id,
                &inner.config.holder,
                inner.config.lease_ttl,
            )
            .await?
        {
            // Working, but nobody holds its thread: its process died. End it here.
            let result = inner.cancel_at_rest(auth, task_id, &reason).await;
            inner
                .runtime
                .thread_store()
                .release_lease(auth, &lease)
                .await?;
            inner.schedule(auth, &task.thread_id);
            result?;
        }
        inner.wait_until_resting(auth, task_id).await?;
        let task = self.get_task(auth, task_id, None).await?;
        if task.state() != TaskState::Canceled {
            return Err(AgentError::TaskNotCancelable {
                task_id: task_id.clone(),
                state: task.state(),
            });
        }
        Ok(task)
    }

    /// Asynchronous tools: deliver a callback's result for the call `call_id`, in whichever
    /// tenant dispatched it: the call is found by its id alone and the secret, the one sent
    /// with the invocation, is the credential. An unknown call, a wrong secret, a late result
    /// (past the deadline, or the task already ended) and a second delivery are refused with a
    /// [`CallbackError`](crate::CallbackError) and change nothing; of concurrent deliveries
    /// exactly one is accepted (a compare-and-set in the store). An accepted one is recorded
    /// and its task queued on its thread, where it resumes in order.
    pub async fn deliver_tool_result(
        &self,
        call_id: &str,
        secret: &str,
        output: Value,
        is_error: bool,
    ) -> Result<crate::AcceptedCallback, crate::CallbackError> {
        use crate::async_tools::{self as at, PendingCall};
        use crate::CallbackError;
        use keel_runtime::AsyncCallState;
        let inner = &self.inner;
        let calls = inner.runtime.async_call_store();
        let Some(call) = calls.find_async_call(call_id).await? else {
            return Err(CallbackError::UnknownCall {
                call_id: call_id.to_owned(),
            });
        };
        let mut record: PendingCall = serde_json::from_value(call.record.clone()).map_err(|e| {
            AgentError::storage(format!("asynchronous call `{call_id}` is malformed: {e}"))
        })?;
        // The secret first: without it a caller learns nothing about the call's state.
        if !at::same(&at::hash_secret(secret), &record.secret_sha256) {
            return Err(CallbackError::Forbidden {
                call_id: call_id.to_owned(),
            });
        }
        let late = || CallbackError::Late {
            call_id: call_id.to_owned(),
        };
        let refusal = |state: AsyncCallState| match state {
            AsyncCallState::Delivered => CallbackError::Duplicate {
                call_id: call_id.to_owned(),
            },
            _ => late(),
        };
        if call.state != AsyncCallState::Pending {
            if call.state == AsyncCallState::Delivered {
                // A process that accepted the result may have died before it queued the
                // task; the tool's retry (same secret) queues it again. Harmless otherwise.
                inner
                    .requeue_if_waiting_for(&call.auth, &call.thread_id, &record.task_id, call_id)
                    .await?;
            }
            return Err(refusal(call.state));
        }
        if Utc::now() >= record.deadline {
            return Err(late());
        }
        let task = inner
            .runtime
            .task_manager()
            .get_task(&call.auth, &record.task_id)
            .await?;
        if task.is_none_or(|t| t.state().is_terminal()) {
            return Err(late());
        }
        record.output = Some(output);
        record.is_error = is_error;
        let moved = calls
            .transition_async_call(
                &call.auth,
                call_id,
                AsyncCallState::Pending,
                AsyncCallState::Delivered,
                serde_json::to_value(&record).map_err(AgentError::internal)?,
            )
            .await?;
        if !moved {
            // Another delivery (or the timeout) got there first; say which.
            let now = calls
                .find_async_call(call_id)
                .await?
                .map_or(AsyncCallState::Expired, |c| c.state);
            return Err(refusal(now));
        }
        inner
            .enqueue(
                &call.auth,
                &call.thread_id,
                QueuedWork::Task {
                    task_id: record.task_id.clone(),
                },
            )
            .await?;
        Ok(crate::AcceptedCallback {
            auth: call.auth,
            thread_id: call.thread_id,
            task_id: record.task_id,
        })
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
        self.inner
            .sinks
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .push(sink);
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
        let mut task =
            tasks
                .get_task(auth, task_id)
                .await?
                .ok_or_else(|| AgentError::TaskNotFound {
                    task_id: task_id.clone(),
                })?;
        let pending: ApprovalRequest = task
            .metadata
            .get(META_PENDING_APPROVAL)
            .filter(|_| task.state() == TaskState::InputRequired)
            .and_then(|v| serde_json::from_value(v.clone()).ok())
            .ok_or_else(|| {
                AgentError::invalid_input(
                    "task_id",
                    format!("task {task_id} has no action waiting for approval"),
                )
            })?;
        if pending.request_id != decision.request_id {
            return Err(AgentError::invalid_input(
                "approval_decision.request_id",
                format!(
                    "`{}` does not answer the pending request `{}`",
                    decision.request_id, pending.request_id
                ),
            ));
        }
        task.metadata.insert(
            META_APPROVAL_DECISION.into(),
            serde_json::to_value(&decision).map_err(AgentError::internal)?,
        );
        tasks.save_task(auth, &task).await?;
        self.inner
            .enqueue(
                auth,
                &task.thread_id,
                QueuedWork::Task {
                    task_id: task.id.clone(),
                },
            )
            .await?;
        // Wait for the run to pick the decision up and rest again.
        self.inner.wait_until(auth, task_id, answered).await?;
        // Answered with its history, like every task this API hands out.
        self.get_task(auth, task_id, None).await
    }

    /// Call one tool directly, with no model (a deterministic path), through the same
    /// argument validation, policy, approvals and budget as a model-chosen call. A denial is
    /// [`AgentError::ActionDenied`]; an approval nobody can give in-process is
    /// [`AgentError::ApprovalRequired`] carrying the request; a failing tool is
    /// [`AgentError::ToolFailed`]. Events go to the executor's sinks under `context`'s run.
    pub async fn call_tool_in_context(
        &self,
        auth: &AuthContext,
        thread_id: ThreadId,
        name: &str,
        arguments: Value,
        context: RunContext,
    ) -> AgentResult<Value> {
        let inner = &self.inner;
        let registered = inner.agent.tool(name).ok_or_else(|| {
            AgentError::invalid_input("tool", format!("the agent has no tool `{name}`"))
        })?;
        registered.validate(&arguments)?;
        let call = ToolCall::new(name, arguments);
        let task_id = TaskId::new();
        let sinks = inner
            .sinks
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let obs = Arc::new(RunObs::new(
            &sinks,
            &context,
            &task_id,
            &inner.agent.card().name,
            inner.agent.authorizer().clone(),
        ));
        let action = Arc::new(tool_action(registered.tool.as_ref(), &call));
        obs.emit(RunEvent::action_requested(&action)).await;
        if let Err(err) = obs.authorize(&action).await {
            if let AgentError::ActionDenied { reason, .. } = &err {
                obs.emit(RunEvent::action_denied(action.id.clone(), reason.clone()))
                    .await;
            }
            return Err(err);
        }
        obs.budget(|b| b.check_tool_call()).await?;
        registered.validate(&call.arguments)?;
        obs.emit(RunEvent::action_started(&action)).await;
        let ctx = ToolContext {
            auth: auth.clone(),
            run: context,
            task_id,
            thread_id: thread_id.clone(),
            thread: self.thread(auth, thread_id),
            cancel: CancellationToken::new(),
            runtime: inner.runtime.clone(),
            events: Some(obs.clone()),
        };
        let started = Instant::now();
        let duration_ms = || Some(started.elapsed().as_millis() as u64);
        match registered.tool.call(call.arguments.clone(), &ctx).await {
            Ok(output) => {
                obs.emit(RunEvent::action_completed(ActionCompletedPayload {
                    action_id: action.id.clone(),
                    output: output.clone(),
                    artifacts: Vec::new(),
                    duration_ms: duration_ms(),
                }))
                .await;
                Ok(output)
            }
            Err(err) => {
                obs.emit(RunEvent::action_failed(ActionFailedPayload {
                    action_id: action.id.clone(),
                    error: err.to_string(),
                    duration_ms: duration_ms(),
                }))
                .await;
                Err(AgentError::ToolFailed {
                    tool: name.to_owned(),
                    message: err.to_string(),
                })
            }
        }
    }

    /// A signal bumped whenever this process appends to a task's event log or changes a
    /// task's status, so that streams can follow tasks without polling the store. Work done
    /// by other processes sharing the store does not bump it: followers of such tasks look
    /// at the store now and then.
    pub fn task_updates(&self) -> watch::Receiver<u64> {
        self.inner.changed.subscribe()
    }

    /// Whether a run of this task is executing in this process.
    pub fn is_running(&self, auth: &AuthContext, task_id: &TaskId) -> bool {
        self.inner
            .active
            .contains_key(&(auth.namespace(), task_id.clone()))
    }

    /// Resume what a dead process left behind for this tenant: every task that is queued or
    /// working gets its thread scheduled (a working task resumes at its last persisted step),
    /// and a task whose queue entry was lost is queued again.
    pub async fn recover(&self, auth: &AuthContext) -> AgentResult<usize> {
        let tasks = self.inner.runtime.task_manager();
        let threads = self.inner.runtime.thread_store();
        let mut resumed = 0;
        for state in [TaskState::Working, TaskState::Submitted] {
            let mut filter = ListTasksFilter {
                state: Some(state),
                page_size: Some(100),
                ..Default::default()
            };
            loop {
                let page = tasks.list_tasks(auth, &filter).await?;
                for task in &page.items {
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
                    self.inner.schedule(auth, &task.thread_id);
                    resumed += 1;
                }
                match page.next_page_token {
                    Some(token) => filter.page_token = Some(token),
                    None => break,
                }
            }
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

    /// Cancel every run of this process (reason `server shutting down`), stop taking new
    /// work, and wait until each run has persisted its final state.
    pub async fn shutdown(&self) {
        self.inner.shutting_down.cancel();
        for run in self.inner.active.iter() {
            *run.reason.lock().unwrap_or_else(|p| p.into_inner()) =
                Some("server shutting down".into());
            run.token.cancel();
        }
        self.inner.tracker.close();
        self.inner.tracker.wait().await;
    }
}

/// Thread key-value key naming the agent a task was sent to.
fn owner_key(task_id: &TaskId) -> String {
    format!("keel:agent:{task_id}")
}

fn cancel_key(task_id: &TaskId) -> String {
    format!("keel:cancel:{task_id}")
}

/// Whether a caller waiting for the task's answer stops here: the task rests
/// ([`TaskRest`]), and not for an asynchronous tool, which calls back by itself. A decision
/// waiting to be applied is no rest, so an approval's caller waits for the run to take it.
fn answered(task: &Task) -> bool {
    TaskRest::of(task, 0).is_some_and(|rest| rest.answers())
}

impl Inner {
    /// Queue `task_id` again if it still rests waiting for the asynchronous call `call_id`.
    async fn requeue_if_waiting_for(
        &self,
        auth: &AuthContext,
        thread_id: &ThreadId,
        task_id: &TaskId,
        call_id: &str,
    ) -> AgentResult<()> {
        let Some(task) = self.runtime.task_manager().get_task(auth, task_id).await? else {
            return Ok(());
        };
        let waiting = task.state() == TaskState::Working
            && task.metadata.get("stop_reason") == Some(&json!("awaiting_tool"))
            && task.metadata.get("awaiting_tool_call") == Some(&json!(call_id));
        if waiting {
            self.enqueue(
                auth,
                thread_id,
                QueuedWork::Task {
                    task_id: task_id.clone(),
                },
            )
            .await?;
        }
        Ok(())
    }

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

    /// Make sure a local driver looks after the thread: wake the one that exists or start one.
    pub(crate) fn schedule(&self, auth: &AuthContext, thread_id: &ThreadId) {
        if self.shutting_down.is_cancelled() {
            return;
        }
        let Some(me) = self.me.upgrade() else { return };
        let key = (auth.namespace(), thread_id.clone());
        match self.workers.entry(key.clone()) {
            dashmap::mapref::entry::Entry::Occupied(worker) => worker.get().notify_one(),
            dashmap::mapref::entry::Entry::Vacant(slot) => {
                let notify = Arc::new(Notify::new());
                slot.insert(notify.clone());
                let (auth, thread_id) = (auth.clone(), thread_id.clone());
                let span = tracing::info_span!("thread", thread_id = %thread_id);
                self.tracker.spawn(
                    async move { me.drive_thread(auth, thread_id, key, notify).await }
                        .instrument(span),
                );
            }
        }
    }

    /// Take the thread's lease and work its queue; while another process holds the lease,
    /// look again now and then, so that work is taken over if that process dies.
    async fn drive_thread(
        self: Arc<Self>,
        auth: AuthContext,
        thread_id: ThreadId,
        key: ThreadKey,
        notify: Arc<Notify>,
    ) {
        let store = self.runtime.thread_store();
        loop {
            if self.shutting_down.is_cancelled() {
                break;
            }
            match store.queue_len(&auth, &thread_id).await {
                Ok(0) => break,
                Ok(_) => {}
                Err(err) => tracing::warn!(error = %err, "cannot read the thread queue"),
            }
            match store
                .acquire_lease(
                    &auth,
                    &thread_id,
                    &self.config.holder,
                    self.config.lease_ttl,
                )
                .await
            {
                Ok(Some(lease)) => {
                    let Ok(_permit) = self.slots.clone().acquire_owned().await else {
                        break;
                    };
                    if self.work_queue(&auth, lease).await == Worked::LeftForAnotherAgent {
                        // That agent's executor takes the thread (its driver polls for the
                        // lease); looking again here would only take the lease from it.
                        self.workers.remove(&key);
                        return;
                    }
                    continue;
                }
                Ok(None) => {}
                Err(err) => tracing::warn!(error = %err, "cannot take the thread lease"),
            }
            tokio::select! {
                () = notify.notified() => {}
                () = tokio::time::sleep(self.config.poll_interval) => {}
                () = self.shutting_down.cancelled() => break,
            }
        }
        self.workers.remove(&key);
        // Work queued between the last look and the removal must not be stranded.
        if !self.shutting_down.is_cancelled()
            && store.queue_len(&auth, &thread_id).await.unwrap_or(0) > 0
        {
            self.schedule(&auth, &thread_id);
        }
    }

    /// Holding the lease: process queued work in FIFO order until the queue is empty, or
    /// until the next item is a task of another agent sharing the thread.
    async fn work_queue(&self, auth: &AuthContext, lease: Lease) -> Worked {
        let store = self.runtime.thread_store();
        let flow = Flow {
            auth: auth.clone(),
            thread_id: lease.thread_id.clone(),
            lease: Arc::new(RwLock::new(Arc::new(lease))),
            lost: CancellationToken::new(),
        };
        let renewer = {
            let (store, auth, lease, lost) = (
                store.clone(),
                auth.clone(),
                flow.lease.clone(),
                flow.lost.clone(),
            );
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
                            tracing::warn!(error = %err, "thread lease lost; stopping the flow");
                            lost.cancel();
                            return;
                        }
                    }
                }
            })
        };
        let mut worked = Worked::Done;
        loop {
            if flow.lost.is_cancelled() || self.shutting_down.is_cancelled() {
                break;
            }
            let items = match store.peek_queue(auth, &flow.thread_id, 1).await {
                Ok(items) => items,
                Err(err) => {
                    tracing::error!(error = %err, "cannot read the thread queue");
                    break;
                }
            };
            let Some(item) = items.into_iter().next() else {
                break;
            };
            let result = match serde_json::from_value::<QueuedWork>(item.payload.clone()) {
                Err(err) => {
                    tracing::error!(error = %err, item = %item.id, "dropping malformed queued work");
                    Ok(())
                }
                Ok(QueuedWork::Task { task_id }) => {
                    if self.owned_by_another_agent(&flow, &task_id).await {
                        worked = Worked::LeftForAnotherAgent;
                        break;
                    }
                    self.run_task(&flow, &task_id).await
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
                    self.fire_effect(auth, &flow.thread_id, effect).await
                }
            };
            if let Err(err) = result {
                if matches!(err, AgentError::LeaseLost { .. }) {
                    break;
                }
                tracing::error!(error = %err, "queued work failed");
            }
            if flow.lost.is_cancelled() {
                break;
            }
            if let Err(err) = store
                .ack_queue(auth, &flow.lease(), std::slice::from_ref(&item.id))
                .await
            {
                tracing::warn!(error = %err, "cannot acknowledge queued work");
                break;
            }
        }
        renewer.abort();
        if let Err(err) = store.release_lease(auth, &flow.lease()).await {
            tracing::warn!(error = %err, "cannot release the thread lease");
        }
        worked
    }

    /// Whether the task was sent to another agent's executor on this thread (a task with no
    /// recorded owner is anyone's).
    async fn owned_by_another_agent(&self, flow: &Flow, task_id: &TaskId) -> bool {
        match self
            .runtime
            .thread_store()
            .kv_get(&flow.auth, &flow.thread_id, &owner_key(task_id))
            .await
        {
            Ok(Some(owner)) => owner.as_str() != Some(self.agent.card().name.as_str()),
            _ => false,
        }
    }

    /// Work queued while the thread was idle starts a turn of its own: a task in the thread.
    async fn start_turn(
        &self,
        flow: &Flow,
        mut message: Message,
        item_id: &str,
    ) -> AgentResult<()> {
        let tasks = self.runtime.task_manager();
        let mut task = Task::new(flow.thread_id.clone());
        // The task id derives from the queue item, so a redelivered item continues its task.
        task.id = TaskId::from(format!("queued-{item_id}"));
        if tasks.get_task(&flow.auth, &task.id).await?.is_none() {
            RunContext::ensure_task_context(&mut task)?;
            message.task_id = Some(task.id.clone());
            message.thread_id = Some(task.thread_id.clone());
            tasks.save_task(&flow.auth, &task).await?;
            tasks
                .add_task_event(&flow.auth, &task.id, &TaskEvent::Message { message })
                .await?;
        }
        self.run_task(flow, &task.id).await
    }

    /// Wait until the task rests with an answer ([`answered`]).
    async fn wait_until_resting(&self, auth: &AuthContext, task_id: &TaskId) -> AgentResult<()> {
        self.wait_until(auth, task_id, answered).await.map(|_| ())
    }

    /// Wait until the stored task satisfies `done`, and answer it. Local changes wake the
    /// waiter at once; a task run by another process is looked at every poll interval.
    async fn wait_until(
        &self,
        auth: &AuthContext,
        task_id: &TaskId,
        done: impl Fn(&Task) -> bool,
    ) -> AgentResult<Task> {
        let mut changed = self.rested.subscribe();
        loop {
            changed.borrow_and_update();
            let task = self
                .runtime
                .task_manager()
                .get_task(auth, task_id)
                .await?
                .ok_or_else(|| AgentError::TaskNotFound {
                    task_id: task_id.clone(),
                })?;
            if done(&task) {
                return Ok(task);
            }
            tokio::select! {
                _ = changed.changed() => {}
                () = tokio::time::sleep(self.config.poll_interval) => {}
            }
        }
    }

    async fn persist_status(&self, auth: &AuthContext, task: &Task) -> AgentResult<()> {
        let tasks = self.runtime.task_manager();
        tasks.save_task(auth, task).await?;
        tasks
            .add_task_event(
                auth,
                &task.id,
                &TaskEvent::StatusUpdate {
                    task_id: task.id.clone(),
                    thread_id: task.thread_id.clone(),
                    status: task.status().clone(),
                    is_final: task.state().is_terminal(),
                },
            )
            .await?;
        self.task_saved();
        Ok(())
    }

    /// Tell [`AgentExecutor::task_updates`] subscribers that a task changed. Nobody listens
    /// most of the time, and a watch wakes its (absent) waiters at a cost even then: twice a
    /// step. A subscriber arriving later sees only later changes either way.
    fn task_changed(&self) {
        if self.changed.receiver_count() > 0 {
            self.changed.send_modify(|n| *n = n.wrapping_add(1));
        }
    }

    /// Wake local waiters after a task record was saved (see `rested`), and event watchers.
    fn task_saved(&self) {
        self.rested.send_modify(|n| *n = n.wrapping_add(1));
        self.task_changed();
    }

    /// Cancel a task no run holds.
    async fn cancel_at_rest(
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
        if let Some(me) = self.me.upgrade() {
            crate::subagents::child_task_rested(&me, auth, &task).await;
        }
        self.persist_status(auth, &task).await
    }

    pub(crate) fn cancel_thread_runs(
        &self,
        auth: &AuthContext,
        thread_id: &ThreadId,
        reason: &str,
    ) {
        let namespace = auth.namespace();
        for run in self.active.iter() {
            if run.key().0 == namespace && &run.thread_id == thread_id {
                *run.reason.lock().unwrap_or_else(|p| p.into_inner()) = Some(reason.to_owned());
                run.token.cancel();
            }
        }
    }

    /// Whether the run must stop: canceled here, canceled through the store by another
    /// process, or the thread's lease lost.
    async fn stop_requested(&self, flow: &Flow, run: &ActiveRun) -> Option<Outcome> {
        if flow.lost.is_cancelled() {
            return Some(Outcome::Abandoned);
        }
        if run.token.is_cancelled() {
            return Some(Outcome::Canceled {
                reason: run_reason(run),
            });
        }
        match self
            .runtime
            .memory_service()
            .load_serialized(&flow.auth, &run.cancel_key)
            .await
        {
            Ok(Some(reason)) => {
                let reason = reason.as_str().unwrap_or("canceled by request").to_owned();
                *run.reason.lock().unwrap_or_else(|p| p.into_inner()) = Some(reason.clone());
                run.token.cancel();
                Some(Outcome::Canceled { reason })
            }
            _ => None,
        }
    }

    /// Run (or resume) one task on the thread `flow` holds.
    async fn run_task(&self, flow: &Flow, task_id: &TaskId) -> AgentResult<()> {
        let auth = &flow.auth;
        let Some(mut task) = self.runtime.task_manager().get_task(auth, task_id).await? else {
            return Ok(());
        };
        // Nothing to do for a task at rest, unless it waits for a tool (this queue item is its
        // callback or its deadline) or got the input it waited for.
        if TaskRest::of(&task, 0).is_some_and(|rest| rest.answers())
            && !self.has_unseen_input(flow, &task).await?
        {
            return Ok(());
        }
        let key = (auth.namespace(), task_id.clone());
        let run = Arc::new(ActiveRun {
            thread_id: flow.thread_id.clone(),
            token: CancellationToken::new(),
            reason: Mutex::new(None),
            cancel_key: cancel_key(task_id),
        });
        self.active.insert(key.clone(), run.clone());
        // A cancel accepted by another process arrives as a durable flag; watch for it while
        // a model or tool call is in flight, so that the call is dropped at once.
        let watcher = {
            let (memory, auth, task_id, run) = (
                self.runtime.memory_service(),
                auth.clone(),
                task_id.clone(),
                run.clone(),
            );
            let period = self.config.poll_interval;
            tokio::spawn(async move {
                while !run.token.is_cancelled() {
                    tokio::select! {
                        () = run.token.cancelled() => return,
                        () = tokio::time::sleep(period) => {}
                    }
                    if let Ok(Some(reason)) =
                        memory.load_serialized(&auth, &cancel_key(&task_id)).await
                    {
                        let reason = reason.as_str().unwrap_or("canceled by request").to_owned();
                        *run.reason.lock().unwrap_or_else(|p| p.into_inner()) = Some(reason);
                        run.token.cancel();
                    }
                }
            })
        };
        let span = tracing::info_span!("run", task_id = %task_id, agent = %self.agent.card().name);
        // Boxed: the run's state machine (step loop, tool calls, persistence) is large, and
        // inline it would make every thread worker's future that large, copied whole when
        // the worker is spawned.
        let result = Box::pin(self.run_task_inner(flow, &mut task, &run).instrument(span)).await;
        watcher.abort();
        self.active.remove(&key);
        self.task_saved();
        match result {
            Ok(()) => Ok(()),
            Err(err @ AgentError::LeaseLost { .. }) => Err(err),
            Err(err) => {
                tracing::error!(error = %err, "run failed; failing the task");
                if let Ok(Some(mut task)) =
                    self.runtime.task_manager().get_task(auth, task_id).await
                {
                    if !task.state().is_terminal() && task.fail(err.to_string()).is_ok() {
                        self.persist_status(auth, &task).await?;
                    }
                }
                Ok(())
            }
        }
    }

    /// Whether a resting task has user input that the thread history has not seen (an
    /// input-required task that got its answer).
    async fn has_unseen_input(&self, flow: &Flow, task: &Task) -> AgentResult<bool> {
        if !matches!(
            task.state(),
            TaskState::InputRequired | TaskState::AuthRequired
        ) {
            return Ok(false);
        }
        let history = self.read_history(flow).await?;
        let seen = tag_values(&history, META_MESSAGE);
        let events = self
            .runtime
            .task_manager()
            .get_task_events(&flow.auth, &task.id)
            .await?;
        let unseen = user_messages(&events).any(|m| !seen.contains(m.message_id.as_str()));
        Ok(unseen)
    }

    async fn read_history(&self, flow: &Flow) -> AgentResult<Vec<LlmMessage>> {
        Ok(self
            .runtime
            .thread_store()
            .read_history(&flow.auth, &flow.thread_id, 0, usize::MAX)
            .await?
            .into_iter()
            .map(|entry| entry.message)
            .collect())
    }

    /// Persist to the thread history under the lease, and mirror locally.
    async fn append(
        &self,
        flow: &Flow,
        history: &mut Vec<LlmMessage>,
        mut messages: Vec<LlmMessage>,
    ) -> AgentResult<()> {
        self.mark_side(&mut messages);
        self.runtime
            .thread_store()
            .append_history(&flow.auth, &flow.lease(), &messages)
            .await?;
        history.extend(messages);
        Ok(())
    }

    /// Mark the entries this agent speaks (assistant messages, tool results) with its side.
    fn mark_side(&self, messages: &mut [LlmMessage]) {
        for message in messages {
            if matches!(message.role, LlmRole::Assistant | LlmRole::Tool) {
                message
                    .metadata
                    .insert(META_SIDE.into(), json!(self.agent.card().name));
            }
        }
    }

    async fn record_event(
        &self,
        auth: &AuthContext,
        task: &Task,
        parts: Vec<Part>,
    ) -> AgentResult<Message> {
        let mut message = Message::new(Role::Agent, parts);
        message.task_id = Some(task.id.clone());
        message.thread_id = Some(task.thread_id.clone());
        self.runtime
            .task_manager()
            .add_task_event(
                auth,
                &task.id,
                &TaskEvent::Message {
                    message: message.clone(),
                },
            )
            .await?;
        self.task_changed();
        Ok(message)
    }

    async fn run_task_inner(
        &self,
        flow: &Flow,
        task: &mut Task,
        run: &ActiveRun,
    ) -> AgentResult<()> {
        let auth = &flow.auth;
        let thread = ThreadState {
            auth: auth.clone(),
            thread_id: flow.thread_id.clone(),
            inner: self
                .me
                .upgrade()
                .ok_or_else(|| AgentError::internal("executor dropped"))?,
            cancel: run.token.clone(),
        };
        // A task whose thread was terminated after it was queued never starts.
        if thread.is_terminated().await? {
            mark_canceled(task, "thread terminated")?;
            return self.persist_status(auth, task).await;
        }
        let run_context = RunContext::ensure_task_context(task)?;
        let sinks = self.sinks.read().unwrap_or_else(|p| p.into_inner()).clone();
        let obs = Arc::new(RunObs::new(
            &sinks,
            &run_context,
            &task.id,
            &self.agent.card().name,
            self.agent.authorizer().clone(),
        ));
        if let Some(outcome) = self.stop_requested(flow, run).await {
            return self.finish(flow, &obs, task, outcome).await;
        }
        if task.state() != TaskState::Working {
            task.begin()?;
            self.persist_status(auth, task).await?;
            // The whole task rides on the final status only (the payload's contract).
            obs.emit(RunEvent::task_state_of(task)).await;
        }
        let ctx = ToolContext {
            auth: auth.clone(),
            run: run_context.clone(),
            task_id: task.id.clone(),
            thread_id: task.thread_id.clone(),
            thread,
            cancel: run.token.clone(),
            runtime: self.runtime.clone(),
            events: Some(obs.clone()),
        };
        let scope = Scope {
            flow,
            ctx: &ctx,
            run,
            obs: &obs,
        };

        // The task's user messages join the thread history once each (a resumed run finds
        // them there already).
        let mut history = self.read_history(flow).await?;
        let seen = tag_values(&history, META_MESSAGE);
        let events = self
            .runtime
            .task_manager()
            .get_task_events(auth, &task.id)
            .await?;
        let mut new_input = Vec::new();
        for message in user_messages(&events) {
            if !seen.contains(message.message_id.as_str()) {
                let mut entry = user_entry(message);
                tag(&mut entry, &task.id);
                entry
                    .metadata
                    .insert(META_MESSAGE.into(), json!(message.message_id.as_str()));
                new_input.push(entry);
            }
        }
        let direct = direct_tool_calls(user_messages(&events).last());
        if !new_input.is_empty() {
            self.append(flow, &mut history, new_input).await?;
        }
        if let Some(max_turns) = self.agent.stop_rules().max_session_turns {
            let turns = history
                .iter()
                .filter(|m| m.role == LlmRole::User && m.metadata.contains_key(META_MESSAGE))
                .count() as u64;
            if turns > u64::from(max_turns) {
                let error = AgentError::BudgetExceeded {
                    limit: "max_session_turns".into(),
                    used: turns,
                    max: u64::from(max_turns),
                };
                return self
                    .finish(
                        flow,
                        &obs,
                        task,
                        Outcome::Failed {
                            error,
                            reason: "max_session_turns".into(),
                        },
                    )
                    .await;
            }
        }

        // Subagents: `immediate` kinds are queued to run before the thread's first model step.
        if direct.is_none() {
            crate::subagents::activate_immediate(&self.agent, &ctx, &history).await?;
        }
        let outcome = match direct {
            Some(calls) => self.run_direct(&scope, task, calls, &mut history).await?,
            None => match self
                .resume_interrupted_calls(&scope, task, &mut history)
                .await?
            {
                Some(outcome) => outcome,
                None => self.step_loop(&scope, task, &mut history).await?,
            },
        };
        self.finish(flow, &obs, task, outcome).await
    }

    /// After a crash or an approval: tool calls of this task with no persisted result. A
    /// call waiting for an approval runs (or is refused) as decided; otherwise it is re-run
    /// when the tool is idempotent and answered with an "interrupted" error when not.
    async fn resume_interrupted_calls(
        &self,
        scope: &Scope<'_>,
        task: &mut Task,
        history: &mut Vec<LlmMessage>,
    ) -> AgentResult<Option<Outcome>> {
        let answered: HashSet<String> = history
            .iter()
            .filter_map(|m| m.tool_call_id.clone())
            .collect();
        // Calls run in order and each persists its result before the next starts, so only the
        // first unanswered call of a step can have started; the later ones never ran.
        let dangling: Vec<(ToolCall, bool)> = history
            .iter()
            .filter(|m| m.role == LlmRole::Assistant && is_tagged(m, &task.id))
            .flat_map(|m| {
                m.tool_calls
                    .iter()
                    .filter(|c| !answered.contains(&c.id))
                    .enumerate()
                    .map(|(i, c)| (c.clone(), i == 0))
                    .collect::<Vec<_>>()
            })
            .collect();
        let pending: Option<ApprovalRequest> = task
            .metadata
            .get(META_PENDING_APPROVAL)
            .and_then(|v| serde_json::from_value(v.clone()).ok());
        let decision: Option<ApprovalDecision> = task
            .metadata
            .get(META_APPROVAL_DECISION)
            .and_then(|v| serde_json::from_value(v.clone()).ok());
        for (call, may_have_started) in dangling {
            let awaited = pending.as_ref().filter(|p| {
                p.action.metadata.get("call_id").and_then(Value::as_str) == Some(call.id.as_str())
            });
            // Asynchronous tools: a call still waiting, answered by callback, or timed out.
            let asynchronous = self.async_result(scope, &call).await?;
            let result = match (awaited, &decision) {
                _ if asynchronous.is_some() => asynchronous.unwrap_or(ToolRun::Pending {
                    call_id: call.id.clone(),
                }),
                (Some(request), Some(decision)) if decision.request_id == request.request_id => {
                    scope
                        .obs
                        .emit(RunEvent::approval_decided(request, decision))
                        .await;
                    if decision.outcome == ApprovalOutcome::Approved {
                        self.call_tool(scope, &call, true).await
                    } else {
                        let reason = decision
                            .reason
                            .clone()
                            .unwrap_or_else(|| "denied by the approver".into());
                        scope
                            .obs
                            .emit(RunEvent::action_denied(
                                request.action.id.clone(),
                                reason.clone(),
                            ))
                            .await;
                        ToolRun::Done {
                            output: json!(format!("denied: {reason}")),
                            is_error: true,
                        }
                    }
                }
                (Some(request), _) => {
                    return Ok(Some(Outcome::AwaitingApproval {
                        request: Box::new(request.clone()),
                    }))
                }
                (None, _)
                    if !may_have_started
                        || self
                            .agent
                            .tool(&call.name)
                            .is_some_and(|t| t.tool.idempotent()) =>
                {
                    self.call_tool(scope, &call, false).await
                }
                (None, _) => ToolRun::Done {
                    output: json!(format!(
                        "tool call `{}` was interrupted by a restart and not run again",
                        call.name
                    )),
                    is_error: true,
                },
            };
            match result {
                ToolRun::Done { output, is_error } => {
                    self.persist_tool_result(scope.flow, task, &call, output, is_error, history)
                        .await?;
                }
                ToolRun::Canceled => {
                    return Ok(Some(Outcome::Canceled {
                        reason: run_reason(scope.run),
                    }))
                }
                ToolRun::Approval(request) => {
                    return Ok(Some(Outcome::AwaitingApproval { request }))
                }
                ToolRun::Stop(error) => return Ok(Some(budget_failure(error))),
                ToolRun::Pending { call_id } => return Ok(Some(Outcome::AwaitingTool { call_id })),
            }
        }
        if task.metadata.remove(META_PENDING_APPROVAL).is_some()
            | task.metadata.remove(META_APPROVAL_DECISION).is_some()
        {
            self.runtime
                .task_manager()
                .save_task(&scope.flow.auth, task)
                .await?;
            self.task_saved();
        }
        Ok(None)
    }

    // ---- Asynchronous tools (seed 004): dispatch, callback results, timeouts. ----

    /// Dispatch an asynchronous call: persist the pending call and its link from the model's
    /// tool call (before the tool can call back), send the invocation, and arm a local timer
    /// for the deadline.
    async fn dispatch_async(
        &self,
        scope: &Scope<'_>,
        call: &ToolCall,
        dispatch: &dyn crate::AsyncDispatch,
    ) -> ToolRun {
        use crate::async_tools::{self as at, PendingCall};
        use keel_runtime::{AsyncCall, AsyncCallState};
        let failed = |message: String| ToolRun::Done {
            output: json!(message),
            is_error: true,
        };
        let Some(base) = self.config.callback_base_url.as_deref() else {
            return failed(format!(
                "`{}` is asynchronous but no callback URL is configured",
                call.name
            ));
        };
        let (auth, ctx) = (&scope.flow.auth, scope.ctx);
        let secret = at::new_secret();
        let call_id = at::new_call_id();
        let timeout = dispatch.timeout().unwrap_or(self.config.async_tool_timeout);
        // A timeout too long to represent never ends (rather than overflowing the clock).
        let deadline = chrono::Duration::from_std(timeout)
            .ok()
            .and_then(|t| Utc::now().checked_add_signed(t))
            .unwrap_or(chrono::DateTime::<Utc>::MAX_UTC);
        let record = PendingCall {
            task_id: ctx.task_id.clone(),
            tool_call_id: call.id.clone(),
            tool: call.name.clone(),
            secret_sha256: at::hash_secret(&secret),
            deadline,
            output: None,
            is_error: false,
        };
        let calls = self.runtime.async_call_store();
        let store = self.runtime.thread_store();
        let persisted = async {
            let pending = AsyncCall {
                call_id: call_id.clone(),
                auth: auth.clone(),
                thread_id: ctx.thread_id.clone(),
                state: AsyncCallState::Pending,
                record: serde_json::to_value(&record).map_err(AgentError::internal)?,
            };
            calls.put_async_call(&pending).await?;
            store
                .kv_set(
                    auth,
                    &ctx.thread_id,
                    &at::link_key(&call.id),
                    json!({ "call_id": call_id }),
                )
                .await
        }
        .await;
        if let Err(err) = persisted {
            return failed(format!("cannot record the pending call: {err}"));
        }
        let invocation = crate::AsyncInvocation {
            tool: call.name.clone(),
            call_id: call_id.clone(),
            arguments: call.arguments.clone(),
            callback_url: format!("{}/callbacks/{}", base.trim_end_matches('/'), call_id),
            callback_secret: secret,
            group_id: ctx.thread_id.as_str().to_owned(),
            user_id: Some(auth.user_name.clone()),
        };
        scope
            .obs
            .emit(
                RunEvent::builder(
                    EventType::new("tool.async.dispatched"),
                    format!("asynchronous tool `{}` dispatched", call.name),
                )
                .payload(json!({
                    "call_id": call_id,
                    "tool_call_id": call.id,
                    "tool": call.name,
                    "deadline": deadline,
                })),
            )
            .await;
        if let Err(err) = dispatch.dispatch(&invocation).await {
            // Not acknowledged: the call is over (a callback for it is late) and the model
            // sees the failure now.
            let _ = calls
                .transition_async_call(
                    auth,
                    &call_id,
                    AsyncCallState::Pending,
                    AsyncCallState::Expired,
                    serde_json::to_value(&record).unwrap_or(Value::Null),
                )
                .await;
            let _ = store
                .kv_set(auth, &ctx.thread_id, &at::link_key(&call.id), Value::Null)
                .await;
            return failed(err.to_string());
        }
        scope
            .obs
            .emit(
                RunEvent::builder(
                    EventType::new("tool.async.acknowledged"),
                    format!("asynchronous tool `{}` acknowledged", call.name),
                )
                .payload(json!({"call_id": call_id, "tool_call_id": call.id, "tool": call.name})),
            )
            .await;
        self.arm_deadline(auth, &ctx.thread_id, &ctx.task_id, deadline);
        ToolRun::Pending { call_id }
    }

    /// Best effort in this process: at `deadline` the task runs again and a call still pending
    /// ends as a timeout. Armed at dispatch and again whenever a run finds the call still
    /// pending (so a process that starts after the dispatching one exited times it out too);
    /// any later run of the task sees the deadline as well.
    fn arm_deadline(
        &self,
        auth: &AuthContext,
        thread_id: &ThreadId,
        task_id: &TaskId,
        deadline: chrono::DateTime<Utc>,
    ) {
        let Some(me) = self.me.upgrade() else {
            return;
        };
        let wait = (deadline - Utc::now()).to_std().unwrap_or_default();
        let (auth, thread_id, task_id) = (auth.clone(), thread_id.clone(), task_id.clone());
        let stop = self.shutting_down.clone();
        self.tracker.spawn(async move {
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                () = stop.cancelled() => return,
            }
            let _ = me
                .enqueue(&auth, &thread_id, QueuedWork::Task { task_id })
                .await;
        });
    }

    /// The state of an asynchronous call on resume: `None` when it is not one; `Pending`
    /// while it waits; its result when delivered (event `tool.async.result`); a timeout error
    /// past its deadline (event `tool.async.timed_out`).
    async fn async_result(
        &self,
        scope: &Scope<'_>,
        call: &ToolCall,
    ) -> AgentResult<Option<ToolRun>> {
        use crate::async_tools::{self as at, PendingCall};
        use keel_runtime::AsyncCallState;
        let flow = scope.flow;
        let link = self
            .runtime
            .thread_store()
            .kv_get(&flow.auth, &flow.thread_id, &at::link_key(&call.id))
            .await?;
        let Some(call_id) = link
            .as_ref()
            .and_then(|v| v.get("call_id"))
            .and_then(Value::as_str)
        else {
            return Ok(None);
        };
        let calls = self.runtime.async_call_store();
        let Some(mut pending) = calls.find_async_call(call_id).await? else {
            return Ok(None);
        };
        let record: PendingCall = serde_json::from_value(pending.record.clone()).map_err(|e| {
            AgentError::storage(format!("asynchronous call `{call_id}` is malformed: {e}"))
        })?;
        if pending.state == AsyncCallState::Pending && Utc::now() >= record.deadline {
            // Expire with the same compare-and-set a delivery uses: if a result won the race,
            // it is the one the model sees.
            let expired = calls
                .transition_async_call(
                    &flow.auth,
                    call_id,
                    AsyncCallState::Pending,
                    AsyncCallState::Expired,
                    pending.record.clone(),
                )
                .await?;
            if !expired {
                pending = calls.find_async_call(call_id).await?.ok_or_else(|| {
                    AgentError::storage(format!("asynchronous call `{call_id}` vanished"))
                })?;
            } else {
                pending.state = AsyncCallState::Expired;
            }
        }
        let run = match pending.state {
            AsyncCallState::Pending => {
                self.arm_deadline(
                    &flow.auth,
                    &flow.thread_id,
                    &record.task_id,
                    record.deadline,
                );
                ToolRun::Pending {
                    call_id: call_id.to_owned(),
                }
            }
            AsyncCallState::Delivered => {
                let delivered: PendingCall = serde_json::from_value(pending.record.clone())
                    .map_err(|e| {
                        AgentError::storage(format!(
                            "asynchronous call `{call_id}` is malformed: {e}"
                        ))
                    })?;
                scope
                    .obs
                    .emit(
                        RunEvent::builder(
                            EventType::new("tool.async.result"),
                            format!("asynchronous tool `{}` called back", call.name),
                        )
                        .payload(json!({
                            "call_id": call_id,
                            "tool_call_id": call.id,
                            "tool": call.name,
                            "is_error": delivered.is_error,
                        })),
                    )
                    .await;
                ToolRun::Done {
                    output: delivered.output.unwrap_or(Value::Null),
                    is_error: delivered.is_error,
                }
            }
            AsyncCallState::Expired => {
                scope
                    .obs
                    .emit(
                        RunEvent::builder(
                            EventType::new("tool.async.timed_out"),
                            format!("asynchronous tool `{}` timed out", call.name),
                        )
                        .payload(json!({
                            "call_id": call_id,
                            "tool_call_id": call.id,
                            "tool": call.name,
                            "deadline": record.deadline,
                        })),
                    )
                    .await;
                ToolRun::Done {
                    output: json!(format!(
                        "asynchronous tool `{}` timed out: no result arrived by {}",
                        call.name, record.deadline
                    )),
                    is_error: true,
                }
            }
        };
        Ok(Some(run))
    }

    async fn persist_tool_result(
        &self,
        flow: &Flow,
        task: &Task,
        call: &ToolCall,
        output: Value,
        is_error: bool,
        history: &mut Vec<LlmMessage>,
    ) -> AgentResult<()> {
        let mut result = LlmMessage::tool_result(call, render(&output));
        tag(&mut result, &task.id);
        if is_error {
            result.metadata.insert("keel.is_error".into(), json!(true));
        }
        let part = Part::tool_output(&call.id, &call.name, output, is_error);
        self.persist_point(flow, history, vec![result], task, vec![part])
            .await
    }

    /// One persist point of a step: history entries under the lease and the matching agent
    /// message in the task's log, in one round trip when the runtime has a step store.
    async fn persist_point(
        &self,
        flow: &Flow,
        history: &mut Vec<LlmMessage>,
        mut messages: Vec<LlmMessage>,
        task: &Task,
        parts: Vec<Part>,
    ) -> AgentResult<()> {
        self.mark_side(&mut messages);
        let mut message = Message::new(Role::Agent, parts);
        message.task_id = Some(task.id.clone());
        message.thread_id = Some(task.thread_id.clone());
        let event = TaskEvent::Message { message };
        match self.runtime.step_store() {
            Some(steps) => {
                steps
                    .persist_step(
                        &flow.auth,
                        &flow.lease(),
                        &messages,
                        &task.id,
                        std::slice::from_ref(&event),
                    )
                    .await?
            }
            None => {
                self.runtime
                    .thread_store()
                    .append_history(&flow.auth, &flow.lease(), &messages)
                    .await?;
                self.runtime
                    .task_manager()
                    .add_task_event(&flow.auth, &task.id, &event)
                    .await?;
            }
        }
        history.extend(messages);
        self.task_changed();
        Ok(())
    }

    /// Queued messages and tools are injected before the next model call (§9).
    async fn inject_queued(
        &self,
        scope: &Scope<'_>,
        task: &Task,
        history: &mut Vec<LlmMessage>,
    ) -> AgentResult<Option<Outcome>> {
        let flow = scope.flow;
        let store = self.runtime.thread_store();
        let mut items = store.peek_queue(&flow.auth, &flow.thread_id, 64).await?;
        // Effects run first; what they queue is injected in this same pass.
        if self
            .fire_queued_effects(&flow.auth, &flow.lease(), &items)
            .await?
        {
            items = store.peek_queue(&flow.auth, &flow.thread_id, 64).await?;
        }
        // The items already in the history, worked out only when some item is not the run's
        // own: at most steps there is none, and the history only grows.
        let mut seen: Option<HashSet<String>> = None;
        let mut injected = Vec::new();
        let mut outcome = None;
        for item in items {
            // The run's own queue item (its task) heads the queue at every step: judged by
            // its kind, it need not be decoded.
            if matches!(
                item.payload.get("kind").and_then(Value::as_str),
                Some("task" | "effect")
            ) {
                continue;
            }
            let Ok(work) = QueuedWork::deserialize(&item.payload) else {
                continue;
            };
            if matches!(work, QueuedWork::Task { .. } | QueuedWork::Effect(_)) {
                continue;
            }
            let seen = seen.get_or_insert_with(|| tag_values(history, META_QUEUE_ITEM));
            if !seen.contains(&item.id) {
                match work {
                    QueuedWork::Task { .. } | QueuedWork::Effect(_) => continue,
                    QueuedWork::Message { message } => {
                        let mut entry = user_entry(&message);
                        tag(&mut entry, &task.id);
                        entry
                            .metadata
                            .insert(META_QUEUE_ITEM.into(), json!(item.id));
                        self.append(flow, history, vec![entry]).await?;
                        let mut shown = message;
                        shown.task_id = Some(task.id.clone());
                        shown.thread_id = Some(task.thread_id.clone());
                        self.runtime
                            .task_manager()
                            .add_task_event(
                                &flow.auth,
                                &task.id,
                                &TaskEvent::Message { message: shown },
                            )
                            .await?;
                    }
                    QueuedWork::Tool { call } => {
                        let mut request = LlmMessage::assistant("", vec![call.clone()]);
                        tag(&mut request, &task.id);
                        request
                            .metadata
                            .insert(META_QUEUE_ITEM.into(), json!(item.id));
                        self.append(flow, history, vec![request]).await?;
                        match self.call_tool(scope, &call, false).await {
                            ToolRun::Done { output, is_error } => {
                                self.persist_tool_result(
                                    flow, task, &call, output, is_error, history,
                                )
                                .await?;
                            }
                            ToolRun::Canceled => {
                                outcome = Some(Outcome::Canceled {
                                    reason: run_reason(scope.run),
                                })
                            }
                            ToolRun::Approval(request) => {
                                outcome = Some(Outcome::AwaitingApproval { request })
                            }
                            ToolRun::Stop(error) => outcome = Some(budget_failure(error)),
                            ToolRun::Pending { call_id } => {
                                outcome = Some(Outcome::AwaitingTool { call_id })
                            }
                        }
                    }
                }
            }
            injected.push(item.id);
            if outcome.is_some() {
                break;
            }
        }
        if !injected.is_empty() {
            tracing::debug!(count = injected.len(), "queued work injected");
            scope
                .obs
                .emit(
                    RunEvent::builder(
                        EventType::new("queue.injected"),
                        format!("{} queued item(s) injected", injected.len()),
                    )
                    .payload(json!({ "items": injected })),
                )
                .await;
            store
                .ack_queue(&flow.auth, &flow.lease(), &injected)
                .await?;
        }
        Ok(outcome)
    }

    async fn system_prompt(&self, ctx: &ToolContext) -> String {
        let mut prompt = self.agent.instructions().to_owned();
        if !prompt.contains("{{") {
            return prompt;
        }
        let builtins = [
            ("agent_name", self.agent.card().name.clone()),
            ("thread_id", ctx.thread_id.to_string()),
            ("task_id", ctx.task_id.to_string()),
            ("date", Utc::now().format("%Y-%m-%d").to_string()),
        ];
        for (name, value) in builtins {
            prompt = prompt.replace(&format!("{{{{{name}}}}}"), &value);
        }
        // Remaining placeholders come from the thread's key-value store.
        let mut rest = prompt.clone();
        while let Some(start) = rest.find("{{") {
            let Some(len) = rest[start + 2..].find("}}") else {
                break;
            };
            let name = rest[start + 2..start + 2 + len].trim().to_owned();
            if let Ok(Some(value)) = ctx.thread.get_value(&name).await {
                prompt = prompt.replace(&format!("{{{{{name}}}}}"), &render(&value));
            }
            rest = rest[start + 2 + len + 2..].to_owned();
        }
        prompt
    }

    async fn step_loop(
        &self,
        scope: &Scope<'_>,
        task: &Task,
        history: &mut Vec<LlmMessage>,
    ) -> AgentResult<Outcome> {
        let (flow, ctx, run, obs) = (scope.flow, scope.ctx, scope.run, scope.obs);
        let llm = self
            .agent
            .llm()
            .cloned()
            .unwrap_or_else(|| self.runtime.default_llm());
        let profile = llm.profile();
        let tools = Arc::new(self.agent.tool_specs());
        let rules = self.agent.stop_rules().clone();
        let mut invalid_calls: HashMap<String, u32> = HashMap::new();
        // The model's view of the thread and its token estimates, carried from one step to
        // the next so a step works on what it adds (decision 82).
        let mut view = ModelView::default();
        let mut estimates = ManifestEstimates::default();
        // A resumed run continues counting from the steps already in the history.
        let done = history
            .iter()
            .filter(|m| m.role == LlmRole::Assistant && is_tagged(m, &task.id))
            .count() as u32;
        for step in done + 1..=rules.max_steps {
            if let Some(outcome) = self.stop_requested(flow, run).await {
                return Ok(outcome);
            }
            if let Err(error) = obs.budget(|b| b.check_step()).await {
                return Ok(budget_failure(error));
            }
            if let Some(outcome) = self.inject_queued(scope, task, history).await? {
                return Ok(outcome);
            }
            obs.emit(
                RunEvent::builder(EventType::new("queue.drained"), "queue drained").step(step),
            )
            .await;
            let system = self.system_prompt(ctx).await;
            let messages = view
                .messages(
                    system,
                    history,
                    &self.agent.card().name,
                    profile.supports_vision,
                    &ctx.thread,
                )
                .await;
            let request = LlmRequest::new(messages).with_tools(tools.clone());
            // Shared with its `context.prepared` event rather than copied for it.
            let manifest = Arc::new(prepare_manifest_reusing(
                &request,
                &profile,
                ManifestIds::from_run_context(&ctx.run, Some(&self.agent.card().name)),
                &mut estimates,
            ));
            obs.emit(RunEvent::context_prepared(&manifest).step(step))
                .await;
            if let Err(error) = obs.budget(|b| b.check_llm_call(&manifest)).await {
                return Ok(budget_failure(error));
            }
            obs.emit(
                RunEvent::llm_call_started(LlmCallStartedPayload {
                    provider: Some(profile.provider.clone()),
                    model: Some(llm.model_name().to_owned()),
                    estimated_input_tokens: manifest.total_estimated_tokens,
                })
                .step(step),
            )
            .await;
            let called = Instant::now();
            // The model answers as a stream: text deltas become `llm.stream` events as they
            // arrive; the final response closes it.
            let streamed = async {
                let mut events = llm.stream(request);
                while let Some(event) = events.next().await {
                    match event? {
                        LlmStreamEvent::TextDelta { text } => {
                            obs.emit(RunEvent::llm_stream(text).step(step)).await
                        }
                        LlmStreamEvent::Done { response } => return Ok(response),
                        _ => {}
                    }
                }
                Err(AgentError::llm(
                    llm.model_name(),
                    "the response stream ended without a final response",
                ))
            };
            let response = tokio::select! {
                biased;
                () = run.token.cancelled() => return Ok(Outcome::Canceled { reason: run_reason(run) }),
                () = flow.lost.cancelled() => return Ok(Outcome::Abandoned),
                response = streamed.instrument(tracing::info_span!("step", step)) => response,
            };
            let response = match response {
                Ok(response) => response,
                Err(error) => {
                    return Ok(Outcome::Failed {
                        error,
                        reason: "model_error".into(),
                    })
                }
            };
            obs.record_llm_usage(response.usage.input_tokens, response.usage.output_tokens);
            obs.emit(
                RunEvent::llm_call_completed(LlmCallCompletedPayload {
                    provider: Some(profile.provider.clone()),
                    model: Some(llm.model_name().to_owned()),
                    input_tokens: response.usage.input_tokens,
                    output_tokens: response.usage.output_tokens,
                    latency_ms: Some(called.elapsed().as_millis() as u64),
                    finish_reason: None,
                })
                .step(step),
            )
            .await;
            if let Some(outcome) = self.stop_requested(flow, run).await {
                return Ok(outcome);
            }
            // Persist the assistant response before anything runs.
            let content = response.content.clone().unwrap_or_default();
            let mut assistant = LlmMessage::assistant(content.clone(), response.tool_calls.clone());
            tag(&mut assistant, &task.id);
            let mut parts: Vec<Part> = if content.is_empty() {
                Vec::new()
            } else {
                vec![Part::text(&content)]
            };
            parts.extend(
                response
                    .tool_calls
                    .iter()
                    .map(|c| Part::tool_call(&c.id, &c.name, c.arguments.clone())),
            );
            if parts.is_empty() {
                self.append(flow, history, vec![assistant]).await?;
            } else {
                self.persist_point(flow, history, vec![assistant], task, parts)
                    .await?;
            }
            obs.emit(
                RunEvent::builder(
                    EventType::new("message.persisted"),
                    "assistant message persisted",
                )
                .payload_from(MessagePersisted {
                    role: "assistant",
                    tool_calls: response.tool_calls.len(),
                })
                .step(step),
            )
            .await;
            if let Err(error) = obs.budget(|b| b.check_output_tokens()).await {
                return Ok(budget_failure(error));
            }
            if response.tool_calls.is_empty() {
                let stop = rules.stop_on_response;
                stop_evaluated(obs, step, stop.then_some("response")).await;
                if stop {
                    return Ok(Outcome::Answer {
                        text: content,
                        reason: "response",
                        recorded: true,
                    });
                }
                continue;
            }

            let mut lifecycle: Option<Outcome> = None;
            let mut stop_tool_output: Option<String> = None;
            let mut handoff: Option<String> = None;
            let mut repeated_invalid: Option<String> = None;
            for call in &response.tool_calls {
                if let Some(outcome) = self.stop_requested(flow, run).await {
                    return Ok(outcome);
                }
                let (output, is_error) = match call.name.as_str() {
                    SESSION_STOP_TOOL if rules.lifecycle_tools => {
                        let result = call.arguments.get("result").map(render).unwrap_or_default();
                        lifecycle.get_or_insert(Outcome::Answer {
                            text: result,
                            reason: "session_stop",
                            recorded: false,
                        });
                        (json!("the task will end as completed"), false)
                    }
                    SESSION_FAIL_TOOL if rules.lifecycle_tools => {
                        let error = call
                            .arguments
                            .get("error")
                            .map(render)
                            .unwrap_or_else(|| "the agent gave up".into());
                        lifecycle.get_or_insert(Outcome::Failed {
                            error: AgentError::ToolFailed {
                                tool: SESSION_FAIL_TOOL.into(),
                                message: error,
                            },
                            reason: "session_fail".into(),
                        });
                        (json!("the task will end as failed"), false)
                    }
                    ASK_HUMAN_TOOL if self.agent.human_handoff() => {
                        let question = call
                            .arguments
                            .get("question")
                            .map(render)
                            .unwrap_or_default();
                        handoff.get_or_insert(question);
                        (json!("the question was sent to the human; their answer follows as a user message"), false)
                    }
                    _ => match self.call_tool(scope, call, false).await {
                        ToolRun::Done { output, is_error } => (output, is_error),
                        ToolRun::Canceled => {
                            return Ok(Outcome::Canceled {
                                reason: run_reason(run),
                            })
                        }
                        // The call stays unanswered in the history until the decision arrives.
                        ToolRun::Approval(request) => {
                            return Ok(Outcome::AwaitingApproval { request })
                        }
                        ToolRun::Stop(error) => return Ok(budget_failure(error)),
                        ToolRun::Pending { call_id } => {
                            return Ok(Outcome::AwaitingTool { call_id })
                        }
                    },
                };
                if is_error
                    && output
                        .as_str()
                        .is_some_and(|o| o.starts_with("invalid arguments"))
                {
                    let count = invalid_calls
                        .entry(format!("{}:{}", call.name, call.arguments))
                        .or_default();
                    *count += 1;
                    if *count > rules.max_invalid_repeats {
                        repeated_invalid.get_or_insert_with(|| call.name.clone());
                    }
                }
                if !is_error && rules.stop_tool.as_deref() == Some(call.name.as_str()) {
                    stop_tool_output.get_or_insert_with(|| render(&output));
                }
                self.persist_tool_result(flow, task, call, output, is_error, history)
                    .await?;
                obs.emit(
                    RunEvent::builder(
                        EventType::new("tool_result.persisted"),
                        "tool result persisted",
                    )
                    .payload_from(ToolResultPersisted {
                        call_id: call.id.clone(),
                        is_error,
                        tool: call.name.clone(),
                    })
                    .step(step),
                )
                .await;
            }
            // Stop rules, in the seed's order.
            let fired = if lifecycle.is_some() {
                Some("lifecycle_tool")
            } else if stop_tool_output.is_some() {
                Some("stop_tool")
            } else if repeated_invalid.is_some() {
                Some("invalid_tool_repeats")
            } else if handoff.is_some() {
                Some("input_required")
            } else {
                None
            };
            stop_evaluated(obs, step, fired).await;
            if let Some(outcome) = lifecycle {
                return Ok(outcome);
            }
            if let Some(text) = stop_tool_output {
                return Ok(Outcome::Answer {
                    text,
                    reason: "stop_tool",
                    recorded: false,
                });
            }
            if let Some(tool) = repeated_invalid {
                let error = AgentError::ToolFailed {
                    tool,
                    message: format!(
                        "the model repeated the same invalid call more than {} times",
                        rules.max_invalid_repeats
                    ),
                };
                return Ok(Outcome::Failed {
                    error,
                    reason: "invalid_tool_repeats".into(),
                });
            }
            if let Some(question) = handoff {
                return Ok(Outcome::InputRequired { question });
            }
        }
        let error = AgentError::BudgetExceeded {
            limit: "max_steps".into(),
            used: u64::from(rules.max_steps),
            max: u64::from(rules.max_steps),
        };
        Ok(Outcome::Failed {
            error,
            reason: "max_steps".into(),
        })
    }

    /// Decision 6: a message made only of tool calls runs them with no model, and the task
    /// fails when one fails.
    async fn run_direct(
        &self,
        scope: &Scope<'_>,
        task: &Task,
        calls: Vec<ToolCall>,
        history: &mut Vec<LlmMessage>,
    ) -> AgentResult<Outcome> {
        let flow = scope.flow;
        let answered: HashSet<String> = history
            .iter()
            .filter_map(|m| m.tool_call_id.clone())
            .collect();
        let mut outputs = Vec::new();
        for call in &calls {
            if answered.contains(&call.id) {
                continue;
            }
            if let Some(outcome) = self.stop_requested(flow, scope.run).await {
                return Ok(outcome);
            }
            let mut request = LlmMessage::assistant("", vec![call.clone()]);
            tag(&mut request, &task.id);
            self.append(flow, history, vec![request]).await?;
            let (output, is_error) = match self.call_tool(scope, call, false).await {
                ToolRun::Done { output, is_error } => (output, is_error),
                ToolRun::Canceled => {
                    return Ok(Outcome::Canceled {
                        reason: run_reason(scope.run),
                    })
                }
                ToolRun::Approval(request) => return Ok(Outcome::AwaitingApproval { request }),
                ToolRun::Stop(error) => return Ok(budget_failure(error)),
                ToolRun::Pending { call_id } => return Ok(Outcome::AwaitingTool { call_id }),
            };
            self.persist_tool_result(flow, task, call, output.clone(), is_error, history)
                .await?;
            if is_error {
                let error = AgentError::ToolFailed {
                    tool: call.name.clone(),
                    message: render(&output),
                };
                return Ok(Outcome::Failed {
                    error,
                    reason: "tool_failed".into(),
                });
            }
            outputs.push(render(&output));
        }
        Ok(Outcome::Answer {
            text: outputs.join("\n"),
            reason: "direct_tool_calls",
            recorded: false,
        })
    }

    /// Prepare, judge and run one tool call. Arguments are checked before the action is
    /// prepared and again right before the tool runs; unknown tools, invalid arguments,
    /// denials, failures and panics all become error outputs the model sees.
    async fn call_tool(&self, scope: &Scope<'_>, call: &ToolCall, preapproved: bool) -> ToolRun {
        let (ctx, run, obs) = (scope.ctx, scope.run, scope.obs);
        let Some(registered) = self.agent.tool(&call.name) else {
            return ToolRun::Done {
                output: json!(format!("unknown tool `{}`", call.name)),
                is_error: true,
            };
        };
        if let Err(err) = registered.validate(&call.arguments) {
            return ToolRun::Done {
                output: json!(format!("invalid arguments: {err}")),
                is_error: true,
            };
        }
        // Shared by its `action.requested` and `action.started` events, not copied for each.
        let action = Arc::new(tool_action(registered.tool.as_ref(), call));
        obs.emit(RunEvent::action_requested(&action)).await;
        if !preapproved {
            match obs.authorize(&action).await {
                Ok(_) => {}
                Err(AgentError::ActionDenied { reason, .. }) => {
                    obs.emit(RunEvent::action_denied(action.id.clone(), reason.clone()))
                        .await;
                    return ToolRun::Done {
                        output: json!(format!("denied: {reason}")),
                        is_error: true,
                    };
                }
                Err(AgentError::ApprovalRequired { request }) => return ToolRun::Approval(request),
                Err(err) => {
                    // Fail closed: an action that could not be judged does not run.
                    obs.emit(RunEvent::action_denied(action.id.clone(), err.to_string()))
                        .await;
                    return ToolRun::Done {
                        output: json!(format!("denied: {err}")),
                        is_error: true,
                    };
                }
            }
        }
        if let Err(error) = obs.budget(|b| b.check_tool_call()).await {
            return ToolRun::Stop(error);
        }
        obs.emit(RunEvent::action_started(&action)).await;
        // Asynchronous tools: dispatch, persist the pending call, and wait for the callback.
        if let Some(dispatch) = registered.tool.asynchronous() {
            return self.dispatch_async(scope, call, dispatch).await;
        }
        let started = Instant::now();
        let span = tracing::info_span!("tool", name = %call.name, call_id = %call.id);
        // The call runs in this task: a spawned task would cost a cross-thread hand-off per
        // tool call for nothing, since the run waits for it anyway. Canceling drops the
        // future (the same as aborting a spawned one); a panic is caught and becomes the
        // tool's error, as a spawned task's would have.
        let call_future =
            std::panic::AssertUnwindSafe(registered.tool.call(call.arguments.clone(), ctx))
                .catch_unwind()
                .instrument(span);
        let (output, is_error) = tokio::select! {
            biased;
            () = run.token.cancelled() => return ToolRun::Canceled,
            joined = call_future => match joined {
                Ok(Ok(value)) => (value, false),
                Ok(Err(err)) => (json!(err.to_string()), true),
                Err(panic) => (
                    json!(format!("tool `{}` panicked: {}", call.name, panic_message(&*panic))),
                    true,
                ),
            },
        };
        let duration_ms = Some(started.elapsed().as_millis() as u64);
        if is_error {
            obs.emit(RunEvent::action_failed(ActionFailedPayload {
                action_id: action.id.clone(),
                error: render(&output),
                duration_ms,
            }))
            .await;
        } else {
            obs.emit(RunEvent::action_completed(ActionCompletedPayload {
                action_id: action.id.clone(),
                output: output.clone(),
                artifacts: Vec::new(),
                duration_ms,
            }))
            .await;
        }
        ToolRun::Done { output, is_error }
    }

    /// Write how the run ended: the task's final (or resting) state, its answer, artifact and
    /// stop reason, then the run's report and task record.
    async fn finish(
        &self,
        flow: &Flow,
        obs: &RunObs,
        task: &mut Task,
        outcome: Outcome,
    ) -> AgentResult<()> {
        let auth = &flow.auth;
        // The cancel flag has done its job once the run ends, whatever the ending.
        let _ = self
            .runtime
            .memory_service()
            .delete(auth, &cancel_key(&task.id))
            .await;
        match outcome {
            Outcome::Abandoned => return Ok(()),
            Outcome::AwaitingTool { call_id } => {
                // The task stays working; the callback queues it again.
                task.metadata
                    .insert("stop_reason".into(), json!("awaiting_tool"));
                task.metadata
                    .insert("awaiting_tool_call".into(), json!(call_id));
                obs.emit(
                    RunEvent::builder(
                        EventType::new("run.stopped"),
                        "run stopped: awaiting_tool".to_owned(),
                    )
                    .payload(json!({ "reason": "awaiting_tool", "call_id": call_id, "state": task.state() })),
                )
                .await;
                self.save_records(auth, obs, task).await;
                self.runtime.task_manager().save_task(auth, task).await?;
                self.task_saved();
                return Ok(());
            }
            Outcome::Answer {
                text,
                reason,
                recorded,
            } => {
                let answer = if recorded {
                    let mut m = Message::agent(text.clone());
                    m.task_id = Some(task.id.clone());
                    m
                } else {
                    let mut entry = LlmMessage::assistant(text.clone(), vec![]);
                    tag(&mut entry, &task.id);
                    self.mark_side(std::slice::from_mut(&mut entry));
                    self.runtime
                        .thread_store()
                        .append_history(auth, &flow.lease(), &[entry])
                        .await?;
                    self.record_event(auth, task, vec![Part::text(&text)])
                        .await?
                };
                let artifact = Artifact::text(text).named("answer");
                self.runtime
                    .task_manager()
                    .add_task_event(
                        auth,
                        &task.id,
                        &TaskEvent::ArtifactUpdate {
                            task_id: task.id.clone(),
                            thread_id: task.thread_id.clone(),
                            artifact: artifact.clone(),
                            append: false,
                            last_chunk: true,
                        },
                    )
                    .await?;
                obs.emit(RunEvent::task_artifact(&artifact, false, true))
                    .await;
                task.add_artifact(artifact);
                task.metadata.insert("stop_reason".into(), json!(reason));
                task.update_status(TaskState::Completed, Some(answer))?;
            }
            Outcome::Failed { error, reason } => {
                task.metadata.insert("stop_reason".into(), json!(reason));
                task.fail(error.to_string())?;
            }
            Outcome::InputRequired { question } => {
                task.metadata
                    .insert("stop_reason".into(), json!("input_required"));
                let message = self
                    .record_event(auth, task, vec![Part::text(&question)])
                    .await?;
                task.update_status(TaskState::InputRequired, Some(message))?;
            }
            Outcome::AwaitingApproval { request } => {
                // Persisted redacted, so it can wait across restarts without keeping secrets.
                let stored = RedactionPolicy::default().redact_approval_request(&request)?;
                task.metadata.insert(
                    META_PENDING_APPROVAL.into(),
                    serde_json::to_value(&stored).map_err(AgentError::internal)?,
                );
                task.metadata
                    .insert("stop_reason".into(), json!("approval_required"));
                let message = self
                    .record_event(
                        auth,
                        task,
                        vec![Part::text(format!(
                            "Approval required for `{}`: {}",
                            request.action.name, request.reason
                        ))],
                    )
                    .await?;
                task.update_status(TaskState::InputRequired, Some(message))?;
            }
            Outcome::Canceled { reason } => {
                task.metadata
                    .insert("stop_reason".into(), json!("canceled"));
                mark_canceled(task, &reason)?;
            }
        }
        if let Some(reason) = task.metadata.get("stop_reason").cloned() {
            obs.emit(
                RunEvent::builder(
                    EventType::new("run.stopped"),
                    format!("run stopped: {}", render(&reason)),
                )
                .payload(json!({ "reason": reason, "state": task.state() })),
            )
            .await;
        }
        // The final event and the records come before the status is persisted: persisting
        // wakes whoever waits for the task, and they must find the run fully reported.
        obs.emit(RunEvent::task_status_of(task)).await;
        self.save_records(auth, obs, task).await;
        // Subagents: a background child's result goes to its parent from here, durably.
        if let Some(me) = self.me.upgrade() {
            crate::subagents::child_task_rested(&me, auth, task).await;
        }
        self.persist_status(auth, task).await
    }

    /// The run report (redacted) and a task snapshot go to the run store. A failure here is
    /// logged: the task itself is already persisted.
    async fn save_records(&self, auth: &AuthContext, obs: &RunObs, task: &Task) {
        let runs = self.runtime.run_store();
        let agent_name = Some(self.agent.card().name.as_str());
        let result = async {
            // Read once: it indexes both records.
            let ctx = RunContext::from_task(task)?;
            runs.save_task_record(
                auth,
                &TaskRecord::with_context(task, ctx.as_ref(), agent_name),
            )
            .await?;
            if let Some(ctx) = ctx {
                // Masked and written as text while the run went (the run's report writer),
                // which the in-memory store keeps as it is.
                let report = obs.take_report_json()?;
                runs.save_run_report_json(
                    auth,
                    RunRecord {
                        run_id: ctx.run_id,
                        task_id: Some(task.id.clone()),
                        thread_id: Some(task.thread_id.clone()),
                        trace_id: Some(ctx.trace_id),
                        agent_name: agent_name.map(str::to_owned),
                        recorded_at: Utc::now(),
                        report: Value::Null,
                    },
                    report,
                )
                .await?;
            }
            AgentResult::Ok(())
        }
        .await;
        if let Err(err) = result {
            tracing::warn!(error = %err, "could not save the run report");
        }
    }
}

/// How a worker left the thread's queue.
#[derive(Debug, PartialEq, Eq)]
enum Worked {
    /// Empty, or stopped (lease lost, shutdown, store error).
    Done,
    /// The next item is a task of another agent sharing the thread.
    LeftForAnotherAgent,
}

/// Per-run handles, passed together through the step loop.
struct Scope<'a> {
    flow: &'a Flow,
    ctx: &'a ToolContext,
    run: &'a ActiveRun,
    obs: &'a RunObs,
}

/// How one tool call went.
enum ToolRun {
    Done {
        output: Value,
        is_error: bool,
    },
    /// Asynchronous tools: dispatched and acknowledged; the result comes by callback.
    Pending {
        call_id: String,
    },
    Canceled,
    Approval(Box<ApprovalRequest>),
    Stop(AgentError),
}

/// The message a panic carried (`panic!` with a literal or a formatted string).
fn panic_message(panic: &(dyn std::any::Any + Send)) -> &str {
    panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("a panic without a message")
}

fn budget_failure(error: AgentError) -> Outcome {
    let reason = match &error {
        AgentError::BudgetExceeded { limit, .. } => limit.clone(),
        _ => "budget".into(),
    };
    Outcome::Failed { error, reason }
}

/// The action prepared for a tool call: the tool's declared capabilities always included.
fn tool_action(tool: &dyn crate::Tool, call: &ToolCall) -> RunAction {
    let mut action = tool
        .prepare_action(&call.arguments)
        .unwrap_or_else(|| RunAction::tool_call(&call.name, call.arguments.clone()));
    for capability in tool.capabilities() {
        if !action.capabilities.contains(&capability) {
            action.capabilities.push(capability);
        }
    }
    if action.preview.is_none() {
        action.preview = tool.preview(&call.arguments);
    }
    action.metadata.insert("call_id".into(), json!(call.id));
    action
}

/// A JSON value as the model sees it: strings bare, everything else as JSON.
fn render(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn run_reason(run: &ActiveRun) -> String {
    run.reason
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone()
        .unwrap_or_else(|| "canceled by request".into())
}

fn tag(message: &mut LlmMessage, task_id: &TaskId) {
    message
        .metadata
        .insert(META_TASK.into(), json!(task_id.as_str()));
}

fn is_tagged(message: &LlmMessage, task_id: &TaskId) -> bool {
    message.metadata.get(META_TASK).and_then(Value::as_str) == Some(task_id.as_str())
}

/// The values of the text tag `key` across the history (the ids its entries came from).
fn tag_values(history: &[LlmMessage], key: &str) -> HashSet<String> {
    history
        .iter()
        .filter_map(|m| {
            m.metadata
                .get(key)
                .and_then(Value::as_str)
                .map(str::to_owned)
        })
        .collect()
}

fn user_messages(events: &[TaskEvent]) -> impl Iterator<Item = &Message> {
    events
        .iter()
        .filter_map(TaskEvent::as_message)
        .filter(|m| m.role == Role::User)
}

/// End a task `canceled` with its reason in `metadata.cancel_reason`, in the status message,
/// and in the task's run context (marked canceled with the same reason).
fn mark_canceled(task: &mut Task, reason: &str) -> AgentResult<()> {
    task.cancel(Some(reason))?;
    task.set_status_message(Message::agent(format!("Canceled: {reason}")));
    let mut ctx = RunContext::ensure_task_context(task)?;
    ctx.cancel(reason);
    ctx.attach_to_task(task)
}

/// The tool calls of a message made only of `tool_call` parts.
fn direct_tool_calls(message: Option<&Message>) -> Option<Vec<ToolCall>> {
    let message = message?;
    let calls: Vec<ToolCall> = message
        .parts
        .iter()
        .map(|p| match &p.content {
            PartContent::ToolCall {
                call_id,
                tool_name,
                args,
            } => Some(ToolCall {
                id: call_id.clone(),
                name: tool_name.clone(),
                arguments: args.clone(),
            }),
            _ => None,
        })
        .collect::<Option<_>>()?;
    (!calls.is_empty()).then_some(calls)
}

/// The step's stop evaluation is done: which rule fired, if any (§6 order).
async fn stop_evaluated(obs: &RunObs, step: u32, fired: Option<&'static str>) {
    obs.emit(
        RunEvent::builder(EventType::new("stop.evaluated"), "stop rules evaluated")
            .payload_from(StopEvaluated { stop: fired })
            .step(step),
    )
    .await;
}

// The payloads of the step markers every step emits, typed so that they are written into
// the run's report as text without a JSON tree in between.

/// `message.persisted`.
#[derive(Serialize)]
struct MessagePersisted {
    role: &'static str,
    tool_calls: usize,
}

/// `tool_result.persisted`.
#[derive(Serialize)]
struct ToolResultPersisted {
    call_id: String,
    is_error: bool,
    tool: String,
}

/// `stop.evaluated`: the rule that fired, if any.
#[derive(Serialize)]
struct StopEvaluated {
    stop: Option<&'static str>,
}

/// A user message as a history entry: its text, and its files as attachments.
fn user_entry(message: &Message) -> LlmMessage {
    let mut entry = LlmMessage::user(message.text());
    entry.attachments = message
        .parts
        .iter()
        .filter_map(|p| match &p.content {
            PartContent::File { file } => Some(file.clone()),
            _ => None,
        })
        .collect();
    entry
}

/// A history entry as a model request carries it: everything but Keel's own bookkeeping
/// metadata (`keel.*`: side, task, queue item), which no provider sends and which would
/// otherwise be copied, entry by entry, into every step's request.
fn request_copy(entry: &LlmMessage) -> LlmMessage {
    // Destructured in full, so a new field cannot be left out silently.
    let LlmMessage {
        id,
        role,
        content,
        name,
        tool_calls,
        tool_call_id,
        tool_name,
        attachments,
        metadata,
        created_at,
    } = entry;
    LlmMessage {
        id: id.clone(),
        role: *role,
        content: content.clone(),
        name: name.clone(),
        tool_calls: tool_calls.clone(),
        tool_call_id: tool_call_id.clone(),
        tool_name: tool_name.clone(),
        attachments: attachments.clone(),
        metadata: application_metadata(metadata),
        created_at: *created_at,
    }
}

/// `metadata` without Keel's `keel.*` keys.
fn application_metadata(metadata: &keel_core::Metadata) -> keel_core::Metadata {
    metadata
        .iter()
        .filter(|(key, _)| !key.starts_with("keel."))
        .map(|(key, value)| (key.clone(), value.clone()))
        .collect()
}

/// The model's view of a thread during one run: the messages of the last request, kept so
/// the next step adds only what the history gained since (its model call and tool results)
/// instead of assembling and copying the whole history again. The request shares them (an
/// `Arc`): once the model has answered and dropped its request, the view is the only owner
/// again and grows in place.
#[derive(Default)]
struct ModelView {
    /// The system prompt (when there is one), then the assembled history.
    messages: Arc<Vec<LlmMessage>>,
    /// Whether `messages` starts with the system prompt.
    system: bool,
    /// How many history entries `messages` holds, and the id of the last: a history that
    /// is not the one assembled plus new entries is assembled again from the start.
    seen: usize,
    last_id: Option<String>,
    /// Cleared when an assembled message read a file from the attachment store (the file
    /// may change before the next step) or the view had to be reshaped for a late
    /// asynchronous result: such a view is assembled again at each step, as it used to be.
    reusable: bool,
}

impl ModelView {
    /// The messages of this step's request: `system` then the thread's history as the agent
    /// `side` sees it (see [`assemble_context`]), with stored files' bytes loaded and late
    /// asynchronous results reshaped (see [`crate::async_tools::model_view`]).
    async fn messages(
        &mut self,
        system: String,
        history: &[LlmMessage],
        side: &str,
        vision: bool,
        thread: &crate::ThreadState,
    ) -> Arc<Vec<LlmMessage>> {
        let continues = self.reusable
            && self.seen <= history.len()
            && self.system != system.is_empty()
            && (self.seen == 0
                || history[self.seen - 1].id.as_str()
                    == self.last_id.as_deref().unwrap_or_default());
        if !continues {
            *self = ModelView {
                messages: Arc::new(Vec::with_capacity(history.len() + 1)),
                system: !system.is_empty(),
                seen: 0,
                last_id: None,
                reusable: true,
            };
        }
        // A request still held elsewhere (a model that keeps what it was sent) is copied
        // here, once; otherwise this is the view's own vector.
        let messages = Arc::make_mut(&mut self.messages);
        if self.system {
            // A view that goes on starts with the previous step's prompt; it changes only
            // when a variable it names did.
            match messages.first_mut() {
                Some(first) if first.content == system => {}
                Some(first) => *first = LlmMessage::system(system),
                None => messages.push(LlmMessage::system(system)),
            }
        }
        let start = messages.len();
        assemble_context(&history[self.seen..], side, vision, messages);
        let added = &mut messages[start..];
        // Stored files are references no provider can fetch: the request carries bytes.
        if added
            .iter()
            .flat_map(|m| &m.attachments)
            .any(|file| file.bytes.is_none() && file.uri.is_some())
        {
            self.reusable = false;
            thread.load_attachment_bytes(added).await;
        }
        self.seen = history.len();
        self.last_id = history.last().map(|m| m.id.clone());
        if crate::async_tools::reshaped(messages) {
            self.reusable = false;
            let assembled = Arc::unwrap_or_clone(std::mem::take(&mut self.messages));
            return Arc::new(crate::async_tools::model_view(assembled));
        }
        Arc::clone(&self.messages)
    }
}

/// Context assembly (Standard Agents §4): the model's view of the thread history for the
/// agent `side`, appended to `out`. Entries another agent spoke on this thread (dual_ai) are
/// the other side: its assistant text appears as `user`, and its tool calls and tool results
/// are left out. Without vision, image attachments are replaced by a note at request time;
/// the stored history keeps them.
fn assemble_context(history: &[LlmMessage], side: &str, vision: bool, out: &mut Vec<LlmMessage>) {
    for entry in history {
        let other = entry
            .metadata
            .get(META_SIDE)
            .and_then(Value::as_str)
            .is_some_and(|s| s != side);
        let mut message = if !other {
            request_copy(entry)
        } else if entry.role == LlmRole::Assistant && !entry.content.is_empty() {
            let mut said = LlmMessage::user(entry.content.clone());
            said.id.clone_from(&entry.id);
            said.created_at = entry.created_at;
            said.attachments.clone_from(&entry.attachments);
            said.metadata = application_metadata(&entry.metadata);
            said
        } else {
            continue;
        };
        if !vision {
            message.drop_images();
        }
        out.push(message);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use keel_core::RunBudget;

    fn with_context(permissions: Value, max_steps: Option<u32>) -> Task {
        let mut task = Task::create(Message::user("hi"));
        let mut ctx = RunContext::new().with_budget(RunBudget {
            max_steps,
            ..Default::default()
        });
        ctx.permissions = serde_json::from_value(permissions).unwrap();
        ctx.attach_to_task(&mut task).unwrap();
        task
    }

    fn incoming(permissions: Value, max_steps: Option<u32>) -> RunContext {
        let mut ctx = RunContext::new().with_budget(RunBudget {
            max_steps,
            ..Default::default()
        });
        ctx.permissions = serde_json::from_value(permissions).unwrap();
        ctx
    }

    #[test]
    fn a_new_task_adopts_the_callers_context() {
        let mut task = Task::create(Message::user("hi"));
        let ctx = incoming(json!({"records.*": "deny"}), Some(3));
        adopt_run_context(&mut task, ctx.clone()).unwrap();
        let adopted = RunContext::from_task(&task).unwrap().unwrap();
        assert_eq!(adopted.run_id, ctx.run_id);
        assert_eq!(adopted.permissions, ctx.permissions);
        assert_eq!(adopted.budget.max_steps, Some(3));
    }

    #[test]
    fn a_continuing_task_context_only_narrows() {
        // The budget takes the tighter limit, whichever side sets it.
        let mut task = with_context(json!({"records.*": "deny"}), Some(3));
        adopt_run_context(&mut task, incoming(json!({}), Some(10))).unwrap();
        let ctx = RunContext::from_task(&task).unwrap().unwrap();
        assert_eq!(ctx.budget.max_steps, Some(3));
        // Permissions left empty keep the task's (empty would mean "no narrowing").
        assert_eq!(ctx.permissions["records.*"], json!("deny"));

        // Other permissions are refused, naming the field, and change nothing.
        let before = task.metadata.clone();
        let err = adopt_run_context(&mut task, incoming(json!({"records.read": "allow"}), None))
            .unwrap_err();
        assert!(
            matches!(&err, AgentError::InvalidInput { field, .. } if field == "message.metadata.run_context.permissions"),
            "{err:?}"
        );
        assert_eq!(task.metadata, before);

        // A task without permissions may take some: that only narrows.
        let mut open = with_context(json!({}), None);
        adopt_run_context(&mut open, incoming(json!({"records.*": false}), Some(2))).unwrap();
        let ctx = RunContext::from_task(&open).unwrap().unwrap();
        assert_eq!(ctx.permissions["records.*"], json!(false));
        assert_eq!(ctx.budget.max_steps, Some(2));
    }
}
