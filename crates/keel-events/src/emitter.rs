//! [`EventEmitter`]: numbers a run's events once and hands them to its sink.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use chrono::Utc;
use keel_core::{AgentResult, RunContext, RunId, TaskId, ThreadId};

use crate::{EventSink, RunEvent, RunEventBuilder, RunSpans, RUN_EVENT_VERSION};

/// Makes the events of one run: stamps run, thread, task and agent, assigns the sequence
/// (1, 2, 3, ... — once, at creation) and the timestamp, and delivers to one sink (use a
/// [`MultiSink`](crate::MultiSink) for several, so all of them see the same numbers).
///
/// Delivery is serialized: concurrent [`emit`](Self::emit) calls reach the sink in
/// sequence order, so no sink ever sees 3 before 2.
///
/// ```
/// use std::sync::Arc;
/// use keel_core::RunContext;
/// use keel_events::{EventEmitter, InMemoryEventSink, RunEvent};
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let sink = Arc::new(InMemoryEventSink::new());
/// let emitter = EventEmitter::new(&RunContext::new().with_agent("worker"), sink.clone());
/// emitter.emit(RunEvent::llm_stream("Hel")).await?;
/// emitter.emit(RunEvent::llm_stream("lo")).await?;
/// let numbers: Vec<u64> = sink.events().iter().map(|e| e.sequence).collect();
/// assert_eq!(numbers, [1, 2]);
/// assert_eq!(sink.events()[0].agent_name.as_deref(), Some("worker"));
/// # Ok::<(), keel_core::AgentError>(())
/// # }).unwrap();
/// ```
pub struct EventEmitter {
    run_id: RunId,
    thread_id: Option<ThreadId>,
    task_id: Option<TaskId>,
    agent_name: Option<String>,
    /// The last sequence number handed out.
    last: AtomicU64,
    sink: Arc<dyn EventSink>,
    /// Held across numbering and delivery so sinks see events in sequence order.
    delivery: futures::lock::Mutex<()>,
    /// Which span of the run's trace each event belongs to.
    spans: RunSpans,
}

impl std::fmt::Debug for EventEmitter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventEmitter")
            .field("run_id", &self.run_id)
            .field("task_id", &self.task_id)
            .field("last_sequence", &self.last_sequence())
            .finish_non_exhaustive()
    }
}

impl EventEmitter {
    /// An emitter for the run `context` describes; the agent is the last of its chain.
    pub fn new(context: &RunContext, sink: Arc<dyn EventSink>) -> Self {
        Self {
            run_id: context.run_id.clone(),
            thread_id: context.thread_id.clone(),
            task_id: None,
            agent_name: context.agent_chain.last().cloned(),
            last: AtomicU64::new(0),
            sink,
            delivery: futures::lock::Mutex::new(()),
            spans: RunSpans::of(context),
        }
    }

    /// Stamp events with `task_id`.
    #[must_use]
    pub fn with_task(mut self, task_id: TaskId) -> Self {
        self.task_id = Some(task_id);
        self
    }

    /// Stamp events with `agent_name`.
    #[must_use]
    pub fn with_agent_name(mut self, agent_name: impl Into<String>) -> Self {
        self.agent_name = Some(agent_name.into());
        self
    }

    /// Continue a resumed run's numbering: the next event gets `last_sequence + 1`.
    #[must_use]
    pub fn continuing_after(self, last_sequence: u64) -> Self {
        self.last.store(last_sequence, Ordering::SeqCst);
        self
    }

    /// The run.
    pub fn run_id(&self) -> &RunId {
        &self.run_id
    }

    /// The run's spans: the ids its events carry.
    pub fn spans(&self) -> &RunSpans {
        &self.spans
    }

    /// The last sequence number assigned (0 before the first event).
    pub fn last_sequence(&self) -> u64 {
        self.last.load(Ordering::SeqCst)
    }

    /// Number and stamp an event without delivering it (for a caller that writes the
    /// durable log itself). The number is spent either way. The event gets the run's trace
    /// id and, unless the builder names its own, the span it belongs to ([`RunSpans`]).
    pub fn create(&self, mut builder: RunEventBuilder) -> RunEvent {
        self.spans.stamp(&mut builder);
        let sequence = self.last.fetch_add(1, Ordering::SeqCst) + 1;
        RunEvent {
            version: RUN_EVENT_VERSION,
            event_type: builder.event_type,
            run_id: self.run_id.clone(),
            task_id: builder.task_id.or_else(|| self.task_id.clone()),
            thread_id: self.thread_id.clone(),
            trace_id: Some(self.spans.trace_hex().clone()),
            agent_name: self.agent_name.clone(),
            sequence,
            step: builder.step,
            span_id: builder.span_id,
            parent_span_id: builder.parent_span_id,
            action_id: builder.action_id,
            parent_action_id: builder.parent_action_id,
            delegation_id: builder.delegation_id,
            severity: builder.severity,
            summary: builder.summary.into_owned(),
            payload: builder.payload,
            is_final: builder.is_final,
            timestamp: Utc::now(),
        }
    }

    /// Number, stamp and deliver an event; returns it as delivered. A sink error is
    /// returned after the number is spent, so a failed delivery leaves a gap rather than
    /// two events with one number.
    pub async fn emit(&self, builder: RunEventBuilder) -> AgentResult<RunEvent> {
        let _order = self.delivery.lock().await;
        let event = self.create(builder);
        self.sink.emit(&event).await?;
        Ok(event)
    }

    /// Deliver a task event (a status or artifact update, as the task log and the A2A
    /// transport carry it) as its normalized [`RunEvent`], built by
    /// [`RunEvent::from_task_event`]; `task` rides on a status update so that readers recover
    /// its context ([`RunEvent::run_context`]). A history message has no run event: `None`.
    pub async fn emit_task_event(
        &self,
        event: &keel_core::TaskEvent,
        task: Option<&keel_core::Task>,
    ) -> AgentResult<Option<RunEvent>> {
        match RunEvent::from_task_event(event, task) {
            Some(builder) => self.emit(builder).await.map(Some),
            None => Ok(None),
        }
    }

    /// [`emit`](Self::emit) to the sink, then record the event in `report`, in the same
    /// order as the sink saw it. The report gets the event even when the sink fails (the
    /// sink's error is returned).
    pub async fn emit_reported(
        &self,
        builder: RunEventBuilder,
        report: &crate::ReportWriter,
    ) -> AgentResult<()> {
        let _order = self.delivery.lock().await;
        let event = self.create(builder);
        let delivered = self.sink.emit(&event).await;
        report.record_owned(event);
        delivered
    }
}
