//! The limits that keep one caller from starving the others on a shared server: requests in
//! one JSON-RPC batch, parts in one message, and requests of one tenant handled at once.

use std::sync::Arc;
use std::time::Duration;

use dashmap::DashMap;
use keel_core::{AgentError, Message};
use keel_runtime::AuthContext;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// What one caller may ask of a shared server. Past a limit a request is refused at once:
/// a batch or a message that is too large is invalid (JSON-RPC -32600 / -32602, HTTP 400); a
/// tenant with too many requests in progress gets [`AgentError::Overloaded`] (JSON-RPC
/// -32051 with `retryAfterSeconds`, HTTP 429 with `Retry-After`).
///
/// ```
/// use keel_transport::Limits;
/// let limits = Limits { max_batch_requests: 10, ..Limits::default() };
/// assert_eq!(limits.max_message_parts, Limits::default().max_message_parts);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Requests in one JSON-RPC batch (the requests of a batch run concurrently).
    pub max_batch_requests: usize,
    /// Parts in one message.
    pub max_message_parts: usize,
    /// Requests of one tenant being handled at once, over every binding. A blocking
    /// `SendMessage` counts until it answers; a stream until its first event is ready.
    pub max_requests_per_tenant: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_batch_requests: 32,
            max_message_parts: 128,
            // As many as the engine runs threads by default (decision 276): a blocking send
            // holds its request for its whole run.
            max_requests_per_tenant: 1024,
        }
    }
}

/// How long a tenant over its request limit is asked to wait.
const RETRY_AFTER: Duration = Duration::from_secs(1);

/// The limits at work: an in-process count of each tenant's requests in progress.
pub(crate) struct Admission {
    limits: Limits,
    in_progress: DashMap<String, Arc<Semaphore>>,
}

/// A request of a tenant in progress; dropping it ends the request's count.
pub(crate) struct Admitted {
    _permit: OwnedSemaphorePermit,
}

impl Admission {
    pub(crate) fn new(limits: Limits) -> Self {
        Self {
            limits,
            in_progress: DashMap::new(),
        }
    }

    pub(crate) fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Count a request of `auth`, or refuse it when the tenant has as many in progress as
    /// its limit allows.
    pub(crate) fn admit(&self, auth: &AuthContext) -> Result<Admitted, AgentError> {
        let max = self.limits.max_requests_per_tenant.max(1);
        let semaphore = match self.in_progress.get(&auth.namespace()) {
            Some(semaphore) => semaphore.clone(),
            None => self
                .in_progress
                .entry(auth.namespace())
                .or_insert_with(|| Arc::new(Semaphore::new(max)))
                .clone(),
        };
        let permit = semaphore
            .try_acquire_owned()
            .map_err(|_| AgentError::Overloaded {
                limit: "requests of this tenant in progress".into(),
                max: max as u64,
                retry_after: RETRY_AFTER,
            })?;
        Ok(Admitted { _permit: permit })
    }

    /// Refuse a message with more parts than allowed.
    pub(crate) fn check_message(&self, message: &Message) -> Result<(), AgentError> {
        let max = self.limits.max_message_parts;
        if message.parts.len() > max {
            return Err(AgentError::invalid_input(
                "message.parts",
                format!(
                    "holds {} parts; this server accepts at most {max}",
                    message.parts.len()
                ),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenant_at_its_limit_is_refused_and_others_are_not() {
        let admission = Admission::new(Limits {
            max_requests_per_tenant: 2,
            ..Limits::default()
        });
        let (a, b) = (AuthContext::new("a", "u"), AuthContext::new("b", "u"));
        let first = admission.admit(&a).unwrap();
        let _second = admission.admit(&a).unwrap();
        let refused = admission.admit(&a).err().unwrap();
        assert!(
            matches!(refused, AgentError::Overloaded { max: 2, .. }),
            "{refused:?}"
        );
        let _other = admission.admit(&b).unwrap();
        drop(first);
        assert!(admission.admit(&a).is_ok());
    }
}
