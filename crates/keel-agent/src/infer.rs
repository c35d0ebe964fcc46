//! One model call with its run's events and budget: the checkpoints the step loop goes
//! through around each call (`context.prepared`, the budget check, `llm.call.started`,
//! `llm.stream`, usage, `llm.call.completed`), written once and used by the engine and by
//! [`Inference`], which offers them to code outside the engine.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Instant;

use futures::StreamExt;
use keel_core::{AgentError, AgentResult, BudgetUsage, ContextManifest, RunContext};
use keel_events::payload::{LlmCallCompletedPayload, LlmCallStartedPayload};
use keel_events::{EventSink, RunEvent};
use keel_llm::{
    prepare_manifest, Llm, LlmRequest, LlmResponse, LlmStreamEvent, ManifestIds, ModelProfile,
};
use keel_policy::{BudgetEnforcer, BudgetPolicy};

use crate::observe::RunObs;

/// The model being called, and the step the call belongs to.
pub(crate) struct CallSite<'a> {
    pub(crate) llm: &'a dyn Llm,
    pub(crate) profile: &'a ModelProfile,
    pub(crate) step: u32,
}

impl<'a> CallSite<'a> {
    pub(crate) fn new(llm: &'a dyn Llm, profile: &'a ModelProfile, step: u32) -> Self {
        Self { llm, profile, step }
    }
}

/// Before a step (one model call of the run): the budget's step check, an exceeded budget
/// being the error after its `budget.exceeded` event.
pub(crate) async fn step_checkpoint(obs: &RunObs) -> AgentResult<()> {
    obs.budget(|b| b.check_step()).await
}

/// After the call's answer is kept: the budget's output check.
pub(crate) async fn output_checkpoint(obs: &RunObs) -> AgentResult<()> {
    obs.budget(|b| b.check_output_tokens()).await
}

/// Before the call: `context.prepared`, the budget's model-call checks (an exceeded budget
/// is the error, after its `budget.exceeded` event), then `llm.call.started`. A priced model's
/// call is first checked for cost: its context's estimated tokens at the input price and
/// its output limit (the request's, else the model's) at the output price (decision 186).
pub(crate) async fn before_call(
    obs: &RunObs,
    site: &CallSite<'_>,
    manifest: &ContextManifest,
    request: &LlmRequest,
) -> AgentResult<()> {
    obs.emit(RunEvent::context_prepared(manifest).step(site.step))
        .await;
    let estimate = site.profile.price.map(|price| {
        let output = request
            .max_output_tokens
            .or(site.profile.max_output_tokens)
            .unwrap_or(0);
        price.cost_micros(manifest.total_estimated_tokens, output)
    });
    obs.budget(|b| {
        let mut warnings = match estimate {
            Some(estimate) => b.check_llm_cost(estimate)?,
            None => Vec::new(),
        };
        warnings.extend(b.check_llm_call(manifest)?);
        Ok(warnings)
    })
    .await?;
    obs.emit(
        RunEvent::llm_call_started(LlmCallStartedPayload {
            provider: Some(site.profile.provider.clone()),
            model: Some(site.llm.model_name().to_owned()),
            estimated_input_tokens: manifest.total_estimated_tokens,
        })
        .step(site.step),
    )
    .await;
    Ok(())
}

/// The call itself, as a stream: text deltas become `llm.stream` events as they arrive;
/// the final response closes it.
pub(crate) async fn stream_response(
    obs: &RunObs,
    site: &CallSite<'_>,
    request: LlmRequest,
) -> AgentResult<LlmResponse> {
    let mut events = site.llm.stream(request);
    while let Some(event) = events.next().await {
        match event? {
            LlmStreamEvent::TextDelta { text } => {
                obs.emit(RunEvent::llm_stream(text).step(site.step)).await
            }
            LlmStreamEvent::Done { response } => return Ok(response),
            _ => {}
        }
    }
    Err(AgentError::llm(
        site.llm.model_name(),
        "the response stream ended without a final response",
    ))
}

/// After the call: its usage goes to the budget (output counted from a local estimate when
/// the provider reports none), then `llm.call.completed`. The output check
/// (`check_output_tokens`) is the caller's: the engine makes it once the answer is persisted.
pub(crate) async fn after_call(
    obs: &RunObs,
    site: &CallSite<'_>,
    response: &LlmResponse,
    called: Instant,
) {
    let output_tokens = response.output_tokens();
    obs.record_llm_usage(response.usage.input_tokens, output_tokens);
    // The cost of the tokens the event reports, so that the events add up to the usage.
    let cost_micros = site
        .profile
        .price
        .map(|price| price.cost_micros(response.usage.input_tokens, output_tokens));
    if let Some(cost) = cost_micros {
        obs.record_llm_cost(cost);
    }
    obs.emit(
        RunEvent::llm_call_completed(LlmCallCompletedPayload {
            provider: Some(site.profile.provider.clone()),
            model: Some(site.llm.model_name().to_owned()),
            input_tokens: response.usage.input_tokens,
            output_tokens,
            latency_ms: Some(called.elapsed().as_millis() as u64),
            // Why the model stopped, as the answer shows it (providers' own reasons are not
            // carried by `LlmResponse`): it asked for tools, or it answered.
            finish_reason: Some(
                if response.tool_calls.is_empty() {
                    "stop"
                } else {
                    "tool_calls"
                }
                .to_owned(),
            ),
            cost_micros,
        })
        .step(site.step),
    )
    .await;
}

/// Model calls made outside the engine, reported and budgeted as the engine's own are
/// (seed 000's `llm.infer(..., run_context=..., event_callback=...)`): each
/// [`infer`](Self::infer) counts a step, prepares the call's [`ContextManifest`], emits
/// `context.prepared`, checks the run's budget, emits `llm.call.started`, `llm.stream` and `llm.call.completed`,
/// and checks the output budget, all to the given sink, numbered from 1 for the run that
/// `context` names. Calls share one budget: the context's [`RunBudget`](keel_core::RunBudget)
/// under a [`BudgetEnforcer`] unless [`with_budget_policy`](Self::with_budget_policy) says
/// otherwise. The call does not go through the engine: no task, no thread history, no tools
/// run.
///
/// ```
/// use std::sync::Arc;
/// use keel_agent::Inference;
/// use keel_core::{RunBudget, RunContext};
/// use keel_events::InMemoryEventSink;
/// use keel_llm::{LlmMessage, LlmRequest, MockLlm};
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), keel_core::AgentError> {
/// let context = RunContext::new().with_budget(RunBudget { max_llm_calls: Some(1), ..Default::default() });
/// let sink = Arc::new(InMemoryEventSink::new());
/// let inference = Inference::new(Arc::new(MockLlm::new()), &context, sink.clone());
/// let request = LlmRequest::new(vec![LlmMessage::user("Summarize this context")]);
/// let answer = inference.infer(request.clone()).await?;
/// assert!(answer.content.is_some());
/// let types: Vec<String> = sink.events().iter().map(|e| e.event_type.to_string()).collect();
/// assert_eq!(types[0], "context.prepared");
/// assert!(inference.infer(request).await.is_err()); // a second call exceeds the budget
/// # Ok(())
/// # }
/// ```
pub struct Inference {
    llm: Arc<dyn Llm>,
    profile: ModelProfile,
    obs: RunObs,
    ids: ManifestIds,
    steps: AtomicU32,
}

impl std::fmt::Debug for Inference {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inference")
            .field("model", &self.llm.model_name())
            .field("calls", &self.steps.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl Inference {
    /// Calls to `llm` for the run `context` describes, reported to `sink`; the agent named in
    /// the events and manifests is the last of the context's chain.
    pub fn new(llm: Arc<dyn Llm>, context: &RunContext, sink: Arc<dyn EventSink>) -> Self {
        let budget: Box<dyn BudgetPolicy> = Box::new(BudgetEnforcer::new(context.budget.clone()));
        Self::with_parts(llm, context, sink, budget)
    }

    /// Decide the budget with `policy` instead of an enforcer of the context's budget.
    #[must_use]
    pub fn with_budget_policy(self, policy: Box<dyn BudgetPolicy>) -> Self {
        self.obs.replace_budget(policy);
        self
    }

    fn with_parts(
        llm: Arc<dyn Llm>,
        context: &RunContext,
        sink: Arc<dyn EventSink>,
        budget: Box<dyn BudgetPolicy>,
    ) -> Self {
        let agent_name = context.agent_chain.last().map(String::as_str);
        Self {
            profile: llm.profile(),
            ids: ManifestIds::from_run_context(context, agent_name),
            obs: RunObs::for_inference(sink, context, budget),
            llm,
            steps: AtomicU32::new(0),
        }
    }

    /// Call the model with `request`, as one step of the run; the events and budget checks
    /// are the engine's. An exceeded budget is [`AgentError::BudgetExceeded`] (after
    /// `budget.exceeded`), before the call when it is a step, call or input limit, after it
    /// when the answer spent the output budget.
    pub async fn infer(&self, request: LlmRequest) -> AgentResult<LlmResponse> {
        let step = self.steps.fetch_add(1, Ordering::Relaxed) + 1;
        let site = CallSite::new(self.llm.as_ref(), &self.profile, step);
        // Each call is a step of the run, as each of the engine's steps is one model call.
        step_checkpoint(&self.obs).await?;
        let manifest = prepare_manifest(&request, &self.profile, self.ids.clone());
        before_call(&self.obs, &site, &manifest, &request).await?;
        let called = Instant::now();
        let response = stream_response(&self.obs, &site, request).await?;
        after_call(&self.obs, &site, &response, called).await;
        output_checkpoint(&self.obs).await?;
        Ok(response)
    }

    /// What the calls have used so far.
    pub fn usage(&self) -> BudgetUsage {
        self.obs.usage()
    }
}
