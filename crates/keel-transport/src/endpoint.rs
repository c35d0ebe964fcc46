//! Custom endpoints (seed 001's `EndpointSpec`): operations an agent's server offers beside
//! A2A, at `/x/{path}` (and `/{tenant}/x/{path}`; under an [`AgentsServer`](crate::AgentsServer)
//! at `/agents/{name}/x/{path}`), with the same credentials and tenant scoping as every
//! other route.
//!
//! A handler receives the caller's tenant, the agent's executor and the request's input (the
//! JSON body or the query parameters, as the spec says) and answers a JSON value (or, for an
//! HTML endpoint, a string). An error it returns is answered like the HTTP+JSON binding's
//! errors: [`AgentError::InvalidInput`] is 400, `TaskNotFound` 404, and so on. An unknown path
//! is 404 and a known path with another method 405 (`Allow` names the methods it has).

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::QueryRejection;
use axum::extract::{DefaultBodyLimit, Path, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::any;
use axum::{Json, Router};
use futures::future::BoxFuture;
use keel_agent::reads::Reads;
use keel_agent::AgentExecutor;
use keel_core::{AgentError, AgentResult};
use keel_runtime::AuthContext;
use serde::de::DeserializeOwned;
use serde_json::{json, Map, Value};

use crate::jsonrpc::RpcError;
use crate::security::{self, Denied, Security};

/// Where custom endpoints are served: `/x/{path}`.
pub const ENDPOINTS_PATH: &str = "/x/";

/// The path of [`EndpointSpec::compact_thread`] under [`ENDPOINTS_PATH`].
pub const COMPACT_THREAD_PATH: &str = "threads/compact";

/// The HTTP method of an endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum HttpMethod {
    /// `GET`.
    Get,
    /// `POST`.
    Post,
    /// `PUT`.
    Put,
    /// `PATCH`.
    Patch,
    /// `DELETE`.
    Delete,
}

impl HttpMethod {
    fn of(method: &Method) -> Option<Self> {
        Some(match *method {
            Method::GET => HttpMethod::Get,
            Method::POST => HttpMethod::Post,
            Method::PUT => HttpMethod::Put,
            Method::PATCH => HttpMethod::Patch,
            Method::DELETE => HttpMethod::Delete,
            _ => return None,
        })
    }

    /// The method's name, as HTTP writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            HttpMethod::Get => "GET",
            HttpMethod::Post => "POST",
            HttpMethod::Put => "PUT",
            HttpMethod::Patch => "PATCH",
            HttpMethod::Delete => "DELETE",
        }
    }
}

/// What an endpoint answers with.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum EndpointContent {
    /// `application/json`: the handler's value.
    #[default]
    Json,
    /// `text/html`: the handler's value, which must be a string.
    Html,
}

/// Where an endpoint's input comes from (the seed's `request_source`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestSource {
    /// No input: the handler gets `null`.
    None,
    /// The JSON body (`null` when empty); a body that is not JSON is 400.
    Body,
    /// The query parameters, as an object of strings.
    QueryParams,
}

/// One call of an endpoint, as its handler sees it.
#[derive(Clone)]
pub struct EndpointRequest {
    /// The caller's tenant, from its credentials (or the server's default tenant).
    pub auth: AuthContext,
    /// The executor of the agent the endpoint belongs to.
    pub executor: AgentExecutor,
    /// The input, from where the spec's [`RequestSource`] says.
    pub input: Value,
}

impl EndpointRequest {
    /// The input read as `T`; input of another shape is [`AgentError::InvalidInput`] (400).
    pub fn input_as<T: DeserializeOwned>(&self) -> AgentResult<T> {
        T::deserialize(&self.input).map_err(|e| AgentError::invalid_input("input", e.to_string()))
    }
}

type Handler = Arc<dyn Fn(EndpointRequest) -> BoxFuture<'static, AgentResult<Value>> + Send + Sync>;

/// A custom endpoint: a name, a path under [`ENDPOINTS_PATH`], a method and an async
/// handler. Register it with [`A2aServer::with_endpoint`](crate::A2aServer::with_endpoint).
///
/// ```
/// use keel_transport::{EndpointSpec, HttpMethod};
/// let spec = EndpointSpec::new("stats", "stats/today", HttpMethod::Get, |request| async move {
///     Ok(serde_json::json!({"tenant": request.auth.app_name}))
/// })
/// .unwrap();
/// assert_eq!(spec.path(), "stats/today");
/// assert!(EndpointSpec::new("bad", "../up", HttpMethod::Get, |_| async { Ok(serde_json::Value::Null) }).is_err());
/// ```
#[derive(Clone)]
pub struct EndpointSpec {
    name: String,
    path: String,
    method: HttpMethod,
    content: EndpointContent,
    source: RequestSource,
    handler: Handler,
}

impl fmt::Debug for EndpointSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EndpointSpec")
            .field("name", &self.name)
            .field("path", &self.path)
            .field("method", &self.method)
            .field("content", &self.content)
            .field("source", &self.source)
            .finish_non_exhaustive()
    }
}

impl EndpointSpec {
    /// An endpoint answering JSON. `path` is relative to [`ENDPOINTS_PATH`] (a leading `/` is
    /// dropped): segments of letters, digits, `-`, `_`, `.` and `~`, not `.` or `..`. The
    /// input comes from the body for `POST`, `PUT` and `PATCH` and from the query for `GET`
    /// and `DELETE` (see [`EndpointSpec::with_request_source`]). An empty name or an invalid
    /// path is [`AgentError::InvalidInput`].
    pub fn new<F, Fut>(
        name: impl Into<String>,
        path: impl Into<String>,
        method: HttpMethod,
        handler: F,
    ) -> AgentResult<Self>
    where
        F: Fn(EndpointRequest) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = AgentResult<Value>> + Send + 'static,
    {
        let name = name.into();
        if name.trim().is_empty() {
            return Err(AgentError::invalid_input(
                "endpoint.name",
                "must not be empty",
            ));
        }
        let path = path.into();
        let path = path
            .trim_start_matches('/')
            .trim_end_matches('/')
            .to_owned();
        let valid_segment = |segment: &str| {
            !segment.is_empty()
                && segment != "."
                && segment != ".."
                && segment
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.~".contains(c))
        };
        if !path.split('/').all(valid_segment) {
            return Err(AgentError::invalid_input(
                "endpoint.path",
                format!("`{path}` is not a path of plain segments (letters, digits, - _ . ~)"),
            ));
        }
        Ok(Self::checked(name, path, method, handler))
    }

    /// A spec whose name and path are already known to be valid.
    fn checked<F, Fut>(name: String, path: String, method: HttpMethod, handler: F) -> Self
    where
        F: Fn(EndpointRequest) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = AgentResult<Value>> + Send + 'static,
    {
        let source = match method {
            HttpMethod::Post | HttpMethod::Put | HttpMethod::Patch => RequestSource::Body,
            HttpMethod::Get | HttpMethod::Delete => RequestSource::QueryParams,
        };
        Self {
            name,
            path,
            method,
            content: EndpointContent::Json,
            source,
            handler: Arc::new(move |request| Box::pin(handler(request))),
        }
    }

    /// Answer with this content type.
    #[must_use]
    pub fn with_content(mut self, content: EndpointContent) -> Self {
        self.content = content;
        self
    }

    /// Take the input from here.
    #[must_use]
    pub fn with_request_source(mut self, source: RequestSource) -> Self {
        self.source = source;
        self
    }

    /// The operator's compaction of a thread, `POST /x/threads/compact`: the body is a
    /// [`HistoryCompactionRequest`](keel_llm::HistoryCompactionRequest) naming its
    /// `thread_id` (`{"thread_id": "...", "strategy": "summary", "preserve_recent": 6}`), the
    /// answer the [`HistoryCompactionResult`](keel_llm::HistoryCompactionResult). It runs
    /// [`AgentExecutor::compact_thread`] in the caller's tenant: a thread of another tenant
    /// has no history there. A thread a run holds is 429 with `Retry-After`.
    ///
    /// ```
    /// let spec = keel_transport::EndpointSpec::compact_thread();
    /// assert_eq!((spec.name(), spec.path()), ("compact_thread", "threads/compact"));
    /// ```
    pub fn compact_thread() -> Self {
        Self::checked(
            "compact_thread".into(),
            COMPACT_THREAD_PATH.into(),
            HttpMethod::Post,
            |request: EndpointRequest| async move {
                let compaction: keel_llm::HistoryCompactionRequest = request.input_as()?;
                let thread_id = compaction.thread_id.clone().ok_or_else(|| {
                    AgentError::invalid_input("thread_id", "names the thread to compact")
                })?;
                let result = request
                    .executor
                    .compact_thread(&request.auth, &thread_id, &compaction)
                    .await?;
                serde_json::to_value(result).map_err(AgentError::internal)
            },
        )
    }

    /// The endpoint's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its path under [`ENDPOINTS_PATH`].
    pub fn path(&self) -> &str {
        &self.path
    }

    /// Its method.
    pub fn method(&self) -> HttpMethod {
        self.method
    }
}

#[derive(Clone)]
struct EndpointsState {
    executor: AgentExecutor,
    reads: Reads,
    security: Option<Security>,
    /// By path, then method; a later spec for the same path and method replaces the earlier.
    routes: Arc<BTreeMap<String, BTreeMap<HttpMethod, EndpointSpec>>>,
}

/// The routes of `specs`; `None` when there are none, so a server without endpoints keeps
/// its routes as they were.
pub(crate) fn router(
    executor: AgentExecutor,
    security: Option<Security>,
    specs: &[EndpointSpec],
    body_limit: usize,
) -> Option<Router> {
    if specs.is_empty() {
        return None;
    }
    let mut routes: BTreeMap<String, BTreeMap<HttpMethod, EndpointSpec>> = BTreeMap::new();
    for spec in specs {
        routes
            .entry(spec.path.clone())
            .or_default()
            .insert(spec.method, spec.clone());
    }
    let state = EndpointsState {
        reads: executor.reads(),
        executor,
        security,
        routes: Arc::new(routes),
    };
    Some(
        Router::new()
            .route("/x/{*path}", any(serve))
            .route("/{tenant}/x/{*path}", any(serve_in_tenant))
            .layer(DefaultBodyLimit::max(body_limit))
            .with_state(state),
    )
}

async fn serve(
    State(state): State<EndpointsState>,
    Path(path): Path<String>,
    method: Method,
    headers: HeaderMap,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
    body: Bytes,
) -> Response {
    answer(state, None, path, method, headers, query, body).await
}

async fn serve_in_tenant(
    State(state): State<EndpointsState>,
    Path((tenant, path)): Path<(String, String)>,
    method: Method,
    headers: HeaderMap,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
    body: Bytes,
) -> Response {
    answer(state, Some(tenant), path, method, headers, query, body).await
}

fn refuse(error: AgentError) -> Response {
    crate::rest::error_response(&RpcError::from_agent_error(&error))
}

fn plain(status: StatusCode, message: String) -> Response {
    (
        status,
        Json(json!({"error": {"code": status.as_u16(), "message": message}})),
    )
        .into_response()
}

async fn answer(
    state: EndpointsState,
    tenant: Option<String>,
    path: String,
    method: Method,
    headers: HeaderMap,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
    body: Bytes,
) -> Response {
    // Credentials first: an unauthenticated caller learns nothing of which paths exist.
    let credentials = security::credentials(&headers, state.security.as_ref(), tenant);
    let auth = match security::authenticate(&state.reads, state.security.as_ref(), &credentials) {
        Ok(auth) => auth,
        Err(Denied::Unauthenticated(reason)) => {
            return security::unauthorized(state.security.as_ref(), reason, false)
        }
        Err(Denied::Failed(error)) => return crate::rest::error_response(&error),
    };
    let path = path.trim_end_matches('/');
    let Some(methods) = state.routes.get(path) else {
        return plain(
            StatusCode::NOT_FOUND,
            format!("no endpoint at `{ENDPOINTS_PATH}{path}`"),
        );
    };
    let Some(spec) = HttpMethod::of(&method).and_then(|m| methods.get(&m)) else {
        let allow: Vec<&str> = methods.keys().map(|m| m.as_str()).collect();
        let mut response = plain(
            StatusCode::METHOD_NOT_ALLOWED,
            format!("`{ENDPOINTS_PATH}{path}` answers {}", allow.join(", ")),
        );
        if let Ok(value) = HeaderValue::from_str(&allow.join(", ")) {
            response.headers_mut().insert(header::ALLOW, value);
        }
        return response;
    };
    let input = match spec.source {
        RequestSource::None => Value::Null,
        RequestSource::QueryParams => match query {
            Ok(Query(pairs)) => Value::Object(
                pairs
                    .into_iter()
                    .map(|(k, v)| (k, Value::String(v)))
                    .collect::<Map<String, Value>>(),
            ),
            Err(rejection) => {
                return refuse(AgentError::invalid_input("query", rejection.body_text()))
            }
        },
        RequestSource::Body if body.iter().all(u8::is_ascii_whitespace) => Value::Null,
        RequestSource::Body => match serde_json::from_slice(&body) {
            Ok(value) => value,
            Err(err) => {
                return refuse(AgentError::invalid_input(
                    "body",
                    format!("must be JSON: {err}"),
                ))
            }
        },
    };
    let span = tracing::info_span!("endpoint", name = %spec.name, method = spec.method.as_str());
    let request = EndpointRequest {
        auth,
        executor: state.executor.clone(),
        input,
    };
    let result = tracing::Instrument::instrument((spec.handler)(request), span).await;
    match (result, spec.content) {
        (Ok(value), EndpointContent::Json) => (StatusCode::OK, Json(value)).into_response(),
        (Ok(Value::String(html)), EndpointContent::Html) => Html(html).into_response(),
        (Ok(other), EndpointContent::Html) => {
            tracing::warn!(endpoint = %spec.name, "an HTML endpoint answered a non-string value");
            refuse(AgentError::internal(format!(
                "endpoint `{}` answered {} where HTML was expected",
                spec.name,
                type_name(&other)
            )))
        }
        (Err(error), _) => refuse(error),
    }
}

fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}
