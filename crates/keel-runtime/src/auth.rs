//! Authentication and tenancy: who owns the data a request touches.

use serde::{Deserialize, Serialize};

/// The tenant of a request. Every stored key is namespaced by it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct AuthContext {
    /// The application.
    pub app_name: String,
    /// The user within the application.
    pub user_name: String,
}

impl AuthContext {
    /// A tenant.
    pub fn new(app_name: impl Into<String>, user_name: impl Into<String>) -> Self {
        Self {
            app_name: app_name.into(),
            user_name: user_name.into(),
        }
    }

    /// A string that identifies the tenant unambiguously, for use as a key prefix. Both
    /// names are length-prefixed, so no choice of names can collide with another tenant's.
    ///
    /// ```
    /// let a = keel_runtime::AuthContext::new("a:b", "c");
    /// let b = keel_runtime::AuthContext::new("a", "b:c");
    /// assert_ne!(a.namespace(), b.namespace());
    /// ```
    pub fn namespace(&self) -> String {
        format!(
            "{}:{}/{}:{}",
            self.app_name.len(),
            self.app_name,
            self.user_name.len(),
            self.user_name
        )
    }
}

/// Identifies the tenant of the current execution.
pub trait AuthService: Send + Sync {
    /// The tenant.
    fn auth_context(&self) -> AuthContext;
}

/// An [`AuthService`] that always answers the same tenant.
#[derive(Debug, Clone)]
pub struct StaticAuthService {
    context: AuthContext,
}

impl StaticAuthService {
    /// Always answer `context`.
    pub fn new(context: AuthContext) -> Self {
        Self { context }
    }
}

impl Default for StaticAuthService {
    fn default() -> Self {
        Self::new(AuthContext::new("default-app", "default-user"))
    }
}

impl AuthService for StaticAuthService {
    fn auth_context(&self) -> AuthContext {
        self.context.clone()
    }
}
