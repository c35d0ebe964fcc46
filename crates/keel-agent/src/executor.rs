//! The engine that runs an [`Agent`] on tasks: the step loop, persistence after every step,
//! and live cancellation.

use std::sync::{Arc, Mutex};

use dashmap::DashMap;
use keel_core::{
    AgentError, AgentResult, Artifact, Message, Part, PartContent, Role, RunContext, Task,
    TaskEvent, TaskId, TaskState,
};
use keel_llm::{LlmRequest, ToolCall};
use keel_runtime::{load_task_with_history, AuthContext, Runtime};
use serde_json::{json, Value};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use crate::conversation::{llm_messages, render};
use crate::{Agent, ToolContext};

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

/// A run in progress in this process.
struct ActiveRun {
    token: CancellationToken,
    reason: Mutex<Option<String>>,
    done: watch::Receiver<bool>,
}

type RunKey = (String, TaskId);

struct Inner {
    agent: Agent,
    runtime: Arc<dyn Runtime>,
    active: DashMap<RunKey, Arc<ActiveRun>>,
    tracker: TaskTracker,
}

/// Runs one [`Agent`] on tasks, persisting through a [`Runtime`]. Cheap to clone.
#[derive(Clone)]
pub struct AgentExecutor {
    inner: Arc<Inner>,
}

/// How a run ended, before it is written to the task.
enum Outcome {
    Answer(String),
    Failed(AgentError),
    Canceled,
}

impl AgentExecutor {
    /// An executor for `agent`, storing through `runtime`.
    pub fn new(agent: Agent, runtime: Arc<dyn Runtime>) -> Self {
        Self {
            inner: Arc::new(Inner {
                agent,
                runtime,
                active: DashMap::new(),
                tracker: TaskTracker::new(),
            }),
        }
    }

    /// The agent.
    pub fn agent(&self) -> &Agent {
        &self.inner.agent
    }

    /// The service hub.
    pub fn runtime(&self) -> &Arc<dyn Runtime> {
        &self.inner.runtime
    }

    /// Accept a user message: start a new task in the message's thread (or a new thread), or
    /// continue the task it names when that task is waiting for input. The message is
    /// persisted before this returns. Blocking by default; see [`SendOptions`].
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
        message.task_id = Some(task.id.clone());
        message.thread_id = Some(task.thread_id.clone());
        match options.run_context {
            Some(ctx) => ctx.attach_to_task(&mut task)?,
            None => {
                RunContext::ensure_task_context(&mut task)?;
            }
        }
        tasks.save_task(auth, &task).await?;
        tasks
            .add_task_event(auth, &task.id, &TaskEvent::Message { message })
            .await?;

        let done = self.start_run(auth.clone(), task.id.clone());
        if options.return_immediately {
            return self.get_task(auth, &task.id, options.history_length).await;
        }
        wait_done(done).await;
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

    /// Cancel a task. A running task is stopped live and ends `canceled` with `reason`; a
    /// terminal task is [`AgentError::TaskNotCancelable`]; an unknown one
    /// [`AgentError::TaskNotFound`].
    pub async fn cancel_task(
        &self,
        auth: &AuthContext,
        task_id: &TaskId,
        reason: Option<String>,
    ) -> AgentResult<Task> {
        let tasks = self.inner.runtime.task_manager();
        let mut task =
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
        let active = self
            .inner
            .active
            .get(&(auth.namespace(), task_id.clone()))
            .map(|a| a.clone());
        match active {
            Some(run) => {
                *run.reason.lock().unwrap_or_else(|p| p.into_inner()) = reason;
                run.token.cancel();
                wait_done(run.done.clone()).await;
            }
            None => {
                let reason = reason.unwrap_or_else(|| "canceled by request".into());
                mark_canceled(&mut task, &reason)?;
                self.inner.persist_final(auth, &task).await?;
            }
        }
        let task = self.get_task(auth, task_id, None).await?;
        if task.state() != TaskState::Canceled {
            return Err(AgentError::TaskNotCancelable {
                task_id: task_id.clone(),
                state: task.state(),
            });
        }
        Ok(task)
    }

    /// Whether a run of this task is executing in this process.
    pub fn is_running(&self, auth: &AuthContext, task_id: &TaskId) -> bool {
        self.inner
            .active
            .contains_key(&(auth.namespace(), task_id.clone()))
    }

    /// Cancel every running task (reason `shutdown`) and wait until each has persisted its
    /// final state.
    pub async fn shutdown(&self) {
        for run in self.inner.active.iter() {
            *run.reason.lock().unwrap_or_else(|p| p.into_inner()) =
                Some("server shutting down".into());
            run.token.cancel();
        }
        self.inner.tracker.close();
        self.inner.tracker.wait().await;
    }

    fn start_run(&self, auth: AuthContext, task_id: TaskId) -> watch::Receiver<bool> {
        let (done_tx, done_rx) = watch::channel(false);
        let run = Arc::new(ActiveRun {
            token: CancellationToken::new(),
            reason: Mutex::new(None),
            done: done_rx.clone(),
        });
        let key = (auth.namespace(), task_id.clone());
        self.inner.active.insert(key.clone(), run.clone());
        let inner = self.inner.clone();
        let span = tracing::info_span!("run", task_id = %task_id, agent = %inner.agent.card().name);
        self.inner.tracker.spawn(
            async move {
                // The run itself is a separate task so that a panic in it (or in a tool) is
                // contained here and still ends the task.
                let worker = {
                    let inner = inner.clone();
                    let auth = auth.clone();
                    let task_id = task_id.clone();
                    let run = run.clone();
                    tokio::spawn(
                        async move { inner.run(&auth, &task_id, &run).await }.in_current_span(),
                    )
                };
                let result = match worker.await {
                    Ok(result) => result,
                    Err(join) => Err(AgentError::internal(format!("the run panicked: {join}"))),
                };
                if let Err(err) = result {
                    tracing::error!(error = %err, "run ended with an error; failing the task");
                    inner.fail_after_error(&auth, &task_id, &err).await;
                }
                inner.active.remove(&key);
                let _ = done_tx.send(true);
            }
            .instrument(span),
        );
        done_rx
    }
}

async fn wait_done(mut done: watch::Receiver<bool>) {
    // An error means the sender is gone, which only happens once the run has finished.
    let _ = done.wait_for(|finished| *finished).await;
}

impl Inner {
    async fn persist_final(&self, auth: &AuthContext, task: &Task) -> AgentResult<()> {
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
            .await
    }

    async fn record(
        &self,
        auth: &AuthContext,
        task: &Task,
        message: Message,
        history: &mut Vec<Message>,
    ) -> AgentResult<()> {
        let mut message = message;
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
        history.push(message);
        Ok(())
    }

    /// A run that ended in an error it could not record: fail the task if it is not terminal.
    async fn fail_after_error(&self, auth: &AuthContext, task_id: &TaskId, err: &AgentError) {
        let tasks = self.runtime.task_manager();
        let Ok(Some(mut task)) = tasks.get_task(auth, task_id).await else {
            return;
        };
        if task.state().is_terminal() {
            return;
        }
        if task.fail(err.to_string()).is_ok() {
            if let Err(e) = self.persist_final(auth, &task).await {
                tracing::error!(error = %e, "could not record the failure of task {task_id}");
            }
        }
    }

    async fn run(
        &self,
        auth: &AuthContext,
        task_id: &TaskId,
        active: &ActiveRun,
    ) -> AgentResult<()> {
        let mut task =
            load_task_with_history(self.runtime.task_manager().as_ref(), auth, task_id, None)
                .await?
                .ok_or_else(|| AgentError::TaskNotFound {
                    task_id: task_id.clone(),
                })?;
        let mut history = std::mem::take(&mut task.history);
        task.begin()?;
        self.persist_final(auth, &task).await?;

        let run_context = RunContext::ensure_task_context(&mut task)?;
        let ctx = ToolContext {
            auth: auth.clone(),
            run: run_context,
            task_id: task.id.clone(),
            thread_id: task.thread_id.clone(),
            cancel: active.token.clone(),
            runtime: self.runtime.clone(),
        };
        let outcome = match direct_tool_calls(history.last()) {
            Some(calls) => {
                self.run_direct(auth, &task, calls, &ctx, &mut history)
                    .await?
            }
            None => {
                self.run_model_loop(auth, &mut task, &ctx, &mut history)
                    .await?
            }
        };

        match outcome {
            Outcome::Answer(text) => {
                let answer = Message::agent(text.clone());
                self.record(auth, &task, answer.clone(), &mut history)
                    .await?;
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
                task.add_artifact(artifact);
                task.update_status(TaskState::Completed, Some(answer))?;
            }
            Outcome::Failed(err) => {
                if let AgentError::BudgetExceeded { limit, .. } = &err {
                    task.metadata
                        .insert("stop_reason".into(), Value::String(limit.clone()));
                }
                task.fail(err.to_string())?;
            }
            Outcome::Canceled => {
                let reason = active
                    .reason
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .clone()
                    .unwrap_or_else(|| "canceled by request".into());
                mark_canceled(&mut task, &reason)?;
            }
        }
        self.persist_final(auth, &task).await
    }

    async fn run_model_loop(
        &self,
        auth: &AuthContext,
        task: &mut Task,
        ctx: &ToolContext,
        history: &mut Vec<Message>,
    ) -> AgentResult<Outcome> {
        let llm = self
            .agent
            .llm()
            .cloned()
            .unwrap_or_else(|| self.runtime.default_llm());
        let tools = self.agent.tool_specs();
        let max_steps = self.agent.max_steps();
        for step in 1..=max_steps {
            let request = LlmRequest::new(llm_messages(self.agent.instructions(), history))
                .with_tools(tools.clone());
            let response = tokio::select! {
                biased;
                () = ctx.cancel.cancelled() => return Ok(Outcome::Canceled),
                response = llm.complete(request).instrument(tracing::info_span!("step", step)) => response,
            };
            let response = match response {
                Ok(response) => response,
                Err(err) => return Ok(Outcome::Failed(err)),
            };
            if response.is_final() {
                return Ok(Outcome::Answer(response.content.unwrap_or_default()));
            }
            let mut parts: Vec<Part> = response
                .content
                .iter()
                .filter(|t| !t.is_empty())
                .map(Part::text)
                .collect();
            parts.extend(
                response
                    .tool_calls
                    .iter()
                    .map(|c| Part::tool_call(&c.id, &c.name, c.arguments.clone())),
            );
            self.record(auth, task, Message::new(Role::Agent, parts), history)
                .await?;
            for call in &response.tool_calls {
                let Some((output, is_error)) = self.call_tool(call, ctx).await else {
                    return Ok(Outcome::Canceled);
                };
                let part = Part::tool_output(&call.id, &call.name, output, is_error);
                self.record(auth, task, Message::new(Role::Agent, vec![part]), history)
                    .await?;
            }
        }
        Ok(Outcome::Failed(AgentError::BudgetExceeded {
            limit: "max_steps".into(),
            used: u64::from(max_steps),
            max: u64::from(max_steps),
        }))
    }

    /// Decision 6: a message that asks for tool calls directly runs them with no model, and
    /// the task fails when one fails.
    async fn run_direct(
        &self,
        auth: &AuthContext,
        task: &Task,
        calls: Vec<ToolCall>,
        ctx: &ToolContext,
        history: &mut Vec<Message>,
    ) -> AgentResult<Outcome> {
        let mut outputs = Vec::new();
        for call in &calls {
            let Some((output, is_error)) = self.call_tool(call, ctx).await else {
                return Ok(Outcome::Canceled);
            };
            let part = Part::tool_output(&call.id, &call.name, output.clone(), is_error);
            self.record(auth, task, Message::new(Role::Agent, vec![part]), history)
                .await?;
            if is_error {
                return Ok(Outcome::Failed(AgentError::ToolFailed {
                    tool: call.name.clone(),
                    message: render(&output),
                }));
            }
            outputs.push(render(&output));
        }
        Ok(Outcome::Answer(outputs.join("\n")))
    }

    /// Run one tool call: `None` when the run was canceled meanwhile, else the output and
    /// whether it is an error. Unknown tools, invalid arguments, failures and panics all
    /// become error outputs.
    async fn call_tool(&self, call: &ToolCall, ctx: &ToolContext) -> Option<(Value, bool)> {
        let span = tracing::info_span!("tool", name = %call.name, call_id = %call.id);
        let Some(registered) = self.agent.tool(&call.name) else {
            return Some((json!(format!("unknown tool `{}`", call.name)), true));
        };
        if let Err(err) = registered.validate(&call.arguments) {
            return Some((json!(err.to_string()), true));
        }
        let tool = registered.tool.clone();
        let args = call.arguments.clone();
        let tool_ctx = ctx.clone();
        let mut handle =
            tokio::spawn(async move { tool.call(args, &tool_ctx).await }.instrument(span));
        tokio::select! {
            biased;
            () = ctx.cancel.cancelled() => {
                handle.abort();
                None
            }
            joined = &mut handle => Some(match joined {
                Ok(Ok(value)) => (value, false),
                Ok(Err(err)) => (json!(err.to_string()), true),
                Err(join) => (json!(format!("tool `{}` panicked: {join}", call.name)), true),
            }),
        }
    }
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
    let message = message.filter(|m| m.role == Role::User)?;
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
