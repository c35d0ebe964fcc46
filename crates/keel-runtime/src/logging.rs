//! Structured logging for skills and the runtime itself.

/// Severity of a log line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LogLevel {
    /// Very detailed.
    Trace,
    /// Detailed.
    Debug,
    /// Normal operation.
    Info,
    /// Something looks wrong.
    Warn,
    /// Something failed.
    Error,
}

/// Where runtime logs go.
pub trait LoggingService: Send + Sync {
    /// Record one line.
    fn log(&self, level: LogLevel, message: &str);
}

/// A [`LoggingService`] that forwards to `tracing` under the `keel` target.
#[derive(Debug, Clone, Copy, Default)]
pub struct TracingLoggingService;

impl LoggingService for TracingLoggingService {
    fn log(&self, level: LogLevel, message: &str) {
        match level {
            LogLevel::Trace => tracing::trace!(target: "keel", "{message}"),
            LogLevel::Debug => tracing::debug!(target: "keel", "{message}"),
            LogLevel::Info => tracing::info!(target: "keel", "{message}"),
            LogLevel::Warn => tracing::warn!(target: "keel", "{message}"),
            LogLevel::Error => tracing::error!(target: "keel", "{message}"),
        }
    }
}
