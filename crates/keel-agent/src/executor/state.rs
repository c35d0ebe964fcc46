//! The executor's shared state and the types its parts pass each other: the process-local
//! registry (`Inner`), the queued work, the lease a worker holds, how a run ended.

use std::collections::HashSet;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, RwLock, Weak};

use dashmap::DashMap;
use keel_core::ApprovalRequest;
use keel_core::{
    AgentError, AgentResult, Message, PartContent, Role, RunContext, StatusKind, Task, TaskEvent,
    TaskId, ThreadId,
};
use keel_llm::LlmMessage;
use keel_runtime::{AuthContext, Lease, Runtime};
use serde_json::{json, Value};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::config::*;
use crate::approval_part;
use crate::thread_state::ThreadHost;
use crate::work::EffectScheduler;
use crate::{Agent, TaskRest};

pub(super) use crate::work::QueuedWork;

/// Metadata keys Keel puts on thread history entries.
pub(super) const META_TASK: &str = "keel.task_id";
/// History metadata key: the A2A `messageId` of the user message an entry came from (a
/// model or hook that decides by the incoming message reads it here).
pub const META_MESSAGE: &str = "keel.message_id";
pub(super) const META_QUEUE_ITEM: &str = "keel.queue_item";
/// What the id of a task started by queued work begins with; the queue item's id follows.
pub(super) const TURN_PREFIX: &str = "queued-";
/// History metadata key: the agent (side) that wrote an assistant or tool entry, so that two
/// agents sharing a thread each see the other as the user (dual_ai, §4).
pub(super) const META_SIDE: &str = "keel.side";
/// History metadata key on a tool result that is an error.
pub(super) const META_IS_ERROR: &str = "keel.is_error";
/// History metadata key on a run's final answer written when the run ended (a stop tool's
/// output, `session_stop`'s result): the stop reason, so that a run resumed after a crash
/// before its task was marked done finishes from it instead of asking the model again.
pub(super) const META_STOP: &str = "keel.stop_reason";

/// A run in progress in this process.
pub(super) struct ActiveRun {
    pub(super) thread_id: ThreadId,
    pub(super) token: CancellationToken,
    pub(super) reason: Mutex<Option<String>>,
    /// Where another process leaves a cancel request for this task (`cancel_key`), read at
    /// every checkpoint.
    pub(super) cancel_key: String,
}

impl ActiveRun {
    /// Stop the run, saying why.
    pub(super) fn cancel(&self, reason: String) {
        *self.reason.lock().unwrap_or_else(|p| p.into_inner()) = Some(reason);
        self.token.cancel();
    }

    /// Why the run was canceled.
    pub(super) fn reason(&self) -> String {
        self.reason
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .unwrap_or_else(|| "canceled by request".into())
    }
}

pub(super) type TaskKey = (String, TaskId);
pub(super) type ThreadKey = (String, ThreadId);

/// The executor's process-wide parts, behind the public front ([`AgentExecutor`]): what it
/// runs (the agent, over the runtime, tuned by the configuration), the thread driver's state,
/// who hears about tasks, and the subagent and effect wake-ups. One run's state (its task,
/// history, events and budget) is the run loop's ([`RunLoop`](super::run::RunLoop)).
pub(super) struct Inner {
    pub(super) agent: Agent,
    pub(super) runtime: Arc<dyn Runtime>,
    pub(super) config: ExecutorConfig,
    pub(super) me: Weak<Inner>,
    pub(super) driver: Driver,
    pub(super) notices: super::notices::Notices,
    /// Subagents: the executors whose agents use this one as a child kind, woken when a
    /// child's result is queued on their thread.
    pub(super) parents: RwLock<Vec<(String, Weak<dyn ThreadHost>)>>,
    /// Scheduled effects: what wakes the scheduler.
    pub(super) effects: EffectScheduler,
}

/// The thread driver's state in this process: the runs going on, a worker per thread with
/// work, the threads to take back, the work slots, and the background tasks and their stop.
pub(super) struct Driver {
    pub(super) active: DashMap<TaskKey, Arc<ActiveRun>, foldhash::fast::RandomState>,
    pub(super) workers: DashMap<ThreadKey, Arc<Notify>, foldhash::fast::RandomState>,
    /// Threads that recovery found unfinished: their drivers take the lease back even when
    /// it is still held under this process's own holder name (a restart with a stable
    /// instance id), instead of waiting for it to lapse.
    pub(super) reclaim: dashmap::DashSet<ThreadKey, foldhash::fast::RandomState>,
    pub(super) slots: super::slots::Slots,
    pub(super) tracker: TaskTracker,
    /// Set by [`AgentExecutor::shutdown`]: no new work is taken, and runs stop at their next
    /// step, leaving their tasks to the thread's next holder.
    pub(super) shutting_down: CancellationToken,
    /// The shutdown's drain ran out: workers drop their runs where they are.
    pub(super) halted: CancellationToken,
    /// The shutdown is over and this process's work is handed on: callers still waiting here
    /// for a task to rest are answered with the task as it stands.
    pub(super) handed_over: CancellationToken,
    /// The tasks whose runs stopped at a step for the shutdown, for its report.
    pub(super) drained: Mutex<Vec<TaskId>>,
}

impl Driver {
    pub(super) fn new(config: &ExecutorConfig) -> Self {
        Self {
            active: DashMap::default(),
            workers: DashMap::default(),
            reclaim: Default::default(),
            slots: super::slots::Slots::new(
                config.max_concurrent_threads,
                config.max_threads_per_tenant,
            ),
            tracker: TaskTracker::new(),
            shutting_down: CancellationToken::new(),
            halted: CancellationToken::new(),
            handed_over: CancellationToken::new(),
            drained: Mutex::new(Vec::new()),
        }
    }
}

/// Runs one [`Agent`] on threads, persisting through a [`Runtime`]. Cheap to clone.
#[derive(Clone)]
pub struct AgentExecutor {
    pub(super) inner: Arc<Inner>,
}

/// The lease a worker holds, kept fresh by a renewal task.
pub(super) struct Flow {
    pub(super) auth: AuthContext,
    pub(super) thread_id: ThreadId,
    pub(super) lease: Arc<RwLock<Arc<Lease>>>,
    pub(super) lost: CancellationToken,
    /// A run on this flow stopped for a shutdown ([`Outcome::HandedOn`]): its queue item is
    /// not acknowledged, so the thread's next holder resumes it.
    pub(super) handed_on: AtomicBool,
}

impl Flow {
    /// The current lease, shared: every persist point passes it to the store, and copying it
    /// each time (its strings) was an allocation per write.
    pub(super) fn lease(&self) -> Arc<Lease> {
        self.lease.read().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// Where a run's answer stands in the task's log when the run ends.
pub(super) enum AnswerLog {
    /// Not written yet: ending the run writes it with the history entry.
    Unwritten,
    /// Written as this message, which the final status then carries too: one answer, one
    /// message id in the task's history and status.
    Written(Box<Message>),
    /// In the history already, with no logged message at hand: written by a run that
    /// stopped (a restart) before it ended, or an empty answer, which has no part for the
    /// task's log. The final status says its text under an id of its own.
    InHistory,
}

/// How a run ended, before it is written to the task.
pub(super) enum Outcome {
    /// Completed with this answer; `logged` says where the answer message stands in the
    /// task's log.
    Answer {
        text: String,
        reason: &'static str,
        logged: AnswerLog,
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
    /// The executor is shutting down: the run stopped before a step, everything before it
    /// persisted; the thread's next holder (a replica, or this process restarted) resumes it.
    HandedOn,
    /// Asynchronous tools: a call waits for its callback; the task stays working and the
    /// thread is released.
    AwaitingTool {
        call_id: String,
    },
}

/// Thread key-value key naming the agent a task was sent to.
pub(super) fn owner_key(task_id: &TaskId) -> String {
    format!("keel:agent:{task_id}")
}

pub(super) fn cancel_key(task_id: &TaskId) -> String {
    format!("keel:cancel:{task_id}")
}

/// Whether a caller waiting for the task's answer stops here: the task rests
/// ([`TaskRest`]), and not for an asynchronous tool, which calls back by itself. A decision
/// waiting to be applied is no rest, so an approval's caller waits for the run to take it.
pub(super) fn answered(task: &Task) -> bool {
    TaskRest::of(task, 0).is_some_and(|rest| rest.answers())
}

/// How a worker left the thread's queue.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Worked {
    /// The store said the queue was empty: the last item was acknowledged with the lease's
    /// release, or none was left.
    Emptied,
    /// Stopped short (lease lost, shutdown, store error).
    Done,
    /// The next item is a task of another agent sharing the thread.
    LeftForAnotherAgent,
}

/// How one tool call went.
pub(super) enum ToolRun {
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

impl ToolRun {
    /// The call's output and whether it is an error, or how the run stops instead: canceled
    /// (with `run`'s reason), waiting for an approval or a callback, or out of budget.
    pub(super) fn output_or_stop(self, run: &ActiveRun) -> Result<(Value, bool), Outcome> {
        match self {
            ToolRun::Done { output, is_error } => Ok((output, is_error)),
            ToolRun::Canceled => Err(Outcome::Canceled {
                reason: run.reason(),
            }),
            ToolRun::Approval(request) => Err(Outcome::AwaitingApproval { request }),
            ToolRun::Stop(error) => Err(budget_failure(error)),
            ToolRun::Pending { call_id } => Err(Outcome::AwaitingTool { call_id }),
        }
    }
}

pub(super) fn budget_failure(error: AgentError) -> Outcome {
    let reason = match &error {
        AgentError::BudgetExceeded { limit, .. } => limit.clone(),
        _ => "budget".into(),
    };
    Outcome::Failed { error, reason }
}

/// A JSON value as the model sees it: strings bare, everything else as JSON.
pub(super) fn render(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

pub(super) fn tag(message: &mut LlmMessage, task_id: &TaskId) {
    message
        .metadata
        .insert(META_TASK.into(), json!(task_id.as_str()));
}

pub(crate) fn is_tagged(message: &LlmMessage, task_id: &TaskId) -> bool {
    message.metadata.get(META_TASK).and_then(Value::as_str) == Some(task_id.as_str())
}

/// The values of the text tag `key` across the history (the ids its entries came from).
pub(super) fn tag_values(history: &[LlmMessage], key: &str) -> HashSet<String> {
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

/// The task's messages from its user that join the model's conversation: every one but those
/// taken as approval decisions, which reach the model as the tool's result instead.
pub(super) fn user_messages(events: &[TaskEvent]) -> impl Iterator<Item = &Message> {
    events
        .iter()
        .filter_map(TaskEvent::as_message)
        .filter(|m| m.role == Role::User && !approval_part::is_decision_message(m))
}

/// End a task `canceled` with its reason in `metadata.cancel_reason`, in the status message,
/// and in the task's run context (marked canceled with the same reason).
pub(super) fn mark_canceled(task: &mut Task, reason: &str) -> AgentResult<()> {
    task.cancel(Some(reason))?;
    let kind = if reason == crate::thread_state::TERMINATED_REASON {
        StatusKind::Termination
    } else {
        StatusKind::ExecutionAbort
    };
    task.set_status_message(Message::agent(format!("Canceled: {reason}")).with_status_kind(kind));
    let mut ctx = RunContext::ensure_task_context(task)?;
    ctx.cancel(reason);
    ctx.attach_to_task(task)
}

/// A user message as a history entry: its text, and its files as attachments.
pub(super) fn user_entry(message: &Message) -> LlmMessage {
    let mut entry = LlmMessage::user(message.text());
    // A synthesized status message stays one in the thread history (seed 003 §12), and
    // the message of a turn keeps the queue item it came from.
    for key in [keel_core::STATUS_KIND_KEY, META_QUEUE_ITEM] {
        if let Some(value) = message.metadata.get(key) {
            entry.metadata.insert(key.into(), value.clone());
        }
    }
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
