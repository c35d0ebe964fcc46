//! What a `run_code` call settles with: exactly one status, a value or an error, the console.

use serde::Serialize;

use crate::value::SandboxValue;

/// How an execution ended (decision 11): exactly one of these.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExecutionStatus {
    /// The selected export resolved; `result` holds its value.
    Success,
    /// Evaluation threw, the selected export threw or rejected, a value could not be
    /// cloned, or the source had a syntax error.
    Error,
    /// `terminate` was called, or a safety cap fired.
    Terminated,
    /// The memory limit was exceeded.
    Memory,
    /// A module could not be linked: an unknown, URL or unsupplied specifier, a missing
    /// selected export, or an unusable import or global.
    LinkError,
}

impl ExecutionStatus {
    /// The wire spelling: `success`, `error`, `terminated`, `memory` or `link_error`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Success => "success",
            Self::Error => "error",
            Self::Terminated => "terminated",
            Self::Memory => "memory",
            Self::LinkError => "link_error",
        }
    }
}

/// An error surfaced by an execution.
#[serde_with::skip_serializing_none]
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ExecutionError {
    /// The error's name (`TypeError`, `SyntaxError`, `SerializationError`, ...).
    pub name: String,
    /// The error's message.
    pub message: String,
    /// 1-based line in the caller's source (or in `file`), where known.
    pub line: Option<u32>,
    /// 1-based column in the caller's source (or in `file`), where known.
    pub column: Option<u32>,
    /// The file `line` and `column` refer to: the request's filename or a module's path.
    pub file: Option<String>,
}

impl ExecutionError {
    /// An error with no position.
    pub fn new(name: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            message: message.into(),
            line: None,
            column: None,
            file: None,
        }
    }
}

/// The console method that produced a line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ConsoleLevel {
    /// `console.log`.
    Log,
    /// `console.info`.
    Info,
    /// `console.warn`.
    Warn,
    /// `console.error`.
    Error,
    /// `console.debug` and `console.trace`.
    Debug,
}

/// One captured console line.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ConsoleLine {
    /// Which method.
    pub level: ConsoleLevel,
    /// The arguments, formatted and joined by spaces.
    pub message: String,
}

/// The settled outcome of one `run_code` call (decision 11).
///
/// ```
/// use keel_sandbox::{CodeExecutionResult, ExecutionStatus};
/// let r = CodeExecutionResult::terminated("deadline", Vec::new());
/// assert_eq!(r.status, ExecutionStatus::Terminated);
/// assert_eq!(serde_json::to_value(&r).unwrap()["status"], "terminated");
/// ```
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CodeExecutionResult {
    /// Exactly one status.
    pub status: ExecutionStatus,
    /// The selected export's final value (`undefined` unless `status` is `success`).
    pub result: SandboxValue,
    /// The error, for every status but `success`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<ExecutionError>,
    /// Console lines captured in order (empty when the caller supplied `console`).
    pub console: Vec<ConsoleLine>,
    /// Whether console lines were dropped because the capture limit was reached.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub console_truncated: bool,
}

impl CodeExecutionResult {
    /// A `terminated` result whose message is the caller's reason (or a default).
    pub fn terminated(reason: impl Into<String>, console: Vec<ConsoleLine>) -> Self {
        Self {
            status: ExecutionStatus::Terminated,
            result: SandboxValue::Undefined,
            error: Some(ExecutionError::new("TerminationError", reason)),
            console,
            console_truncated: false,
        }
    }

    /// Whether the status is `success`.
    pub fn is_success(&self) -> bool {
        self.status == ExecutionStatus::Success
    }
}
