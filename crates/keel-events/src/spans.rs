//! [`RunSpans`]: which span of a run's trace each of its events belongs to, so that a run's
//! events and its OpenTelemetry spans are one tree (decision 180).
//!
//! A run is a tree of spans: the run, its steps, each step's model call and each tool call
//! (an action). The ids are W3C-sized and derived from the run's id (the run span) and from
//! the step number or action id (the spans under it), so a run resumed in another process
//! after a pause or a crash gives its later events the same spans, without storing them.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use keel_core::{ActionId, RunContext, SpanId, W3cTraceId};

use crate::{EventType, RunEventBuilder};

/// The kind of span an event belongs to (by the event's step, action and type).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SpanKind {
    /// The run itself: `invoke_agent {agent}`.
    Run,
    /// One step: a model call and the tool calls it returned.
    Step,
    /// A step's model call: `chat {model}`.
    ModelCall,
    /// A tool call (an action): `execute_tool {tool}`.
    ToolCall,
}

/// The span ids of one run: its trace, its own span and the span it hangs under, and the
/// ids of its steps', model calls' and tool calls' spans.
///
/// ```
/// use keel_core::RunContext;
/// use keel_events::{EventEmitter, InMemoryEventSink, RunEvent};
/// let context = RunContext::new();
/// let emitter = EventEmitter::new(&context, std::sync::Arc::new(InMemoryEventSink::new()));
/// let start = emitter.create(RunEvent::builder("task.status", "working"));
/// let step = emitter.create(RunEvent::builder("queue.drained", "").step(1));
/// assert_eq!(start.trace_id.as_deref(), Some(context.trace_id.as_str()));
/// assert_eq!(step.parent_span_id, start.span_id);
/// ```
#[derive(Debug)]
pub struct RunSpans {
    trace_id: W3cTraceId,
    trace_hex: Arc<str>,
    run_span: SpanId,
    run_hex: Arc<str>,
    parent: Option<Arc<str>>,
    delegation_id: Option<String>,
    /// The step the run is in (0 before its first): a tool call's span is under it.
    step: AtomicU32,
    /// The ids of the last step an event named, written once and shared by its events (a
    /// step's events outnumber its steps several times over).
    step_ids: Mutex<Option<StepIds>>,
}

/// A step's span id and its model call's, as events carry them.
#[derive(Debug, Clone)]
struct StepIds {
    step: u32,
    span: Arc<str>,
    model_call: Arc<str>,
}

impl RunSpans {
    /// The spans of the run `context` describes: its trace id, the run span derived from
    /// its run id, under `context.parent_span_id`.
    pub fn of(context: &RunContext) -> Self {
        let trace_id = W3cTraceId::of(&context.trace_id);
        let run_span = SpanId::derive(&[b"run", context.run_id.as_str().as_bytes()]);
        Self {
            trace_hex: trace_id.to_hex().into(),
            trace_id,
            run_hex: run_span.to_hex().into(),
            run_span,
            parent: context.parent_span_id.as_deref().map(Arc::from),
            delegation_id: context.delegation_id.clone(),
            step: AtomicU32::new(0),
            step_ids: Mutex::new(None),
        }
    }

    /// The trace.
    pub fn trace_id(&self) -> W3cTraceId {
        self.trace_id
    }

    /// The run's own span.
    pub fn run_span(&self) -> SpanId {
        self.run_span
    }

    /// The span the run's span hangs under, as 16 hex digits.
    pub fn parent(&self) -> Option<&str> {
        self.parent.as_deref()
    }

    /// The span of step `step`.
    pub fn step_span(&self, step: u32) -> SpanId {
        SpanId::derive(&[&self.run_span.0, b"step", &step.to_be_bytes()])
    }

    /// The span of step `step`'s model call.
    pub fn model_call_span(&self, step: u32) -> SpanId {
        SpanId::derive(&[&self.run_span.0, b"chat", &step.to_be_bytes()])
    }

    /// The span of the tool call `action`.
    pub fn tool_call_span(&self, action: &ActionId) -> SpanId {
        SpanId::derive(&[&self.run_span.0, b"tool", action.as_str().as_bytes()])
    }

    /// The step the run is in now (0 before its first step).
    pub fn current_step(&self) -> u32 {
        self.step.load(Ordering::Relaxed)
    }

    /// Go on from step `step` (a resumed run, whose earlier events reached `step`).
    pub fn resume_at_step(&self, step: u32) {
        self.step.fetch_max(step, Ordering::Relaxed);
    }

    /// Which kind of span an event with this type, step and action belongs to.
    pub fn kind_of(
        event_type: &EventType,
        step: Option<u32>,
        action: Option<&ActionId>,
    ) -> SpanKind {
        if action.is_some() {
            SpanKind::ToolCall
        } else if step.is_none() {
            SpanKind::Run
        } else if *event_type == EventType::LLM_CALL_STARTED
            || *event_type == EventType::LLM_CALL_COMPLETED
            || *event_type == EventType::LLM_STREAM
            || *event_type == EventType::CONTEXT_PREPARED
        {
            SpanKind::ModelCall
        } else {
            SpanKind::Step
        }
    }

    /// Fill in the builder's trace, span, parent span and delegation, unless it names its
    /// own span.
    pub(crate) fn stamp(&self, builder: &mut RunEventBuilder) {
        if builder.delegation_id.is_none() {
            builder.delegation_id.clone_from(&self.delegation_id);
        }
        if builder.span_id.is_some() {
            return;
        }
        let (span, parent) = self.span_of(
            &builder.event_type,
            builder.step,
            builder.action_id.as_ref(),
        );
        builder.span_id = Some(span);
        builder.parent_span_id = parent;
    }

    /// The span and parent span of the run's next event, of this type, step and action: what
    /// [`stamp`](Self::stamp) gives it, and what a stored run's reader derives again
    /// (decision 257). A step moves the run on to it.
    pub(crate) fn span_of(
        &self,
        event_type: &EventType,
        step: Option<u32>,
        action: Option<&ActionId>,
    ) -> (Arc<str>, Option<Arc<str>>) {
        if let Some(step) = step {
            self.step.fetch_max(step, Ordering::Relaxed);
        }
        match Self::kind_of(event_type, step, action) {
            SpanKind::Run => (self.run_hex.clone(), self.parent.clone()),
            SpanKind::Step => {
                let ids = self.step_ids(step.unwrap_or_default());
                (ids.span, Some(self.run_hex.clone()))
            }
            SpanKind::ModelCall => {
                let ids = self.step_ids(step.unwrap_or_default());
                (ids.model_call, Some(ids.span))
            }
            SpanKind::ToolCall => {
                let span = match action {
                    Some(action) => self.tool_call_span(action).to_hex().into(),
                    None => self.run_hex.clone(),
                };
                let parent = match self.current_step() {
                    0 => self.run_hex.clone(),
                    step => self.step_ids(step).span,
                };
                (span, Some(parent))
            }
        }
    }

    /// The ids of step `step`'s span and its model call's span (a tool call's parent is
    /// the step it was returned in, or the run when it ran without a model, a direct call).
    fn step_ids(&self, step: u32) -> StepIds {
        let mut cached = self.step_ids.lock().unwrap_or_else(|p| p.into_inner());
        match &*cached {
            Some(ids) if ids.step == step => ids.clone(),
            _ => {
                let ids = StepIds {
                    step,
                    span: self.step_span(step).to_hex().into(),
                    model_call: self.model_call_span(step).to_hex().into(),
                };
                *cached = Some(ids.clone());
                ids
            }
        }
    }

    /// The trace id as 32 hex digits, as events carry it (shared).
    pub(crate) fn trace_hex(&self) -> &Arc<str> {
        &self.trace_hex
    }
}
