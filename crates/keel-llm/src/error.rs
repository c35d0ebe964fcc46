//! [`LlmError`]: typed model-call failures (auth, rate limit, context overflow, bad response,
//! transport, ...) that fold into [`AgentError::Llm`] and can be recovered from it by kind.

use std::fmt;
use std::time::Duration;

use keel_core::AgentError;
use serde::{Deserialize, Serialize};

/// What kind of failure a model call met; the part of an [`LlmError`] a caller acts on.
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
    const ALL: [LlmErrorKind; 8] = [
        Self::Auth,
        Self::RateLimit,
        Self::ContextOverflow,
        Self::BadResponse,
        Self::Transport,
        Self::Timeout,
        Self::Api,
        Self::Config,
    ];

    /// The kind's stable snake_case name (`rate_limit`), which prefixes the message of the
    /// [`AgentError::Llm`] it becomes.
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

    /// The kind of an [`AgentError`] that came from an [`LlmError`].
    ///
    /// `AgentError::Llm` carries only a message, so the kind travels as its prefix; this reads
    /// it back.
    ///
    /// ```
    /// use keel_core::AgentError;
    /// use keel_llm::{LlmError, LlmErrorKind};
    /// let err: AgentError = LlmError::new(LlmErrorKind::RateLimit, "gpt-4o", "slow down").into();
    /// assert_eq!(LlmErrorKind::of(&err), Some(LlmErrorKind::RateLimit));
    /// assert_eq!(LlmErrorKind::of(&AgentError::internal("x")), None);
    /// ```
    pub fn of(error: &AgentError) -> Option<Self> {
        match error {
            AgentError::Llm { message, .. } => {
                let (name, _) = message.split_once(": ")?;
                Self::parse(name)
            }
            _ => None,
        }
    }
}

impl fmt::Display for LlmErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A failed model call: its kind, the model, a message fit for logs (never a secret), and the
/// HTTP status and `Retry-After` delay where the provider gave them.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{kind}: {message}")]
pub struct LlmError {
    kind: LlmErrorKind,
    model: String,
    message: String,
    status: Option<u16>,
    retry_after: Option<Duration>,
}

impl LlmError {
    /// An error of `kind` for `model`.
    pub fn new(kind: LlmErrorKind, model: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            kind,
            model: model.into(),
            message: message.into(),
            status: None,
            retry_after: None,
        }
    }

    /// Record the HTTP status the provider answered.
    #[must_use]
    pub fn with_status(mut self, status: u16) -> Self {
        self.status = Some(status);
        self
    }

    /// Record how long the provider asked callers to wait.
    #[must_use]
    pub fn with_retry_after(mut self, delay: Option<Duration>) -> Self {
        self.retry_after = delay;
        self
    }

    /// What kind of failure this is.
    pub fn kind(&self) -> LlmErrorKind {
        self.kind
    }

    /// The model (or provider) that failed.
    pub fn model(&self) -> &str {
        &self.model
    }

    /// What went wrong.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The HTTP status, when the provider answered one.
    pub fn status(&self) -> Option<u16> {
        self.status
    }

    /// The delay the provider asked for (`Retry-After`), when it gave one.
    pub fn retry_after(&self) -> Option<Duration> {
        self.retry_after
    }
}

impl From<LlmError> for AgentError {
    fn from(error: LlmError) -> Self {
        AgentError::Llm {
            message: error.to_string(),
            model: error.model,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_survives_the_trip_through_agent_error() {
        for kind in LlmErrorKind::ALL {
            let err: AgentError = LlmError::new(kind, "m", "it broke: badly")
                .with_status(500)
                .into();
            assert_eq!(LlmErrorKind::of(&err), Some(kind));
            assert!(err.to_string().contains(kind.as_str()));
            assert!(matches!(err, AgentError::Llm { ref model, .. } if model == "m"));
        }
    }

    #[test]
    fn plain_llm_messages_have_no_kind() {
        let err = AgentError::Llm {
            model: "mock".into(),
            message: "rate limited".into(),
        };
        assert_eq!(LlmErrorKind::of(&err), None);
    }
}
