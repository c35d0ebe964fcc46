//! Keel's traces for the tools operators already run (docs/observability.md).
//!
//! The engine records a run as events, each naming the span it belongs to
//! ([`keel_events::RunSpans`]); this crate turns those events into OpenTelemetry spans by
//! the GenAI semantic conventions ([`semconv`]) and exports them over OTLP (feature `otel`):
//! the events and the spans are one tree, with the same ids and times, by construction
//! (decision 181); the process's `metrics` go the same way ([`OtlpRecorder`], decision
//! 233). Without the feature only the conventions' names are here.

pub mod semconv;

#[cfg(feature = "otel")]
mod otlp;
#[cfg(feature = "otel")]
mod recorder;
#[cfg(feature = "otel")]
mod sink;

#[cfg(feature = "otel")]
pub use otlp::{Telemetry, TelemetryConfig};
#[cfg(feature = "otel")]
pub use recorder::OtlpRecorder;
#[cfg(feature = "otel")]
pub use sink::SpanSink;
