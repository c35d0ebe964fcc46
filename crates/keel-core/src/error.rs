//! The one error type of Keel's public API, shaped as a few kinds with structured fields.
//!
//! Core only classifies errors ([`ErrorKind`]); the transport maps each kind to an HTTP
//! status and an A2A error code, in one place.

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
    /// The task exists but is already terminal, so it cannot be canceled.
    #[error("task {task_id} cannot be canceled: it is already {state}")]
    TaskNotCancelable {
        /// The task that was asked for.
        task_id: TaskId,
        /// Its (terminal) state.
        state: TaskState,
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
    /// The model provider failed or answered something unusable.
    #[error("model `{model}` failed: {message}")]
    Llm {
        /// The model (or provider) that failed.
        model: String,
        /// What went wrong.
        message: String,
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
    /// A bug or an unexpected condition inside Keel.
    #[error("internal error: {source}")]
    Internal {
        /// What went wrong.
        source: crate::ErrorSource,
    },
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
    /// Anything else.
    Internal,
}

impl AgentError {
    /// The coarse class of this error.
    ///
    /// ```
    /// use keel_core::{AgentError, ErrorKind};
    /// let err = AgentError::TaskNotFound { task_id: "t-1".into() };
    /// assert_eq!(err.kind(), ErrorKind::NotFound);
    /// ```
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::TaskNotFound { .. } => ErrorKind::NotFound,
            Self::TaskNotCancelable { .. } => ErrorKind::NotCancelable,
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
            Self::Internal { .. } => ErrorKind::Internal,
        }
    }

    /// Shorthand for [`AgentError::InvalidInput`].
    pub fn invalid_input(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Self::InvalidInput {
            field: field.into(),
            reason: reason.into(),
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
    }
}
