//! The [`RunEvent`] envelope, its [`EventType`]s, and [`RunEventBuilder`], from which an
//! [`EventEmitter`](crate::EventEmitter) makes numbered events.

use std::borrow::Cow;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use keel_core::{ActionId, RunId, TaskId, ThreadId};
use serde::{de::DeserializeOwned, Deserialize, Serialize};
use serde_json::Value;

/// The version of the [`RunEvent`] envelope. Raised only when an existing field changes
/// meaning; new event types and new optional fields do not raise it.
pub const RUN_EVENT_VERSION: u32 = 1;

/// A normalized event type: a dotted name such as `action.policy`.
///
/// The known types are associated constants, each with its payload struct in
/// [`crate::payload`]; the set is open so applications can add their own with
/// [`EventType::new`]. Two types are equal when their names are.
///
/// ```
/// use keel_events::EventType;
/// assert_eq!(EventType::ACTION_POLICY.as_str(), "action.policy");
/// assert_eq!(EventType::new("action.policy"), EventType::ACTION_POLICY);
/// assert_eq!(serde_json::to_value(EventType::LLM_STREAM).unwrap(), "llm.stream");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct EventType(Cow<'static, str>);

impl EventType {
    /// A task's status changed: the task, its state and its status message.
    pub const TASK_STATUS: EventType = EventType::known("task.status");
    /// An artifact was produced or extended.
    pub const TASK_ARTIFACT: EventType = EventType::known("task.artifact");
    /// A [`ContextManifest`](keel_core::ContextManifest) was prepared before a model call.
    pub const CONTEXT_PREPARED: EventType = EventType::known("context.prepared");
    /// A model call is about to start.
    pub const LLM_CALL_STARTED: EventType = EventType::known("llm.call.started");
    /// A model call returned; usage and latency are known.
    pub const LLM_CALL_COMPLETED: EventType = EventType::known("llm.call.completed");
    /// A chunk of streamed model output.
    pub const LLM_STREAM: EventType = EventType::known("llm.stream");
    /// Usage is near a budget limit.
    pub const BUDGET_WARNING: EventType = EventType::known("budget.warning");
    /// A budget limit refused further work.
    pub const BUDGET_EXCEEDED: EventType = EventType::known("budget.exceeded");
    /// A [`RunAction`](keel_core::RunAction) is ready for policy.
    pub const ACTION_REQUESTED: EventType = EventType::known("action.requested");
    /// Policy decided: allow, deny or require approval.
    pub const ACTION_POLICY: EventType = EventType::known("action.policy");
    /// An authorized action started.
    pub const ACTION_STARTED: EventType = EventType::known("action.started");
    /// An action completed successfully.
    pub const ACTION_COMPLETED: EventType = EventType::known("action.completed");
    /// Policy or an approver refused an action; it did not run.
    pub const ACTION_DENIED: EventType = EventType::known("action.denied");
    /// An action ran and failed.
    pub const ACTION_FAILED: EventType = EventType::known("action.failed");
    /// An approval checkpoint was created.
    pub const APPROVAL_REQUIRED: EventType = EventType::known("approval.required");
    /// The approver decided.
    pub const APPROVAL_DECIDED: EventType = EventType::known("approval.decided");

    /// Every type this crate defines: the run's lifecycle in order, then the engine's
    /// markers, effects and subagents (see [`crate::payload`]).
    pub const KNOWN: [EventType; 39] = [
        Self::TASK_STATUS,
        Self::TASK_ARTIFACT,
        Self::CONTEXT_PREPARED,
        Self::LLM_CALL_STARTED,
        Self::LLM_CALL_COMPLETED,
        Self::LLM_STREAM,
        Self::BUDGET_WARNING,
        Self::BUDGET_EXCEEDED,
        Self::ACTION_REQUESTED,
        Self::ACTION_POLICY,
        Self::ACTION_STARTED,
        Self::ACTION_COMPLETED,
        Self::ACTION_DENIED,
        Self::ACTION_FAILED,
        Self::APPROVAL_REQUIRED,
        Self::APPROVAL_DECIDED,
        Self::TOOL_ASYNC_DISPATCHED,
        Self::TOOL_ASYNC_ACKNOWLEDGED,
        Self::TOOL_ASYNC_RESULT,
        Self::TOOL_ASYNC_PROGRESS,
        Self::TOOL_ASYNC_TIMED_OUT,
        Self::QUEUE_INJECTED,
        Self::QUEUE_DRAINED,
        Self::MESSAGE_PERSISTED,
        Self::TOOL_RESULT_PERSISTED,
        Self::RUN_STOPPED,
        Self::STOP_EVALUATED,
        Self::THREAD_TERMINATED,
        Self::CONTEXT_COMPACTED,
        Self::EFFECT_SCHEDULED,
        Self::EFFECT_FIRED,
        Self::EFFECT_CANCELED,
        Self::EFFECT_DROPPED,
        Self::SUBAGENT_CREATED,
        Self::SUBAGENT_MESSAGED,
        Self::SUBAGENT_RETURNED,
        Self::SUBAGENT_FAILED,
        Self::SUBAGENT_STATUS,
        Self::SUBAGENT_BOOTSTRAP_REQUIRED,
    ];

    pub(crate) const fn known(name: &'static str) -> Self {
        Self(Cow::Borrowed(name))
    }

    /// A type by name; use it for types this crate does not define.
    pub fn new(name: impl Into<Cow<'static, str>>) -> Self {
        Self(name.into())
    }

    /// The dotted name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for EventType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl PartialEq<str> for EventType {
    fn eq(&self, other: &str) -> bool {
        self.0 == other
    }
}

impl PartialEq<&str> for EventType {
    fn eq(&self, other: &&str) -> bool {
        self.0 == *other
    }
}

impl From<&'static str> for EventType {
    fn from(name: &'static str) -> Self {
        Self(Cow::Borrowed(name))
    }
}

impl From<String> for EventType {
    fn from(name: String) -> Self {
        Self(Cow::Owned(name))
    }
}

/// How a renderer or a log should treat an event.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Severity {
    /// Progress.
    #[default]
    Info,
    /// Something to notice: a budget warning, a denied action.
    Warning,
    /// Something failed.
    Error,
}

impl Severity {
    /// Whether it is [`Severity::Info`], the default.
    pub fn is_info(&self) -> bool {
        *self == Severity::Info
    }

    /// The name as it is serialized: `info`, `warning` or `error`.
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Info => "info",
            Severity::Warning => "warning",
            Severity::Error => "error",
        }
    }
}

/// One normalized, versioned event of a run: what a terminal renderer, a web client, a
/// test recorder and the durable log all consume.
///
/// `sequence` is assigned once, when the [`EventEmitter`](crate::EventEmitter) creates the
/// event: it starts at 1 and grows by one per event of the run, and every sink sees the
/// same number (decision 10 of the design brief). The `payload` shape depends on the type;
/// see [`crate::payload`].
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunEvent {
    /// Envelope version ([`RUN_EVENT_VERSION`]).
    pub version: u32,
    /// The event type.
    #[serde(rename = "type")]
    pub event_type: EventType,
    /// The run.
    pub run_id: RunId,
    /// The task the run executes.
    pub task_id: Option<TaskId>,
    /// The thread the task belongs to.
    pub thread_id: Option<ThreadId>,
    /// The run's W3C trace id (32 hex digits): the trace its spans are exported in. Shared:
    /// every event of a run holds the run's one copy (so does each id below, per span).
    pub trace_id: Option<Arc<str>>,
    /// The agent that emitted or handled the event.
    pub agent_name: Option<String>,
    /// Position in the run's event sequence, from 1.
    pub sequence: u64,
    /// The step (model call plus its tool calls), from 1, when the event belongs to one.
    pub step: Option<u32>,
    /// The span the event belongs to (16 hex digits): the run's, a step's, a model call's
    /// or a tool call's ([`RunSpans`](crate::RunSpans)); the same id as the exported span.
    pub span_id: Option<Arc<str>>,
    /// That span's parent: the run's for a step, a step's for a model or tool call, and for
    /// the run's own span the caller's (a `traceparent`) or the delegating tool call's.
    pub parent_span_id: Option<Arc<str>>,
    /// The action the event is about.
    pub action_id: Option<ActionId>,
    /// The action that action is part of.
    pub parent_action_id: Option<ActionId>,
    /// The delegation a delegated run serves (the delegating tool call's action id), on
    /// every event of that run.
    pub delegation_id: Option<String>,
    /// How to treat it (left out of the JSON when it is `info`, as most events are).
    #[serde(default, skip_serializing_if = "Severity::is_info")]
    pub severity: Severity,
    /// Short progress text for CLIs, UIs and logs.
    #[serde(default)]
    pub summary: String,
    /// The type-specific body.
    #[serde(default)]
    pub payload: Value,
    /// Whether the event marks a final boundary (the run's last status); left out of the
    /// JSON when false.
    #[serde(rename = "final", default, skip_serializing_if = "std::ops::Not::not")]
    pub is_final: bool,
    /// When the event was created.
    #[serde(serialize_with = "rfc3339")]
    pub timestamp: DateTime<Utc>,
}

/// `time` as chrono's own `Serialize` writes it (RFC 3339, `Z`, as many fraction digits as
/// needed), but handed to the serializer as one string: chrono's `Display` writes a time in
/// a dozen pieces, and `serde_json` escapes each piece on its own, which made writing the
/// timestamps a tenth of the cost of an engine step.
pub(crate) fn rfc3339<S: serde::Serializer>(
    time: &DateTime<Utc>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(&time.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true))
}

impl RunEvent {
    /// Start an event of any type; the typed constructors ([`RunEvent::action_policy`] and
    /// friends in [`crate::payload`]) fill in payload, summary and correlation for you.
    pub fn builder(
        event_type: impl Into<EventType>,
        summary: impl Into<Cow<'static, str>>,
    ) -> RunEventBuilder {
        RunEventBuilder::new(event_type.into(), summary)
    }

    /// The payload read as `T` (one of the [`crate::payload`] structs).
    pub fn payload_as<T: DeserializeOwned>(&self) -> keel_core::AgentResult<T> {
        T::deserialize(&self.payload).map_err(|e| {
            keel_core::AgentError::invalid_input(
                "run_event.payload",
                format!("{} event #{}: {e}", self.event_type, self.sequence),
            )
        })
    }

    /// Whether the event is of `event_type`.
    pub fn is(&self, event_type: &str) -> bool {
        self.event_type == event_type
    }

    /// The [`RunContext`](keel_core::RunContext) of the task this event carries: a
    /// `task.status` built with its task (the run's final status is) holds the serialized
    /// task, whose `metadata.run_context` is read here. `Ok(None)` when the event carries no
    /// task, or the task no context; a context that does not read is
    /// [`AgentError::InvalidInput`](keel_core::AgentError::InvalidInput) naming where it was.
    pub fn run_context(&self) -> keel_core::AgentResult<Option<keel_core::RunContext>> {
        if self.event_type != EventType::TASK_STATUS {
            return Ok(None);
        }
        let stored = self
            .payload
            .get("task")
            .and_then(|task| task.get("metadata"))
            .and_then(|metadata| metadata.get(keel_core::RUN_CONTEXT_KEY));
        match stored {
            None | Some(Value::Null) => Ok(None),
            Some(value) => keel_core::RunContext::deserialize(value)
                .map(Some)
                .map_err(|e| {
                    keel_core::AgentError::invalid_input(
                        "run_event.payload.task.metadata.run_context",
                        format!("event #{}: {e}", self.sequence),
                    )
                }),
        }
    }
}

/// An event not yet numbered: everything but `sequence`, `timestamp` and the run's own
/// correlation, which the [`EventEmitter`](crate::EventEmitter) adds exactly once.
#[derive(Debug, Clone, PartialEq)]
pub struct RunEventBuilder {
    pub(crate) event_type: EventType,
    /// Borrowed when it is a literal: most summaries are, and a step makes a dozen.
    pub(crate) summary: Cow<'static, str>,
    pub(crate) severity: Severity,
    pub(crate) payload: Value,
    pub(crate) task_id: Option<TaskId>,
    pub(crate) step: Option<u32>,
    pub(crate) span_id: Option<Arc<str>>,
    pub(crate) parent_span_id: Option<Arc<str>>,
    pub(crate) action_id: Option<ActionId>,
    pub(crate) parent_action_id: Option<ActionId>,
    pub(crate) delegation_id: Option<String>,
    pub(crate) is_final: bool,
}

impl RunEventBuilder {
    /// An info event with an empty payload.
    pub fn new(event_type: EventType, summary: impl Into<Cow<'static, str>>) -> Self {
        Self {
            event_type,
            summary: summary.into(),
            severity: Severity::Info,
            payload: Value::Object(Default::default()),
            task_id: None,
            step: None,
            span_id: None,
            parent_span_id: None,
            action_id: None,
            parent_action_id: None,
            delegation_id: None,
            is_final: false,
        }
    }

    /// The type being built.
    pub fn event_type(&self) -> &EventType {
        &self.event_type
    }

    /// Set the payload.
    #[must_use]
    pub fn payload(mut self, payload: Value) -> Self {
        self.payload = payload;
        self
    }

    /// Set the payload from any serializable value (one of the [`crate::payload`] structs,
    /// or an application's own). A value that does not serialize leaves the event saying why
    /// (`{"payload_error": ...}`) rather than failing the run.
    ///
    /// ```
    /// use keel_core::RunContext;
    /// use keel_events::{EventEmitter, InMemoryEventSink, RunEvent};
    /// #[derive(serde::Serialize)]
    /// struct Injected { items: u32 }
    /// let emitter = EventEmitter::new(&RunContext::new(), std::sync::Arc::new(InMemoryEventSink::new()));
    /// let event = emitter.create(RunEvent::builder("queue.injected", "1 item").payload_from(Injected { items: 1 }));
    /// assert_eq!(event.payload["items"], 1);
    /// ```
    #[must_use]
    pub fn payload_from<T: Serialize>(self, payload: T) -> Self {
        self.payload(crate::payload::to_payload(&payload))
    }

    /// Replace the summary.
    #[must_use]
    pub fn summary(mut self, summary: impl Into<Cow<'static, str>>) -> Self {
        self.summary = summary.into();
        self
    }

    /// Set the severity.
    #[must_use]
    pub fn severity(mut self, severity: Severity) -> Self {
        self.severity = severity;
        self
    }

    /// Set the step.
    #[must_use]
    pub fn step(mut self, step: u32) -> Self {
        self.step = Some(step);
        self
    }

    /// Override the emitter's task (for events about another task of the run).
    #[must_use]
    pub fn task(mut self, task_id: TaskId) -> Self {
        self.task_id = Some(task_id);
        self
    }

    /// Set the span and its parent.
    #[must_use]
    pub fn span(mut self, span_id: impl Into<String>, parent_span_id: Option<String>) -> Self {
        self.span_id = Some(Arc::from(span_id.into()));
        self.parent_span_id = parent_span_id.map(Arc::from);
        self
    }

    /// Set the action.
    #[must_use]
    pub fn action(mut self, action_id: ActionId) -> Self {
        self.action_id = Some(action_id);
        self
    }

    /// Set the parent action.
    #[must_use]
    pub fn parent_action(mut self, parent_action_id: ActionId) -> Self {
        self.parent_action_id = Some(parent_action_id);
        self
    }

    /// Set the delegation.
    #[must_use]
    pub fn delegation(mut self, delegation_id: impl Into<String>) -> Self {
        self.delegation_id = Some(delegation_id.into());
        self
    }

    /// Mark (or unmark) the event as a final boundary.
    #[must_use]
    pub fn final_boundary(mut self, is_final: bool) -> Self {
        self.is_final = is_final;
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_are_written_as_chrono_writes_them() {
        use chrono::TimeZone;
        let whole = Utc.with_ymd_and_hms(2026, 1, 2, 3, 4, 5).unwrap();
        for nanos in [0, 100_000_000, 120_000, 123_456_789, 1] {
            let time = whole + chrono::Duration::nanoseconds(nanos);
            let mut text = Vec::new();
            rfc3339(&time, &mut serde_json::Serializer::new(&mut text)).unwrap();
            assert_eq!(text, serde_json::to_vec(&time).unwrap(), "{time:?}");
        }
    }

    #[test]
    fn every_known_type_serializes_with_its_exact_name() {
        let names = [
            "task.status",
            "task.artifact",
            "context.prepared",
            "llm.call.started",
            "llm.call.completed",
            "llm.stream",
            "budget.warning",
            "budget.exceeded",
            "action.requested",
            "action.policy",
            "action.started",
            "action.completed",
            "action.denied",
            "action.failed",
            "approval.required",
            "approval.decided",
            "tool.async.dispatched",
            "tool.async.acknowledged",
            "tool.async.result",
            "tool.async.progress",
            "tool.async.timed_out",
            "queue.injected",
            "queue.drained",
            "message.persisted",
            "tool_result.persisted",
            "run.stopped",
            "stop.evaluated",
            "thread.terminated",
            "context.compacted",
            "effect.scheduled",
            "effect.fired",
            "effect.canceled",
            "effect.dropped",
            "subagent.created",
            "subagent.messaged",
            "subagent.returned",
            "subagent.failed",
            "subagent.status",
            "subagent.bootstrap_required",
        ];
        assert_eq!(EventType::KNOWN.len(), names.len());
        for (t, name) in EventType::KNOWN.iter().zip(names) {
            assert_eq!(serde_json::to_value(t).unwrap(), Value::from(name));
            let back: EventType = serde_json::from_value(Value::from(name)).unwrap();
            assert_eq!(&back, t);
        }
    }

    #[test]
    fn envelope_uses_the_seed_field_names_and_round_trips() {
        let event = RunEvent {
            version: RUN_EVENT_VERSION,
            event_type: EventType::ACTION_STARTED,
            run_id: RunId::from("run-1"),
            task_id: Some(TaskId::from("task-1")),
            thread_id: None,
            trace_id: Some("4bf92f3577b34da6a3ce929d0e0e4736".into()),
            agent_name: Some("clerk".into()),
            sequence: 7,
            step: Some(2),
            span_id: Some("s-2".into()),
            parent_span_id: Some("s-1".into()),
            action_id: Some(ActionId::from("a-1")),
            parent_action_id: Some(ActionId::from("a-0")),
            delegation_id: Some("d-1".into()),
            severity: Severity::Warning,
            summary: "started".into(),
            payload: serde_json::json!({"x": 1}),
            is_final: true,
            timestamp: Utc::now(),
        };
        let json = serde_json::to_value(&event).unwrap();
        for field in [
            "version",
            "type",
            "run_id",
            "task_id",
            "agent_name",
            "sequence",
            "step",
            "span_id",
            "parent_span_id",
            "action_id",
            "parent_action_id",
            "delegation_id",
            "severity",
            "summary",
            "payload",
            "final",
            "timestamp",
        ] {
            assert!(json.get(field).is_some(), "missing {field}");
        }
        assert_eq!(json["type"], "action.started");
        assert_eq!(json["severity"], "warning");
        let back: RunEvent = serde_json::from_value(json).unwrap();
        assert_eq!(back, event);
    }

    #[test]
    fn custom_types_round_trip() {
        let t = EventType::new("queue.injected");
        let back: EventType = serde_json::from_value(serde_json::to_value(&t).unwrap()).unwrap();
        assert_eq!(back, t);
        assert_eq!(back, "queue.injected");
    }
}
