//! Structured logging for skills and the runtime itself: the [`LoggingService`] trait, a
//! service that forwards to `tracing`, and a console service that writes plain lines.

use std::io::Write;
use std::sync::Mutex;

/// Severity of a log line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
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

impl LogLevel {
    /// The level's name in upper case, as log lines print it.
    pub fn as_str(self) -> &'static str {
        match self {
            LogLevel::Trace => "TRACE",
            LogLevel::Debug => "DEBUG",
            LogLevel::Info => "INFO",
            LogLevel::Warn => "WARN",
            LogLevel::Error => "ERROR",
        }
    }
}

/// Where runtime logs go.
pub trait LoggingService: keel_core::MaybeSend + keel_core::MaybeSync {
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

/// A [`LoggingService`] that writes one human-readable line per entry, for a terminal and
/// for programs that do not set up `tracing`: `2026-01-02T03:04:05.678Z WARN keel: text`
/// (UTC time, level, message). Lines below the minimum level are dropped. Writes go to
/// stderr unless another writer is given; a write that fails is dropped, because logging
/// must never stop the work it describes.
///
/// ```
/// use keel_runtime::{ConsoleLoggingService, LogLevel, LoggingService};
/// let console = ConsoleLoggingService::with_writer(Vec::new()).with_min_level(LogLevel::Info);
/// console.log(LogLevel::Debug, "dropped");
/// console.log(LogLevel::Warn, "disk almost full");
/// let text = String::from_utf8(console.into_writer()).unwrap();
/// assert!(text.ends_with(" WARN keel: disk almost full\n"));
/// assert_eq!(text.lines().count(), 1);
/// ```
pub struct ConsoleLoggingService<W = std::io::Stderr> {
    writer: Mutex<W>,
    min_level: LogLevel,
}

impl<W> std::fmt::Debug for ConsoleLoggingService<W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConsoleLoggingService")
            .field("min_level", &self.min_level)
            .finish_non_exhaustive()
    }
}

impl Default for ConsoleLoggingService {
    fn default() -> Self {
        Self::new()
    }
}

impl ConsoleLoggingService {
    /// Lines of level `Info` and above on stderr.
    pub fn new() -> Self {
        Self::with_writer(std::io::stderr())
    }
}

impl<W: Write + Send> ConsoleLoggingService<W> {
    /// Lines of level `Info` and above to `writer` (a file, a buffer in tests).
    pub fn with_writer(writer: W) -> Self {
        Self {
            writer: Mutex::new(writer),
            min_level: LogLevel::Info,
        }
    }

    /// Keep only lines of `level` and above.
    #[must_use]
    pub fn with_min_level(mut self, level: LogLevel) -> Self {
        self.min_level = level;
        self
    }

    /// The writer back, with everything written so far.
    pub fn into_writer(self) -> W {
        self.writer
            .into_inner()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl<W: Write + Send> LoggingService for ConsoleLoggingService<W> {
    fn log(&self, level: LogLevel, message: &str) {
        if level < self.min_level {
            return;
        }
        let time = chrono::Utc::now().format("%Y-%m-%dT%H:%M:%S%.3fZ");
        // One line per entry, even when the message spans several: a reader greps lines.
        let message = message.replace('\n', "\\n");
        let line = format!("{time} {} keel: {message}\n", level.as_str());
        let mut writer = self
            .writer
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        // Whole lines only: one write per entry, under the lock, so lines never interleave.
        let _ = writer
            .write_all(line.as_bytes())
            .and_then(|()| writer.flush());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn console_lines_carry_time_level_and_message_one_per_entry() {
        let console =
            ConsoleLoggingService::with_writer(Vec::new()).with_min_level(LogLevel::Debug);
        console.log(LogLevel::Trace, "too detailed");
        console.log(LogLevel::Debug, "looking");
        console.log(LogLevel::Error, "two\nlines");
        let text = String::from_utf8(console.into_writer()).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2, "{text}");
        let (time, rest) = lines[0].split_once(' ').unwrap();
        assert!(chrono::DateTime::parse_from_rfc3339(time).is_ok(), "{time}");
        assert_eq!(rest, "DEBUG keel: looking");
        assert!(
            lines[1].ends_with(" ERROR keel: two\\nlines"),
            "{}",
            lines[1]
        );
    }
}
