//! Sinks that keep a run's events for its report: [`RunRecorder`] (for tests and
//! applications, which read the report and the events) and [`ReportWriter`] (for the engine,
//! which only persists the report's JSON when the run ends).

use std::sync::{Mutex, PoisonError};

use async_trait::async_trait;
use keel_core::stored::JsonText;
use keel_core::{AgentResult, Metadata};
use serde_json::Value;

use crate::stored::StoredRun;
use crate::{EventSink, RedactionPolicy, RunEvent, RunReport};

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
    /// hold no credentials. For the default policy the report equals the one
    /// [`RunReport::redacted_json`] makes of the unmasked events.
    #[must_use]
    pub fn redacting(mut self, policy: RedactionPolicy) -> Self {
        self.redaction = Some(policy);
        self
    }

    /// The events recorded so far.
    pub fn events(&self) -> Vec<RunEvent> {
        self.lock().clone()
    }

    /// The report of the events recorded so far, leaving the recorder empty: for the end of
    /// a run, when the events are not needed again (it spares copying them all).
    pub fn take_report(&self) -> RunReport {
        self.report_of(self.take_events())
    }

    /// The run recorded so far as JSON text in the form a run is stored (its events and a
    /// small summary, [`STORED_RUN_VERSION`](crate::STORED_RUN_VERSION), decision 257),
    /// leaving the recorder empty; [`RunReport::from_value`] renders the report from it. A
    /// redacting recorder's events are already masked, and its metadata is masked here.
    pub fn take_report_json(&self) -> AgentResult<JsonText> {
        let mut metadata = Value::Object(self.metadata.clone());
        if let Some(policy) = &self.redaction {
            policy.redact_value(&mut metadata);
        }
        let metadata = match metadata {
            Value::Object(metadata) => metadata,
            _ => Metadata::new(),
        };
        let run = StoredRun::of(self.take_events(), metadata);
        // A stored event takes about a quarter of a kilobyte of JSON.
        JsonText::of_sized(&run, 256 * run.events.len() + 512)
    }

    fn take_events(&self) -> Vec<RunEvent> {
        std::mem::take(&mut *self.lock())
    }

    /// The report of the events recorded so far.
    pub fn report(&self) -> RunReport {
        self.report_of(self.events())
    }

    fn report_of(&self, events: Vec<RunEvent>) -> RunReport {
        let mut report = RunReport::from_owned_events(events);
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
        let mut events = self.lock();
        if events.capacity() == 0 {
            // A run of a few steps emits a few dozen events: grow the list less often.
            events.reserve(64);
        }
        events.push(event);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<RunEvent>> {
        // A panic elsewhere while holding the lock leaves a Vec that is still valid.
        self.events.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[async_trait]
impl EventSink for RunRecorder {
    async fn emit(&self, event: &RunEvent) -> AgentResult<()> {
        self.record(event.clone());
        Ok(())
    }
}

/// A run's report as the engine keeps it: a [`RunRecorder`] whose report is taken once, as
/// JSON text, when the run ends. Fed by
/// [`EventEmitter::emit_reported`](crate::EventEmitter::emit_reported), it sees every event
/// in the order the run's sinks saw it, without being one of them.
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
#[derive(Debug, Default)]
pub struct ReportWriter {
    recorder: RunRecorder,
}

impl ReportWriter {
    /// A writer that masks nothing.
    pub fn new() -> Self {
        Self::default()
    }

    /// Mask every event with `policy` as it is recorded, and the metadata when the report
    /// is taken.
    #[must_use]
    pub fn redacting(mut self, policy: RedactionPolicy) -> Self {
        self.recorder = self.recorder.redacting(policy);
        self
    }

    /// Attach application metadata to the report.
    #[must_use]
    pub fn with_metadata(mut self, metadata: Metadata) -> Self {
        self.recorder = self.recorder.with_metadata(metadata);
        self
    }

    /// Record one more event.
    pub fn record(&self, event: &RunEvent) {
        self.recorder.record(event.clone());
    }

    /// Record an event the caller has no further use for.
    pub(crate) fn record_owned(&self, event: RunEvent) {
        self.recorder.record(event);
    }

    /// The run recorded so far as JSON text in its stored form
    /// ([`RunRecorder::take_report_json`]), leaving the writer empty.
    pub fn take_json(&self) -> AgentResult<JsonText> {
        self.recorder.take_report_json()
    }
}

#[async_trait]
impl EventSink for ReportWriter {
    async fn emit(&self, event: &RunEvent) -> AgentResult<()> {
        self.record(event);
        Ok(())
    }
}
