//! [`SpanSink`]: an event sink that turns a run's events into OpenTelemetry spans with the
//! events' own trace and span ids, start and end times (decision 181).
//!
//! A span opens at the first event that names it and ends at the event that closes it: a
//! tool call at its `action.completed|failed|denied`, a model call at `llm.call.completed`, a
//! step at `stop.evaluated`, and the run (with whatever it left open) at its final status or
//! a `run.stopped` that leaves it working (a hand-over, a wait for a tool's callback). The
//! finished span goes to the span processor (batched there, exported off the run's task).
//!
//! A span that a run's later part opens again (the run after a rest or a crash, a tool call
//! whose approval came after the run rested) is exported as a span of its own, linked to the
//! earlier one (decision 239): one id is never exported twice.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::SystemTime;

use async_trait::async_trait;
use keel_core::ApprovalOutcome;
use keel_core::{AgentResult, SpanId, TaskState, W3cTraceId};
use keel_events::payload::{
    ActionCompletedPayload, ActionFailedPayload, ActionPayload, ActionPolicyPayload,
    ApprovalDecidedPayload, LlmCallCompletedPayload, LlmCallStartedPayload, LlmStreamPayload,
    RunStoppedPayload,
};
use keel_events::{EventSink, EventType, RedactionPolicy, RunEvent, SpanKind};
use opentelemetry::trace::{
    Event, Link, SpanContext, SpanKind as OtelKind, Status, TraceFlags, TraceState,
};
use opentelemetry::{Array, InstrumentationScope, KeyValue, StringValue, Value};
use opentelemetry_sdk::trace::{SpanData, SpanEvents, SpanLinks, SpanProcessor};

use crate::semconv as sc;

/// Turns every event it is given into spans, handed to `processor` as they end.
///
/// Content (tool arguments and results, the model's output) is left out unless asked for
/// with [`SpanSink::with_content`], and is masked by the redaction policy even then.
pub struct SpanSink {
    processor: Box<dyn SpanProcessor>,
    scope: InstrumentationScope,
    content: Option<RedactionPolicy>,
    open: Mutex<HashMap<[u8; 8], Open>>,
}

impl std::fmt::Debug for SpanSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SpanSink")
            .field("content", &self.content.is_some())
            .finish_non_exhaustive()
    }
}

/// A span between its first event and the event that ends it.
struct Open {
    kind: SpanKind,
    run_id: keel_core::RunId,
    trace_id: W3cTraceId,
    /// The id it is exported with: the events' span id, or its own for a later part.
    span_id: SpanId,
    parent: Option<SpanId>,
    /// The span (the events' id) this one goes on from, when it is a later part of it.
    resumes: Option<SpanId>,
    start: SystemTime,
    agent: String,
    model: Option<String>,
    tool: Option<String>,
    attributes: Vec<KeyValue>,
    events: Vec<Event>,
    status: Status,
    /// The model's streamed output, kept only when content is captured.
    output: String,
}

impl SpanSink {
    /// A sink that hands finished spans to `processor` (a batch processor over an OTLP
    /// exporter, as [`crate::Telemetry`] builds, or any other).
    pub fn new(processor: impl SpanProcessor + 'static) -> Self {
        Self {
            processor: Box::new(processor),
            scope: InstrumentationScope::builder(sc::SCOPE)
                .with_version(env!("CARGO_PKG_VERSION"))
                .with_attributes([KeyValue::new(
                    "keel.genai.conventions",
                    sc::GENAI_CONVENTIONS,
                )])
                .build(),
            content: None,
            open: Mutex::new(HashMap::new()),
        }
    }

    /// Put prompt and completion content on the spans (tool arguments and results, the
    /// model's output), masked by `redaction`.
    #[must_use]
    pub fn with_content(mut self, redaction: RedactionPolicy) -> Self {
        self.content = Some(redaction);
        self
    }

    /// Export what the processor holds now.
    pub fn flush(&self) {
        if let Err(err) = self.processor.force_flush() {
            tracing::warn!(error = %err, "cannot flush the trace exporter");
        }
    }

    /// Flush and stop the processor (at the process's end).
    pub fn shutdown(&self) {
        if let Err(err) = self.processor.shutdown() {
            tracing::warn!(error = %err, "cannot shut the trace exporter down");
        }
    }

    /// Take in one event; the spans it ends.
    fn observe(&self, event: &RunEvent) -> Vec<Open> {
        let (Some(span), Some(trace)) = (
            event.span_id.as_deref().and_then(SpanId::parse),
            event.trace_id.as_deref(),
        ) else {
            return Vec::new();
        };
        let trace_id = W3cTraceId::of(&keel_core::TraceId::from(trace));
        let kind =
            keel_events::RunSpans::kind_of(&event.event_type, event.step, event.action_id.as_ref());
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        let entry = open
            .entry(span.0)
            .or_insert_with(|| Open::new(kind, trace_id, span, event));
        entry.absorb(event, self.content.as_ref());
        let ends = match kind {
            SpanKind::ToolCall => {
                event.is(EventType::ACTION_COMPLETED.as_str())
                    || event.is(EventType::ACTION_FAILED.as_str())
                    || event.is(EventType::ACTION_DENIED.as_str())
                    // A call approved after its run rested runs as a new call (a span of its
                    // own): the approval was all the resumed part of this one waited for.
                    || (entry.resumes.is_some()
                        && event.is(EventType::APPROVAL_DECIDED.as_str())
                        && event
                            .payload_as::<ApprovalDecidedPayload>()
                            .is_ok_and(|p| p.decision.outcome == ApprovalOutcome::Approved))
            }
            SpanKind::ModelCall => event.is(EventType::LLM_CALL_COMPLETED.as_str()),
            SpanKind::Step => event.is(EventType::STOP_EVALUATED.as_str()),
            SpanKind::Run => {
                event.is_final
                    || (event.is(EventType::RUN_STOPPED.as_str())
                        && event
                            .payload_as::<RunStoppedPayload>()
                            .is_ok_and(|p| p.state == TaskState::Working))
            }
        };
        if !ends {
            return Vec::new();
        }
        if kind != SpanKind::Run {
            return open.remove(&span.0).into_iter().collect();
        }
        // The run ends: so does everything it left open (a tool call waiting for an
        // approval, a step cut short), inner spans first.
        let ids: Vec<[u8; 8]> = open
            .iter()
            .filter(|(_, o)| o.run_id == event.run_id)
            .map(|(id, _)| *id)
            .collect();
        let mut ended: Vec<Open> = ids.iter().filter_map(|id| open.remove(id)).collect();
        ended.sort_by_key(|o| o.kind == SpanKind::Run);
        ended
    }

    fn export(&self, open: Open, end: SystemTime) {
        let data = open.into_span_data(end, self.scope.clone());
        self.processor.on_end(data);
    }
}

#[async_trait]
impl EventSink for SpanSink {
    async fn emit(&self, event: &RunEvent) -> AgentResult<()> {
        let end = SystemTime::from(event.timestamp);
        for open in self.observe(event) {
            self.export(open, end);
        }
        Ok(())
    }
}

impl Open {
    fn new(kind: SpanKind, trace_id: W3cTraceId, span_id: SpanId, event: &RunEvent) -> Self {
        let agent = event.agent_name.clone().unwrap_or_default();
        let mut attributes = vec![KeyValue::new(sc::KEEL_RUN_ID, event.run_id.to_string())];
        if let Some(task) = &event.task_id {
            attributes.push(KeyValue::new(sc::KEEL_TASK_ID, task.to_string()));
        }
        if let Some(thread) = &event.thread_id {
            attributes.push(KeyValue::new(sc::KEEL_THREAD_ID, thread.to_string()));
            attributes.push(KeyValue::new(sc::CONVERSATION_ID, thread.to_string()));
        }
        if !agent.is_empty() {
            attributes.push(KeyValue::new(sc::AGENT_NAME, agent.clone()));
        }
        let operation = match kind {
            SpanKind::Run => Some(sc::OP_INVOKE_AGENT),
            SpanKind::ModelCall => Some(sc::OP_CHAT),
            SpanKind::ToolCall => Some(sc::OP_EXECUTE_TOOL),
            SpanKind::Step => None,
        };
        if let Some(operation) = operation {
            attributes.push(KeyValue::new(sc::OPERATION_NAME, operation));
        }
        if let (SpanKind::Step | SpanKind::ModelCall, Some(step)) = (kind, event.step) {
            attributes.push(KeyValue::new(sc::KEEL_STEP, i64::from(step)));
        }
        if kind == SpanKind::Run {
            if let Some(delegation) = &event.delegation_id {
                attributes.push(KeyValue::new(sc::KEEL_DELEGATION_ID, delegation.clone()));
            }
        }
        if let Some(action) = &event.action_id {
            attributes.push(KeyValue::new(sc::KEEL_ACTION_ID, action.to_string()));
        }
        // A run's span opens at its first event and a tool call's at its request: opened at
        // a later event, the span goes on from an earlier part that was exported when the
        // run rested (or died with a process that crashed). This part gets an id of its own,
        // derived from the span's and the event's number (so every process derives the
        // same), and a link to the earlier part.
        let resumed = match kind {
            SpanKind::Run => event.sequence > 1,
            SpanKind::ToolCall => !event.is(EventType::ACTION_REQUESTED.as_str()),
            SpanKind::Step | SpanKind::ModelCall => false,
        };
        let (span_id, resumes) = if resumed {
            attributes.push(KeyValue::new(sc::KEEL_RESUMES, span_id.to_hex()));
            let part = SpanId::derive(&[&span_id.0, b"resumed", &event.sequence.to_be_bytes()]);
            (part, Some(span_id))
        } else {
            (span_id, None)
        };
        Self {
            kind,
            run_id: event.run_id.clone(),
            trace_id,
            span_id,
            resumes,
            parent: event.parent_span_id.as_deref().and_then(SpanId::parse),
            start: SystemTime::from(event.timestamp),
            agent,
            model: None,
            tool: None,
            attributes,
            events: Vec::new(),
            status: Status::Unset,
            output: String::new(),
        }
    }

    /// What `event` says about the span.
    fn absorb(&mut self, event: &RunEvent, content: Option<&RedactionPolicy>) {
        let at = SystemTime::from(event.timestamp);
        let t = &event.event_type;
        if *t == EventType::LLM_CALL_STARTED {
            if let Ok(p) = event.payload_as::<LlmCallStartedPayload>() {
                if let Some(provider) = p.provider {
                    self.attributes
                        .push(KeyValue::new(sc::PROVIDER_NAME, provider));
                }
                if let Some(model) = p.model {
                    self.attributes
                        .push(KeyValue::new(sc::REQUEST_MODEL, model.clone()));
                    self.model = Some(model);
                }
            }
        } else if *t == EventType::LLM_STREAM {
            if content.is_some() {
                if let Ok(p) = event.payload_as::<LlmStreamPayload>() {
                    self.output.push_str(&p.delta);
                }
            }
        } else if *t == EventType::LLM_CALL_COMPLETED {
            if let Ok(p) = event.payload_as::<LlmCallCompletedPayload>() {
                if let Some(model) = p.model {
                    self.attributes
                        .push(KeyValue::new(sc::RESPONSE_MODEL, model.clone()));
                    self.model.get_or_insert(model);
                }
                if !self
                    .attributes
                    .iter()
                    .any(|kv| kv.key.as_str() == sc::PROVIDER_NAME)
                {
                    if let Some(provider) = p.provider {
                        self.attributes
                            .push(KeyValue::new(sc::PROVIDER_NAME, provider));
                    }
                }
                self.attributes
                    .push(KeyValue::new(sc::USAGE_INPUT_TOKENS, p.input_tokens as i64));
                self.attributes.push(KeyValue::new(
                    sc::USAGE_OUTPUT_TOKENS,
                    p.output_tokens as i64,
                ));
                if let Some(reason) = p.finish_reason {
                    self.attributes.push(KeyValue::new(
                        sc::RESPONSE_FINISH_REASONS,
                        Value::Array(Array::String(vec![StringValue::from(reason)])),
                    ));
                }
            }
            if let Some(redaction) = content {
                let mut messages = serde_json::json!([{
                    "role": "assistant",
                    "parts": [{"type": "text", "content": std::mem::take(&mut self.output)}],
                }]);
                redaction.redact_value(&mut messages);
                self.attributes
                    .push(KeyValue::new(sc::OUTPUT_MESSAGES, messages.to_string()));
            }
        } else if *t == EventType::ACTION_REQUESTED {
            if let Ok(p) = event.payload_as::<ActionPayload>() {
                let action = p.action;
                self.attributes
                    .push(KeyValue::new(sc::TOOL_NAME, action.name.clone()));
                self.attributes
                    .push(KeyValue::new(sc::TOOL_TYPE, "function"));
                if let Some(description) = action.description {
                    self.attributes
                        .push(KeyValue::new(sc::TOOL_DESCRIPTION, description));
                }
                if let Some(call) = action.metadata.get("call_id").and_then(|v| v.as_str()) {
                    self.attributes
                        .push(KeyValue::new(sc::TOOL_CALL_ID, call.to_owned()));
                }
                if let Some(redaction) = content {
                    let arguments = redaction.redacted(&action.payload);
                    self.attributes.push(KeyValue::new(
                        sc::TOOL_CALL_ARGUMENTS,
                        arguments.to_string(),
                    ));
                }
                self.tool = Some(action.name);
            }
        } else if *t == EventType::ACTION_POLICY {
            if let Ok(p) = event.payload_as::<ActionPolicyPayload>() {
                let mut attributes = vec![KeyValue::new(sc::KEEL_POLICY_DECISION, p.decision)];
                if let Some(reason) = p.reason {
                    attributes.push(KeyValue::new(sc::KEEL_POLICY_REASON, reason));
                }
                self.events
                    .push(Event::new(sc::EVENT_POLICY, at, attributes, 0));
            }
        } else if *t == EventType::APPROVAL_REQUIRED {
            self.events
                .push(Event::new(sc::EVENT_APPROVAL_REQUIRED, at, Vec::new(), 0));
        } else if *t == EventType::APPROVAL_DECIDED {
            if let Ok(p) = event.payload_as::<ApprovalDecidedPayload>() {
                let outcome = serde_json::to_value(p.decision.outcome)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_owned))
                    .unwrap_or_default();
                self.events.push(Event::new(
                    sc::EVENT_APPROVAL_DECIDED,
                    at,
                    vec![KeyValue::new(sc::KEEL_APPROVAL_OUTCOME, outcome)],
                    0,
                ));
            }
        } else if *t == EventType::ACTION_COMPLETED {
            if let Some(redaction) = content {
                if let Ok(p) = event.payload_as::<ActionCompletedPayload>() {
                    let result = redaction.redacted(&p.output);
                    self.attributes
                        .push(KeyValue::new(sc::TOOL_CALL_RESULT, result.to_string()));
                }
            }
        } else if *t == EventType::ACTION_FAILED {
            let error = event
                .payload_as::<ActionFailedPayload>()
                .map(|p| p.error)
                .unwrap_or_default();
            self.attributes
                .push(KeyValue::new(sc::ERROR_TYPE, "tool_error"));
            self.status = Status::Error {
                description: Cow::Owned(error),
            };
        } else if *t == EventType::ACTION_DENIED {
            self.attributes
                .push(KeyValue::new(sc::ERROR_TYPE, "denied"));
            self.status = Status::Error {
                description: Cow::Borrowed("denied"),
            };
        } else if *t == EventType::RUN_STOPPED {
            if let Ok(p) = event.payload_as::<RunStoppedPayload>() {
                self.attributes
                    .push(KeyValue::new(sc::KEEL_STOP_REASON, p.reason));
            }
        } else if *t == EventType::TASK_STATUS && event.is_final {
            let state = event.payload["state"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            if state == TaskState::Failed.as_str() {
                self.attributes
                    .push(KeyValue::new(sc::ERROR_TYPE, "failed"));
                self.status = Status::Error {
                    description: Cow::Owned(
                        event.payload["message"]
                            .as_str()
                            .unwrap_or("failed")
                            .to_owned(),
                    ),
                };
            }
            self.attributes
                .push(KeyValue::new(sc::KEEL_RUN_STATE, state));
        }
    }

    /// The finished span. Its name is the conventions' (`invoke_agent {agent}`, `chat
    /// {model}`, `execute_tool {tool}`), known only now for a model call's model.
    fn into_span_data(self, end: SystemTime, scope: InstrumentationScope) -> SpanData {
        let (name, span_kind) = match self.kind {
            SpanKind::Run => (join(sc::OP_INVOKE_AGENT, &self.agent), OtelKind::Internal),
            SpanKind::Step => (
                format!(
                    "step {}",
                    self.attributes
                        .iter()
                        .find(|kv| kv.key.as_str() == sc::KEEL_STEP)
                        .map(|kv| kv.value.to_string())
                        .unwrap_or_default()
                ),
                OtelKind::Internal,
            ),
            SpanKind::ModelCall => (
                join(sc::OP_CHAT, self.model.as_deref().unwrap_or_default()),
                OtelKind::Client,
            ),
            SpanKind::ToolCall => (
                join(
                    sc::OP_EXECUTE_TOOL,
                    self.tool.as_deref().unwrap_or_default(),
                ),
                OtelKind::Internal,
            ),
        };
        let trace_id = opentelemetry::TraceId::from_bytes(self.trace_id.0);
        let mut events = SpanEvents::default();
        events.events = self.events;
        let mut links = SpanLinks::default();
        if let Some(earlier) = self.resumes {
            links.links.push(Link::new(
                SpanContext::new(
                    trace_id,
                    opentelemetry::SpanId::from_bytes(earlier.0),
                    TraceFlags::SAMPLED,
                    false,
                    TraceState::NONE,
                ),
                vec![KeyValue::new(sc::KEEL_LINK_TYPE, "resumes")],
                0,
            ));
        }
        SpanData {
            span_context: SpanContext::new(
                trace_id,
                opentelemetry::SpanId::from_bytes(self.span_id.0),
                TraceFlags::SAMPLED,
                false,
                TraceState::NONE,
            ),
            parent_span_id: self
                .parent
                .map(|p| opentelemetry::SpanId::from_bytes(p.0))
                .unwrap_or(opentelemetry::SpanId::INVALID),
            // A run's parent is another process's span (a caller, a delegating agent) or,
            // for a subagent, another run of this one: either way not a span of this run.
            parent_span_is_remote: self.kind == SpanKind::Run && self.parent.is_some(),
            span_kind,
            name: Cow::Owned(name),
            start_time: self.start,
            end_time: end.max(self.start),
            attributes: self.attributes,
            dropped_attributes_count: 0,
            events,
            links,
            status: self.status,
            instrumentation_scope: scope,
        }
    }
}

fn join(operation: &str, subject: &str) -> String {
    if subject.is_empty() {
        operation.to_owned()
    } else {
        format!("{operation} {subject}")
    }
}
