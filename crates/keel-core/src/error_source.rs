//! [`ErrorSource`]: the cause under a storage or internal [`AgentError`](crate::AgentError),
//! kept as an error (not flattened into text) and shared, so `AgentError` stays `Clone`.

use std::error::Error;
use std::fmt;
use std::sync::Arc;

/// The error underneath a failure, reachable through [`Error::source`]. Two sources are equal
/// when they read the same, which is what comparing errors in tests needs.
///
/// ```
/// use keel_core::AgentError;
/// let io = std::io::Error::new(std::io::ErrorKind::Other, "disk full");
/// let err = AgentError::storage_source("sqlite", "saving a task", io);
/// assert_eq!(err.to_string(), "storage error: sqlite (saving a task): disk full");
/// let source = std::error::Error::source(&err).expect("a source");
/// assert!(source.downcast_ref::<keel_core::ErrorSource>().is_some());
/// ```
#[derive(Clone)]
pub struct ErrorSource(Arc<dyn Error + Send + Sync>);

impl ErrorSource {
    /// What `error` says at the end of its chain of sources: where a client library's error
    /// reads "error sending request", its innermost cause says "Connection refused", which
    /// is what a user can act on.
    pub fn innermost(error: &(dyn Error + 'static)) -> String {
        let mut cause = error;
        while let Some(inner) = cause.source() {
            cause = inner;
        }
        cause.to_string()
    }

    /// Keep `error` as the cause.
    pub fn new(error: impl Error + Send + Sync + 'static) -> Self {
        Self(Arc::new(error))
    }

    /// A cause known only as text.
    pub fn message(text: impl fmt::Display) -> Self {
        Self(Arc::from(Box::<dyn Error + Send + Sync>::from(
            text.to_string(),
        )))
    }

    /// The cause itself, for downcasting to the backend's error type.
    pub fn get(&self) -> &(dyn Error + Send + Sync + 'static) {
        self.0.as_ref()
    }
}

impl fmt::Display for ErrorSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl fmt::Debug for ErrorSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

impl Error for ErrorSource {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        self.0.source()
    }
}

impl PartialEq for ErrorSource {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0) || self.to_string() == other.to_string()
    }
}
