//! The ephemeral runtime (seed 004): process one input — a user message or an asynchronous
//! tool's callback — run its thread until it must wait, persist, and return, so that a process
//! can handle one input and exit while the store keeps everything.
//!
//! The process returns once the task rests by the engine's one definition,
//! [`TaskRest`](keel_agent::TaskRest): terminal, waiting for input or an approval
//! (`input-required`, `auth-required`), or waiting for an asynchronous tool (`working` with
//! `metadata.stop_reason == "awaiting_tool"` and an empty thread queue); unlike the engine's
//! blocking calls it stops at that last rest too (decision 23), and it also waits until no run
//! of the task is active here.
//!
//! ```
//! use std::sync::Arc;
//! use keel::ephemeral::{process_once, Input, Rest};
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> keel::core::AgentResult<()> {
//! let runtime = Arc::new(keel::DefaultRuntime::offline());
//! let outcome = process_once(runtime, keel::demo::agent()?, Input::message("t-1", "hello")).await?;
//! assert_eq!(outcome.rest, Rest::Finished);
//! assert_eq!(outcome.answer.as_deref(), Some("You said: hello"));
//! # Ok(())
//! # }
//! ```

use std::sync::Arc;
use std::time::Duration;

use keel_agent::{Agent, AgentExecutor, CallbackError, ExecutorConfig, SendOptions, TaskRest};
use keel_core::{AgentError, AgentResult, Message, Task, TaskId, ThreadId};
use keel_runtime::{AuthContext, Runtime};
use serde_json::{json, Value};

/// One input for an ephemeral run.
#[derive(Debug, Clone)]
pub enum Input {
    /// A user message in a thread; with `task_id`, the answer to a task waiting for input.
    Message {
        /// The thread the message belongs to.
        thread_id: ThreadId,
        /// The task it answers, when that task waits for input.
        task_id: Option<TaskId>,
        /// The message's text.
        text: String,
    },
    /// The result of an asynchronous tool call (what its callback carries).
    ToolResult {
        /// The pending call's id.
        call_id: String,
        /// The per-call secret sent with the invocation.
        secret: String,
        /// The tool's output.
        output: Value,
        /// Whether the output is an error.
        is_error: bool,
    },
}

impl Input {
    /// A user message starting a new task in `thread_id`.
    pub fn message(thread_id: impl Into<ThreadId>, text: impl Into<String>) -> Self {
        Input::Message {
            thread_id: thread_id.into(),
            task_id: None,
            text: text.into(),
        }
    }

    /// An asynchronous tool's successful result.
    pub fn tool_result(
        call_id: impl Into<String>,
        secret: impl Into<String>,
        output: Value,
    ) -> Self {
        Input::ToolResult {
            call_id: call_id.into(),
            secret: secret.into(),
            output,
            is_error: false,
        }
    }
}

/// Why the task rests: the engine's one definition ([`TaskRest`]).
pub type Rest = TaskRest;

/// Where the task stands once it rests.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The task, as persisted.
    pub task: Task,
    /// Why it rests.
    pub rest: Rest,
    /// The text of its status message (the final answer, or the question), when any.
    pub answer: Option<String>,
}

impl Outcome {
    /// A JSON summary: task and thread ids, state, rest, answer, stop reason and pending call.
    pub fn to_json(&self) -> Value {
        let mut out = json!({
            "task_id": self.task.id.as_str(),
            "thread_id": self.task.thread_id.as_str(),
            "state": self.task.state().to_string(),
            "rest": self.rest.as_str(),
            "answer": self.answer,
            "stop_reason": self.task.metadata.get("stop_reason"),
        });
        if let Rest::AwaitingTool { call_id } = &self.rest {
            out["awaiting_tool_call"] = json!(call_id);
        }
        out
    }
}

/// How long [`process_once`] waits for the task to rest by default.
pub const DEFAULT_MAX_WAIT: Duration = Duration::from_secs(600);

/// Process `input` with a fresh executor for `agent` over `runtime` (a message in the
/// runtime's default tenant; a tool result in the tenant of its call), wait until the task rests, stop the executor and return where the task stands.
pub async fn process_once(
    runtime: Arc<dyn Runtime>,
    agent: Agent,
    input: Input,
) -> AgentResult<Outcome> {
    process_once_with(
        runtime,
        agent,
        ExecutorConfig::default(),
        input,
        DEFAULT_MAX_WAIT,
    )
    .await
}

/// [`process_once`] with an explicit executor configuration (e.g. the callback base URL of
/// asynchronous tools) and the longest wait for the task to rest.
pub async fn process_once_with(
    runtime: Arc<dyn Runtime>,
    agent: Agent,
    config: ExecutorConfig,
    input: Input,
    max_wait: Duration,
) -> AgentResult<Outcome> {
    let auth = runtime.auth_service().auth_context();
    let executor = AgentExecutor::with_config(agent, runtime, config);
    let result = process(&executor, &auth, input, max_wait).await;
    // Every run of ours rests here; this only stops timers and idle workers.
    executor.shutdown().await;
    result
}

/// Process `input` on an existing executor and wait until its task rests (at most
/// `max_wait`); the executor keeps running. A message is sent as `auth`; a tool result goes to
/// the tenant that dispatched its call, whatever `auth` is.
pub async fn process(
    executor: &AgentExecutor,
    auth: &AuthContext,
    input: Input,
    max_wait: Duration,
) -> AgentResult<Outcome> {
    let (task_id, thread_id) = match input {
        Input::Message {
            thread_id,
            task_id,
            text,
        } => {
            let mut message = Message::user(text).in_thread(thread_id);
            message.task_id = task_id;
            let options = SendOptions::in_background();
            let task = executor.send_message(auth, message, options).await?;
            (task.id, task.thread_id)
        }
        Input::ToolResult {
            call_id,
            secret,
            output,
            is_error,
        } => {
            // The call's own tenant, whoever runs this process: the secret is the credential.
            let accepted = executor
                .deliver_tool_result(&call_id, &secret, output, is_error)
                .await
                .map_err(|err| match err {
                    CallbackError::Agent(err) => err,
                    other => AgentError::invalid_input("callback", other.to_string()),
                })?;
            return wait_for_rest(
                executor,
                &accepted.auth,
                &accepted.task_id,
                &accepted.thread_id,
                max_wait,
            )
            .await;
        }
    };
    wait_for_rest(executor, auth, &task_id, &thread_id, max_wait).await
}

/// Wait until the thread's queue is empty, no run of the task is active here, and the task
/// rests.
async fn wait_for_rest(
    executor: &AgentExecutor,
    auth: &AuthContext,
    task_id: &TaskId,
    thread_id: &ThreadId,
    max_wait: Duration,
) -> AgentResult<Outcome> {
    let deadline = tokio::time::Instant::now() + max_wait;
    let mut changed = executor.task_updates();
    loop {
        changed.borrow_and_update();
        // The queue and the run first, the task after: a worker acknowledges its queue item
        // only after the run's last save, so a task read once the queue is seen empty is
        // that save or newer. Read the other way round, a run that ended between the two
        // reads left an older snapshot looking like the answer.
        let queued = executor
            .runtime()
            .thread_store()
            .queue_len(auth, thread_id)
            .await?;
        let idle = queued == 0 && !executor.is_running(auth, task_id);
        let task = executor.get_task(auth, task_id, None).await?;
        if idle {
            if let Some(rest) = TaskRest::of(&task, queued) {
                let answer = task.status().text();
                return Ok(Outcome { task, rest, answer });
            }
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(AgentError::internal(format!(
                "task {task_id} did not rest within {} s",
                max_wait.as_secs_f64()
            )));
        }
        tokio::select! {
            _ = changed.changed() => {}
            () = tokio::time::sleep(Duration::from_millis(50)) => {}
        }
    }
}
