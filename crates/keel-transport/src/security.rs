//! Authentication at the transport: which security schemes the card declares, how a request's
//! credentials are read from its headers, and the HTTP 401 answer when they prove nobody.
//!
//! The transport only finds credentials; the runtime's auth service decides whom they prove
//! ([`Reads::authenticate`]: an [`AuthContext`], the tenant every read and write is scoped by). A2A leaves authentication to
//! the transport layer (HTTP), so a request that proves nobody is answered with HTTP 401 and
//! `WWW-Authenticate` on every binding, JSON-RPC included, before any method runs.

use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use keel_agent::reads::Reads;
use keel_core::{AgentCard, SecurityScheme};
use keel_runtime::{AuthContext, Credentials};
use serde_json::{json, Value};

use crate::jsonrpc::{self, RpcError, INVALID_REQUEST};

/// The header that carries an API key.
pub const API_KEY_HEADER: &str = "X-API-Key";

/// The card's name for the API key scheme.
pub(crate) const API_KEY_SCHEME: &str = "apiKey";
/// The card's name for the bearer scheme.
pub(crate) const BEARER_SCHEME: &str = "bearer";

/// How callers must authenticate: the schemes the card declares and the server accepts.
/// Either scheme satisfies the card's security requirements.
///
/// ```
/// use keel_transport::Security;
/// let security = Security::api_key_and_bearer();
/// assert!(security.api_key && security.bearer);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Security {
    /// Accept an API key in the [`API_KEY_HEADER`] header.
    pub api_key: bool,
    /// Accept `Authorization: Bearer <token>`.
    pub bearer: bool,
}

impl Security {
    /// Both schemes.
    pub fn api_key_and_bearer() -> Self {
        Self {
            api_key: true,
            bearer: true,
        }
    }

    /// Declare the schemes on `card` (the wire module encodes them as `securitySchemes`), and
    /// answer the card's `securityRequirements` (A2A v1.0 JSON): any one scheme suffices.
    pub(crate) fn declare(&self, card: &mut AgentCard) -> Value {
        let mut requirements = Vec::new();
        if self.api_key {
            card.security_schemes.insert(
                API_KEY_SCHEME.into(),
                SecurityScheme::ApiKey {
                    location: "header".into(),
                    name: API_KEY_HEADER.into(),
                    description: Some("An API key issued by the operator".into()),
                },
            );
            requirements.push(json!({"schemes": {API_KEY_SCHEME: {"list": []}}}));
        }
        if self.bearer {
            card.security_schemes.insert(
                BEARER_SCHEME.into(),
                SecurityScheme::Http {
                    scheme: "Bearer".into(),
                    bearer_format: None,
                    description: Some("A bearer token issued by the operator".into()),
                },
            );
            requirements.push(json!({"schemes": {BEARER_SCHEME: {"list": []}}}));
        }
        Value::Array(requirements)
    }

    /// The challenges of `WWW-Authenticate`, one per scheme.
    fn challenges(security: Option<&Security>) -> Vec<String> {
        let mut out = Vec::new();
        let security = security.copied().unwrap_or(Security {
            api_key: false,
            bearer: true,
        });
        if security.bearer {
            out.push("Bearer realm=\"a2a\"".to_owned());
        }
        if security.api_key {
            out.push(format!("ApiKey realm=\"a2a\", header=\"{API_KEY_HEADER}\""));
        }
        out
    }
}

/// The credentials a request carries: the schemes `security` accepts (both when it is
/// `None`: the auth service then decides alone), and the tenant it routed to.
pub(crate) fn credentials(
    headers: &HeaderMap,
    security: Option<&Security>,
    tenant: Option<String>,
) -> Credentials {
    let accepts = security
        .copied()
        .unwrap_or_else(Security::api_key_and_bearer);
    let api_key = accepts
        .api_key
        .then(|| headers.get(API_KEY_HEADER)?.to_str().ok())
        .flatten()
        .map(str::trim)
        .filter(|k| !k.is_empty())
        .map(str::to_owned);
    let bearer = accepts
        .bearer
        .then(|| {
            let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?.trim();
            let (scheme, token) = value.split_once(' ')?;
            scheme
                .eq_ignore_ascii_case("bearer")
                .then(|| token.trim().to_owned())
        })
        .flatten()
        .filter(|t| !t.is_empty());
    Credentials {
        api_key,
        bearer,
        tenant: tenant.filter(|t| !t.is_empty()),
    }
}

/// Why a request was not let in.
#[derive(Debug)]
pub(crate) enum Denied {
    /// Missing or wrong credentials: HTTP 401.
    Unauthenticated(&'static str),
    /// The auth service failed: answered as an internal error.
    Failed(RpcError),
}

/// The caller's tenant: with `security` set, credentials are required; the auth service then
/// decides whom they prove.
pub(crate) fn authenticate(
    reads: &Reads,
    security: Option<&Security>,
    credentials: &Credentials,
) -> Result<AuthContext, Denied> {
    if security.is_some() && credentials.is_empty() {
        return Err(Denied::Unauthenticated("credentials are required"));
    }
    let prove = |credentials: &Credentials| match reads.authenticate(credentials) {
        Ok(Some(context)) => {
            crate::observability::note_tenant(&context);
            Ok(context)
        }
        Ok(None) => Err(Denied::Unauthenticated("the credentials were not accepted")),
        Err(err) => Err(Denied::Failed(RpcError::from_agent_error(&err))),
    };
    // A request with both an API key and a bearer token is let in only when each proves the
    // same tenant alone: otherwise a wrong key would ride on a valid token (or the other way
    // round), and which one decided would depend on the auth service's order of looking.
    if let (Some(api_key), Some(bearer)) = (&credentials.api_key, &credentials.bearer) {
        let alone = |api_key: Option<&String>, bearer: Option<&String>| Credentials {
            api_key: api_key.cloned(),
            bearer: bearer.cloned(),
            tenant: credentials.tenant.clone(),
        };
        let by_key = prove(&alone(Some(api_key), None))?;
        let by_token = prove(&alone(None, Some(bearer)))?;
        if by_key != by_token {
            return Err(Denied::Unauthenticated(
                "the API key and the bearer token prove different callers",
            ));
        }
        return Ok(by_key);
    }
    prove(credentials)
}

/// HTTP 401 with `WWW-Authenticate`; the body is a JSON-RPC error (null id) or the
/// HTTP+JSON `google.rpc.Status` (`UNAUTHENTICATED`).
pub(crate) fn unauthorized(security: Option<&Security>, reason: &str, json_rpc: bool) -> Response {
    let message = format!("authentication required: {reason}");
    let body = if json_rpc {
        jsonrpc::failure(
            Value::Null,
            &RpcError::new(INVALID_REQUEST, message).with("reason", "UNAUTHENTICATED"),
        )
    } else {
        json!({"error": {"code": 401, "status": "UNAUTHENTICATED", "message": message}})
    };
    let mut response = (StatusCode::UNAUTHORIZED, Json(body)).into_response();
    for challenge in Security::challenges(security) {
        if let Ok(value) = HeaderValue::from_str(&challenge) {
            response
                .headers_mut()
                .append(header::WWW_AUTHENTICATE, value);
        }
    }
    response
}

/// `service` behind the credentials the A2A routes ask for: a request that proves no tenant
/// is answered 401 (a JSON-RPC error body, with `WWW-Authenticate`) as a JSON-RPC request to
/// the agent is, and one that does reaches `service` with the caller's [`AuthContext`] in
/// its extensions.
pub(crate) fn behind_credentials(
    service: axum::Router,
    reads: Reads,
    security: Option<Security>,
) -> axum::Router {
    let check = move |mut request: axum::extract::Request, next: axum::middleware::Next| {
        let reads = reads.clone();
        async move {
            let found = credentials(request.headers(), security.as_ref(), None);
            match authenticate(&reads, security.as_ref(), &found) {
                Ok(auth) => {
                    request.extensions_mut().insert(auth);
                    next.run(request).await
                }
                Err(Denied::Unauthenticated(reason)) => {
                    tracing::debug!(reason, "request not authenticated");
                    unauthorized(security.as_ref(), reason, true)
                }
                Err(Denied::Failed(error)) => {
                    (StatusCode::OK, Json(jsonrpc::failure(Value::Null, &error))).into_response()
                }
            }
        }
    };
    service.layer(axum::middleware::from_fn(check))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_come_from_the_api_key_header_and_the_bearer_token() {
        let mut headers = HeaderMap::new();
        headers.insert(API_KEY_HEADER, "k1".parse().unwrap());
        headers.insert(header::AUTHORIZATION, "bearer  t1".parse().unwrap());
        let all = credentials(&headers, None, Some("acme".into()));
        assert_eq!(all.api_key.as_deref(), Some("k1"));
        assert_eq!(all.bearer.as_deref(), Some("t1"));
        assert_eq!(all.tenant.as_deref(), Some("acme"));
        let only_bearer = Security {
            api_key: false,
            bearer: true,
        };
        assert_eq!(
            credentials(&headers, Some(&only_bearer), None).api_key,
            None
        );
        headers.insert(header::AUTHORIZATION, "Basic abc".parse().unwrap());
        assert_eq!(credentials(&headers, None, None).bearer, None);
    }
}
