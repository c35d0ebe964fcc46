//! The step loop: model calls, tool calls judged by policy and run in order, and the
//! stop rules; also the direct (model-less) tool call of the public API.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

use futures::FutureExt;
use keel_core::RunAction;
use keel_core::{AgentError, AgentResult, Part, RunContext, Task, TaskId, ThreadId};
use keel_events::payload::{
    ActionCompletedPayload, ActionFailedPayload, MessagePersistedPayload, StopEvaluatedPayload,
    ToolResultPersistedPayload,
};
use keel_events::RunEvent;
use keel_llm::{prepare_manifest_reusing, ManifestEstimates, ManifestIds};
use keel_llm::{LlmMessage, LlmRequest, LlmResponse, LlmRole, ToolCall};
use keel_runtime::AuthContext;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::context::*;
use super::state::*;
use crate::agent::{ASK_HUMAN_TOOL, SESSION_FAIL_TOOL, SESSION_STOP_TOOL};
use crate::infer::{after_call, before_call, stream_response};
pub(super) use crate::infer::{output_checkpoint, step_checkpoint, CallSite};
use crate::observe::RunObs;
use crate::{ToolContext, ToolVerdict};

impl Inner {
    pub(super) async fn step_loop(
        &self,
        scope: &Scope<'_>,
        task: &Task,
        history: &mut Vec<LlmMessage>,
    ) -> AgentResult<Outcome> {
        let (flow, ctx, run, obs) = (scope.flow, scope.ctx, scope.run, scope.obs);
        let llm = self.model();
        let profile = llm.profile();
        let tools = Arc::new(self.agent.tool_specs());
        let rules = self.agent.stop_rules().clone();
        let mut invalid_calls: HashMap<String, u32> = HashMap::new();
        // The model's view of the thread and its token estimates, carried from one step to
        // the next so a step works on what it adds (decision 82).
        let mut view = ModelView::default();
        let mut estimates = ManifestEstimates::default();
        for step in next_step(history, task)..=rules.max_steps {
            if let Some(outcome) = self.stop_before_step(flow, run) {
                return Ok(outcome);
            }
            if let Err(error) = step_checkpoint(obs).await {
                return Ok(budget_failure(error));
            }
            self.agent.lifecycle.before_step(ctx, step).await;
            if let Some(outcome) = self.inject_queued(scope, task, history).await? {
                return Ok(outcome);
            }
            obs.emit(RunEvent::queue_drained().step(step)).await;
            let system = self.system_prompt(ctx).await;
            // Kept only when the agent compacts automatically: a compaction assembles the
            // view again, prompt first.
            let again = self.agent.compaction().map(|_| system.clone());
            let mut system = Some(system);
            let mut compacted = None;
            let (request, manifest) = loop {
                let messages = view
                    .messages(
                        system.take().or_else(|| again.clone()).unwrap_or_default(),
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
                if let (None, Some(prompt)) = (&compacted, &again) {
                    if let Some(done) = self
                        .compact_when_over(scope, history, &manifest, prompt, llm.as_ref())
                        .await?
                    {
                        compacted = Some((done, manifest.total_estimated_tokens));
                        drop(request);
                        view = ModelView::default();
                        estimates = ManifestEstimates::default();
                        continue;
                    }
                }
                if let Some(((result, window), before)) = compacted.take() {
                    obs.emit(
                        super::compaction::compacted_event(
                            &result,
                            window,
                            before,
                            manifest.total_estimated_tokens,
                        )
                        .step(step),
                    )
                    .await;
                }
                break (request, manifest);
            };
            let site = CallSite {
                llm: llm.as_ref(),
                profile: &profile,
                step,
            };
            let response = match self.model_call(scope, &site, &manifest, request).await {
                Ok(response) => response,
                Err(outcome) => return Ok(outcome),
            };
            if let Some(outcome) = self.stop_requested(flow, run) {
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
                RunEvent::message_persisted(MessagePersistedPayload {
                    role: "assistant".to_owned(),
                    tool_calls: response.tool_calls.len(),
                })
                .step(step),
            )
            .await;
            self.agent
                .lifecycle
                .after_model_call(ctx, step, &response)
                .await;
            if let Err(error) = output_checkpoint(obs).await {
                return Ok(budget_failure(error));
            }
            if response.tool_calls.is_empty() {
                let stop = rules.stop_on_response;
                stop_evaluated(obs, step, stop.then_some("response")).await;
                self.agent.lifecycle.after_step(ctx, step).await;
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
                if let Some(outcome) = self.stop_requested(flow, run) {
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
                    _ => match self.hooked_tool_call(scope, call).await {
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
                    RunEvent::tool_result_persisted(ToolResultPersistedPayload {
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
            self.agent.lifecycle.after_step(ctx, step).await;
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
        Ok(steps_exhausted(rules.max_steps))
    }

    /// One model call of the run, a step's or an `infer` part's, through the checkpoints
    /// `Inference` also offers outside the engine: `context.prepared`, the budget's call
    /// check, `llm.call.started`, the application's `before_model_call` hooks, the streamed
    /// call (given up when the run is canceled or the lease lost), then usage and
    /// `llm.call.completed`. `Err` is how the run ends instead. The step check before and the
    /// output check after are the caller's ([`step_checkpoint`], [`output_checkpoint`]),
    /// since the answer is persisted in between.
    pub(super) async fn model_call(
        &self,
        scope: &Scope<'_>,
        site: &CallSite<'_>,
        manifest: &keel_core::ContextManifest,
        request: LlmRequest,
    ) -> Result<LlmResponse, Outcome> {
        let (flow, run, obs) = (scope.flow, scope.run, scope.obs);
        before_call(obs, site, manifest)
            .await
            .map_err(budget_failure)?;
        self.agent
            .lifecycle
            .before_model_call(scope.ctx, site.step, &request)
            .await;
        let called = Instant::now();
        let streamed = stream_response(obs, site, request);
        let response = tokio::select! {
            biased;
            () = run.token.cancelled() => return Err(Outcome::Canceled { reason: run_reason(run) }),
            () = flow.lost.cancelled() => return Err(Outcome::Abandoned),
            response = streamed.instrument(tracing::info_span!("step", step = site.step)) => response,
        };
        let response = response.map_err(|error| Outcome::Failed {
            error,
            reason: "model_error".into(),
        })?;
        after_call(obs, site, &response, called).await;
        Ok(response)
    }

    /// A model-chosen tool call with the application's lifecycle hooks around it: a veto
    /// becomes the call's error result without reaching policy or the tool.
    async fn hooked_tool_call(&self, scope: &Scope<'_>, call: &ToolCall) -> ToolRun {
        let hooks = &self.agent.lifecycle;
        let run = match hooks.before_tool_call(scope.ctx, call).await {
            ToolVerdict::Veto(reason) => ToolRun::Done {
                output: json!(format!("vetoed: {reason}")),
                is_error: true,
            },
            ToolVerdict::Run => self.call_tool(scope, call, false).await,
        };
        if let ToolRun::Done { output, is_error } = &run {
            hooks
                .after_tool_call(scope.ctx, call, output, *is_error)
                .await;
        }
        run
    }

    /// Decision 6: a message made only of tool calls runs them with no model, and the task
    /// fails when one fails.
    pub(super) async fn run_direct(
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
            if let Some(outcome) = self.stop_requested(flow, scope.run) {
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
    pub(super) async fn call_tool(
        &self,
        scope: &Scope<'_>,
        call: &ToolCall,
        preapproved: bool,
    ) -> ToolRun {
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
        let registered = inner.agent.tool(name).ok_or_else(|| {
            AgentError::invalid_input("tool", format!("the agent has no tool `{name}`"))
        })?;
        registered.validate(&arguments)?;
        let call = ToolCall::new(name, arguments);
        let task_id = TaskId::new();
        let obs = Arc::new(inner.run_obs(&context, &task_id));
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
            in_task: false,
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
}

/// The number of the task's next step: one after its model answers already in the history,
/// so that a resumed run continues counting where it stopped (an `infer` part is a step).
pub(super) fn next_step(history: &[LlmMessage], task: &Task) -> u32 {
    let done = history
        .iter()
        .filter(|m| m.role == LlmRole::Assistant && is_tagged(m, &task.id))
        .count();
    u32::try_from(done).unwrap_or(u32::MAX).saturating_add(1)
}

/// How a run ends that used the agent's `max_steps` stop rule up.
pub(super) fn steps_exhausted(max_steps: u32) -> Outcome {
    let error = AgentError::BudgetExceeded {
        limit: "max_steps".into(),
        used: u64::from(max_steps),
        max: u64::from(max_steps),
    };
    Outcome::Failed {
        error,
        reason: "max_steps".into(),
    }
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

/// The step's stop evaluation is done: which rule fired, if any (§6 order).
async fn stop_evaluated(obs: &RunObs, step: u32, fired: Option<&'static str>) {
    obs.emit(
        RunEvent::stop_evaluated(StopEvaluatedPayload {
            stop: fired.map(str::to_owned),
        })
        .step(step),
    )
    .await;
}
