//! Authentication and tenancy: who owns the data a request touches.

use std::collections::HashMap;
use std::fmt;

use keel_core::AgentResult;
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
        // Every store operation keys by it, so it is built directly, without `format!`.
        let (app, user) = (&self.app_name, &self.user_name);
        let (mut app_len, mut user_len) = (itoa::Buffer::new(), itoa::Buffer::new());
        let (app_len, user_len) = (app_len.format(app.len()), user_len.format(user.len()));
        let mut out =
            String::with_capacity(app_len.len() + user_len.len() + app.len() + user.len() + 3);
        out.push_str(app_len);
        out.push(':');
        out.push_str(app);
        out.push('/');
        out.push_str(user_len);
        out.push(':');
        out.push_str(user);
        out
    }

    /// The tenant whose [`AuthContext::namespace`] is `namespace`, or `None` when the text is
    /// not a namespace. Stores that index by namespace use it to list tenants.
    ///
    /// ```
    /// use keel_runtime::AuthContext;
    /// let tenant = AuthContext::new("a:b/1:x", "ü");
    /// assert_eq!(AuthContext::from_namespace(&tenant.namespace()), Some(tenant));
    /// assert_eq!(AuthContext::from_namespace("3:ab/1:c"), None);
    /// ```
    pub fn from_namespace(namespace: &str) -> Option<AuthContext> {
        fn field(text: &str, end: Option<char>) -> Option<(&str, &str)> {
            let (len, rest) = text.split_once(':')?;
            if len.is_empty() || !len.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            let len: usize = len.parse().ok()?;
            let value = rest.get(..len)?;
            let rest = &rest[len..];
            match end {
                Some(sep) => Some((value, rest.strip_prefix(sep)?)),
                None => rest.is_empty().then_some((value, rest)),
            }
        }
        let (app, rest) = field(namespace, Some('/'))?;
        let (user, _) = field(rest, None)?;
        Some(AuthContext::new(app, user))
    }

    /// The tenants of `namespaces` a store kept (for
    /// [`TaskManager::tenants`](crate::TaskManager::tenants)); one that is not a namespace is [`AgentError::Storage`](keel_core::AgentError::Storage)
    /// naming it and `place`, where it was found.
    pub fn from_stored_namespaces(
        namespaces: &[String],
        place: &str,
    ) -> keel_core::AgentResult<Vec<AuthContext>> {
        namespaces
            .iter()
            .map(|ns| {
                AuthContext::from_namespace(ns).ok_or_else(|| {
                    keel_core::AgentError::storage(format!("{place} holds `{ns}`, not a tenant"))
                })
            })
            .collect()
    }
}

/// What a caller presented to prove who it is, as a transport found it (e.g. the
/// `X-API-Key` header, the token of `Authorization: Bearer`, and the A2A `tenant` it routed
/// to). Secrets are redacted from `Debug`.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Credentials {
    /// An API key.
    pub api_key: Option<String>,
    /// A bearer token.
    pub bearer: Option<String>,
    /// The tenant the caller addressed (A2A `tenant`), a routing hint: an [`AuthService`]
    /// decides whether it means anything; it must never let it widen what the credentials grant.
    pub tenant: Option<String>,
}

impl Credentials {
    /// Whether the caller presented any secret at all.
    pub fn is_empty(&self) -> bool {
        self.api_key.is_none() && self.bearer.is_none()
    }
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let redact = |v: &Option<String>| v.as_ref().map(|_| "<redacted>");
        f.debug_struct("Credentials")
            .field("api_key", &redact(&self.api_key))
            .field("bearer", &redact(&self.bearer))
            .field("tenant", &self.tenant)
            .finish()
    }
}

/// Identifies the tenant of the current execution, and turns a caller's credentials into one.
pub trait AuthService: keel_core::MaybeSend + keel_core::MaybeSync {
    /// The tenant of work that has no caller (local runs, recovery).
    fn auth_context(&self) -> AuthContext;

    /// The tenant that `credentials` prove, or `None` when they prove nobody (missing or
    /// wrong). The default ignores the credentials and answers [`AuthService::auth_context`]:
    /// a single-tenant service that trusts every caller.
    ///
    /// ```
    /// use keel_runtime::{AuthService, Credentials, StaticAuthService};
    /// let auth = StaticAuthService::default();
    /// let ctx = auth.authenticate(&Credentials::default()).unwrap();
    /// assert_eq!(ctx, Some(auth.auth_context()));
    /// ```
    fn authenticate(&self, credentials: &Credentials) -> AgentResult<Option<AuthContext>> {
        let _ = credentials;
        Ok(Some(self.auth_context()))
    }
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

/// An [`AuthService`] that maps API keys (or bearer tokens: both are looked up in the same
/// table) to tenants. Unknown or missing keys prove nobody, and so does an API key presented
/// with a bearer token that is unknown or names another tenant. The `tenant` a caller routes to
/// is ignored: the key alone decides whose data a request sees.
///
/// ```
/// use keel_runtime::{ApiKeyAuthService, AuthContext, AuthService, Credentials};
/// let auth = ApiKeyAuthService::new(AuthContext::new("local", "operator"))
///     .with_key("k-alice", AuthContext::new("acme", "alice"));
/// let alice = Credentials { api_key: Some("k-alice".into()), ..Credentials::default() };
/// assert_eq!(auth.authenticate(&alice).unwrap(), Some(AuthContext::new("acme", "alice")));
/// assert_eq!(auth.authenticate(&Credentials::default()).unwrap(), None);
/// ```
#[derive(Clone)]
pub struct ApiKeyAuthService {
    local: AuthContext,
    keys: HashMap<String, AuthContext>,
}

impl ApiKeyAuthService {
    /// No keys yet; `local` is the tenant of work without a caller.
    pub fn new(local: AuthContext) -> Self {
        Self {
            local,
            keys: HashMap::new(),
        }
    }

    /// Accept `key` (as an API key or a bearer token) for `tenant`.
    #[must_use]
    pub fn with_key(mut self, key: impl Into<String>, tenant: AuthContext) -> Self {
        self.keys.insert(key.into(), tenant);
        self
    }
}

impl fmt::Debug for ApiKeyAuthService {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ApiKeyAuthService")
            .field("local", &self.local)
            .field("keys", &self.keys.len())
            .finish()
    }
}

impl AuthService for ApiKeyAuthService {
    fn auth_context(&self) -> AuthContext {
        self.local.clone()
    }

    fn authenticate(&self, credentials: &Credentials) -> AgentResult<Option<AuthContext>> {
        // Every secret presented must be known and name the same tenant: a wrong key never
        // rides on a valid token.
        let mut proven: Option<&AuthContext> = None;
        for key in [&credentials.api_key, &credentials.bearer]
            .into_iter()
            .flatten()
        {
            match (self.keys.get(key), proven) {
                (None, _) => return Ok(None),
                (Some(tenant), Some(earlier)) if tenant != earlier => return Ok(None),
                (Some(tenant), _) => proven = Some(tenant),
            }
        }
        Ok(proven.cloned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_namespaces_are_tenants_and_anything_else_is_storage_naming_where() {
        let a = AuthContext::new("app", "alice");
        let b = AuthContext::new("a:b/1:x", "bob");
        assert_eq!(
            AuthContext::from_stored_namespaces(&[a.namespace(), b.namespace()], "here").unwrap(),
            vec![a.clone(), b]
        );
        let err = AuthContext::from_stored_namespaces(&[a.namespace(), "junk".into()], "the set")
            .unwrap_err();
        assert!(
            matches!(err, keel_core::AgentError::Storage { .. })
                && err.to_string().contains("the set")
                && err.to_string().contains("junk"),
            "{err}"
        );
    }

    #[test]
    fn namespaces_keep_their_stored_form() {
        // Stored keys are prefixed with it: its form must never change.
        let long = "x".repeat(1234);
        for (app, user, expected) in [
            ("app", "user", "3:app/4:user".to_owned()),
            ("", "", "0:/0:".to_owned()),
            ("a:b", "c/d", "3:a:b/3:c/d".to_owned()),
            ("é", &long, format!("2:é/1234:{long}")),
        ] {
            let ns = AuthContext::new(app, user).namespace();
            assert_eq!(ns, expected);
            assert_eq!(
                AuthContext::from_namespace(&ns),
                Some(AuthContext::new(app, user))
            );
        }
    }

    #[test]
    fn api_keys_map_to_their_tenants_and_unknown_keys_to_nobody() {
        let a = AuthContext::new("a", "u");
        let b = AuthContext::new("b", "u");
        let auth = ApiKeyAuthService::new(AuthContext::new("local", "op"))
            .with_key("ka", a.clone())
            .with_key("kb", b.clone());
        let with =
            |api_key: Option<&str>, bearer: Option<&str>, tenant: Option<&str>| Credentials {
                api_key: api_key.map(Into::into),
                bearer: bearer.map(Into::into),
                tenant: tenant.map(Into::into),
            };
        assert_eq!(
            auth.authenticate(&with(Some("ka"), None, None)).unwrap(),
            Some(a.clone())
        );
        assert_eq!(
            auth.authenticate(&with(None, Some("kb"), None)).unwrap(),
            Some(b)
        );
        // The routed tenant never widens what the key grants.
        assert_eq!(
            auth.authenticate(&with(Some("ka"), None, Some("b")))
                .unwrap(),
            Some(a)
        );
        assert_eq!(
            auth.authenticate(&with(Some("nope"), None, None)).unwrap(),
            None
        );
        assert_eq!(auth.authenticate(&Credentials::default()).unwrap(), None);
        assert!(!format!("{:?}", with(Some("ka"), None, None)).contains("ka"));
    }

    #[test]
    fn conflicting_credentials_prove_nobody() {
        let a = AuthContext::new("a", "u");
        let auth = ApiKeyAuthService::new(AuthContext::new("local", "op"))
            .with_key("ka", a.clone())
            .with_key("kb", AuthContext::new("b", "u"));
        let both = |api_key: &str, bearer: &str| Credentials {
            api_key: Some(api_key.into()),
            bearer: Some(bearer.into()),
            tenant: None,
        };
        assert_eq!(auth.authenticate(&both("wrong", "ka")).unwrap(), None);
        assert_eq!(auth.authenticate(&both("ka", "wrong")).unwrap(), None);
        assert_eq!(auth.authenticate(&both("ka", "kb")).unwrap(), None);
        assert_eq!(auth.authenticate(&both("ka", "ka")).unwrap(), Some(a));
    }
}
