//! What a run reports and what it asks permission for: the run's event emitter (every sink
//! plus a [`ReportWriter`] sees each event with the same sequence number), its budget, and its
//! action authorizer, bundled so the step loop calls them at the seed's checkpoints.

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use keel_core::{
    AgentError, AgentResult, ApprovalDecision, ApprovalRequest, Artifact, RunAction, RunContext,
    TaskId,
};
use keel_events::payload::{ActionPolicyPayload, BudgetPayload};
use keel_events::{
    EventEmitter, EventSink, MultiSink, RedactionPolicy, ReportWriter, RunEvent, RunEventBuilder,
};
use keel_policy::{
    ActionAuthorizer, Authorization, AuthorizationObserver, BudgetPolicy, BudgetWarning,
    PolicyDecision,
};
use keel_runtime::{LogLevel, LoggingService};

/// The observability and control plane of one run.
pub(crate) struct RunObs {
    emitter: EventEmitter,
    /// `None` for model calls outside the engine, which keep no report.
    report: Option<ReportWriter>,
    budget: Mutex<Box<dyn BudgetPolicy>>,
    authorizer: Arc<ActionAuthorizer>,
    context: RunContext,
    logging: Arc<dyn LoggingService>,
    /// Artifact updates the run's tools logged, for the task's snapshot when the run rests
    /// (with whether each appends).
    artifacts: Mutex<Vec<(Artifact, bool)>>,
}

impl RunObs {
    /// The plane of a run of `task_id`: its events go to `sinks`, in order (the engine puts
    /// the run's meter first).
    pub(crate) fn new(
        sinks: &[Arc<dyn EventSink>],
        context: &RunContext,
        task_id: &TaskId,
        agent_name: &str,
        budget: Box<dyn BudgetPolicy>,
        authorizer: Arc<ActionAuthorizer>,
        logging: Arc<dyn LoggingService>,
    ) -> Self {
        // The report is persisted redacted: each event is masked as it is recorded. It is not
        // one of the sinks: `emit_reported` records every event in it after the sinks saw it,
        // so a failing sink never leaves the report short.
        let mut report = ReportWriter::new().redacting(RedactionPolicy::default());
        // A fork says in its report where it came from (`keel runs` shows it); the rest of the
        // context's metadata stays out of every report.
        if let Some(source) = context.metadata.get(crate::replay::FORKED_FROM) {
            let mut metadata = keel_core::Metadata::new();
            metadata.insert(crate::replay::FORKED_FROM.to_owned(), source.clone());
            report = report.with_metadata(metadata);
        }
        let mut fan_out = MultiSink::new();
        for sink in sinks {
            fan_out = fan_out.with(sink.clone());
        }
        Self {
            emitter: EventEmitter::new(context, Arc::new(fan_out))
                .with_task(task_id.clone())
                .with_agent_name(agent_name),
            report: Some(report),
            budget: Mutex::new(budget),
            authorizer,
            context: context.clone(),
            logging,
            artifacts: Mutex::new(Vec::new()),
        }
    }

    /// Go on with a run that already has events (a run resumed after a pause or a restart):
    /// `earlier` join the report first, and the next event is numbered after the last of
    /// them, so that the run keeps one sequence and one report.
    #[must_use]
    pub(crate) fn continuing(mut self, earlier: Vec<RunEvent>) -> Self {
        let Some(last) = earlier.iter().map(|e| e.sequence).max() else {
            return self;
        };
        if let Some(report) = &self.report {
            for event in &earlier {
                report.record(event);
            }
        }
        if let Some(step) = earlier.iter().filter_map(|e| e.step).max() {
            self.emitter.spans().resume_at_step(step);
        }
        self.emitter = self.emitter.continuing_after(last);
        self
    }

    /// The run's span ids.
    pub(crate) fn spans(&self) -> &keel_events::RunSpans {
        self.emitter.spans()
    }

    /// Note an artifact update already in the task's log.
    pub(crate) fn produced_artifact(&self, artifact: Artifact, append: bool) {
        self.artifacts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((artifact, append));
    }

    /// The artifact updates noted since the last call, in order.
    pub(crate) fn take_artifacts(&self) -> Vec<(Artifact, bool)> {
        std::mem::take(&mut *self.artifacts.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// The plane of model calls made outside the engine ([`crate::Inference`]): no task, no
    /// actions to authorize, log lines through `tracing`.
    pub(crate) fn for_inference(
        sink: Arc<dyn EventSink>,
        context: &RunContext,
        budget: Box<dyn BudgetPolicy>,
    ) -> Self {
        Self {
            emitter: EventEmitter::new(context, sink),
            // Nothing takes a report here: recording one would only grow with every call.
            report: None,
            budget: Mutex::new(budget),
            authorizer: Arc::new(ActionAuthorizer::new(keel_policy::CapabilityPolicy::new())),
            context: context.clone(),
            logging: Arc::new(keel_runtime::TracingLoggingService),
            artifacts: Mutex::new(Vec::new()),
        }
    }

    /// Replace the budget policy (before any check).
    pub(crate) fn replace_budget(&self, budget: Box<dyn BudgetPolicy>) {
        *self.budget.lock().unwrap_or_else(|p| p.into_inner()) = budget;
    }

    /// What the run has used so far.
    pub(crate) fn usage(&self) -> keel_core::BudgetUsage {
        self.budget
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .usage()
    }

    /// Emit an event. A sink failing never stops the run (only authorization checkpoints
    /// fail closed); it is logged.
    pub(crate) async fn emit(&self, event: RunEventBuilder) {
        if let Err(err) = self.deliver(event).await {
            self.logging
                .log(LogLevel::Warn, &format!("an event sink failed: {err}"));
        }
    }

    /// Number and deliver an event to the sinks, then record it in the report if there is one.
    async fn deliver(&self, event: RunEventBuilder) -> AgentResult<()> {
        match &self.report {
            Some(report) => self.emitter.emit_reported(event, report).await,
            None => self.emitter.emit(event).await.map(drop),
        }
    }

    /// Run a budget check: warnings become `budget.warning` events, an exceeded limit a
    /// `budget.exceeded` event and the error.
    pub(crate) async fn budget(
        &self,
        check: impl FnOnce(&mut dyn BudgetPolicy) -> AgentResult<Vec<BudgetWarning>>,
    ) -> AgentResult<()> {
        let (result, usage) = {
            let mut budget = self.budget.lock().unwrap_or_else(|p| p.into_inner());
            let result = check(budget.as_mut());
            (result, budget.usage())
        };
        match result {
            Ok(warnings) => {
                for warning in warnings {
                    self.emit(RunEvent::budget_warning(BudgetPayload {
                        limit: warning.limit.as_str().into(),
                        used: warning.used,
                        max: warning.max,
                        usage: Some(usage.clone()),
                    }))
                    .await;
                }
                Ok(())
            }
            Err(err) => {
                if let AgentError::BudgetExceeded { limit, used, max } = &err {
                    self.emit(RunEvent::budget_exceeded(BudgetPayload {
                        limit: limit.clone(),
                        used: *used,
                        max: *max,
                        usage: Some(usage),
                    }))
                    .await;
                }
                Err(err)
            }
        }
    }

    /// Record model usage after a call.
    pub(crate) fn record_llm_usage(&self, input: u64, output: u64) {
        self.budget
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .record_llm_usage(input, output);
    }

    /// Record what a priced model call cost, in micro-dollars.
    pub(crate) fn record_llm_cost(&self, cost_micros: u64) {
        self.budget
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .record_llm_cost(cost_micros);
    }

    /// Judge an action with the agent's policy narrowed by the run's permissions, emitting
    /// `action.policy`, `approval.required` and `approval.decided` as they happen.
    pub(crate) async fn authorize(&self, action: &RunAction) -> AgentResult<Authorization> {
        self.authorizer
            .authorize_observed(action, &self.context, &EmitObserver(self))
            .await
    }

    /// The run report built from every event so far, redacted, as the JSON text the run
    /// store keeps, taking the recorded events: the run is over when its report is saved,
    /// and the events are not copied for it.
    pub(crate) fn take_report_json(&self) -> AgentResult<keel_core::stored::JsonText> {
        match &self.report {
            Some(report) => report.take_json(),
            None => Err(AgentError::internal("this run keeps no report")),
        }
    }
}

/// Emits the authorization checkpoints; an emit failure stops the action (fail closed).
struct EmitObserver<'a>(&'a RunObs);

impl EmitObserver<'_> {
    async fn emit(&self, event: RunEventBuilder) -> AgentResult<()> {
        self.0.deliver(event).await
    }
}

#[async_trait]
impl AuthorizationObserver for EmitObserver<'_> {
    async fn policy_decided(
        &self,
        action: &RunAction,
        decision: &PolicyDecision,
    ) -> AgentResult<()> {
        self.emit(RunEvent::action_policy(ActionPolicyPayload {
            action_id: action.id.clone(),
            decision: decision.as_str().into(),
            reason: decision.reason().map(Into::into),
            capability: decision.capability().map(Into::into),
        }))
        .await
    }

    async fn approval_required(&self, request: &ApprovalRequest) -> AgentResult<()> {
        self.emit(RunEvent::approval_required(request)).await
    }

    async fn approval_decided(
        &self,
        request: &ApprovalRequest,
        decision: &ApprovalDecision,
    ) -> AgentResult<()> {
        self.emit(RunEvent::approval_decided(request, decision))
            .await
    }
}
