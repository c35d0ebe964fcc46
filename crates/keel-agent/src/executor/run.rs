//! The run lifecycle: start or resume a task's run, cancel it, and finish it (its final
//! state, stop reason, report and task record).

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use keel_core::ApprovalOutcome;
use keel_core::{
    AgentError, AgentResult, Message, Part, PartContent, Role, RunContext, Task, TaskEvent, TaskId,
    TaskState, ThreadId,
};
use keel_events::RunEvent;
use keel_llm::{LlmMessage, LlmRole, ToolCall};
use keel_runtime::{AuthContext, LogLevel};
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::state::*;
use crate::agent::{ASK_HUMAN_TOOL, SESSION_FAIL_TOOL, SESSION_STOP_TOOL};
use crate::observe::RunObs;
use crate::task_meta::{clear_approval, EngineMeta};
use crate::thread_state::ThreadHost;
use crate::{TaskRest, ThreadState, ToolContext};

impl Inner {
    pub(super) async fn persist_status(&self, auth: &AuthContext, task: &Task) -> AgentResult<()> {
        self.persist_status_after(auth, task, Vec::new()).await
    }

    /// Save the task with `events` and then its status event appended to its log, in one
    /// store write (the status and what led to it commit together).
    pub(super) async fn persist_status_after(
        &self,
        auth: &AuthContext,
        task: &Task,
        events: Vec<TaskEvent>,
    ) -> AgentResult<()> {
        self.write_status_after(auth, task, events).await?;
        self.notices.task_saved(auth, &task.id);
        Ok(())
    }

    /// [`Self::persist_status_after`] without waking the task's waiters.
    pub(super) async fn write_status_after(
        &self,
        auth: &AuthContext,
        task: &Task,
        mut events: Vec<TaskEvent>,
    ) -> AgentResult<()> {
        events.push(TaskEvent::StatusUpdate {
            task_id: task.id.clone(),
            thread_id: task.thread_id.clone(),
            status: task.status().clone(),
            is_final: task.state().is_terminal(),
        });
        self.runtime
            .task_manager()
            .save_task_with_events(auth, task, &events)
            .await
    }

    /// The events, budget and policy of a run of `task_id` under `context`, reported to the
    /// executor's sinks.
    pub(super) fn run_obs(&self, context: &RunContext, task_id: &TaskId) -> RunObs {
        RunObs::new(
            &self.notices.sinks(),
            context,
            task_id,
            &self.agent.card().name,
            self.agent.budget_policy_for(context),
            self.agent.authorizer().clone(),
            self.runtime.logging_service(),
        )
    }

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
                *run.reason.lock().unwrap_or_else(|p| p.into_inner()) = Some(reason.to_owned());
                run.token.cancel();
            }
        }
    }

    /// Whether the run must stop, at a checkpoint: canceled here, or the thread's lease lost.
    /// A cancel left in the store by another process cancels the run's token through the
    /// run's watcher (within a poll interval), so checkpoints need no store read of their own:
    /// that was a round trip at every checkpoint of every run, for a flag almost never set.
    pub(super) fn stop_requested(&self, flow: &Flow, run: &ActiveRun) -> Option<Outcome> {
        if flow.lost.is_cancelled() {
            return Some(Outcome::Abandoned);
        }
        run.token.is_cancelled().then(|| Outcome::Canceled {
            reason: run_reason(run),
        })
    }

    /// [`Self::stop_requested`], also reading the store's cancel flag: at the start of a run,
    /// so that a cancel accepted while the task waited is honoured before any work.
    pub(super) async fn stop_requested_durably(
        &self,
        flow: &Flow,
        run: &ActiveRun,
    ) -> Option<Outcome> {
        if let Some(outcome) = self.stop_requested(flow, run) {
            return Some(outcome);
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

    /// [`Self::run_task`] of a task just read from the store.
    pub(super) async fn run_loaded_task(&self, flow: &Flow, mut task: Task) -> AgentResult<()> {
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
        self.driver.active.remove(&key);
        self.notices.task_saved(auth, task_id);
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

    pub(super) async fn record_event(
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
        self.notices.task_changed();
        Ok(message)
    }

    pub(super) async fn run_task_inner(
        &self,
        flow: &Flow,
        task: &mut Task,
        run: &ActiveRun,
    ) -> AgentResult<()> {
        let auth = &flow.auth;
        let thread = ThreadState {
            auth: auth.clone(),
            thread_id: flow.thread_id.clone(),
            host: self
                .shared()
                .ok_or_else(|| AgentError::internal("executor dropped"))?,
            cancel: run.token.clone(),
        };
        // A task whose thread was terminated after it was queued never starts.
        if thread.is_terminated().await? {
            mark_canceled(task, "thread terminated")?;
            return self.persist_status(auth, task).await;
        }
        let run_context = RunContext::ensure_task_context(task)?;
        let obs = Arc::new(self.run_obs(&run_context, &task.id));
        if let Some(outcome) = self.stop_requested_durably(flow, run).await {
            return self.finish(flow, &obs, task, outcome).await;
        }
        // The working status is written below, together with the run's new input.
        let began = task.state() != TaskState::Working;
        if began {
            task.begin()?;
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
            in_task: true,
        };
        let scope = Scope {
            flow,
            ctx: &ctx,
            run,
            obs: &obs,
        };

        // The task's user messages join the thread history once each (a resumed run finds
        // them there already).
        let task_manager = self.runtime.task_manager();
        let (history, events) = tokio::join!(
            self.read_history(flow),
            task_manager.get_task_events(auth, &task.id)
        );
        let (mut history, events) = (history?, events?);
        let seen = tag_values(&history, META_MESSAGE);
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
        let explicit = match direct {
            None => super::direct::explicit_parts(user_messages(&events).last()),
            Some(_) => None,
        };
        // Two independent writes, sent together (one SQLite batch, one Redis pipeline): the
        // task's working status and its input joining the thread history. Either may be
        // there without the other after a crash, and a resumed run handles both.
        let status = async {
            if began {
                self.persist_status(auth, task).await
            } else {
                Ok(())
            }
        };
        let input = async {
            if new_input.is_empty() {
                Ok(())
            } else {
                self.append(flow, &mut history, new_input).await
            }
        };
        let (status, input) = tokio::join!(status, input);
        status?;
        input?;
        if began {
            // The whole task rides on the final status only (the payload's contract).
            obs.emit(RunEvent::task_state_of(task)).await;
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
        if direct.is_none() && explicit.is_none() {
            self.agent.hooks.before_first_step(&ctx, &history).await?;
        }
        let outcome = match (direct, explicit) {
            (Some(calls), _) => self.run_direct(&scope, task, calls, &mut history).await?,
            (None, Some(items)) => self.run_explicit(&scope, task, items, &mut history).await?,
            (None, None) => match self
                .resume_interrupted_calls(&scope, task, &mut history)
                .await?
            {
                Some(outcome) => outcome,
                None => match self.persisted_ending(task, &history) {
                    Some(outcome) => outcome,
                    None => self.step_loop(&scope, task, &mut history).await?,
                },
            },
        };
        self.finish(flow, &obs, task, outcome).await
    }

    /// After a crash or an approval: tool calls of this task with no persisted result. A
    /// call waiting for an approval runs (or is refused) as decided; otherwise it is re-run
    /// when the tool is idempotent and answered with an "interrupted" error when not.
    pub(super) async fn resume_interrupted_calls(
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
        let EngineMeta {
            pending_approval: pending,
            approval_decision: decision,
            ..
        } = EngineMeta::of(&task.metadata);
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
                        // Its start was recorded but not its result: the run stopped in
                        // between (a crash or restart, a lost lease, or a store that could
                        // not save the result), and which one is not known here.
                        "tool call `{}` may have started, but its result was never saved (the run stopped before it could be: a restart, a lost thread lease or a store failure); it is not run again",
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
        if clear_approval(task) {
            self.runtime
                .task_manager()
                .save_task(&scope.flow.auth, task)
                .await?;
            self.notices.task_saved(&scope.flow.auth, &task.id);
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
    pub(super) fn persisted_ending(&self, task: &Task, history: &[LlmMessage]) -> Option<Outcome> {
        let last = history.iter().rposition(|m| is_tagged(m, &task.id))?;
        // The entries of the last step: its assistant message and then its tool results.
        let step = history[..=last]
            .iter()
            .rposition(|m| m.role == LlmRole::Assistant && is_tagged(m, &task.id))?;
        if history[step..=last]
            .iter()
            .any(|m| m.role != LlmRole::Assistant && m.role != LlmRole::Tool)
        {
            return None;
        }
        let assistant = &history[step];
        let rules = self.agent.stop_rules();
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
                recorded: true,
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
            SESSION_STOP_TOOL if rules.lifecycle_tools => Some(Outcome::Answer {
                text: call.arguments.get("result").map(render).unwrap_or_default(),
                reason: "session_stop",
                recorded: false,
            }),
            SESSION_FAIL_TOOL if rules.lifecycle_tools => Some(Outcome::Failed {
                error: AgentError::ToolFailed {
                    tool: SESSION_FAIL_TOOL.into(),
                    message: call
                        .arguments
                        .get("error")
                        .map(render)
                        .unwrap_or_else(|| "the agent gave up".into()),
                },
                reason: "session_fail".into(),
            }),
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
                    recorded: false,
                })
        };
        let handoff = || {
            calls
                .iter()
                .find(|call| call.name == ASK_HUMAN_TOOL && self.agent.human_handoff())
                .map(|call| Outcome::InputRequired {
                    question: call
                        .arguments
                        .get("question")
                        .map(render)
                        .unwrap_or_default(),
                })
        };
        lifecycle.or_else(stop_tool).or_else(handoff)
    }
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
