//! [`RunRecorder`] and the [`RunReport`] it builds: the durable, app-facing summary of a
//! run, computed purely from its events.
//!
//! What the report reads, by event type (payload structs from [`crate::payload`]):
//!
//! | type | read into |
//! |---|---|
//! | any | `run_id`, `task_id`, `thread_id`, `agent_name` (first seen), `started_at` (first timestamp), `event_count`, `events`, `budget.usage.steps` (highest `step`) |
//! | `task.status` | `final_state` (`state`), `final_task` (`task`, last one carried), `finished_at` (a `final` event's timestamp) |
//! | `task.artifact` | `artifacts` (`artifact`; `append` extends the earlier one's parts) |
//! | `context.prepared` | `context_manifests` (`manifest`; not repeated in the report's JSON, see [`RunReport::context_manifests`]) |
//! | `llm.call.started` | `model.started_calls` |
//! | `llm.call.completed` | `model` (`input_tokens`, `output_tokens`, `latency_ms`, `model`) |
//! | `budget.warning` / `budget.exceeded` | `budget.warnings` / `budget.exceeded` |
//! | `action.requested` | a new [`ActionRecord`] (`action`; the records are not repeated in the report's JSON, see [`RunReport::actions`]) |
//! | `action.policy` | its `policy` |
//! | `approval.required` | `approvals`, and the action record's `approval_request` |
//! | `approval.decided` | the matching approval's (and action's) `decision`, by `request_id` |
//! | `action.started` / `completed` / `denied` / `failed` | the action's `status`, `output`, `artifacts`, `error`; `budget.usage.tool_calls` counts `action.started` |
//!
//! Other types are kept in `events` and otherwise ignored. A payload that does not read
//! is noted in `problems`, never a panic.
//!
//! The engine persists a report per run, so the path from events to stored JSON is kept
//! cheap: a [`RunRecorder::redacting`] recorder masks each event as it arrives (instead of
//! walking the whole report at the end), and [`RunRecorder::take_report_json`] writes the
//! events as JSON text straight from their structs, without a JSON tree of the report.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use keel_core::stored::JsonText;
use keel_core::{
    ActionId, AgentResult, ApprovalDecision, ApprovalRequest, Artifact, BudgetUsage,
    ContextManifest, Metadata, RunAction, RunId, TaskId, TaskState, ThreadId,
};
use serde::{de::DeserializeOwned, Deserialize, Serialize};
use serde_json::Value;

use crate::event::PayloadRef;
use crate::payload::{
    ActionCompletedPayload, ActionDeniedPayload, ActionFailedPayload, ActionPayload,
    ActionPolicyPayload, ApprovalDecidedPayload, ApprovalRequiredPayload, BudgetPayload,
    ContextPreparedPayload, LlmCallCompletedPayload, TaskArtifactPayload, TaskStatusPayload,
};
use crate::{EventSink, EventType, RedactionPolicy, RunEvent};

/// The version of the [`RunReport`] shape. Version 2 leaves `context_manifests` out of the
/// JSON (they are the `context.prepared` events' payloads, rebuilt from them when a report is
/// read). Version 3 also leaves out of each event the envelope fields that repeat the
/// report's own (`version`, `run_id`, `task_id`, `thread_id`, `agent_name`; an event whose
/// optional field is empty while the report's is not says `null`), and reading fills them in
/// again. Version 4 leaves out `actions` too (each action is already in its `action.*`
/// events, twice over), rebuilt from the events when a report is read. Version 5 leaves out
/// `final_task` (the last `task.status` event carries it), rebuilt the same way. Reports of
/// versions 1 to 4 still read.
pub const RUN_REPORT_VERSION: u32 = 5;

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
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyRecord {
    /// `allow`, `deny` or `require_approval`.
    pub decision: String,
    /// Why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The capability that caused it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capability: Option<String>,
}

/// One action's story: what it was, what policy and the approver said, how it ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ActionRecord {
    /// The action's id.
    pub action_id: ActionId,
    /// The action, from `action.requested` (or `action.started` when no request was seen).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action: Option<RunAction>,
    /// The policy decision.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<PolicyRecord>,
    /// The approval request, when one was made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval_request: Option<ApprovalRequest>,
    /// The approver's decision.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval: Option<ApprovalDecision>,
    /// Where it got to.
    pub status: ActionStatus,
    /// What it returned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<Value>,
    /// What it produced.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub artifacts: Vec<Artifact>,
    /// The denial reason or the failure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// How long it ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
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
    /// Models seen, in first-use order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub models: Vec<String>,
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
// `remote = "Self"`: the derived code becomes `RunReport::serialize`/`deserialize`, wrapped by
// the trait impls below, which rebuild `context_manifests` from the events on reading.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(remote = "Self")]
pub struct RunReport {
    /// Report shape version ([`RUN_REPORT_VERSION`]).
    pub version: u32,
    /// The run (absent only for a report of no events).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_id: Option<RunId>,
    /// The task.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_id: Option<TaskId>,
    /// The thread.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thread_id: Option<ThreadId>,
    /// The agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_name: Option<String>,
    /// The first event's time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<DateTime<Utc>>,
    /// The final event's time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<DateTime<Utc>>,
    /// The last task state seen.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub final_state: Option<TaskState>,
    /// The last serialized task carried by a status event. It is also that event's
    /// payload, so the JSON form leaves it out (version 5) and reading a report rebuilds it
    /// from `events`.
    #[serde(default, skip_serializing)]
    pub final_task: Option<Value>,
    /// Every context prepared for a model, in order. Each is also the payload of its
    /// `context.prepared` event, so the JSON form leaves this out (each step's manifest
    /// once, not twice) and reading a report rebuilds it from `events`.
    #[serde(default, skip_serializing)]
    pub context_manifests: Vec<ContextManifest>,
    /// Every action, in request order. Read from the `action.*` events, so the JSON form
    /// leaves this out (version 4) and reading a report rebuilds it from `events`.
    #[serde(default, skip_serializing)]
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
    /// Written and read by the trait impls below (version 3 shortens each event).
    #[serde(skip)]
    pub events: Vec<RunEvent>,
    /// Payloads that could not be read, by event.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub problems: Vec<String>,
    /// Application metadata.
    #[serde(default, skip_serializing_if = "Metadata::is_empty")]
    pub metadata: Metadata,
}

impl Serialize for RunReport {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        /// The summary's fields, then the events, shortened against the summary.
        #[derive(Serialize)]
        struct Wire<'a> {
            #[serde(flatten, serialize_with = "summary")]
            report: &'a RunReport,
            events: ShortEvents<'a>,
        }
        fn summary<S: serde::Serializer>(report: &&RunReport, s: S) -> Result<S::Ok, S::Error> {
            RunReport::serialize(report, s)
        }
        Wire {
            report: self,
            events: ShortEvents(self),
        }
        .serialize(serializer)
    }
}

/// A report's events as version 3 writes them.
struct ShortEvents<'a>(&'a RunReport);

impl Serialize for ShortEvents<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(
            self.0
                .events
                .iter()
                .map(|event| ShortEvent::of(&EventView::of(event), &Head::of(self.0), false)),
        )
    }
}

/// One event without the envelope fields that repeat its report's. An outer `None` leaves a
/// field out (the reader takes the report's); `Some(None)` writes `null`.
#[derive(Serialize)]
struct ShortEvent<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    version: Option<u32>,
    #[serde(rename = "type")]
    event_type: &'a EventType,
    #[serde(skip_serializing_if = "Option::is_none")]
    run_id: Option<&'a RunId>,
    #[serde(skip_serializing_if = "Option::is_none")]
    task_id: Option<Option<&'a TaskId>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    thread_id: Option<Option<&'a ThreadId>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    agent_name: Option<Option<&'a str>>,
    sequence: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    step: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    span_id: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    parent_span_id: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    action_id: Option<&'a ActionId>,
    #[serde(skip_serializing_if = "Option::is_none")]
    parent_action_id: Option<&'a ActionId>,
    #[serde(skip_serializing_if = "Option::is_none")]
    delegation_id: Option<&'a str>,
    severity: crate::Severity,
    summary: &'a str,
    payload: PayloadRef<'a>,
    #[serde(rename = "final")]
    is_final: bool,
    #[serde(serialize_with = "short_time")]
    timestamp: &'a DateTime<Utc>,
}

fn short_time<S: serde::Serializer>(time: &&DateTime<Utc>, s: S) -> Result<S::Ok, S::Error> {
    crate::time::serialize(time, s)
}

impl Serialize for PayloadRef<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            PayloadRef::Json(value) => value.serialize(serializer),
            PayloadRef::Typed(typed) => typed.to_value().serialize(serializer),
        }
    }
}

/// One event as the report reads and writes it: a [`RunEvent`]'s fields, borrowed either
/// from an event or, for a [`ReportWriter`] fed by its emitter, from the builder and the
/// emitter themselves (so no event is made only to be written and dropped).
pub(crate) struct EventView<'a> {
    pub(crate) version: u32,
    pub(crate) event_type: &'a EventType,
    pub(crate) run_id: &'a RunId,
    pub(crate) task_id: Option<&'a TaskId>,
    pub(crate) thread_id: Option<&'a ThreadId>,
    pub(crate) agent_name: Option<&'a str>,
    pub(crate) sequence: u64,
    pub(crate) step: Option<u32>,
    pub(crate) span_id: Option<&'a str>,
    pub(crate) parent_span_id: Option<&'a str>,
    pub(crate) action_id: Option<&'a ActionId>,
    pub(crate) parent_action_id: Option<&'a ActionId>,
    pub(crate) delegation_id: Option<&'a str>,
    pub(crate) severity: crate::Severity,
    pub(crate) summary: &'a str,
    pub(crate) payload: PayloadRef<'a>,
    pub(crate) is_final: bool,
    pub(crate) timestamp: &'a DateTime<Utc>,
}

impl<'a> EventView<'a> {
    pub(crate) fn of(event: &'a RunEvent) -> Self {
        // Destructured in full, so a field added to events cannot be left out here.
        let RunEvent {
            version,
            event_type,
            run_id,
            task_id,
            thread_id,
            agent_name,
            sequence,
            step,
            span_id,
            parent_span_id,
            action_id,
            parent_action_id,
            delegation_id,
            severity,
            summary,
            payload,
            is_final,
            timestamp,
        } = event;
        EventView {
            version: *version,
            event_type,
            run_id,
            task_id: task_id.as_ref(),
            thread_id: thread_id.as_ref(),
            agent_name: agent_name.as_deref(),
            sequence: *sequence,
            step: *step,
            span_id: span_id.as_deref(),
            parent_span_id: parent_span_id.as_deref(),
            action_id: action_id.as_ref(),
            parent_action_id: parent_action_id.as_ref(),
            delegation_id: delegation_id.as_deref(),
            severity: *severity,
            summary,
            payload: PayloadRef::Json(payload),
            is_final: *is_final,
            timestamp,
        }
    }

    /// The payload read as `T`, or the problem a report notes.
    fn payload_as<T: DeserializeOwned + Clone + 'static>(&self) -> Result<T, String> {
        self.payload.read::<T>().map_err(|e| {
            keel_core::AgentError::invalid_input(
                "run_event.payload",
                format!("{} event #{}: {e}", self.event_type, self.sequence),
            )
            .to_string()
        })
    }
}

/// The envelope fields a report states once for all its events.
#[derive(Clone, Copy)]
struct Head<'a> {
    run_id: Option<&'a RunId>,
    task_id: Option<&'a TaskId>,
    thread_id: Option<&'a ThreadId>,
    agent_name: Option<&'a str>,
}

impl<'a> Head<'a> {
    fn of(report: &'a RunReport) -> Self {
        Head {
            run_id: report.run_id.as_ref(),
            task_id: report.task_id.as_ref(),
            thread_id: report.thread_id.as_ref(),
            agent_name: report.agent_name.as_deref(),
        }
    }
}

impl<'a> ShortEvent<'a> {
    /// The event shortened against `head`. With `only_stated`, a field is left out only
    /// when the head states it (some value, the same): what a report written while its
    /// events arrive needs, since its head is the first event's and a later event may
    /// state what the first did not.
    fn of(event: &EventView<'a>, head: &Head<'_>, only_stated: bool) -> Self {
        /// `None` when the event says what the report says.
        fn unless_same<'a, T: PartialEq + ?Sized>(
            own: Option<&'a T>,
            report: Option<&T>,
            only_stated: bool,
        ) -> Option<Option<&'a T>> {
            let same = own == report && !(only_stated && report.is_none());
            (!same).then_some(own)
        }
        ShortEvent {
            version: (event.version != crate::RUN_EVENT_VERSION).then_some(event.version),
            event_type: event.event_type,
            run_id: (Some(event.run_id) != head.run_id).then_some(event.run_id),
            task_id: unless_same(event.task_id, head.task_id, only_stated),
            thread_id: unless_same(event.thread_id, head.thread_id, only_stated),
            agent_name: unless_same(event.agent_name, head.agent_name, only_stated),
            sequence: event.sequence,
            step: event.step,
            span_id: event.span_id,
            parent_span_id: event.parent_span_id,
            action_id: event.action_id,
            parent_action_id: event.parent_action_id,
            delegation_id: event.delegation_id,
            severity: event.severity,
            summary: event.summary,
            payload: event.payload,
            is_final: event.is_final,
            timestamp: event.timestamp,
        }
    }
}

impl ShortEvent<'_> {
    /// Append the event as compact JSON: what its `Serialize` writes, field for field, without
    /// going through a serializer (see [`json_text`](crate::json_text)).
    ///
    /// With a `policy`, the event is masked as it is written, as
    /// [`RedactionPolicy::redact_event`] masks an event: its free-text envelope fields and
    /// its payload.
    fn write_json(
        &self,
        out: &mut String,
        times: &mut crate::time::TimeWriter,
        policy: Option<&RedactionPolicy>,
    ) {
        use crate::json_text::{write_key, write_str, write_u64};
        use crate::redact::Envelope;
        let masked = |field: Envelope, text: &str| {
            policy.is_some_and(|p| p.envelope_field_is_sensitive(field, text))
        };
        let write_text = |out: &mut String, field: Envelope, text: &str| {
            if masked(field, text) {
                write_str(out, crate::REDACTED);
            } else {
                write_str(out, text);
            }
        };
        let write_opt_str = |out: &mut String, field: Envelope, text: Option<&str>| match text {
            Some(text) => write_text(out, field, text),
            None => out.push_str("null"),
        };
        let first = &mut true;
        out.push('{');
        if let Some(version) = self.version {
            write_key(out, first, "version");
            write_u64(out, u64::from(version));
        }
        write_key(out, first, "type");
        write_str(out, self.event_type.as_str());
        if let Some(run_id) = self.run_id {
            write_key(out, first, "run_id");
            write_str(out, run_id.as_str());
        }
        if let Some(task_id) = self.task_id {
            write_key(out, first, "task_id");
            write_opt_str(out, Envelope::Kept, task_id.map(TaskId::as_str));
        }
        if let Some(thread_id) = self.thread_id {
            write_key(out, first, "thread_id");
            write_opt_str(out, Envelope::Kept, thread_id.map(ThreadId::as_str));
        }
        if let Some(agent_name) = self.agent_name {
            write_key(out, first, "agent_name");
            write_opt_str(out, Envelope::AgentName, agent_name);
        }
        write_key(out, first, "sequence");
        write_u64(out, self.sequence);
        if let Some(step) = self.step {
            write_key(out, first, "step");
            write_u64(out, u64::from(step));
        }
        let optional = [
            ("span_id", Envelope::SpanId, self.span_id),
            (
                "parent_span_id",
                Envelope::ParentSpanId,
                self.parent_span_id,
            ),
            (
                "action_id",
                Envelope::Kept,
                self.action_id.map(ActionId::as_str),
            ),
            (
                "parent_action_id",
                Envelope::Kept,
                self.parent_action_id.map(ActionId::as_str),
            ),
            ("delegation_id", Envelope::DelegationId, self.delegation_id),
        ];
        for (key, field, text) in optional {
            if let Some(text) = text {
                write_key(out, first, key);
                write_text(out, field, text);
            }
        }
        write_key(out, first, "severity");
        write_str(out, self.severity.as_str());
        write_key(out, first, "summary");
        write_text(out, Envelope::Summary, self.summary);
        write_key(out, first, "payload");
        let start = out.len();
        self.payload.write(out, policy);
        if policy.is_some_and(|p| p.envelope_field_is_sensitive(Envelope::Payload, ""))
            && &out[start..] != "null"
        {
            out.truncate(start);
            write_str(out, crate::REDACTED);
        }
        write_key(out, first, "final");
        out.push_str(if self.is_final { "true" } else { "false" });
        write_key(out, first, "timestamp");
        times.write(out, self.timestamp);
        out.push('}');
    }
}

/// Fill in what a version 3 report left out of its events: the report's own envelope fields.
fn restore_event(event: &mut Value, report: &RunReport) {
    let Value::Object(fields) = event else {
        return;
    };
    let fill = [
        ("version", Some(Value::from(crate::RUN_EVENT_VERSION))),
        (
            "run_id",
            report.run_id.as_ref().map(|v| Value::from(v.as_str())),
        ),
        (
            "task_id",
            report.task_id.as_ref().map(|v| Value::from(v.as_str())),
        ),
        (
            "thread_id",
            report.thread_id.as_ref().map(|v| Value::from(v.as_str())),
        ),
        ("agent_name", report.agent_name.as_deref().map(Value::from)),
    ];
    for (key, value) in fill {
        if let Some(value) = value {
            fields.entry(key).or_insert(value);
        }
    }
}

impl<'de> Deserialize<'de> for RunReport {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let mut value = Value::deserialize(deserializer)?;
        let events = match &mut value {
            Value::Object(fields) => fields.remove("events"),
            _ => None,
        };
        let mut report = RunReport::deserialize(value).map_err(D::Error::custom)?;
        if let Some(events) = events {
            let Value::Array(events) = events else {
                return Err(D::Error::custom("a report's `events` must be an array"));
            };
            let short = report.version >= 3;
            report.events = events
                .into_iter()
                .map(|mut event| {
                    if short {
                        restore_event(&mut event, &report);
                    }
                    serde_json::from_value::<RunEvent>(event).map_err(D::Error::custom)
                })
                .collect::<Result<_, _>>()?;
        }
        if report.version >= 4 {
            let rebuilt = RunReport::summary_of(&report.events);
            report.actions = rebuilt.actions;
            report.context_manifests = rebuilt.context_manifests;
            if report.version >= 5 {
                report.final_task = rebuilt.final_task;
            }
            // The JSON's own list does not cover action payloads (its summary reads none).
            for problem in rebuilt.problems {
                if !report.problems.contains(&problem) {
                    report.problems.push(problem);
                }
            }
        }
        if report.context_manifests.is_empty() {
            // Version 2 JSON: the manifests are the `context.prepared` payloads.
            report.context_manifests = report
                .events
                .iter()
                .filter(|e| e.event_type == EventType::CONTEXT_PREPARED)
                .filter_map(|e| e.payload_as::<ContextPreparedPayload>().ok())
                .map(|p| p.manifest)
                .collect();
        }
        Ok(report)
    }
}

impl RunReport {
    /// Build a report from events (sorted by sequence first; arrival order does not matter).
    pub fn from_events(events: &[RunEvent]) -> RunReport {
        Self::from_owned_events(events.to_vec())
    }

    /// [`from_events`](Self::from_events) taking the events by value, sparing a copy.
    pub fn from_owned_events(sorted: Vec<RunEvent>) -> RunReport {
        Self::build(sorted, false)
    }

    /// The summary [`build`](Self::build) reads from `events` (in sequence order), without
    /// the events: where reading a version 4 report takes the action records and context
    /// manifests its JSON leaves out.
    fn summary_of(events: &[RunEvent]) -> RunReport {
        let mut builder = ReportBuilder::default();
        for event in events {
            builder.read(&EventView::of(event));
        }
        builder.report
    }

    fn build(mut sorted: Vec<RunEvent>, json_only: bool) -> RunReport {
        sorted.sort_by_key(|e| e.sequence);
        let mut builder = ReportBuilder {
            json_only,
            ..ReportBuilder::default()
        };
        for event in &sorted {
            builder.read(&EventView::of(event));
        }
        builder.finish(sorted)
    }

    /// A copy with `policy` applied to everything free-form (event payloads, action
    /// payloads, outputs, the final task, metadata). Apply it whenever a report is
    /// persisted or leaves the process.
    ///
    /// Fails only when a configured extra key masks a structural field of the report (for
    /// instance `action`), so that the result would no longer be a report; use
    /// [`redacted_json`](Self::redacted_json) then.
    pub fn redacted(&self, policy: &RedactionPolicy) -> AgentResult<RunReport> {
        policy.redact_serializable(self)
    }

    /// The report as JSON with `policy` applied; never fails on content.
    pub fn redacted_json(&self, policy: &RedactionPolicy) -> AgentResult<Value> {
        let mut value = serde_json::to_value(self).map_err(keel_core::AgentError::internal)?;
        policy.redact_value(&mut value);
        Ok(value)
    }

    /// The report as JSON text (what `serde_json::to_string` gives) of events the caller
    /// has masked with `policy` already, as a redacting recorder does. The summary is read
    /// from those masked events, so only the metadata, which no event carries, is masked
    /// here; and everything is written straight from the structs, with no JSON tree of the
    /// report in between.
    fn into_json_text(mut self, policy: Option<&RedactionPolicy>) -> AgentResult<JsonText> {
        if let Some(policy) = policy {
            if !self.metadata.is_empty() {
                let mut metadata = Value::Object(std::mem::take(&mut self.metadata));
                policy.redact_value(&mut metadata);
                if let Value::Object(map) = metadata {
                    self.metadata = map;
                }
            }
        }
        // The summary through serde (it is small), the events written directly: the text is
        // what `serde_json::to_string(&self)` gives (a test holds it to that).
        let summary =
            serde_json::to_string(&Summary(&self)).map_err(keel_core::AgentError::internal)?;
        let mut out = String::with_capacity(summary.len() + 16 + 400 * self.events.len());
        // The summary always holds `version` and `event_count`, so `events` follows a comma.
        out.push_str(summary.strip_suffix('}').unwrap_or(&summary));
        out.push_str(",\"events\":[");
        let mut times = crate::time::TimeWriter::default();
        for (i, event) in self.events.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            ShortEvent::of(&EventView::of(event), &Head::of(&self), false)
                .write_json(&mut out, &mut times, None);
        }
        out.push_str("]}");
        Ok(JsonText::assume_valid(out))
    }
}

/// A report's summary alone: its fields without the events.
struct Summary<'a>(&'a RunReport);

impl Serialize for Summary<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        RunReport::serialize(self.0, serializer)
    }
}

#[derive(Default)]
struct ReportBuilder {
    /// Build only what the report's JSON holds: leave `context_manifests` (only their token
    /// counts are read) and `actions` (only `action.started` is counted) empty, for a report
    /// written straight to JSON. An action payload that does not read is noted when the
    /// report is read back, not in the JSON's `problems`.
    json_only: bool,
    report: RunReport,
    action_index: HashMap<ActionId, usize>,
    manifest_tokens: u64,
    max_step: u32,
    tool_calls: u32,
    last_timestamp: Option<DateTime<Utc>>,
}

impl ReportBuilder {
    fn payload<T: DeserializeOwned + Clone + 'static>(&mut self, event: &EventView) -> Option<T> {
        match event.payload_as::<T>() {
            Ok(payload) => Some(payload),
            Err(problem) => {
                self.report.problems.push(problem);
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

    fn read(&mut self, event: &EventView) {
        let r = &mut self.report;
        r.run_id.get_or_insert_with(|| event.run_id.clone());
        if r.task_id.is_none() {
            r.task_id = event.task_id.cloned();
        }
        if r.thread_id.is_none() {
            r.thread_id = event.thread_id.cloned();
        }
        if r.agent_name.is_none() {
            r.agent_name = event.agent_name.map(str::to_owned);
        }
        r.started_at.get_or_insert(*event.timestamp);
        self.last_timestamp = Some(*event.timestamp);
        if let Some(step) = event.step {
            self.max_step = self.max_step.max(step);
        }
        if event.is_final {
            self.report.finished_at = Some(*event.timestamp);
        }

        let t = event.event_type;
        if *t == EventType::TASK_STATUS && self.json_only {
            // Only the state: the JSON leaves `final_task` out (version 5).
            let state = match event.payload {
                PayloadRef::Json(payload) => {
                    payload.get("state").cloned().map(serde_json::from_value)
                }
                PayloadRef::Typed(typed) => {
                    let any = typed.as_any();
                    any.downcast_ref::<TaskStatusPayload>()
                        .map(|p| Ok(p.state))
                        .or_else(|| {
                            any.downcast_ref::<crate::payload::TaskStatusOf>()
                                .map(|p| Ok(p.state))
                        })
                        .or_else(|| Some(serde_json::from_value(typed.to_value()["state"].take())))
                }
            };
            match state {
                Some(Ok(state)) => self.report.final_state = Some(state),
                _ => {
                    // Not a status: note it as the full read would.
                    let _ = self.payload::<TaskStatusPayload>(event);
                }
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
        } else if *t == EventType::CONTEXT_PREPARED && self.json_only {
            // Only the token count is needed; anything else falls to the full read below,
            // which notes a payload that is not a manifest.
            let tokens = match event.payload {
                PayloadRef::Json(payload) => payload["manifest"]["total_estimated_tokens"].as_u64(),
                PayloadRef::Typed(typed) => {
                    let any = typed.as_any();
                    any.downcast_ref::<crate::payload::SharedManifestPayload>()
                        .map(|p| p.manifest.total_estimated_tokens)
                        .or_else(|| {
                            any.downcast_ref::<ContextPreparedPayload>()
                                .map(|p| p.manifest.total_estimated_tokens)
                        })
                }
            };
            match tokens {
                Some(tokens) => self.manifest_tokens += tokens,
                None => {
                    if let Some(p) = self.payload::<ContextPreparedPayload>(event) {
                        self.manifest_tokens += p.manifest.total_estimated_tokens;
                    }
                }
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
        } else if self.json_only && *t == EventType::ACTION_STARTED {
            self.tool_calls += 1;
        } else if self.json_only
            && [
                EventType::ACTION_REQUESTED,
                EventType::ACTION_POLICY,
                EventType::ACTION_COMPLETED,
                EventType::ACTION_DENIED,
                EventType::ACTION_FAILED,
            ]
            .contains(t)
        {
            // Only the action records read these, and the JSON holds none.
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
                if !self.json_only {
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
                if !self.json_only {
                    self.action(&p.action_id).approval = Some(p.decision);
                }
            }
        } else if *t == EventType::ACTION_STARTED {
            // An action read from its `action.requested` event already only changes status:
            // its payload (the same action again) need not be decoded a second time.
            let known = event
                .action_id
                .as_ref()
                .and_then(|id| self.action_index.get(id).copied())
                .filter(|&i| self.report.actions[i].action.is_some());
            if let Some(i) = known {
                self.tool_calls += 1;
                self.report.actions[i].status = ActionStatus::Started;
            } else if let Some(p) = self.payload::<ActionPayload>(event) {
                self.tool_calls += 1;
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

    fn finish(self, events: Vec<RunEvent>) -> RunReport {
        let count = events.len() as u64;
        let mut report = self.finish_counted(count);
        report.events = events;
        report
    }

    /// The summary of `event_count` events read, without the events.
    fn finish_counted(mut self, event_count: u64) -> RunReport {
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
        };
        self.report
    }
}

/// Writes a run's report as JSON text while the run goes, for persisting it when the run
/// ends: each event is masked (with a [`redacting`](Self::redacting) writer) and written
/// the moment it arrives, then let go, and the summary is kept as events arrive. The text
/// is the report [`RunReport::redacted_json`] makes of the same events (keys of a payload
/// in the order its struct declares them). The engine keeps one per run; unlike a
/// [`RunRecorder`] it keeps no events to hand back.
///
/// Events must arrive in sequence order, as
/// [`EventEmitter::emit_reported`](crate::EventEmitter::emit_reported) delivers them.
///
/// ```
/// use keel_core::{Message, RunContext, Task};
/// use keel_events::{EventEmitter, MultiSink, RedactionPolicy, ReportWriter, RunEvent, RunReport};
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let emitter = EventEmitter::new(&RunContext::new(), std::sync::Arc::new(MultiSink::new()));
/// let writer = ReportWriter::new().redacting(RedactionPolicy::default());
/// let action = keel_core::RunAction::tool_call("login", serde_json::json!({"password": "hunter2"}));
/// emitter.emit_reported(RunEvent::action_requested(&action), &writer).await?;
/// let mut task = Task::create(Message::user("hi"));
/// task.complete("hello")?;
/// emitter.emit_reported(RunEvent::task_status_of(&task), &writer).await?;
/// let text = writer.take_json()?;
/// assert!(!text.as_str().contains("hunter2"));
/// let report: RunReport = serde_json::from_str(text.as_str()).unwrap();
/// assert_eq!(report.final_state, Some(keel_core::TaskState::Completed));
/// assert_eq!(report.actions.len(), 1);
/// # Ok::<(), keel_core::AgentError>(())
/// # }).unwrap();
/// ```
#[derive(Debug)]
pub struct ReportWriter {
    state: Mutex<WriterState>,
    metadata: Metadata,
    redaction: Option<RedactionPolicy>,
}

#[derive(Default)]
struct WriterState {
    summary: ReportBuilder,
    /// The first event's envelope, which later events are shortened against.
    head: Option<OwnedHead>,
    /// The events written so far, comma-separated.
    events: String,
    count: u64,
    times: crate::time::TimeWriter,
}

impl std::fmt::Debug for WriterState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WriterState")
            .field("count", &self.count)
            .field("bytes", &self.events.len())
            .finish_non_exhaustive()
    }
}

impl WriterState {
    fn new() -> Self {
        WriterState {
            summary: ReportBuilder {
                json_only: true,
                ..ReportBuilder::default()
            },
            ..WriterState::default()
        }
    }
}

/// The size of the last report a [`ReportWriter`] wrote, which the next one starts with.
static LAST_REPORT_BYTES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

struct OwnedHead {
    run_id: RunId,
    task_id: Option<TaskId>,
    thread_id: Option<ThreadId>,
    agent_name: Option<String>,
}

impl OwnedHead {
    fn head(&self) -> Head<'_> {
        Head {
            run_id: Some(&self.run_id),
            task_id: self.task_id.as_ref(),
            thread_id: self.thread_id.as_ref(),
            agent_name: self.agent_name.as_deref(),
        }
    }
}

impl Default for ReportWriter {
    fn default() -> Self {
        Self::new()
    }
}

impl ReportWriter {
    /// A writer that masks nothing.
    pub fn new() -> Self {
        ReportWriter {
            state: Mutex::new(WriterState::new()),
            metadata: Metadata::new(),
            redaction: None,
        }
    }

    /// Mask every event with `policy` as it is written, and the summary when the report is
    /// taken.
    #[must_use]
    pub fn redacting(mut self, policy: RedactionPolicy) -> Self {
        self.redaction = Some(policy);
        self
    }

    /// Attach application metadata to the report.
    #[must_use]
    pub fn with_metadata(mut self, metadata: Metadata) -> Self {
        self.metadata = metadata;
        self
    }

    /// Write one more event.
    pub fn record(&self, event: &RunEvent) {
        self.write(&EventView::of(event));
    }

    pub(crate) fn write(&self, event: &EventView) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        self.write_into(&mut state, event);
    }

    /// [`write`](Self::write) an event that `stamp` numbers and times under the writer's
    /// lock: events written from several tasks at once land in the order of their numbers,
    /// with no other lock around them.
    pub(crate) fn write_stamped(
        &self,
        event: EventView<'_>,
        stamp: impl FnOnce() -> (u64, DateTime<Utc>),
    ) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let (sequence, timestamp) = stamp();
        let event = EventView {
            sequence,
            timestamp: &timestamp,
            ..event
        };
        self.write_into(&mut state, &event);
    }

    fn write_into(&self, state: &mut WriterState, event: &EventView) {
        state.summary.read(event);
        let head = state.head.get_or_insert_with(|| OwnedHead {
            run_id: event.run_id.clone(),
            task_id: event.task_id.cloned(),
            thread_id: event.thread_id.cloned(),
            agent_name: event.agent_name.map(str::to_owned),
        });
        if state.count > 0 {
            state.events.push(',');
        } else {
            // Sized like the last report this process wrote, so the text is not copied
            // over and over as it grows.
            let last = LAST_REPORT_BYTES.load(std::sync::atomic::Ordering::Relaxed);
            state.events.reserve(last + last / 8);
            state.events.push_str("{\"events\":[");
        }
        ShortEvent::of(event, &head.head(), true).write_json(
            &mut state.events,
            &mut state.times,
            self.redaction.as_ref(),
        );
        state.count += 1;
    }

    /// The report of the events written so far, as JSON text, leaving the writer empty.
    pub fn take_json(&self) -> AgentResult<JsonText> {
        let state = std::mem::replace(
            &mut *self.state.lock().unwrap_or_else(PoisonError::into_inner),
            WriterState::new(),
        );
        let mut report = state.summary.finish_counted(state.count);
        report.metadata = self.metadata.clone();
        // The events come first, so the text written while the run went is not copied: the
        // summary follows them (the order of an object's fields means nothing to a reader).
        let mut out = state.events;
        if state.count == 0 {
            out.push_str("{\"events\":[");
        }
        out.push_str("],");
        let summary_at = out.len();
        crate::masked::write_masked(&mut out, &Summary(&report), self.redaction.as_ref())
            .map_err(keel_core::AgentError::internal)?;
        // Drop the summary's own `{`; it always holds `version` and `event_count`.
        out.remove(summary_at);
        LAST_REPORT_BYTES.store(out.len().min(1 << 18), std::sync::atomic::Ordering::Relaxed);
        Ok(JsonText::assume_valid(out))
    }
}

#[async_trait]
impl EventSink for ReportWriter {
    async fn emit(&self, event: &RunEvent) -> AgentResult<()> {
        self.record(event);
        Ok(())
    }
}

/// An [`EventSink`] that keeps a run's events and builds its [`RunReport`] on demand.
///
/// ```
/// use std::sync::Arc;
/// use keel_core::{RunContext, Task, Message};
/// use keel_events::{EventEmitter, RunEvent, RunRecorder};
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let recorder = Arc::new(RunRecorder::new());
/// let emitter = EventEmitter::new(&RunContext::new(), recorder.clone());
/// let mut task = Task::create(Message::user("hi"));
/// task.complete("hello")?;
/// emitter.emit(RunEvent::task_status_of(&task)).await?;
/// let report = recorder.report();
/// assert_eq!(report.final_state, Some(keel_core::TaskState::Completed));
/// assert!(report.final_task.is_some());
/// # Ok::<(), keel_core::AgentError>(())
/// # }).unwrap();
/// ```
#[derive(Debug, Default)]
pub struct RunRecorder {
    events: Mutex<Vec<RunEvent>>,
    metadata: Metadata,
    redaction: Option<RedactionPolicy>,
}

impl RunRecorder {
    /// An empty recorder.
    pub fn new() -> Self {
        Self::default()
    }

    /// Attach application metadata to the reports.
    #[must_use]
    pub fn with_metadata(mut self, metadata: Metadata) -> Self {
        self.metadata = metadata;
        self
    }

    /// Mask every event with `policy` as it is recorded ([`RedactionPolicy::redact_event`]),
    /// so [`events`](Self::events), the reports and [`take_report_json`](Self::take_report_json)
    /// hold no credentials, and persisting the report needs no walk over all of it. For the
    /// default policy the report equals the one [`RunReport::redacted_json`] makes of the
    /// unmasked events.
    #[must_use]
    pub fn redacting(mut self, policy: RedactionPolicy) -> Self {
        self.redaction = Some(policy);
        self
    }

    /// The events recorded so far.
    pub fn events(&self) -> Vec<RunEvent> {
        self.events
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The report of the events recorded so far, leaving the recorder empty: for the end of
    /// a run, when the events are not needed again (it spares copying them all).
    pub fn take_report(&self) -> RunReport {
        let events =
            std::mem::take(&mut *self.events.lock().unwrap_or_else(PoisonError::into_inner));
        let mut report = RunReport::from_owned_events(events);
        report.metadata = self.metadata.clone();
        report
    }

    /// [`take_report`](Self::take_report) as JSON text, ready to persist: a redacting
    /// recorder's events are already masked, the rest of the report (metadata included) is
    /// masked here, and the events are written as text straight from their structs.
    pub fn take_report_json(&self) -> AgentResult<JsonText> {
        let events =
            std::mem::take(&mut *self.events.lock().unwrap_or_else(PoisonError::into_inner));
        // The JSON leaves the manifests out (they are the events' payloads), so they are
        // not decoded for it.
        let mut report = RunReport::build(events, true);
        report.metadata = self.metadata.clone();
        report.into_json_text(self.redaction.as_ref())
    }

    /// The report of the events recorded so far.
    pub fn report(&self) -> RunReport {
        let mut report = RunReport::from_owned_events(self.events());
        report.metadata = self.metadata.clone();
        report
    }

    /// Keep `event` (masked first when the recorder is [`redacting`](Self::redacting)),
    /// taking it by value, for a caller that has no further use for it and so need not copy
    /// it (as the recorder's [`EventSink::emit`] must).
    pub fn record(&self, mut event: RunEvent) {
        if let Some(policy) = &self.redaction {
            policy.redact_event(&mut event);
        }
        self.events
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(event);
    }
}

#[async_trait]
impl EventSink for RunRecorder {
    async fn emit(&self, event: &RunEvent) -> AgentResult<()> {
        self.record(event.clone());
        Ok(())
    }
}
