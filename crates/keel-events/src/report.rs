//! [`RunReport`]: the durable, app-facing summary of a run, computed purely from its
//! events, and its one JSON form (see `docs/run-report.md`).
//!
//! What the report reads, by event type (payload structs from [`crate::payload`]):
//!
//! | type | read into |
//! |---|---|
//! | any | `run_id`, `task_id`, `thread_id`, `agent_name` (first seen), `started_at` (first timestamp), `event_count`, `events`, `budget.usage.steps` (highest `step`) |
//! | `task.status` | `final_state` (`state`), `final_task` (`task`, last one carried), `finished_at` (a `final` event's timestamp) |
//! | `task.artifact` | `artifacts` (`artifact`; `append` extends the earlier one's parts) |
//! | `context.prepared` | `context_manifests` (`manifest`) |
//! | `llm.call.started` | `model.started_calls` |
//! | `llm.call.completed` | `model` (`input_tokens`, `output_tokens`, `latency_ms`, `model`, `cost_micros`), `budget.usage.cost_micros` |
//! | `budget.warning` / `budget.exceeded` | `budget.warnings` / `budget.exceeded` |
//! | `action.requested` | a new [`ActionRecord`] (`action`) |
//! | `action.policy` | its `policy` |
//! | `approval.required` | `approvals`, and the action record's `approval_request` |
//! | `approval.decided` | the matching approval's (and action's) `decision`, by `request_id` |
//! | `action.started` / `completed` / `denied` / `failed` | the action's `status`, `output`, `artifacts`, `error`; `budget.usage.tool_calls` counts `action.started` |
//!
//! Other types are kept in `events` and otherwise ignored. A payload that does not read
//! is noted in `problems`, never a panic. A run is stored in a form of its own (its events
//! and a small summary, `crate::stored`, decision 257) from which [`RunReport::from_value`]
//! renders the report when it is read.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use keel_core::{
    ActionId, AgentError, AgentResult, ApprovalDecision, ApprovalRequest, Artifact, BudgetUsage,
    ContextManifest, Metadata, RunAction, RunId, TaskId, TaskState, ThreadId,
};
use serde::{de::DeserializeOwned, Deserialize, Serialize};
use serde_json::Value;

use crate::payload::{
    ActionCompletedPayload, ActionDeniedPayload, ActionFailedPayload, ActionPayload,
    ActionPolicyPayload, ApprovalDecidedPayload, ApprovalRequiredPayload, BudgetPayload,
    ContextPreparedPayload, LlmCallCompletedPayload, TaskArtifactPayload, TaskStatusPayload,
};
use crate::stored::StoredRun;
use crate::{EventType, RedactionPolicy, RunEvent};

/// The version of the [`RunReport`] JSON form. A report of any other version (but the stored
/// form of a run, [`STORED_RUN_VERSION`](crate::STORED_RUN_VERSION)) is refused with an
/// error naming the versions.
pub const RUN_REPORT_VERSION: u32 = 7;

/// Where an action got to.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ActionStatus {
    /// Requested; no outcome seen.
    #[default]
    Requested,
    /// Authorized and started.
    Started,
    /// Completed successfully.
    Completed,
    /// Refused by policy or an approver.
    Denied,
    /// Ran and failed.
    Failed,
}

/// The policy decision recorded for an action.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyRecord {
    /// `allow`, `deny` or `require_approval`.
    pub decision: String,
    /// Why.
    pub reason: Option<String>,
    /// The capability that caused it.
    pub capability: Option<String>,
}

/// One action's story: what it was, what policy and the approver said, how it ended.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ActionRecord {
    /// The action's id.
    pub action_id: ActionId,
    /// The action, from `action.requested` (or `action.started` when no request was seen).
    pub action: Option<RunAction>,
    /// The policy decision.
    pub policy: Option<PolicyRecord>,
    /// The approval request, when one was made.
    pub approval_request: Option<ApprovalRequest>,
    /// The approver's decision.
    pub approval: Option<ApprovalDecision>,
    /// Where it got to.
    pub status: ActionStatus,
    /// What it returned.
    pub output: Option<Value>,
    /// What it produced.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub artifacts: Vec<Artifact>,
    /// The denial reason or the failure.
    pub error: Option<String>,
    /// How long it ran.
    pub duration_ms: Option<u64>,
}

impl ActionRecord {
    fn new(action_id: ActionId) -> Self {
        Self {
            action_id,
            action: None,
            policy: None,
            approval_request: None,
            approval: None,
            status: ActionStatus::Requested,
            output: None,
            artifacts: Vec::new(),
            error: None,
            duration_ms: None,
        }
    }
}

/// One approval checkpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApprovalRecord {
    /// The request.
    pub request: ApprovalRequest,
    /// The decision, once one arrived.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decision: Option<ApprovalDecision>,
}

/// Model usage over the run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ModelMetrics {
    /// `llm.call.started` events.
    pub started_calls: u32,
    /// `llm.call.completed` events.
    pub calls: u32,
    /// Sum of reported input tokens.
    pub input_tokens: u64,
    /// Sum of reported output tokens.
    pub output_tokens: u64,
    /// Sum of reported latencies (calls without one add nothing).
    pub latency_ms: u64,
    /// Sum of the calls' costs in micro-dollars (unpriced calls add nothing; absent from
    /// JSON when none was priced).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cost_micros: u64,
    /// Models seen, in first-use order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub models: Vec<String>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Budget facts of the run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct BudgetReport {
    /// What the run used, derived from the events: steps (highest step), model calls
    /// (started), tool calls (`action.started`), input tokens (reported by completed calls,
    /// or the manifests' estimates when none reported any), output tokens, runtime (first
    /// event to the final one, or to the last when none is final).
    pub usage: BudgetUsage,
    /// Warnings raised.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<BudgetPayload>,
    /// The limit that stopped the run, if one did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exceeded: Option<BudgetPayload>,
}

/// The durable summary of a run. Persist it through
/// [`RunReport::redacted`] — action payloads and model context often carry credentials.
///
/// Its JSON is the derived serde form of this struct, except that `final_task`,
/// `context_manifests`, `actions` and `problems` are left out: each is already in the events
/// (the last `task.status` payload, the `context.prepared` payloads, the `action.*` events,
/// the payloads themselves), and reading a report rebuilds them from there.
// `remote = "Self"`: the derived code becomes `RunReport::serialize`/`deserialize`, wrapped by
// the trait impls below, which check the version and rebuild the fields left out.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(remote = "Self")]
pub struct RunReport {
    /// Report shape version ([`RUN_REPORT_VERSION`]).
    pub version: u32,
    /// The run (absent only for a report of no events).
    pub run_id: Option<RunId>,
    /// The task.
    pub task_id: Option<TaskId>,
    /// The thread.
    pub thread_id: Option<ThreadId>,
    /// The agent.
    pub agent_name: Option<String>,
    /// The first event's time.
    pub started_at: Option<DateTime<Utc>>,
    /// The final event's time.
    pub finished_at: Option<DateTime<Utc>>,
    /// The last task state seen.
    pub final_state: Option<TaskState>,
    /// The last serialized task carried by a status event (rebuilt from `events` on reading).
    #[serde(skip)]
    pub final_task: Option<Value>,
    /// Every context prepared for a model, in order (rebuilt from `events` on reading).
    #[serde(skip)]
    pub context_manifests: Vec<ContextManifest>,
    /// Every action, in request order (rebuilt from `events` on reading).
    #[serde(skip)]
    pub actions: Vec<ActionRecord>,
    /// Every approval checkpoint, in order.
    #[serde(default)]
    pub approvals: Vec<ApprovalRecord>,
    /// Task artifacts, chunks merged.
    #[serde(default)]
    pub artifacts: Vec<Artifact>,
    /// Model usage.
    #[serde(default)]
    pub model: ModelMetrics,
    /// Budget facts.
    #[serde(default)]
    pub budget: BudgetReport,
    /// How many events the report was built from.
    pub event_count: u64,
    /// The events themselves, in sequence order (what [`RunReplay`](crate::RunReplay) reads).
    #[serde(default)]
    pub events: Vec<RunEvent>,
    /// Payloads that could not be read, by event (rebuilt from `events` on reading).
    #[serde(skip)]
    pub problems: Vec<String>,
    /// Application metadata.
    #[serde(default, skip_serializing_if = "Metadata::is_empty")]
    pub metadata: Metadata,
}

impl Serialize for RunReport {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        RunReport::serialize(self, serializer)
    }
}

impl<'de> Deserialize<'de> for RunReport {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        RunReport::from_value(Value::deserialize(deserializer)?).map_err(serde::de::Error::custom)
    }
}

impl RunReport {
    /// Read a report: the documented JSON of version [`RUN_REPORT_VERSION`] (a rendered
    /// report, or one stored by an earlier Keel), or a run as the engine stores it, of version
    /// [`STORED_RUN_VERSION`](crate::STORED_RUN_VERSION), which is rendered here from its
    /// events (decision 257). Any other version (or none) is [`AgentError::InvalidInput`]
    /// naming the version found and the ones read; JSON that is not a report is
    /// [`AgentError::InvalidInput`] too.
    pub fn from_value(value: Value) -> AgentResult<RunReport> {
        let found = value.get("version").cloned().unwrap_or(Value::Null);
        let stored_version = |v: &u32| found.as_u64() == Some(u64::from(*v));
        if crate::stored::READ_STORED_RUN_VERSIONS
            .iter()
            .any(stored_version)
        {
            let stored = StoredRun::deserialize(value)
                .map_err(|e| AgentError::invalid_input("run_report", e.to_string()))?;
            let (events, metadata) = stored.into_events();
            let mut report = RunReport::of_events(events, Parts::All);
            report.metadata = metadata;
            return Ok(report);
        }
        if found.as_u64() != Some(u64::from(RUN_REPORT_VERSION)) {
            return Err(AgentError::invalid_input(
                "run_report.version",
                format!(
                    "a run report of version {found} cannot be read: this Keel reads version \
                     {RUN_REPORT_VERSION} (and versions {:?}, the forms it stores)",
                    crate::stored::READ_STORED_RUN_VERSIONS
                ),
            ));
        }
        let mut report = RunReport::deserialize(value)
            .map_err(|e| AgentError::invalid_input("run_report", e.to_string()))?;
        report.fill_shared_ids();
        let rebuilt = RunReport::summary_of(&report.events, Parts::All);
        report.final_task = rebuilt.final_task;
        report.context_manifests = rebuilt.context_manifests;
        report.actions = rebuilt.actions;
        report.problems = rebuilt.problems;
        Ok(report)
    }

    /// The report read from `value` ([`from_value`](Self::from_value)) as its documented
    /// JSON: what a reader of a stored run is shown (decision 257).
    pub fn render(value: Value) -> AgentResult<Value> {
        serde_json::to_value(RunReport::from_value(value)?).map_err(AgentError::internal)
    }

    /// When no event names a task (thread, agent) but the report does, they were left out
    /// as shared (as Keel stored reports of version 7, decision 93): every event has the
    /// report's.
    fn fill_shared_ids(&mut self) {
        fn fill<T: Clone>(
            events: &mut [RunEvent],
            shared: &Option<T>,
            field: fn(&mut RunEvent) -> &mut Option<T>,
        ) {
            if shared.is_some() && events.iter_mut().all(|e| field(e).is_none()) {
                events.iter_mut().for_each(|e| field(e).clone_from(shared));
            }
        }
        fill(&mut self.events, &self.task_id, |e| &mut e.task_id);
        fill(&mut self.events, &self.thread_id, |e| &mut e.thread_id);
        fill(&mut self.events, &self.agent_name, |e| &mut e.agent_name);
    }

    /// Build a report from events (sorted by sequence first; arrival order does not matter).
    pub fn from_events(events: &[RunEvent]) -> RunReport {
        Self::from_owned_events(events.to_vec())
    }

    /// [`from_events`](Self::from_events) taking the events by value, sparing a copy.
    pub fn from_owned_events(events: Vec<RunEvent>) -> RunReport {
        RunReport::of_events(events, Parts::All)
    }

    /// What the stored form of a run keeps of its report besides the events: its ids, final
    /// state, times and usage (`Parts::Stored` reads only the payloads those need).
    pub(crate) fn stored_summary(events: &[RunEvent]) -> RunReport {
        RunReport::summary_of(events, Parts::Stored)
    }

    fn of_events(mut events: Vec<RunEvent>, parts: Parts) -> RunReport {
        events.sort_by_key(|e| e.sequence);
        let mut report = RunReport::summary_of(&events, parts);
        report.events = events;
        report
    }

    /// The report of `events` (in sequence order), without the events themselves.
    fn summary_of(events: &[RunEvent], parts: Parts) -> RunReport {
        let mut builder = ReportBuilder {
            parts,
            ..ReportBuilder::default()
        };
        for event in events {
            builder.read(event);
        }
        builder.finish(events.len() as u64)
    }

    /// A copy with `policy` applied to everything free-form (event payloads, action
    /// payloads, outputs, the final task, metadata). Apply it whenever a report is
    /// persisted or leaves the process.
    ///
    /// Fails only when a configured extra key masks a structural field of the report (for
    /// instance `action`), so that the result would no longer be a report; use
    /// [`redacted_json`](Self::redacted_json) then.
    pub fn redacted(&self, policy: &RedactionPolicy) -> AgentResult<RunReport> {
        // Reading the masked JSON rebuilds the records it leaves out from the masked events.
        policy.redact_serializable(self)
    }

    /// The report as JSON with `policy` applied; never fails on content.
    pub fn redacted_json(&self, policy: &RedactionPolicy) -> AgentResult<Value> {
        let mut value = serde_json::to_value(self).map_err(AgentError::internal)?;
        policy.redact_value(&mut value);
        Ok(value)
    }
}

/// Which parts of a report to build.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
enum Parts {
    /// Everything: a report to read.
    #[default]
    All,
    /// What the JSON holds: a report to store. Actions, manifests, the final task and the
    /// problems are left out, and the payloads only they need are not read.
    Stored,
}

/// What the stored summary reads of a `task.status` payload.
#[derive(Deserialize)]
struct StateOf {
    state: TaskState,
}

/// What the stored summary reads of a `context.prepared` payload.
#[derive(Deserialize)]
struct TokensOf {
    manifest: ManifestTokens,
}

#[derive(Deserialize)]
struct ManifestTokens {
    total_estimated_tokens: u64,
}

/// Whether the stored summary (ids, final state, times, usage) reads nothing of events of
/// type `t`: only the parts a read report renders (action records, artifacts, approvals,
/// budget warnings) do. `action.started` also counts tool calls, so it is read.
fn is_unread_by_stored_summary(t: &EventType) -> bool {
    [
        EventType::ACTION_REQUESTED,
        EventType::ACTION_POLICY,
        EventType::ACTION_COMPLETED,
        EventType::ACTION_DENIED,
        EventType::ACTION_FAILED,
        EventType::TASK_ARTIFACT,
        EventType::APPROVAL_REQUIRED,
        EventType::APPROVAL_DECIDED,
        EventType::BUDGET_WARNING,
        EventType::BUDGET_EXCEEDED,
    ]
    .contains(t)
}

#[derive(Default)]
struct ReportBuilder {
    parts: Parts,
    report: RunReport,
    action_index: HashMap<ActionId, usize>,
    manifest_tokens: u64,
    max_step: u32,
    tool_calls: u32,
    last_timestamp: Option<DateTime<Utc>>,
}

impl ReportBuilder {
    /// The event's payload read as `T`, or `None` with the problem noted.
    fn payload<T: DeserializeOwned>(&mut self, event: &RunEvent) -> Option<T> {
        match event.payload_as::<T>() {
            Ok(payload) => Some(payload),
            Err(problem) => {
                if self.parts == Parts::All {
                    self.report.problems.push(problem.to_string());
                }
                None
            }
        }
    }

    fn action(&mut self, action_id: &ActionId) -> &mut ActionRecord {
        let index = match self.action_index.get(action_id) {
            Some(&i) => i,
            None => {
                self.report
                    .actions
                    .push(ActionRecord::new(action_id.clone()));
                let i = self.report.actions.len() - 1;
                self.action_index.insert(action_id.clone(), i);
                i
            }
        };
        &mut self.report.actions[index]
    }

    fn read(&mut self, event: &RunEvent) {
        let r = &mut self.report;
        r.run_id.get_or_insert_with(|| event.run_id.clone());
        if r.task_id.is_none() {
            r.task_id = event.task_id.clone();
        }
        if r.thread_id.is_none() {
            r.thread_id = event.thread_id.clone();
        }
        if r.agent_name.is_none() {
            r.agent_name = event.agent_name.clone();
        }
        r.started_at.get_or_insert(event.timestamp);
        self.last_timestamp = Some(event.timestamp);
        if let Some(step) = event.step {
            self.max_step = self.max_step.max(step);
        }
        if event.is_final {
            self.report.finished_at = Some(event.timestamp);
        }

        let t = &event.event_type;
        let all = self.parts == Parts::All;
        if !all && is_unread_by_stored_summary(t) {
            // A stored run keeps none of what they give: reading renders it from them.
        } else if *t == EventType::TASK_STATUS && !all {
            if let Some(p) = self.payload::<StateOf>(event) {
                self.report.final_state = Some(p.state);
            }
        } else if *t == EventType::TASK_STATUS {
            if let Some(p) = self.payload::<TaskStatusPayload>(event) {
                self.report.final_state = Some(p.state);
                if p.task.is_some() {
                    self.report.final_task = p.task;
                }
            }
        } else if *t == EventType::TASK_ARTIFACT {
            if let Some(p) = self.payload::<TaskArtifactPayload>(event) {
                let artifacts = &mut self.report.artifacts;
                match artifacts.iter_mut().find(|a| a.id == p.artifact.id) {
                    Some(existing) if p.append => existing.parts.extend(p.artifact.parts),
                    Some(existing) => *existing = p.artifact,
                    None => artifacts.push(p.artifact),
                }
            }
        } else if *t == EventType::CONTEXT_PREPARED && !all {
            if let Some(p) = self.payload::<TokensOf>(event) {
                self.manifest_tokens += p.manifest.total_estimated_tokens;
            }
        } else if *t == EventType::CONTEXT_PREPARED {
            if let Some(p) = self.payload::<ContextPreparedPayload>(event) {
                self.manifest_tokens += p.manifest.total_estimated_tokens;
                self.report.context_manifests.push(p.manifest);
            }
        } else if *t == EventType::LLM_CALL_STARTED {
            self.report.model.started_calls += 1;
        } else if *t == EventType::LLM_CALL_COMPLETED {
            if let Some(p) = self.payload::<LlmCallCompletedPayload>(event) {
                let m = &mut self.report.model;
                m.calls += 1;
                m.input_tokens += p.input_tokens;
                m.output_tokens += p.output_tokens;
                m.latency_ms += p.latency_ms.unwrap_or(0);
                m.cost_micros = m.cost_micros.saturating_add(p.cost_micros.unwrap_or(0));
                if let Some(model) = p.model {
                    if !m.models.contains(&model) {
                        m.models.push(model);
                    }
                }
            }
        } else if *t == EventType::BUDGET_WARNING {
            if let Some(p) = self.payload::<BudgetPayload>(event) {
                self.report.budget.warnings.push(p);
            }
        } else if *t == EventType::BUDGET_EXCEEDED {
            if let Some(p) = self.payload::<BudgetPayload>(event) {
                self.report.budget.exceeded = Some(p);
            }
        } else if *t == EventType::ACTION_REQUESTED {
            if let Some(p) = self.payload::<ActionPayload>(event) {
                let id = p.action.id.clone();
                self.action(&id).action = Some(p.action);
            }
        } else if *t == EventType::ACTION_POLICY {
            if let Some(p) = self.payload::<ActionPolicyPayload>(event) {
                self.action(&p.action_id).policy = Some(PolicyRecord {
                    decision: p.decision,
                    reason: p.reason,
                    capability: p.capability,
                });
            }
        } else if *t == EventType::APPROVAL_REQUIRED {
            if let Some(p) = self.payload::<ApprovalRequiredPayload>(event) {
                if all {
                    let id = p.request.action.id.clone();
                    self.action(&id).approval_request = Some(p.request.clone());
                }
                self.report.approvals.push(ApprovalRecord {
                    request: p.request,
                    decision: None,
                });
            }
        } else if *t == EventType::APPROVAL_DECIDED {
            if let Some(p) = self.payload::<ApprovalDecidedPayload>(event) {
                if let Some(record) = self
                    .report
                    .approvals
                    .iter_mut()
                    .rev()
                    .find(|a| a.request.request_id == p.decision.request_id)
                {
                    record.decision = Some(p.decision.clone());
                }
                if all {
                    self.action(&p.action_id).approval = Some(p.decision);
                }
            }
        } else if *t == EventType::ACTION_STARTED {
            self.tool_calls += 1;
            if !all {
                return;
            }
            if let Some(p) = self.payload::<ActionPayload>(event) {
                let id = p.action.id.clone();
                let record = self.action(&id);
                record.status = ActionStatus::Started;
                record.action.get_or_insert(p.action);
            }
        } else if *t == EventType::ACTION_COMPLETED {
            if let Some(p) = self.payload::<ActionCompletedPayload>(event) {
                let record = self.action(&p.action_id);
                record.status = ActionStatus::Completed;
                record.output = Some(p.output);
                record.artifacts.extend(p.artifacts);
                record.duration_ms = p.duration_ms;
            }
        } else if *t == EventType::ACTION_DENIED {
            if let Some(p) = self.payload::<ActionDeniedPayload>(event) {
                let record = self.action(&p.action_id);
                record.status = ActionStatus::Denied;
                record.error = Some(p.reason);
            }
        } else if *t == EventType::ACTION_FAILED {
            if let Some(p) = self.payload::<ActionFailedPayload>(event) {
                let record = self.action(&p.action_id);
                record.status = ActionStatus::Failed;
                record.error = Some(p.error);
                record.duration_ms = p.duration_ms;
            }
        }
    }

    /// The summary of `event_count` events read, without the events.
    fn finish(mut self, event_count: u64) -> RunReport {
        let r = &mut self.report;
        r.version = RUN_REPORT_VERSION;
        r.event_count = event_count;
        let end = r.finished_at.or(self.last_timestamp);
        let runtime = match (r.started_at, end) {
            (Some(start), Some(end)) => (end - start).num_milliseconds().max(0) as f64 / 1000.0,
            _ => 0.0,
        };
        let input_tokens = if r.model.input_tokens > 0 {
            r.model.input_tokens
        } else {
            self.manifest_tokens
        };
        r.budget.usage = BudgetUsage {
            steps: self.max_step,
            llm_calls: r.model.started_calls.max(r.model.calls),
            tool_calls: self.tool_calls,
            input_tokens,
            output_tokens: r.model.output_tokens,
            runtime_seconds: runtime,
            cost_micros: r.model.cost_micros,
        };
        self.report
    }
}
