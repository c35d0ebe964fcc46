//! [`LlmError`]: typed model-call failures (auth, rate limit, context overflow, bad response,
//! transport, ...) that fold into [`AgentError::Llm`], their kind, status and retry-after
//! carried as its fields.

use std::time::Duration;

use keel_core::AgentError;
pub use keel_core::LlmErrorKind;

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
            model: error.model,
            kind: Some(error.kind),
            message: error.message,
            status: error.status,
            retry_after: error.retry_after,
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
            assert_eq!(
                err.to_string(),
                format!("model `m` failed: {}: it broke: badly", kind.as_str())
            );
            assert!(matches!(
                err,
                AgentError::Llm { ref model, status: Some(500), retry_after: None, .. }
                    if model == "m"
            ));
        }
    }

    #[test]
    fn status_and_retry_after_travel_as_fields() {
        let err: AgentError = LlmError::new(LlmErrorKind::RateLimit, "m", "slow down")
            .with_status(429)
            .with_retry_after(Some(Duration::from_secs(7)))
            .into();
        let AgentError::Llm {
            kind,
            message,
            status,
            retry_after,
            ..
        } = err
        else {
            panic!("not a model failure: {err:?}");
        };
        assert_eq!(kind, Some(LlmErrorKind::RateLimit));
        assert_eq!(message, "slow down");
        assert_eq!(status, Some(429));
        assert_eq!(retry_after, Some(Duration::from_secs(7)));
    }

    #[test]
    fn plain_llm_messages_have_no_kind() {
        let err = AgentError::llm("mock", "rate_limit: slow down");
        assert_eq!(LlmErrorKind::of(&err), None);
    }
}
