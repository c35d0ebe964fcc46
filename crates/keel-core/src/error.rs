//! The one error type of Keel's public API, shaped as a few kinds with structured fields.
//!
//! Core only classifies errors ([`ErrorKind`]); the transport maps each kind to an HTTP
//! status and an A2A error code, in one place.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::{TaskId, TaskState};

/// Result alias used across Keel.
pub type AgentResult<T> = Result<T, AgentError>;

/// Everything that can go wrong in Keel, with the fields a caller needs to act on it.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum AgentError {
    /// No task with this id exists for the caller's tenant.
    #[error("task not found: {task_id}")]
    TaskNotFound {
        /// The id that was asked for.
        task_id: TaskId,
    },
    /// No thread with this id exists for the caller's tenant: an operation that works on an
    /// existing thread (its history, its queue, its children) named one the store does not
    /// know. Seed 002's `SessionNotFound`: a session is a thread (decision 3), and
    /// [`AgentError::session_not_found`] builds this variant. A message naming an unknown
    /// thread is not this error: it starts that thread, as A2A's `contextId` does.
    #[doc(alias = "SessionNotFound")]
    #[error("thread not found: {thread_id}")]
    ThreadNotFound {
        /// The id that was asked for.
        thread_id: crate::ThreadId,
    },
    /// The task exists but is already terminal, so it cannot be canceled.
    #[error("task {task_id} cannot be canceled: it is already {state}")]
    TaskNotCancelable {
        /// The task that was asked for.
        task_id: TaskId,
        /// Its (terminal) state.
        state: TaskState,
    },
    /// A cancel was recorded, but the task's run did not stop within the wait: another
    /// process holds its thread and has not answered the request yet. The cancel stays
    /// recorded, so the run stops when it next looks or when its thread is taken over;
    /// asking again later answers the canceled task.
    #[error(
        "task {task_id} is still stopping: the cancel is recorded and takes effect when \
         the process holding its thread sees it or the thread is taken over; ask again later"
    )]
    CancelPending {
        /// The task that was asked for.
        task_id: TaskId,
    },
    /// A lifecycle change the transition table does not allow.
    #[error("invalid task state transition: {from} -> {to}")]
    InvalidTransition {
        /// The state the task is in.
        from: TaskState,
        /// The state that was requested.
        to: TaskState,
    },
    /// Input that does not have the shape Keel needs; `field` names where.
    #[error("invalid {field}: {reason}")]
    InvalidInput {
        /// Dotted path of the offending input (`message.parts`, `arguments.city`).
        field: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A requested operation or option is not supported by this agent or server.
    #[error("unsupported: {what}")]
    Unsupported {
        /// What was asked for.
        what: String,
    },
    /// A tool was not found or failed while running.
    #[error("tool `{tool}` failed: {message}")]
    ToolFailed {
        /// The tool's name.
        tool: String,
        /// What went wrong.
        message: String,
    },
    /// A configured limit would be exceeded by the next operation.
    #[error("budget exceeded: {limit} used {used} of {max}")]
    BudgetExceeded {
        /// Which limit (`max_steps`, `max_llm_calls`, ...).
        limit: String,
        /// How much has been used.
        used: u64,
        /// The configured maximum.
        max: u64,
    },
    /// Policy denied an action (or an approver did).
    #[error("action {action_id} denied: {reason}")]
    ActionDenied {
        /// The denied action.
        action_id: crate::ActionId,
        /// Why.
        reason: String,
    },
    /// An action needs approval and no approval handler could decide it. The request is
    /// serializable, so an application can persist it and resume when a decision arrives.
    #[error("action {} requires approval: {}", .request.action.id, .request.reason)]
    ApprovalRequired {
        /// The pending request.
        request: Box<crate::ApprovalRequest>,
    },
    /// The thread was terminated; it accepts no more work.
    #[error("thread {thread_id} is terminated and accepts no more work")]
    ThreadTerminated {
        /// The thread.
        thread_id: crate::ThreadId,
    },
    /// The run was canceled.
    #[error("canceled: {reason}")]
    Canceled {
        /// Why, as given by whoever canceled it.
        reason: String,
    },
    /// The model provider failed or answered something unusable. The provider layer fills in
    /// what it knows as fields (the failure's kind, the HTTP status, the delay it asked for),
    /// so a caller acts on them without reading the message.
    #[error("model `{model}` failed: {}", llm_text(*.kind, .message))]
    Llm {
        /// The model (or provider) that failed.
        model: String,
        /// What kind of failure this is, when the provider layer classified it.
        kind: Option<LlmErrorKind>,
        /// What went wrong.
        message: String,
        /// The HTTP status the provider answered, if it answered one.
        status: Option<u16>,
        /// How long the provider asked callers to wait (`Retry-After`), if it said.
        retry_after: Option<Duration>,
    },
    /// The caller's lease on a thread has expired or was taken over, so its write was refused.
    #[error("lease on thread {thread_id} lost (fencing token {token} is stale or expired)")]
    LeaseLost {
        /// The thread.
        thread_id: crate::ThreadId,
        /// The stale fencing token.
        token: u64,
    },
    /// A store could not read or write, or found data it cannot decode.
    #[error("storage error: {}", storage_text(.backend, .operation, .source))]
    Storage {
        /// The backend (`sqlite`, `redis`, `memory`); empty when not known.
        backend: &'static str,
        /// What was being done; empty when not known.
        operation: String,
        /// What went wrong.
        source: crate::ErrorSource,
    },
    /// A store could not be reached: it is down, unreachable or did not answer in time.
    /// Unlike [`AgentError::Storage`] this says nothing about the data; the same request may
    /// succeed once the store is back.
    #[error("store unavailable: {}", storage_text(.backend, .operation, .source))]
    StoreUnavailable {
        /// The backend (`sqlite`, `redis`).
        backend: &'static str,
        /// What was being done; empty when not known.
        operation: String,
        /// What went wrong.
        source: crate::ErrorSource,
    },
    /// A limit that protects a shared server refused the request; it may succeed after
    /// `retry_after`.
    #[error("too many {limit}: at most {max}; retry in {}s", .retry_after.as_secs().max(1))]
    Overloaded {
        /// What was counted (`batch requests`, `concurrent tasks of this tenant`, ...).
        limit: String,
        /// The configured maximum.
        max: u64,
        /// How long the caller should wait before trying again.
        retry_after: Duration,
    },
    /// Another server (a remote agent, an endpoint) could not be reached, or answered with no
    /// usable answer: refused, unresolved, timed out, or an HTTP error that carries no error
    /// of its protocol. Like [`AgentError::StoreUnavailable`], the same request may succeed
    /// once that server is back; the message names the URL tried, so a user can check it.
    #[error("cannot use {url}: {cause}")]
    Unreachable {
        /// The URL that was requested.
        url: String,
        /// What happened (`connection refused`, `answered HTTP 503`, ...).
        cause: String,
    },
    /// A bug or an unexpected condition inside Keel.
    #[error("internal error: {source}")]
    Internal {
        /// What went wrong.
        source: crate::ErrorSource,
    },
}

/// What kind of failure a model call met: the part of an [`AgentError::Llm`] a caller acts on
/// (retry later, fix the key, shorten the prompt).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum LlmErrorKind {
    /// The provider refused the credentials (HTTP 401/403, or an invalid-key answer).
    Auth,
    /// The provider is rate limiting and retries did not get through (HTTP 429).
    RateLimit,
    /// The prompt does not fit the model's context window.
    ContextOverflow,
    /// The provider answered something that cannot be parsed or lacks required fields.
    BadResponse,
    /// The connection failed or broke (including a stream that ended early).
    Transport,
    /// A configured timeout elapsed.
    Timeout,
    /// Any other error status from the provider (a bad request, a server error after
    /// retries).
    Api,
    /// The client is misconfigured (a missing API key, an invalid base URL).
    Config,
}

impl LlmErrorKind {
    /// Every kind, in declaration order.
    pub const ALL: [LlmErrorKind; 8] = [
        Self::Auth,
        Self::RateLimit,
        Self::ContextOverflow,
        Self::BadResponse,
        Self::Transport,
        Self::Timeout,
        Self::Api,
        Self::Config,
    ];

    /// The kind's stable snake_case name (`rate_limit`), which prefixes the text of the
    /// [`AgentError::Llm`] it is part of.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Auth => "auth",
            Self::RateLimit => "rate_limit",
            Self::ContextOverflow => "context_overflow",
            Self::BadResponse => "bad_response",
            Self::Transport => "transport",
            Self::Timeout => "timeout",
            Self::Api => "api",
            Self::Config => "config",
        }
    }

    /// The kind named by [`LlmErrorKind::as_str`], if any.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|kind| kind.as_str() == name)
    }

    /// The kind of a model failure, read from its field; `None` for any other error and for
    /// a model failure nobody classified.
    ///
    /// ```
    /// use keel_core::{AgentError, LlmErrorKind};
    /// let err = AgentError::Llm {
    ///     model: "gpt-4o".into(),
    ///     kind: Some(LlmErrorKind::RateLimit),
    ///     message: "slow down".into(),
    ///     status: Some(429),
    ///     retry_after: None,
    /// };
    /// assert_eq!(LlmErrorKind::of(&err), Some(LlmErrorKind::RateLimit));
    /// assert_eq!(err.to_string(), "model `gpt-4o` failed: rate_limit: slow down");
    /// assert_eq!(LlmErrorKind::of(&AgentError::llm("mock", "no more answers")), None);
    /// assert_eq!(LlmErrorKind::of(&AgentError::internal("x")), None);
    /// ```
    pub fn of(error: &AgentError) -> Option<Self> {
        match error {
            AgentError::Llm { kind, .. } => *kind,
            _ => None,
        }
    }
}

impl fmt::Display for LlmErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A model failure's text: its kind (when known) before the message, as `rate_limit: ...`.
fn llm_text(kind: Option<LlmErrorKind>, message: &str) -> String {
    match kind {
        Some(kind) => format!("{kind}: {message}"),
        None => message.to_owned(),
    }
}

/// The coarse class of an [`AgentError`], which is what protocols map onto codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// A referenced record does not exist.
    NotFound,
    /// The record exists but its state forbids the operation.
    NotCancelable,
    /// The state machine forbids the change.
    InvalidTransition,
    /// The caller sent something malformed.
    InvalidInput,
    /// The operation is not offered.
    Unsupported,
    /// A tool failed.
    Tool,
    /// A budget limit stops the operation.
    Budget,
    /// Policy or an approver refused the action.
    Denied,
    /// The action waits for an approval decision.
    ApprovalRequired,
    /// The thread accepts no more work.
    Terminated,
    /// The work was canceled.
    Canceled,
    /// An upstream model failed.
    Upstream,
    /// Another writer holds the resource.
    Conflict,
    /// Storage failed.
    Storage,
    /// A store cannot be reached for now.
    Unavailable,
    /// A limit that protects the server refused the request for now.
    Overloaded,
    /// Anything else.
    Internal,
}

impl AgentError {
    /// This error as the failure of the tool `tool`: a [`AgentError::ToolFailed`] stays as it
    /// is (its `Display` names the tool, once), any other error becomes one with its text as
    /// the message. The one place a tool's error is given the tool's name.
    ///
    /// ```
    /// use keel_core::AgentError;
    /// let failed = AgentError::ToolFailed { tool: "fetch".into(), message: "HTTP 500".into() };
    /// assert_eq!(failed.into_tool_failure("fetch").to_string(), "tool `fetch` failed: HTTP 500");
    /// let other = AgentError::invalid_input("id", "missing").into_tool_failure("fetch");
    /// assert_eq!(other.to_string(), "tool `fetch` failed: invalid id: missing");
    /// ```
    #[must_use]
    pub fn into_tool_failure(self, tool: &str) -> AgentError {
        match self {
            failed @ AgentError::ToolFailed { .. } => failed,
            other => AgentError::ToolFailed {
                tool: tool.to_owned(),
                message: other.to_string(),
            },
        }
    }

    /// What a failed tool says, as its error result reads to the model: the message of a
    /// [`AgentError::ToolFailed`] (the result is already the tool's, so no prefix names it),
    /// the text of any other error.
    pub fn tool_message(&self) -> String {
        match self {
            AgentError::ToolFailed { message, .. } => message.clone(),
            other => other.to_string(),
        }
    }

    /// The coarse class of this error.
    ///
    /// ```
    /// use keel_core::{AgentError, ErrorKind};
    /// let err = AgentError::TaskNotFound { task_id: "t-1".into() };
    /// assert_eq!(err.kind(), ErrorKind::NotFound);
    /// ```
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::TaskNotFound { .. } | Self::ThreadNotFound { .. } => ErrorKind::NotFound,
            Self::TaskNotCancelable { .. } => ErrorKind::NotCancelable,
            Self::CancelPending { .. } => ErrorKind::Conflict,
            Self::InvalidTransition { .. } => ErrorKind::InvalidTransition,
            Self::InvalidInput { .. } => ErrorKind::InvalidInput,
            Self::Unsupported { .. } => ErrorKind::Unsupported,
            Self::ToolFailed { .. } => ErrorKind::Tool,
            Self::BudgetExceeded { .. } => ErrorKind::Budget,
            Self::ActionDenied { .. } => ErrorKind::Denied,
            Self::ApprovalRequired { .. } => ErrorKind::ApprovalRequired,
            Self::ThreadTerminated { .. } => ErrorKind::Terminated,
            Self::Canceled { .. } => ErrorKind::Canceled,
            Self::Llm { .. } => ErrorKind::Upstream,
            Self::LeaseLost { .. } => ErrorKind::Conflict,
            Self::Storage { .. } => ErrorKind::Storage,
            Self::StoreUnavailable { .. } | Self::Unreachable { .. } => ErrorKind::Unavailable,
            Self::Overloaded { .. } => ErrorKind::Overloaded,
            Self::Internal { .. } => ErrorKind::Internal,
        }
    }

    /// [`AgentError::ThreadNotFound`] under the name seed 002 gives it (`SessionNotFound`):
    /// Keel's session is its thread.
    ///
    /// ```
    /// use keel_core::{AgentError, ErrorKind};
    /// let err = AgentError::session_not_found("s-1");
    /// assert!(matches!(&err, AgentError::ThreadNotFound { thread_id } if thread_id.as_str() == "s-1"));
    /// assert_eq!(err.kind(), ErrorKind::NotFound);
    /// ```
    pub fn session_not_found(session_id: impl Into<crate::ThreadId>) -> Self {
        Self::ThreadNotFound {
            thread_id: session_id.into(),
        }
    }

    /// Shorthand for [`AgentError::InvalidInput`].
    pub fn invalid_input(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Self::InvalidInput {
            field: field.into(),
            reason: reason.into(),
        }
    }

    /// Shorthand for an [`AgentError::Llm`] that carries only a message: no kind, status or
    /// delay.
    pub fn llm(model: impl Into<String>, message: impl Into<String>) -> Self {
        Self::Llm {
            model: model.into(),
            kind: None,
            message: message.into(),
            status: None,
            retry_after: None,
        }
    }

    /// Shorthand for [`AgentError::Storage`] known only as text (no backend or operation).
    pub fn storage(message: impl std::fmt::Display) -> Self {
        Self::Storage {
            backend: "",
            operation: String::new(),
            source: crate::ErrorSource::message(message),
        }
    }

    /// Shorthand for [`AgentError::Storage`]: `backend` failed while doing `operation`,
    /// because of `source`.
    pub fn storage_source(
        backend: &'static str,
        operation: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        Self::Storage {
            backend,
            operation: operation.into(),
            source: crate::ErrorSource::new(source),
        }
    }

    /// Shorthand for [`AgentError::StoreUnavailable`]: `backend` could not be reached while
    /// doing `operation`, because of `source`.
    pub fn store_unavailable(
        backend: &'static str,
        operation: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        Self::StoreUnavailable {
            backend,
            operation: operation.into(),
            source: crate::ErrorSource::new(source),
        }
    }

    /// Shorthand for [`AgentError::Internal`] known only as text.
    pub fn internal(message: impl std::fmt::Display) -> Self {
        Self::Internal {
            source: crate::ErrorSource::message(message),
        }
    }

    /// Shorthand for [`AgentError::Internal`] caused by `source`.
    pub fn internal_source(source: impl std::error::Error + Send + Sync + 'static) -> Self {
        Self::Internal {
            source: crate::ErrorSource::new(source),
        }
    }
}

/// A storage error's text: the backend and operation when known, then the cause.
fn storage_text(backend: &str, operation: &str, source: &crate::ErrorSource) -> String {
    match (backend, operation) {
        ("", "") => source.to_string(),
        (backend, "") | ("", backend) => format!("{backend}: {source}"),
        (backend, operation) => format!("{backend} ({operation}): {source}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_the_structured_fields() {
        let err = AgentError::InvalidTransition {
            from: TaskState::Submitted,
            to: TaskState::Completed,
        };
        assert_eq!(
            err.to_string(),
            "invalid task state transition: submitted -> completed"
        );
        let err = AgentError::BudgetExceeded {
            limit: "max_steps".into(),
            used: 8,
            max: 8,
        };
        assert_eq!(err.kind(), ErrorKind::Budget);
        assert!(err.to_string().contains("max_steps"));
        let err = AgentError::Overloaded {
            limit: "batch requests".into(),
            max: 100,
            retry_after: Duration::from_millis(300),
        };
        assert_eq!(err.kind(), ErrorKind::Overloaded);
        assert_eq!(
            err.to_string(),
            "too many batch requests: at most 100; retry in 1s"
        );
    }
}
