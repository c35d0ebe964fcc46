//! The step loop: each step drains the thread's queue into the history, assembles the
//! model's view, calls the model between the budget checkpoints, persists the answer, runs
//! its tool calls in order and evaluates the stop rules.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

use keel_core::{AgentError, AgentResult, Part};
use keel_events::payload::{
    MessagePersistedPayload, QueueInjectedPayload, StopEvaluatedPayload, ToolResultPersistedPayload,
};
use keel_events::RunEvent;
use keel_llm::{prepare_manifest_reusing, ManifestEstimates, ManifestIds};
use keel_llm::{LlmMessage, LlmRequest, LlmResponse, LlmRole};
use serde::Deserialize;
use serde_json::{json, Value};
use tracing::Instrument;

use super::context::*;
use super::run::{handoff_question, session_fail, session_stop, RunLoop};
use super::state::*;
use crate::agent::{ASK_HUMAN_TOOL, SESSION_FAIL_TOOL, SESSION_STOP_TOOL};
pub(super) use crate::infer::CallSite;
use crate::infer::{after_call, before_call, output_checkpoint, step_checkpoint, stream_response};

impl RunLoop<'_> {
    pub(super) async fn step_loop(&mut self) -> AgentResult<Outcome> {
        let inner = self.inner;
        let agent = &inner.agent;
        let llm = inner.model();
        let profile = llm.profile();
        let rules = agent.stop_rules().clone();
        let mut invalid_calls: HashMap<String, u32> = HashMap::new();
        // The model's view of the thread and its token estimates, carried from one step to
        // the next so a step works on what it adds (decision 82).
        let mut view = ModelView::default();
        let mut estimates = ManifestEstimates::default();
        let mut step = self.next_step();
        loop {
            if let Err(outcome) = self.begin_step(step).await {
                return Ok(outcome);
            }
            agent.lifecycle.before_step(&self.ctx, step).await;
            if let Some(outcome) = self.inject_queued().await? {
                return Ok(outcome);
            }
            self.obs.emit(RunEvent::queue_drained().step(step)).await;
            // A tool source that changed (an MCP server's `tools/list_changed`) is offered as
            // it is now: new tools from this step on, removed ones gone.
            agent.refresh_tools().await;
            let tools = agent.shared_tool_specs();
            let system = self.system_prompt().await;
            // Kept only when the agent compacts automatically: a compaction assembles the
            // view again, prompt first.
            let again = agent.compaction().map(|_| system.clone());
            let mut system = Some(system);
            let mut compacted = None;
            let (request, manifest) = loop {
                let messages = view
                    .messages(
                        system.take().or_else(|| again.clone()).unwrap_or_default(),
                        &self.history,
                        &agent.card().name,
                        profile.supports_vision,
                        &self.ctx.thread,
                    )
                    .await;
                let request = LlmRequest::new(messages).with_tools(tools.clone());
                // Shared with its `context.prepared` event rather than copied for it.
                let manifest = Arc::new(prepare_manifest_reusing(
                    &request,
                    &profile,
                    ManifestIds::from_run_context(&self.ctx.run, Some(&agent.card().name)),
                    &mut estimates,
                ));
                if let (None, Some(prompt)) = (&compacted, &again) {
                    if let Some(done) = self
                        .compact_when_over(&manifest, prompt, llm.as_ref())
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
                    self.obs
                        .emit(
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
            let site = CallSite::new(llm.as_ref(), &profile, step);
            let response = match self.model_call(&site, &manifest, request).await {
                Ok(response) => response,
                Err(outcome) => return Ok(outcome),
            };
            if let Some(outcome) = self.stop_requested() {
                return Ok(outcome);
            }
            // Persist the assistant response before anything runs.
            let content = response.content.clone().unwrap_or_default();
            let mut assistant = LlmMessage::assistant(content.clone(), response.tool_calls.clone());
            tag(&mut assistant, &self.task.id);
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
            let logged = if parts.is_empty() {
                self.append(vec![assistant]).await?;
                None
            } else {
                Some(Box::new(self.persist_point(vec![assistant], parts).await?))
            };
            self.obs
                .emit(
                    RunEvent::message_persisted(MessagePersistedPayload {
                        role: "assistant".to_owned(),
                        tool_calls: response.tool_calls.len(),
                    })
                    .step(step),
                )
                .await;
            agent
                .lifecycle
                .after_model_call(&self.ctx, step, &response)
                .await;
            if let Err(outcome) = self.output_checkpoint().await {
                return Ok(outcome);
            }
            if response.tool_calls.is_empty() {
                let stop = rules.stop_on_response;
                self.stop_evaluated(step, stop.then_some("response")).await;
                agent.lifecycle.after_step(&self.ctx, step).await;
                if stop {
                    return Ok(Outcome::Answer {
                        text: content,
                        reason: "response",
                        // An empty answer went to the history alone (`append`).
                        logged: logged.map_or(AnswerLog::InHistory, AnswerLog::Written),
                    });
                }
                step = step.saturating_add(1);
                continue;
            }

            let mut lifecycle: Option<Outcome> = None;
            let mut stop_tool_output: Option<String> = None;
            let mut handoff: Option<String> = None;
            let mut repeated_invalid: Option<String> = None;
            for call in &response.tool_calls {
                if let Some(outcome) = self.stop_requested() {
                    return Ok(outcome);
                }
                let (output, is_error) = match call.name.as_str() {
                    SESSION_STOP_TOOL if rules.lifecycle_tools => {
                        lifecycle.get_or_insert(session_stop(call));
                        (json!("the task will end as completed"), false)
                    }
                    SESSION_FAIL_TOOL if rules.lifecycle_tools => {
                        lifecycle.get_or_insert(session_fail(call));
                        (json!("the task will end as failed"), false)
                    }
                    ASK_HUMAN_TOOL if agent.human_handoff() => {
                        handoff.get_or_insert(handoff_question(call));
                        (json!("the question was sent to the human; their answer follows as a user message"), false)
                    }
                    // The call stays unanswered in the history until a decision (or a
                    // callback) arrives.
                    _ => match self
                        .hooked_tool_call(call)
                        .await
                        .output_or_stop(&self.active)
                    {
                        Ok(done) => done,
                        Err(outcome) => return Ok(outcome),
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
                self.persist_tool_result(call, output, is_error).await?;
                self.obs
                    .emit(
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
            self.stop_evaluated(step, fired).await;
            agent.lifecycle.after_step(&self.ctx, step).await;
            if let Some(outcome) = lifecycle {
                return Ok(outcome);
            }
            if let Some(text) = stop_tool_output {
                return Ok(Outcome::Answer {
                    text,
                    reason: "stop_tool",
                    logged: AnswerLog::Unwritten,
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
            step = step.saturating_add(1);
        }
    }

    /// The number of the task's next step: one after its model answers already in the
    /// history, so that a resumed run continues counting where it stopped (an `infer` part
    /// is a step).
    pub(super) fn next_step(&self) -> u32 {
        let done = self
            .history
            .iter()
            .filter(|m| m.role == LlmRole::Assistant && is_tagged(m, &self.task.id))
            .count();
        u32::try_from(done).unwrap_or(u32::MAX).saturating_add(1)
    }

    /// The checkpoints before step `step` (a model call of the loop or an `infer` part):
    /// the agent's `max_steps` stop rule, a cancel or a lost lease, and the budget's step
    /// check. `Err` is how the run ends instead.
    pub(super) async fn begin_step(&self, step: u32) -> Result<(), Outcome> {
        let max_steps = self.inner.agent.stop_rules().max_steps;
        if step > max_steps {
            return Err(Outcome::Failed {
                error: AgentError::BudgetExceeded {
                    limit: "max_steps".into(),
                    used: u64::from(max_steps),
                    max: u64::from(max_steps),
                },
                reason: "max_steps".into(),
            });
        }
        if let Some(outcome) = self.stop_requested() {
            return Err(outcome);
        }
        // A step's start is where a run stops for a shutdown (decision 145): everything
        // before it is persisted and nothing of the step has begun, so the resumed run
        // neither repeats nor loses anything.
        if self.inner.driver.shutting_down.is_cancelled() {
            return Err(Outcome::HandedOn);
        }
        step_checkpoint(&self.obs).await.map_err(budget_failure)
    }

    /// The checkpoint after a model answer is persisted: the budget's output check.
    pub(super) async fn output_checkpoint(&self) -> Result<(), Outcome> {
        output_checkpoint(&self.obs).await.map_err(budget_failure)
    }

    /// One model call of the run, a step's or an `infer` part's, through the checkpoints
    /// `Inference` also offers outside the engine: `context.prepared`, the budget's call
    /// check, `llm.call.started`, the application's `before_model_call` hooks, the streamed
    /// call (given up when the run is canceled or the lease lost), then usage and
    /// `llm.call.completed`. `Err` is how the run ends instead. The step check before and the
    /// output check after are the caller's ([`Self::begin_step`], [`Self::output_checkpoint`]),
    /// since the answer is persisted in between.
    pub(super) async fn model_call(
        &self,
        site: &CallSite<'_>,
        manifest: &keel_core::ContextManifest,
        request: LlmRequest,
    ) -> Result<LlmResponse, Outcome> {
        let (obs, run) = (&self.obs, &self.active);
        before_call(obs, site, manifest, &request)
            .await
            .map_err(budget_failure)?;
        self.inner
            .agent
            .lifecycle
            .before_model_call(&self.ctx, site.step, &request)
            .await;
        let called = Instant::now();
        let streamed = stream_response(obs, site, request);
        let response = tokio::select! {
            biased;
            () = run.token.cancelled() => return Err(Outcome::Canceled { reason: run.reason() }),
            () = self.flow.lost.cancelled() => return Err(Outcome::Abandoned),
            response = streamed.instrument(tracing::info_span!("step", step = site.step)) => response,
        };
        let response = response.map_err(|error| Outcome::Failed {
            error,
            reason: "model_error".into(),
        })?;
        after_call(obs, site, &response, called).await;
        Ok(response)
    }

    /// The step's stop evaluation is done: which rule fired, if any (§6 order).
    async fn stop_evaluated(&self, step: u32, fired: Option<&'static str>) {
        self.obs
            .emit(
                RunEvent::stop_evaluated(StopEvaluatedPayload {
                    stop: fired.map(str::to_owned),
                })
                .step(step),
            )
            .await;
    }

    /// Queued messages and tools are injected before the next model call (§9).
    async fn inject_queued(&mut self) -> AgentResult<Option<Outcome>> {
        let (inner, flow) = (self.inner, self.flow);
        let store = inner.runtime.thread_store();
        let mut items = store.peek_queue(&flow.auth, &flow.thread_id, 64).await?;
        // Effects run first; what they queue is injected in this same pass.
        if crate::effects::fire_queued_effects(inner, &flow.auth, &flow.lease(), &items).await? {
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
            // An item already in the history (the one a turn started from, which heads the
            // queue while its run goes on) is acknowledged as taken but not added again.
            let seen = seen.get_or_insert_with(|| tag_values(&self.history, META_QUEUE_ITEM));
            if !seen.contains(&item.id) {
                match work {
                    QueuedWork::Task { .. } | QueuedWork::Effect(_) => continue,
                    QueuedWork::Message { message } => {
                        let mut entry = user_entry(&message);
                        tag(&mut entry, &self.task.id);
                        entry
                            .metadata
                            .insert(META_QUEUE_ITEM.into(), json!(item.id));
                        // The message joins the history and the task's log together.
                        inner
                            .write_message(flow, std::slice::from_ref(&entry), &self.task, message)
                            .await?;
                        self.history.push(entry);
                    }
                    QueuedWork::Tool { call } => {
                        let mut request = LlmMessage::assistant("", vec![call.clone()]);
                        tag(&mut request, &self.task.id);
                        request
                            .metadata
                            .insert(META_QUEUE_ITEM.into(), json!(item.id));
                        // Shown in the task's log too, so that its result has its call.
                        let part = Part::tool_call(&call.id, &call.name, call.arguments.clone());
                        self.persist_point(vec![request], vec![part]).await?;
                        match self
                            .call_tool(&call, false)
                            .await
                            .output_or_stop(&self.active)
                        {
                            Ok((output, is_error)) => {
                                self.persist_tool_result(&call, output, is_error).await?;
                            }
                            Err(stop) => outcome = Some(stop),
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
            self.obs
                .emit(RunEvent::queue_injected(QueueInjectedPayload {
                    items: injected.clone(),
                }))
                .await;
            store
                .ack_queue(&flow.auth, &flow.lease(), &injected)
                .await?;
        }
        Ok(outcome)
    }
}
