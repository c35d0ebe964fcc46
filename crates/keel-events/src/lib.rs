//! Keel's normalized run event stream: [`RunEvent`]s, where they go ([`EventSink`]s), what
//! they add up to ([`RunReport`]), and how tests read them back ([`RunReplay`], the
//! assertion helpers, [`normalize`] for golden runs).
//!
//! One run has one [`EventEmitter`]. It numbers events once, from 1, when it creates them
//! (decision 10 of the design brief), and delivers them in that order to its sink — a
//! [`MultiSink`] when a live view ([`BroadcastEventSink`]), a [`RunRecorder`] and a durable
//! log all listen, so every one of them sees the same numbers.
//!
//! ```
//! use std::sync::Arc;
//! use keel_core::{RunAction, RunContext};
//! use keel_events::{
//!     assert_no_denied_actions, assert_run_events, EventEmitter, InMemoryEventSink, Match,
//!     MultiSink, RunEvent, RunRecorder,
//! };
//! # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
//! let live = Arc::new(InMemoryEventSink::new());
//! let recorder = Arc::new(RunRecorder::new());
//! let sink = MultiSink::new().with(live.clone()).with(recorder.clone());
//! let emitter = EventEmitter::new(&RunContext::new(), Arc::new(sink));
//!
//! let action = RunAction::tool_call("lookup", serde_json::json!({"city": "Oslo"}));
//! emitter.emit(RunEvent::action_requested(&action).step(1)).await?;
//! emitter.emit(RunEvent::action_started(&action).step(1)).await?;
//!
//! let report = recorder.report();
//! assert_eq!(report.actions.len(), 1);
//! assert_run_events(&report, &["action.requested", "action.started"], Match::Exact);
//! assert_no_denied_actions(&live.events());
//! # Ok::<(), keel_core::AgentError>(())
//! # }).unwrap();
//! ```

mod assertions;
mod emitter;
mod event;
mod golden;
pub mod payload;
mod recorder;
mod redact;
mod replay;
mod report;
mod sink;
mod spans;
mod stored;
mod summary;

pub use assertions::{assert_budget_under, assert_no_denied_actions, assert_run_events, Match};
pub use emitter::EventEmitter;
pub use event::{EventType, RunEvent, RunEventBuilder, Severity, RUN_EVENT_VERSION};
pub use golden::normalize;
pub use recorder::{ReportWriter, RunRecorder};
pub use redact::{RedactionPolicy, DEFAULT_SENSITIVE_KEYS, DEFAULT_SENSITIVE_PREFIXES, REDACTED};
pub use replay::{EventSource, RunReplay};
pub use report::{
    ActionRecord, ActionStatus, ApprovalRecord, BudgetReport, ModelMetrics, PolicyRecord,
    RunReport, RUN_REPORT_VERSION,
};
pub use sink::{BroadcastEventSink, EventSink, InMemoryEventSink, MultiSink};
pub use spans::{RunSpans, SpanKind};
pub use stored::STORED_RUN_VERSION;
