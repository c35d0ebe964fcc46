//! The run loop: one run of a task, from its start (or resumption) to the outcome that ends
//! or rests it. [`RunLoop`] owns the run's state (the task, the thread history as the run
//! grows it, the tools' context, the events and budget); the thread driver starts it through
//! [`Inner::run_task`] and [`Inner::run_loaded_task`]. Its steps are in `step.rs`, its tool
//! calls in `tools.rs`, its persist points in `context.rs`, explicit parts in `direct.rs`,
//! and its ending in `records.rs`.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use keel_core::ApprovalOutcome;
use keel_core::TaskId;
use keel_core::{AgentError, AgentResult, Message, PartContent, RunContext, Task, TaskState};
use keel_events::RunEvent;
use keel_llm::{LlmMessage, LlmRole, ToolCall};
use keel_runtime::{LogLevel, TaskWrite};
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::state::*;
use crate::agent::{ASK_HUMAN_TOOL, SESSION_FAIL_TOOL, SESSION_STOP_TOOL};
use crate::observe::RunObs;
use crate::task_meta::{clear_approval, EngineMeta};
use crate::thread_state::ThreadHost;
use crate::{TaskRest, ThreadState, ToolContext};

/// One run of a task on the thread a worker holds: what the run works on and what it owns.
/// Everything process-wide (the agent, the runtime, the configuration, who hears about
/// tasks) it reaches through `inner`.
pub(super) struct RunLoop<'a> {
    pub(super) inner: &'a Inner,
    /// The thread's lease, under which every write of the run is fenced.
    pub(super) flow: &'a Flow,
    /// This run in the registry of running tasks: its cancel token and reason.
    pub(super) active: Arc<ActiveRun>,
    pub(super) task: Task,
    /// The thread's history as the run has read and grown it.
    pub(super) history: Vec<LlmMessage>,
    /// What the run's tools (and hooks) are given: tenant, run context, thread handle.
    pub(super) ctx: ToolContext,
    /// The run's events, report, budget and authorizer.
    pub(super) obs: Arc<RunObs>,
    /// The files tools attached to their results ([`ToolContext::attach_to_result`]), by
    /// call id, until the result is persisted.
    pub(super) attached: std::sync::Mutex<HashMap<String, Vec<keel_core::FileContent>>>,
}

impl Inner {
    /// Run (or resume) one task on the thread `flow` holds.
    pub(super) async fn run_task(&self, flow: &Flow, task_id: &TaskId) -> AgentResult<()> {
        match self
            .runtime
            .task_manager()
            .get_task(&flow.auth, task_id)
            .await?
        {
            Some(task) => self.run_loaded_task(flow, task).await,
            None => Ok(()),
        }
    }

    /// [`Self::run_task`] of a task just read from the store: the run is registered as
    /// running here (and watched for a cancel from another process) while its loop goes.
    pub(super) async fn run_loaded_task(&self, flow: &Flow, task: Task) -> AgentResult<()> {
        let auth = &flow.auth;
        let task_id = &task.id.clone();
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
        self.driver.active.insert(key.clone(), run.clone());
        let watcher = self.watch_cancel_flag(auth, run.clone());
        let span = tracing::info_span!("run", task_id = %task_id, agent = %self.agent.card().name);
        // Boxed: the run's state machine (step loop, tool calls, persistence) is large, and
        // inline it would make every thread worker's future that large, copied whole when
        // the worker is spawned.
        let result = Box::pin(RunLoop::run(self, flow, task, run).instrument(span)).await;
        watcher.abort();
        self.driver.active.remove(&key);
        self.notices.task_touched(auth, task_id);
        match result {
            Ok(()) => Ok(()),
            // Neither is the task's fault: it stays as the store has it, and its queue item
            // stays too, so the next holder of the thread (here, once the store answers, or
            // another process) resumes it from its last persisted step.
            Err(err @ (AgentError::LeaseLost { .. } | AgentError::StoreUnavailable { .. })) => {
                Err(err)
            }
            Err(err) => {
                self.log(
                    LogLevel::Error,
                    &format!("run failed; failing the task: {err}"),
                );
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
    pub(super) async fn has_unseen_input(&self, flow: &Flow, task: &Task) -> AgentResult<bool> {
        if !matches!(
            task.state(),
            TaskState::InputRequired | TaskState::AuthRequired
        ) {
            return Ok(false);
        }
        let events = self
            .runtime
            .task_manager()
            .get_task_events(&flow.auth, &task.id)
            .await?;
        let first = user_messages(&events).next().map(|m| m.message_id.as_str());
        let history = self.read_history(flow, first).await?;
        let seen = tag_values(&history, META_MESSAGE);
        let unseen = user_messages(&events).any(|m| !seen.contains(m.message_id.as_str()));
        Ok(unseen)
    }
}

impl<'a> RunLoop<'a> {
    /// Run `task` until it ends or rests, and write down how.
    async fn run(
        inner: &'a Inner,
        flow: &'a Flow,
        mut task: Task,
        active: Arc<ActiveRun>,
    ) -> AgentResult<()> {
        let auth = &flow.auth;
        let thread = ThreadState {
            auth: auth.clone(),
            thread_id: flow.thread_id.clone(),
            host: inner
                .shared()
                .ok_or_else(|| AgentError::internal("executor dropped"))?,
            cancel: active.token.clone(),
        };
        // A task whose thread was terminated after it was queued never starts.
        if thread.is_terminated().await? {
            mark_canceled(&mut task, "thread terminated")?;
            return inner.persist_status(auth, &task).await;
        }
        let run_context = RunContext::ensure_task_context(&mut task)?;
        // A task that ran before (paused for input, an approval or a tool, or stopped by a
        // restart) goes on with the same run: one sequence of events, one report.
        let obs = if task.state() == TaskState::Submitted {
            inner.run_obs(auth, &run_context, &task.id)
        } else {
            inner.resumed_run_obs(auth, &run_context, &task.id).await?
        };
        let obs = Arc::new(obs);
        let ctx = ToolContext {
            auth: auth.clone(),
            run: run_context,
            task_id: task.id.clone(),
            thread_id: task.thread_id.clone(),
            thread,
            cancel: active.token.clone(),
            runtime: inner.runtime.clone(),
            events: Some(obs.clone()),
            in_task: true,
            call: None,
            attached: None,
        };
        let mut run = RunLoop {
            inner,
            flow,
            active,
            task,
            history: Vec::new(),
            ctx,
            obs,
            attached: Default::default(),
        };
        let outcome = run.work().await?;
        run.finish(outcome).await
    }

    /// From the run's start to its outcome: take the task's new input into the history,
    /// then finish what a previous run left (interrupted tool calls, a decided ending) or
    /// run its explicit parts or the step loop.
    async fn work(&mut self) -> AgentResult<Outcome> {
        if let Some(outcome) = self.stop_requested_durably().await {
            return Ok(outcome);
        }
        let inner = self.inner;
        // The working status is written below, together with the run's new input.
        let fresh = self.task.state() == TaskState::Submitted;
        let began = self.task.state() != TaskState::Working;
        if began {
            self.task.begin()?;
        }

        // The task's user messages join the thread history once each (a resumed run finds
        // them there already).
        let task_manager = inner.runtime.task_manager();
        let events = task_manager.get_task_events(&self.flow.auth, &self.task.id);
        let (history, events) = if fresh {
            // A task that never ran has no entries of its own before the history's newest
            // checkpoint: its history and its events are read together.
            let (history, events) = tokio::join!(inner.read_history(self.flow, None), events);
            (history?, events?)
        } else {
            // A resumed one is read back to its first input.
            let events = events.await?;
            let first = user_messages(&events).next().map(|m| m.message_id.as_str());
            (inner.read_history(self.flow, first).await?, events)
        };
        self.history = history;
        let seen = tag_values(&self.history, META_MESSAGE);
        let mut new_input = Vec::new();
        for message in user_messages(&events) {
            if !seen.contains(message.message_id.as_str()) {
                let mut entry = user_entry(message);
                tag(&mut entry, &self.task.id);
                entry
                    .metadata
                    .insert(META_MESSAGE.into(), json!(message.message_id.as_str()));
                new_input.push(entry);
            }
        }
        let direct = direct_tool_calls(user_messages(&events).last());
        let explicit = match direct {
            None => super::direct::explicit_parts(user_messages(&events).last()),
            Some(_) => None,
        };
        self.take_in(began, new_input).await?;
        if began {
            // The whole task rides on the final status only (the payload's contract).
            self.obs.emit(RunEvent::task_state_of(&self.task)).await;
        }
        if let Some(outcome) = self.session_turns_exceeded() {
            return Ok(outcome);
        }

        // Subagents: `immediate` kinds are queued to run before the thread's first model step.
        if direct.is_none() && explicit.is_none() {
            inner
                .agent
                .hooks
                .before_first_step(&self.ctx, &self.history)
                .await?;
        }
        Ok(match (direct, explicit) {
            (Some(calls), _) => self.run_direct(calls).await?,
            (None, Some(items)) => self.run_explicit(items).await?,
            (None, None) => match self.resume_interrupted_calls().await? {
                Some(outcome) => outcome,
                None => match self.persisted_ending() {
                    Some(outcome) => outcome,
                    None => self.step_loop().await?,
                },
            },
        })
    }

    /// Write the run's start: the task's working status (when the run `began` it) and its
    /// `new_input` joining the thread history. One write where the store can (decision 260:
    /// the status and the input commit together); otherwise two independent writes, sent
    /// together (one SQLite batch, one Redis pipeline), either of which may be there
    /// without the other after a crash, and a resumed run handles both.
    async fn take_in(&mut self, began: bool, mut new_input: Vec<LlmMessage>) -> AgentResult<()> {
        let (inner, auth, task) = (self.inner, &self.flow.auth, &self.task);
        if began && !new_input.is_empty() {
            if let Some(steps) = inner.runtime.step_store() {
                inner.mark_side(&mut new_input);
                let status = super::records::status_event(task);
                let lease = self.flow.lease();
                match steps
                    .persist_step(
                        auth,
                        &lease,
                        &new_input,
                        task,
                        TaskWrite::SnapshotAndLog,
                        &[status],
                    )
                    .await
                {
                    Ok(()) => {
                        inner.notices.task_saved_as(auth, task);
                        self.history.extend(new_input);
                        return Ok(());
                    }
                    Err(AgentError::Unsupported { .. }) => {}
                    Err(err) => return Err(err),
                }
            }
        }
        let status = async {
            if began {
                inner.persist_status(auth, task).await
            } else {
                Ok(())
            }
        };
        let input = async {
            if new_input.is_empty() {
                Ok(Vec::new())
            } else {
                inner.append_history(self.flow, new_input).await
            }
        };
        let (status, input) = tokio::join!(status, input);
        status?;
        self.history.extend(input?);
        Ok(())
    }

    /// The agent's `max_session_turns` stop rule: the thread's user turns so far against it.
    fn session_turns_exceeded(&self) -> Option<Outcome> {
        let max_turns = self.inner.agent.stop_rules().max_session_turns?;
        let turns = self
            .history
            .iter()
            .filter(|m| m.role == LlmRole::User && m.metadata.contains_key(META_MESSAGE))
            .count() as u64;
        (turns > u64::from(max_turns)).then(|| Outcome::Failed {
            error: AgentError::BudgetExceeded {
                limit: "max_session_turns".into(),
                used: turns,
                max: u64::from(max_turns),
            },
            reason: "max_session_turns".into(),
        })
    }

    /// Whether the run must stop, at a checkpoint: canceled here, or the thread's lease lost.
    /// A cancel left in the store by another process cancels the run's token through the
    /// run's watcher (within a poll interval), so checkpoints need no store read of their own:
    /// that was a round trip at every checkpoint of every run, for a flag almost never set.
    pub(super) fn stop_requested(&self) -> Option<Outcome> {
        if self.flow.lost.is_cancelled() {
            return Some(Outcome::Abandoned);
        }
        self.active.token.is_cancelled().then(|| Outcome::Canceled {
            reason: self.active.reason(),
        })
    }

    /// [`Self::stop_requested`], also reading the store's cancel flag: at the start of a run,
    /// so that a cancel accepted while the task waited is honoured before any work.
    async fn stop_requested_durably(&self) -> Option<Outcome> {
        if let Some(outcome) = self.stop_requested() {
            return Some(outcome);
        }
        let memory = self.inner.runtime.memory_service();
        super::cancel::cancel_if_flagged(memory.as_ref(), &self.flow.auth, &self.active)
            .await
            .map(|reason| Outcome::Canceled { reason })
    }

    /// After a crash or an approval: tool calls of this task with no persisted result. A
    /// call waiting for an approval runs (or is refused) as decided; otherwise it is re-run
    /// when the tool is idempotent and answered with an "interrupted" error when not.
    async fn resume_interrupted_calls(&mut self) -> AgentResult<Option<Outcome>> {
        let answered: HashSet<String> = self
            .history
            .iter()
            .filter_map(|m| m.tool_call_id.clone())
            .collect();
        // Calls run in order and each persists its result before the next starts, so only the
        // first unanswered call of a step can have started; the later ones never ran.
        let dangling: Vec<(ToolCall, bool)> = self
            .history
            .iter()
            .filter(|m| m.role == LlmRole::Assistant && is_tagged(m, &self.task.id))
            .flat_map(|m| {
                m.tool_calls
                    .iter()
                    .filter(|c| !answered.contains(&c.id))
                    .enumerate()
                    .map(|(i, c)| (c.clone(), i == 0))
                    .collect::<Vec<_>>()
            })
            .collect();
        let EngineMeta {
            pending_approval: pending,
            approval_decision: decision,
            ..
        } = EngineMeta::of(&self.task.metadata);
        for (call, may_have_started) in dangling {
            let awaited = pending.as_ref().filter(|p| {
                p.action.metadata.get("call_id").and_then(Value::as_str) == Some(call.id.as_str())
            });
            // Asynchronous tools: a call still waiting, answered by callback, or timed out.
            let asynchronous = self.async_result(&call).await?;
            let result = match (awaited, &decision) {
                _ if asynchronous.is_some() => asynchronous.unwrap_or(ToolRun::Pending {
                    call_id: call.id.clone(),
                }),
                (Some(request), Some(decision)) if decision.request_id == request.request_id => {
                    self.obs
                        .emit(RunEvent::approval_decided(request, decision))
                        .await;
                    if decision.outcome == ApprovalOutcome::Approved {
                        self.call_tool(&call, true).await
                    } else {
                        let reason = decision
                            .reason
                            .clone()
                            .unwrap_or_else(|| "denied by the approver".into());
                        self.obs
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
                            .inner
                            .agent
                            .tool(&call.name)
                            .is_some_and(|t| t.tool.idempotent()) =>
                {
                    self.call_tool(&call, false).await
                }
                (None, _) => ToolRun::Done {
                    output: json!(format!(
                        // Its start was recorded but not its result: the run stopped in
                        // between (a crash or restart, a lost lease, or a store that could
                        // not save the result), and which one is not known here.
                        "tool call `{}` may have started, but its result was never saved (the run stopped before it could be: a restart, a lost thread lease or a store failure); it is not run again",
                        call.name
                    )),
                    is_error: true,
                },
            };
            match result.output_or_stop(&self.active) {
                Ok((output, is_error)) => {
                    self.persist_tool_result(&call, output, is_error).await?;
                }
                Err(outcome) => return Ok(Some(outcome)),
            }
        }
        if clear_approval(&mut self.task) {
            let auth = &self.flow.auth;
            self.inner
                .runtime
                .task_manager()
                .save_task(auth, &self.task)
                .await?;
            self.inner.notices.task_saved_as(auth, &self.task);
        }
        Ok(None)
    }

    /// After a crash: the ending the task's last persisted step already decided, so that the
    /// resumed run finishes from it instead of asking the model again (a paid call, maybe a
    /// different answer and new tool calls). The step loop decides the same from the same
    /// entries: a final answer (a response with no tool calls under `stop_on_response`, or
    /// an answer the run's ending wrote, marked with its stop reason), or a step whose tool
    /// calls, all answered by now, fired a stop rule. `None` when the next step is due: no
    /// step yet, new input after the last one, or a step that fired no rule.
    fn persisted_ending(&self) -> Option<Outcome> {
        let (history, task_id) = (&self.history, &self.task.id);
        let last = history.iter().rposition(|m| is_tagged(m, task_id))?;
        // The entries of the last step: its assistant message and then its tool results.
        let step = history[..=last]
            .iter()
            .rposition(|m| m.role == LlmRole::Assistant && is_tagged(m, task_id))?;
        if history[step..=last]
            .iter()
            .any(|m| m.role != LlmRole::Assistant && m.role != LlmRole::Tool)
        {
            return None;
        }
        let assistant = &history[step];
        let agent = &self.inner.agent;
        let rules = agent.stop_rules();
        if assistant.tool_calls.is_empty() {
            let stopped = assistant.metadata.get(META_STOP).and_then(Value::as_str);
            let reason = match stopped {
                Some("session_stop") => "session_stop",
                Some("stop_tool") => "stop_tool",
                Some(_) => "response",
                None if rules.stop_on_response => "response",
                None => return None,
            };
            return Some(Outcome::Answer {
                text: assistant.content.clone(),
                reason,
                logged: AnswerLog::InHistory,
            });
        }
        let result = |call: &ToolCall| {
            history[step..=last]
                .iter()
                .find(|m| m.tool_call_id.as_deref() == Some(call.id.as_str()))
        };
        let calls = &assistant.tool_calls;
        // The step loop's order: lifecycle tools, the stop tool, a handoff to a human.
        let lifecycle = calls.iter().find_map(|call| match call.name.as_str() {
            SESSION_STOP_TOOL if rules.lifecycle_tools => Some(session_stop(call)),
            SESSION_FAIL_TOOL if rules.lifecycle_tools => Some(session_fail(call)),
            _ => None,
        });
        let stop_tool = || {
            calls
                .iter()
                .filter(|call| rules.stop_tool.as_deref() == Some(call.name.as_str()))
                .filter_map(result)
                .find(|entry| !entry.metadata.contains_key(META_IS_ERROR))
                .map(|entry| Outcome::Answer {
                    text: entry.content.clone(),
                    reason: "stop_tool",
                    logged: AnswerLog::Unwritten,
                })
        };
        let handoff = || {
            calls
                .iter()
                .find(|call| call.name == ASK_HUMAN_TOOL && agent.human_handoff())
                .map(|call| Outcome::InputRequired {
                    question: handoff_question(call),
                })
        };
        lifecycle.or_else(stop_tool).or_else(handoff)
    }
}

/// How a `session_stop` call ends the run: completed with its `result`.
pub(super) fn session_stop(call: &ToolCall) -> Outcome {
    Outcome::Answer {
        text: call.arguments.get("result").map(render).unwrap_or_default(),
        reason: "session_stop",
        logged: AnswerLog::Unwritten,
    }
}

/// How a `session_fail` call ends the run: failed with its `error`.
pub(super) fn session_fail(call: &ToolCall) -> Outcome {
    Outcome::Failed {
        error: AgentError::ToolFailed {
            tool: SESSION_FAIL_TOOL.into(),
            message: call
                .arguments
                .get("error")
                .map(render)
                .unwrap_or_else(|| "the agent gave up".into()),
        },
        reason: "session_fail".into(),
    }
}

/// The question an `ask_human` call hands to the human.
pub(super) fn handoff_question(call: &ToolCall) -> String {
    call.arguments
        .get("question")
        .map(render)
        .unwrap_or_default()
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
