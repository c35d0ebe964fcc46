//! Tool calls of a run: prepared as a [`RunAction`], judged by policy, checked against the
//! budget, run (a panic caught, a cancel honoured) and reported; also a message of tool
//! calls run without the model (decision 6) and the public direct call.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Instant;

use futures::FutureExt;
use keel_core::{AgentError, AgentResult, RunAction, RunContext, TaskId, ThreadId};
use keel_events::payload::{ActionCompletedPayload, ActionFailedPayload};
use keel_events::RunEvent;
use keel_llm::{LlmMessage, ToolCall};
use keel_runtime::AuthContext;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::run::RunLoop;
use super::state::*;
use crate::observe::RunObs;
use crate::{ToolContext, ToolVerdict};

impl RunLoop<'_> {
    /// A model-chosen tool call with the application's lifecycle hooks around it: a veto
    /// becomes the call's error result without reaching policy or the tool.
    pub(super) async fn hooked_tool_call(&self, call: &ToolCall) -> ToolRun {
        let hooks = &self.inner.agent.lifecycle;
        let run = match hooks.before_tool_call(&self.ctx, call).await {
            ToolVerdict::Veto(reason) => ToolRun::Done {
                output: json!(format!("vetoed: {reason}")),
                is_error: true,
            },
            ToolVerdict::Run => self.call_tool(call, false).await,
        };
        if let ToolRun::Done { output, is_error } = &run {
            hooks
                .after_tool_call(&self.ctx, call, output, *is_error)
                .await;
        }
        run
    }

    /// Decision 6: a message made only of tool calls runs them with no model, and the task
    /// fails when one fails.
    pub(super) async fn run_direct(&mut self, calls: Vec<ToolCall>) -> AgentResult<Outcome> {
        let answered: HashSet<String> = self
            .history
            .iter()
            .filter_map(|m| m.tool_call_id.clone())
            .collect();
        let mut outputs = Vec::new();
        for call in &calls {
            if answered.contains(&call.id) {
                continue;
            }
            if let Some(outcome) = self.stop_requested() {
                return Ok(outcome);
            }
            let mut request = LlmMessage::assistant("", vec![call.clone()]);
            tag(&mut request, &self.task.id);
            self.append(vec![request]).await?;
            let (output, is_error) = match self
                .call_tool(call, false)
                .await
                .output_or_stop(&self.active)
            {
                Ok(done) => done,
                Err(outcome) => return Ok(outcome),
            };
            self.persist_tool_result(call, output.clone(), is_error)
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
            logged: AnswerLog::Unwritten,
        })
    }

    /// Prepare, judge and run one tool call. Arguments are checked before the action is
    /// prepared and again right before the tool runs; unknown tools, invalid arguments,
    /// denials, failures and panics all become error outputs the model sees.
    pub(super) async fn call_tool(&self, call: &ToolCall, preapproved: bool) -> ToolRun {
        let (obs, run) = (&self.obs, &self.active);
        let Some(registered) = self.inner.agent.tool(&call.name) else {
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
        let action = match admit(obs, registered.tool.as_ref(), call, preapproved).await {
            Ok(action) => action,
            Err(AgentError::ApprovalRequired { request }) => return ToolRun::Approval(request),
            Err(error @ AgentError::BudgetExceeded { .. }) => return ToolRun::Stop(error),
            Err(AgentError::ActionDenied { reason, .. }) => {
                return ToolRun::Done {
                    output: json!(format!("denied: {reason}")),
                    is_error: true,
                }
            }
            Err(err) => {
                return ToolRun::Done {
                    output: json!(format!("denied: {err}")),
                    is_error: true,
                }
            }
        };
        // Asynchronous tools: dispatch, persist the pending call, and wait for the callback.
        if let Some(dispatch) = registered.tool.asynchronous() {
            return self.dispatch_async(call, dispatch).await;
        }
        let started = Instant::now();
        let span = tracing::info_span!("tool", name = %call.name, call_id = %call.id);
        // The tool sees its own call's span, so what it delegates or requests joins the trace
        // under it.
        let ctx = self
            .ctx
            .for_call(obs.spans().tool_call_span(&action.id), action.id.clone());
        // The call runs in this task: a spawned task would cost a cross-thread hand-off per
        // tool call for nothing, since the run waits for it anyway. Canceling drops the
        // future (the same as aborting a spawned one); a panic is caught and becomes the
        // tool's error, as a spawned task's would have.
        let call_future =
            std::panic::AssertUnwindSafe(registered.tool.call(call.arguments.clone(), &ctx))
                .catch_unwind()
                .instrument(span);
        let (output, is_error) = tokio::select! {
            biased;
            () = run.token.cancelled() => return ToolRun::Canceled,
            joined = call_future => match joined {
                Ok(Ok(value)) => (value, false),
                Ok(Err(err)) => (json!(err.tool_message()), true),
                Err(panic) => (
                    json!(format!("tool `{}` panicked: {}", call.name, panic_message(&*panic))),
                    true,
                ),
            },
        };
        let reported = if is_error {
            Err(render(&output))
        } else {
            Ok(&output)
        };
        action_ended(obs, &action, reported, started).await;
        let files = ctx.take_attached();
        if !is_error && !files.is_empty() {
            self.attached
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(call.id.clone(), files);
        }
        ToolRun::Done { output, is_error }
    }
}

impl AgentExecutor {
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
        inner.agent.refresh_tools().await;
        let registered = inner.agent.tool(name).ok_or_else(|| {
            AgentError::invalid_input("tool", format!("the agent has no tool `{name}`"))
        })?;
        registered.validate(&arguments)?;
        let call = ToolCall::new(name, arguments);
        let task_id = TaskId::new();
        let obs = Arc::new(inner.run_obs(auth, &context, &task_id));
        let action = admit(&obs, registered.tool.as_ref(), &call, false).await?;
        let ctx = ToolContext {
            auth: auth.clone(),
            run: context,
            task_id,
            thread_id: thread_id.clone(),
            thread: self.thread(auth, thread_id),
            cancel: CancellationToken::new(),
            runtime: inner.runtime.clone(),
            events: Some(obs.clone()),
            in_task: false,
            call: None,
            attached: None,
        };
        let ctx = ctx.for_call(obs.spans().tool_call_span(&action.id), action.id.clone());
        let started = Instant::now();
        match registered.tool.call(call.arguments.clone(), &ctx).await {
            Ok(output) => {
                action_ended(&obs, &action, Ok(&output), started).await;
                Ok(output)
            }
            Err(err) => {
                action_ended(&obs, &action, Err(err.tool_message()), started).await;
                Err(err.into_tool_failure(name))
            }
        }
    }
}

/// The checkpoints before a tool runs, the same for a run's call and a direct one: the
/// action is prepared and requested (`action.requested`), judged by policy unless
/// `preapproved` (a denial emits `action.denied`; an action that could not be judged is
/// denied too: fail closed), checked against the budget, and started (`action.started`).
/// `Err` is why it does not run: [`AgentError::ActionDenied`],
/// [`AgentError::ApprovalRequired`], [`AgentError::BudgetExceeded`], or the policy's error.
async fn admit(
    obs: &RunObs,
    tool: &dyn crate::Tool,
    call: &ToolCall,
    preapproved: bool,
) -> AgentResult<Arc<RunAction>> {
    // Shared by its `action.requested` and `action.started` events, not copied for each.
    let action = Arc::new(tool_action(tool, call));
    obs.emit(RunEvent::action_requested(&action)).await;
    if !preapproved {
        match obs.authorize(&action).await {
            Ok(_) => {}
            Err(err @ AgentError::ApprovalRequired { .. }) => return Err(err),
            Err(err) => {
                let reason = match &err {
                    AgentError::ActionDenied { reason, .. } => reason.clone(),
                    other => other.to_string(),
                };
                obs.emit(RunEvent::action_denied(action.id.clone(), reason))
                    .await;
                return Err(err);
            }
        }
    }
    obs.budget(|b| b.check_tool_call()).await?;
    obs.emit(RunEvent::action_started(&action)).await;
    Ok(action)
}

/// The tool's answer as its action's last event: `action.completed` with the output, or
/// `action.failed` with the error's text.
async fn action_ended(
    obs: &RunObs,
    action: &RunAction,
    result: Result<&Value, String>,
    started: Instant,
) {
    let duration_ms = Some(started.elapsed().as_millis() as u64);
    let event = match result {
        Ok(output) => RunEvent::action_completed(ActionCompletedPayload {
            action_id: action.id.clone(),
            output: output.clone(),
            artifacts: Vec::new(),
            duration_ms,
        }),
        Err(error) => RunEvent::action_failed(ActionFailedPayload {
            action_id: action.id.clone(),
            error,
            duration_ms,
        }),
    };
    obs.emit(event).await;
}

/// The message a panic carried (`panic!` with a literal or a formatted string).
fn panic_message(panic: &(dyn std::any::Any + Send)) -> &str {
    panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("a panic without a message")
}

/// The action prepared for a tool call: the tool's declared capabilities always included,
/// its description and preview unless the tool's own action has them.
fn tool_action(tool: &dyn crate::Tool, call: &ToolCall) -> RunAction {
    let mut action = tool
        .prepare_action(&call.arguments)
        .unwrap_or_else(|| RunAction::tool_call(&call.name, call.arguments.clone()));
    for capability in tool.capabilities() {
        if !action.capabilities.contains(&capability) {
            action.capabilities.push(capability);
        }
    }
    if action.description.is_none() && !tool.description().is_empty() {
        action.description = Some(tool.description().to_owned());
    }
    if action.previews.is_empty() {
        action.previews.extend(tool.preview(&call.arguments));
    }
    action.metadata.insert("call_id".into(), json!(call.id));
    action
}
