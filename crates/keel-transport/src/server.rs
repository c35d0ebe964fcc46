//! The A2A server on axum: the agent card at `/.well-known/agent-card.json`, the JSON-RPC
//! binding at `/` (A2A v1.0, and v0.3 through the compatibility layer), and the HTTP+JSON
//! binding (see the `rest` module). Both bindings call the same `handlers`.

use std::future::Future;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{DefaultBodyLimit, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::serve::ListenerExt;
use axum::{Json, Router};
use futures::StreamExt;
use keel_agent::AgentExecutor;
use keel_core::AgentCard;
use serde_json::Value;
use tokio::sync::watch;

use crate::compat_v03;
use crate::conn::ConnectionLimits;
use crate::dispatch::{call, stream_envelope, Outcome};
use crate::handlers::Handlers;
use crate::jsonrpc::{self, RpcError, INVALID_REQUEST, PARSE_ERROR};
use crate::limits::{Admission, Limits};
use crate::push::{Push, PushTarget, RetryPolicy, TargetPolicy};
use crate::rest;
use crate::security::Security;
use crate::sse::{sse, sse_json};
use crate::version::{requested_version, Version, VERSION_HEADER};
use crate::wire::{self, Binding, Interface};

/// The path of the public agent card.
pub const AGENT_CARD_PATH: &str = "/.well-known/agent-card.json";

/// Where A2A 0.3 clients of old look for the card (`agent.json`): it serves the v0.3 form.
pub const LEGACY_AGENT_CARD_PATH: &str = "/.well-known/agent.json";

/// The default request body limit: 1 MiB.
pub const DEFAULT_BODY_LIMIT: usize = 1024 * 1024;

/// Serves one agent over A2A: v1.0 on the JSON-RPC and HTTP+JSON bindings, and v0.3 JSON-RPC.
///
/// Routes: `GET /.well-known/agent-card.json` (the v1.0 card for a caller that names 1.0; the
/// v0.3 form for one that names 0.3 or no version, and at `/.well-known/agent.json`), `POST /`
/// (JSON-RPC: every v1.0
/// method, and the v0.3 `message/send`, `message/stream`, `tasks/get`, `tasks/cancel`,
/// `tasks/resubscribe`), and the HTTP+JSON routes of A2A's proto (`POST /message:send`,
/// `GET /tasks/{id}`, ..., each also under `/{tenant}/`), and `GET /ws` (JSON-RPC over a
/// WebSocket: one request or response per frame, a stream as several response frames with the
/// request's id; see [`WS_PATH`](crate::WS_PATH)). JSON-RPC errors are answered with
/// HTTP 200, as A2A clients expect; HTTP+JSON errors with the status A2A assigns.
/// `SendStreamingMessage` and `SubscribeToTask` answer with Server-Sent Events. Push
/// notification configs are stored per tenant through the runtime's memory service and
/// their webhooks receive every status and artifact update (see
/// [`A2aServer::allow_private_push_targets`] for the SSRF guard).
///
/// The `A2A-Version` header (or query parameter) picks the protocol of a JSON-RPC request:
/// `1.0`/`1.0.x` the v1.0 methods, `0.3` the v0.3 ones, none either (dispatched by method
/// name, since v0.3 clients send no header); anything else is -32009.
///
/// ```
/// use std::sync::Arc;
/// use keel_agent::{Agent, AgentExecutor};
/// use keel_core::AgentCard;
/// use keel_llm::MockLlm;
/// use keel_runtime::Services;
/// use keel_transport::A2aServer;
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let agent = Agent::builder(AgentCard::new("echo", "Echoes", "http://unused")).build()?;
/// let runtime = Arc::new(Services::in_memory(Arc::new(MockLlm::new())));
/// let server = A2aServer::new(AgentExecutor::new(agent, runtime));
///
/// let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
/// let base_url = format!("http://{}", listener.local_addr()?);
/// let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
/// let serving = tokio::spawn(server.serve(listener, async move { let _ = stopped.await; }));
///
/// let client = keel_transport::A2aClient::new(base_url);
/// let card = client.get_card().await?;
/// assert_eq!(card.name, "echo");
///
/// let _ = stop.send(());
/// serving.await??;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct A2aServer {
    executor: AgentExecutor,
    public_url: Option<String>,
    body_limit: usize,
    security: Option<Security>,
    extended_card: Option<AgentCard>,
    card_max_age: u64,
    push_targets: TargetPolicy,
    push_retry: RetryPolicy,
    limits: Limits,
    connections: ConnectionLimits,
    endpoints: Vec<crate::EndpointSpec>,
    metrics: Option<crate::MetricsRoute>,
    /// Services mounted beside A2A behind its credentials, by path.
    mounted: Vec<(String, Router)>,
    /// The web console's routes (public: the page asks for credentials itself), when served.
    console: Option<Router>,
}

struct ServerState {
    handlers: Handlers,
    /// The v1.0 card, for callers that send `A2A-Version: 1.0`.
    card: ServedCard,
    /// The card for callers without a version (v0.3 clients by the spec): the v1.0 card plus
    /// the v0.3 fields (`compat_v03::card_from_v1`).
    card_v03: ServedCard,
    card_cache_control: String,
    /// When this server built its card (an HTTP-date): the card changes only with a new
    /// server, so that is when it was last modified.
    card_last_modified: String,
}

/// One variant of the public card and its entity tag.
struct ServedCard {
    json: Value,
    /// A strong validator of `json`: a hash of it, quoted.
    etag: String,
}

impl ServedCard {
    fn new(json: Value) -> Self {
        Self {
            etag: etag(&json),
            json,
        }
    }
}

/// How long clients and caches may keep the public card, by default (`max-age`, seconds).
pub const DEFAULT_CARD_MAX_AGE: u64 = 300;

impl A2aServer {
    /// A server for the agent that `executor` runs.
    pub fn new(executor: AgentExecutor) -> Self {
        Self {
            executor,
            public_url: None,
            body_limit: DEFAULT_BODY_LIMIT,
            security: None,
            extended_card: None,
            card_max_age: DEFAULT_CARD_MAX_AGE,
            push_targets: TargetPolicy::default(),
            push_retry: RetryPolicy::default(),
            limits: Limits::default(),
            connections: ConnectionLimits::default(),
            endpoints: Vec::new(),
            metrics: None,
            mounted: Vec::new(),
            console: None,
        }
    }

    /// Serve the web console's routes (`keel_console::router`, under `/console`) beside A2A,
    /// and lead a browser that opens the server's URL there: `GET /` asking for HTML is
    /// answered `303 See Other` to `console/`, while other callers of `GET /` keep the
    /// answer they had (`405`, `Allow: POST`: `/` is the JSON-RPC binding).
    ///
    /// The routes are not behind the server's credentials: the page and its modules hold no
    /// data, and every call the console makes goes to the operator API and the A2A routes
    /// with the credentials the operator gives it, as any other client's would.
    #[must_use]
    pub fn with_console(mut self, routes: Router) -> Self {
        self.console = Some(routes);
        self
    }

    /// Serve `service` at `path` and below it (such as `/mcp`, where `keel serve` mounts its
    /// MCP server), behind the same credentials as the A2A routes: a request without valid
    /// ones is answered 401 as a JSON-RPC request is, and one with them reaches `service`
    /// with the caller's [`AuthContext`](keel_runtime::AuthContext) in its extensions, the
    /// tenant the service works for.
    #[must_use]
    pub fn with_authenticated(mut self, path: impl Into<String>, service: Router) -> Self {
        self.mounted.push((path.into(), service));
        self
    }

    /// Serve the process's metrics at `/metrics` ([`crate::MetricsRoute`]); [`Self::serve`]
    /// counts and logs every request either way.
    #[must_use]
    pub fn with_metrics(mut self, route: crate::MetricsRoute) -> Self {
        self.metrics = Some(route);
        self
    }

    /// Serve a custom endpoint beside A2A, at `/x/{path}` and `/{tenant}/x/{path}` (see
    /// [`EndpointSpec`](crate::EndpointSpec)), with the server's security. A later endpoint
    /// with the same path and method replaces an earlier one.
    #[must_use]
    pub fn with_endpoint(mut self, endpoint: crate::EndpointSpec) -> Self {
        self.endpoints.push(endpoint);
        self
    }

    /// The limits on one caller's requests ([`Limits::default`] unless set): requests in a
    /// batch, parts in a message, and one tenant's requests in progress.
    #[must_use]
    pub fn with_limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }

    /// The deadlines of a connection's headers, body and idle spells, and the cap on open
    /// connections, that [`A2aServer::serve`] applies ([`ConnectionLimits::default`] unless
    /// set: 10 s, 30 s, 60 s and 10,000).
    #[must_use]
    pub fn with_connection_limits(mut self, limits: ConnectionLimits) -> Self {
        self.connections = limits;
        self
    }

    /// The connection limits [`A2aServer::serve`] applies.
    pub fn connection_limits(&self) -> ConnectionLimits {
        self.connections
    }

    /// Whether push notification webhooks may be loopback, private or link-local addresses
    /// (off by default: such URLs are refused when a config is created and at delivery, so
    /// that a caller cannot make the agent reach into its own network). Turn on for local
    /// development and tests.
    #[must_use]
    pub fn allow_private_push_targets(mut self, allow: bool) -> Self {
        self.push_targets.allow_private = allow;
        self
    }

    /// The only targets push notification webhooks may reach: URL prefixes, host names and
    /// IP networks ([`PushTarget`]). With a list, a webhook outside it is refused (when the
    /// config is created, as invalid params, and at delivery) and one inside it is accepted,
    /// private addresses included, whatever [`A2aServer::allow_private_push_targets`] says.
    /// An empty list (the default) leaves the decision to the public-address rule.
    #[must_use]
    pub fn allow_push_targets(mut self, targets: impl IntoIterator<Item = PushTarget>) -> Self {
        self.push_targets.allowed = targets.into_iter().collect();
        self
    }

    /// How failed push deliveries are retried: `max_attempts` per event and webhook (the
    /// first included, at least 1), waiting `base_delay` (doubled per further attempt, capped
    /// at 30 s, half of it random) in between. The default is 5 attempts from 500 ms.
    #[must_use]
    pub fn with_push_retry(mut self, max_attempts: u32, base_delay: std::time::Duration) -> Self {
        self.push_retry = RetryPolicy {
            max_attempts: max_attempts.max(1),
            base_delay,
            ..RetryPolicy::default()
        };
        self
    }

    /// Require authentication: the card declares `security`'s schemes (API key in the
    /// `X-API-Key` header, bearer token) and requires one of them; every request except the
    /// public card must carry credentials that the runtime's
    /// [`AuthService::authenticate`](keel_runtime::AuthService::authenticate) accepts, and
    /// runs as the tenant they prove. Others are answered HTTP 401 with `WWW-Authenticate`.
    #[must_use]
    pub fn with_security(mut self, security: Security) -> Self {
        self.security = Some(security);
        self
    }

    /// Offer an extended card (A2A `GetExtendedAgentCard`) to authenticated callers: the
    /// public card then says `extendedAgentCard: true`. The served extended card lists the
    /// same interfaces and security as the public one.
    #[must_use]
    pub fn with_extended_card(mut self, card: AgentCard) -> Self {
        self.extended_card = Some(card);
        self
    }

    /// How long the public card may be cached (`Cache-Control: public, max-age=<seconds>`;
    /// [`DEFAULT_CARD_MAX_AGE`] unless set).
    #[must_use]
    pub fn with_card_max_age(mut self, seconds: u64) -> Self {
        self.card_max_age = seconds;
        self
    }

    /// The base URL that clients use to reach this server (e.g. behind a proxy). Without it,
    /// [`A2aServer::serve`] uses `http://<bound address>`.
    #[must_use]
    pub fn with_public_url(mut self, url: impl Into<String>) -> Self {
        self.public_url = Some(url.into());
        self
    }

    /// The largest request body accepted, in bytes ([`DEFAULT_BODY_LIMIT`] unless set). A
    /// larger body is answered with a JSON-RPC invalid-request error.
    #[must_use]
    pub fn with_body_limit(mut self, bytes: usize) -> Self {
        self.body_limit = bytes;
        self
    }

    /// The executor behind the server.
    pub fn executor(&self) -> &AgentExecutor {
        &self.executor
    }

    /// The card as served: the agent's card listing, in order of preference, JSON-RPC 1.0 at
    /// `<public_base_url>/`, HTTP+JSON 1.0 at `<public_base_url>`, gRPC 1.0 at its host and
    /// port (with the `grpc` feature), and JSON-RPC 0.3 at
    /// `<public_base_url>/`; streaming on, push notifications off.
    fn served_card(&self, public_base_url: &str) -> Value {
        self.serve_card(self.executor.agent().card().clone(), public_base_url)
    }

    fn serve_card(&self, mut card: AgentCard, public_base_url: &str) -> Value {
        let base = public_base_url.trim_end_matches('/');
        card.url = format!("{base}/");
        card.protocol_version = wire::PROTOCOL_VERSION.into();
        card.capabilities.streaming = true;
        card.capabilities.push_notifications = true;
        let mut interfaces = vec![
            Interface {
                url: format!("{base}/"),
                binding: Binding::JsonRpc,
                protocol_version: wire::PROTOCOL_VERSION.into(),
            },
            Interface {
                url: base.to_owned(),
                binding: Binding::HttpJson,
                protocol_version: wire::PROTOCOL_VERSION.into(),
            },
            Interface {
                url: format!("{base}/"),
                binding: Binding::JsonRpc,
                protocol_version: compat_v03::PROTOCOL_VERSION.into(),
            },
        ];
        // gRPC comes third: after the HTTP bindings, before the older protocol.
        if let Some(grpc) = grpc_interface(base) {
            interfaces.insert(2, grpc);
        }
        let requirements = self.security.map(|security| security.declare(&mut card));
        let mut json = wire::encode_card_with(&card, &interfaces);
        if let Some(requirements) = requirements {
            json["securityRequirements"] = requirements;
        }
        if self.extended_card.is_some() {
            json["capabilities"]["extendedAgentCard"] = Value::Bool(true);
        }
        json
    }

    /// The axum router, advertising `public_base_url` in the card. Use it to mount the agent
    /// in a larger application; [`A2aServer::serve`] is the all-in-one alternative (it also
    /// ends open streams when it shuts down).
    pub fn router(&self, public_base_url: impl Into<String>) -> Router {
        // Never closing: streams end when their task rests or their client goes away; push
        // deliveries go on as long as the process does.
        let (_closing, closed) = watch::channel(false);
        let (_stop, stopped) = watch::channel(false);
        self.router_with(&public_base_url.into(), closed, stopped)
    }

    pub(crate) fn router_with(
        &self,
        public_base_url: &str,
        closing: watch::Receiver<bool>,
        stopped: watch::Receiver<bool>,
    ) -> Router {
        let handlers = self.handlers(public_base_url, closing, stopped);
        let agents = vec![crate::operator::OperatorAgent::new(
            self.executor.agent().card().name.clone(),
            format!("{}/", public_base_url.trim_end_matches('/')),
            handlers.clone(),
        )];
        self.router_from(public_base_url, handlers, agents)
    }

    /// The A2A operations over this server's executor (and its push deliverer, which takes
    /// up the deliveries a previous process left pending).
    pub(crate) fn handlers(
        &self,
        public_base_url: &str,
        closing: watch::Receiver<bool>,
        stopped: watch::Receiver<bool>,
    ) -> Handlers {
        let push = Push::new(
            self.executor.clone(),
            self.push_targets.clone(),
            self.push_retry,
            stopped,
        );
        // Deliveries that a previous process left pending go on from their cursors.
        push.resume();
        let extended_card = self
            .extended_card
            .clone()
            .map(|extended| self.serve_card(extended, public_base_url));
        Handlers::new(
            self.executor.clone(),
            closing,
            self.security,
            extended_card,
            push,
            Arc::new(Admission::new(self.limits)),
        )
    }

    /// The router over `handlers`; the operator API lists `operator_agents` (the default
    /// first) and sends messages to them.
    pub(crate) fn router_from(
        &self,
        public_base_url: &str,
        handlers: Handlers,
        operator_agents: Vec<crate::operator::OperatorAgent>,
    ) -> Router {
        let card = self.served_card(public_base_url);
        let socket = crate::ws::router(handlers.clone(), self.body_limit);
        #[cfg(feature = "grpc")]
        let grpc_routes = crate::grpc::router(handlers.clone(), self.body_limit);
        #[cfg(not(feature = "grpc"))]
        let grpc_routes = Router::new();
        let state = Arc::new(ServerState {
            handlers,
            card_v03: ServedCard::new(compat_v03::card_from_v1(card.clone())),
            card: ServedCard::new(card),
            card_cache_control: format!("public, max-age={}", self.card_max_age),
            card_last_modified: chrono::Utc::now()
                .format("%a, %d %b %Y %H:%M:%S GMT")
                .to_string(),
        });
        let root = match self.console {
            Some(_) => post(json_rpc).get(to_console),
            None => post(json_rpc),
        };
        let router = Router::new()
            .route(AGENT_CARD_PATH, get(agent_card))
            .route(LEGACY_AGENT_CARD_PATH, get(legacy_agent_card))
            .route("/", root)
            .fallback(rest_binding)
            .layer(DefaultBodyLimit::max(self.body_limit))
            .with_state(state)
            .merge(socket)
            .merge(crate::callbacks::router(self.executor.clone()))
            .merge(grpc_routes)
            .merge(crate::variables::router(
                self.executor.clone(),
                self.security,
            ))
            .merge(crate::operator::router(
                &self.executor,
                self.security,
                operator_agents,
            ))
            .merge(crate::threads::router(self.executor.clone(), self.security))
            .merge(self.console.clone().unwrap_or_default());
        let router = self.mounted.iter().fold(router, |router, (path, service)| {
            let service = crate::security::behind_credentials(
                service.clone(),
                self.executor.reads(),
                self.security,
            );
            router.nest_service(path, service)
        });
        match crate::endpoint::router(
            self.executor.clone(),
            self.security,
            &self.endpoints,
            self.body_limit,
        ) {
            Some(endpoints) => router.merge(endpoints),
            None => router,
        }
    }

    /// Serve on `listener` until `shutdown` completes, under the connection deadlines and
    /// cap of [`A2aServer::with_connection_limits`].
    ///
    /// The public URL is [`A2aServer::with_public_url`]'s, or `http://<listener address>`.
    /// When `shutdown` fires, the server stops accepting connections and hands its work on
    /// ([`AgentExecutor::shutdown`]: running tasks stop at their next step, within the
    /// executor's drain timeout, and stay unfinished, not canceled, for a replica or the
    /// restarted server to resume at once). Then blocked `SendMessage` calls answer with their
    /// task as it stands, and open streams send what the task's log holds and end; a stream
    /// whose task is not at rest ends with a status update, not final, saying the server is
    /// going away (status message `status_kind: server_going_away`). This returns once the
    /// open requests are answered.
    pub async fn serve(
        self,
        listener: tokio::net::TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        let address = listener.local_addr()?;
        let base_url = self
            .public_url
            .clone()
            .unwrap_or_else(|| format!("http://{address}"));
        let (closing, closed) = watch::channel(false);
        let (stop_push, push_stopped) = watch::channel(false);
        let router = self.router_with(&base_url, closed, push_stopped);
        let router = crate::observability::observed(router, self.metrics.as_ref());
        let executor = self.executor.clone();
        let signal = {
            let executor = executor.clone();
            async move {
                shutdown.await;
                tracing::info!("A2A server shutting down; handing running tasks on");
                // Hand the runs on while connections drain, so that blocking requests can
                // finish; then let open streams read their logs one last time and end.
                tokio::spawn(async move {
                    executor.shutdown().await;
                    let _ = closing.send(true);
                });
            }
        };
        tracing::info!(%address, %base_url, "A2A server listening");
        // Answers and stream events are small writes: without TCP_NODELAY, Nagle's algorithm
        // holds each one back until the client's delayed ACK (about 40 ms) arrives.
        let listener = listener.tap_io(|stream| {
            // A socket that refuses the option still serves, only slower.
            let _ = stream.set_nodelay(true);
        });
        let served = crate::conn::serve(listener, router, self.connections, signal).await;
        // Runs started by requests that raced the signal are handed on too.
        executor.shutdown().await;
        // Push deliveries stop where they are; their cursors are persisted, and the next
        // server on the same store delivers the rest.
        let _ = stop_push.send(true);
        served
    }
}

/// The card's gRPC interface, for an agent served at the root of `base` (with the `grpc`
/// feature). gRPC has no path prefix (its paths are `/<service>/<method>`), so an agent under
/// a path, such as `/agents/{name}/`, lists none. A2A writes a plaintext gRPC address without
/// `http://` (a channel's target is `host:port`) and keeps `https://` to say TLS.
#[cfg(feature = "grpc")]
fn grpc_interface(base: &str) -> Option<Interface> {
    let (scheme, authority) = base.split_once("://")?;
    if authority.is_empty() || authority.contains('/') {
        return None;
    }
    Some(Interface {
        url: if scheme.eq_ignore_ascii_case("http") {
            authority.to_owned()
        } else {
            base.to_owned()
        },
        binding: Binding::Grpc,
        protocol_version: wire::PROTOCOL_VERSION.into(),
    })
}

/// Without the `grpc` feature, no gRPC interface.
#[cfg(not(feature = "grpc"))]
fn grpc_interface(_base: &str) -> Option<Interface> {
    None
}

/// The public card at [`AGENT_CARD_PATH`]: to a caller that names A2A 1.0 (header or query
/// parameter, as for `POST /`), the v1.0 card with nothing but the proto's fields (so strict
/// protobuf JSON parsing reads it); to one that names 0.3 or no version (0.3 by v1.0.1,
/// 3.6.2, as on every binding), the v0.3 form ([`compat_v03::card_from_v1`]), which A2A 0.3
/// clients need and lenient v1.0 readers read too; a version this server does not speak gets
/// the v1.0 card.
async fn agent_card(
    state: State<Arc<ServerState>>,
    headers: HeaderMap,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> Response {
    serve_card(state, headers, query, false)
}

/// The card at [`LEGACY_AGENT_CARD_PATH`]: the v0.3 form, unless the caller names A2A 1.0.
async fn legacy_agent_card(
    state: State<Arc<ServerState>>,
    headers: HeaderMap,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> Response {
    serve_card(state, headers, query, true)
}

/// A card with `Cache-Control`, `Last-Modified` and an `ETag`; `If-None-Match` naming the
/// current tag (or `*`) is answered 304 with no body. The form follows the version the caller
/// names (`Vary: A2A-Version`): 1.0 the v1.0 card, 0.3 or none the v0.3 form, one this server
/// does not speak the path's own (`legacy`: v0.3).
fn serve_card(
    State(state): State<Arc<ServerState>>,
    headers: HeaderMap,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
    legacy: bool,
) -> Response {
    let query = query.map(|Query(q)| q).unwrap_or_default();
    let v03 = match requested_version(&headers, &query) {
        Ok(Some(Version::V1)) => false,
        Ok(Some(Version::V03) | None) => true,
        Err(_) => legacy,
    };
    let card = if v03 { &state.card_v03 } else { &state.card };
    let fresh = headers
        .get_all(header::IF_NONE_MATCH)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|tag| tag.trim().trim_start_matches("W/"))
        .any(|tag| tag == "*" || tag == card.etag);
    let mut response = if fresh {
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        Json(card.json.clone()).into_response()
    };
    let headers = response.headers_mut();
    if let Ok(value) = HeaderValue::from_str(&card.etag) {
        headers.insert(header::ETAG, value);
    }
    headers.insert(header::VARY, HeaderValue::from_static(VERSION_HEADER));
    if let Ok(value) = HeaderValue::from_str(&state.card_last_modified) {
        headers.insert(header::LAST_MODIFIED, value);
    }
    if let Ok(value) = HeaderValue::from_str(&state.card_cache_control) {
        headers.insert(header::CACHE_CONTROL, value);
    }
    response
}

/// A strong entity tag for a JSON value: FNV-1a (64 bits) of its serialization, quoted. The
/// same card gives the same tag in every process and release, so replicas agree.
fn etag(value: &Value) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in value.to_string().bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    format!("\"{hash:016x}\"")
}

fn answer(body: impl serde::Serialize) -> Response {
    (StatusCode::OK, Json(body)).into_response()
}

/// `response` with `Retry-After` when an error said when to try again: JSON-RPC errors are
/// HTTP 200, so the header is how an HTTP client or proxy learns to back off, as a 429 or 503
/// of the HTTP+JSON binding tells it.
fn with_retry_after(mut response: Response, seconds: Option<u64>) -> Response {
    if let Some(seconds) = seconds {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
    }
    response
}

fn answer_error(id: Value, error: &RpcError) -> Response {
    answer(jsonrpc::failure(id, error))
}

/// `GET /` with a console: a browser (it asks for `text/html`) is sent to the console; any
/// other caller gets the `405` that `/`, the JSON-RPC binding, answers every `GET`.
async fn to_console(headers: HeaderMap) -> Response {
    let wants_html = headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .any(|accept| accept.contains("text/html"));
    if wants_html {
        // Relative, so that a proxy's path prefix stays in the browser's URL.
        return (
            StatusCode::SEE_OTHER,
            [(header::LOCATION, HeaderValue::from_static("console/"))],
        )
            .into_response();
    }
    (
        StatusCode::METHOD_NOT_ALLOWED,
        [(header::ALLOW, HeaderValue::from_static("POST"))],
    )
        .into_response()
}

async fn json_rpc(
    State(state): State<Arc<ServerState>>,
    headers: HeaderMap,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let body = match body {
        Ok(body) => body,
        Err(rejection) => {
            tracing::debug!(%rejection, "request body rejected");
            let message = if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
                "request body too large"
            } else {
                "request body could not be read"
            };
            return answer_error(Value::Null, &RpcError::new(INVALID_REQUEST, message));
        }
    };
    if let Err(error) = jsonrpc::require_json_body(&headers) {
        let mut response = answer_error(Value::Null, &error);
        *response.status_mut() = StatusCode::UNSUPPORTED_MEDIA_TYPE;
        return response;
    }
    let request: Value = match serde_json::from_slice(&body) {
        Ok(request) => request,
        Err(err) => {
            return answer_error(
                Value::Null,
                &RpcError::new(PARSE_ERROR, format!("parse error: {err}")),
            )
        }
    };
    let query = query.map(|Query(q)| q).unwrap_or_default();
    match request {
        // JSON-RPC 2.0 batch: one answer entry per request that has an id, in any order (this
        // server keeps the request order); none at all is no body. The requests run
        // concurrently, for the one tenant that the HTTP request's credentials prove.
        Value::Array(requests) => {
            if requests.is_empty() {
                return answer_error(
                    Value::Null,
                    &RpcError::new(INVALID_REQUEST, "a batch must hold at least one request"),
                );
            }
            // Refused whole and before any of it runs: a batch's requests run at once, so a
            // huge one would hold the server for everyone else.
            let max = state.handlers.limits().max_batch_requests;
            if requests.len() > max {
                return answer_error(
                    Value::Null,
                    &RpcError::new(
                        INVALID_REQUEST,
                        format!(
                            "a batch holds {} requests; this server accepts at most {max}",
                            requests.len()
                        ),
                    )
                    .with("maxBatchRequests", max.to_string()),
                );
            }
            let auth = match state.handlers.caller(&headers, None, true) {
                Ok(auth) => auth,
                Err(denied) => return *denied,
            };
            let calls = requests
                .into_iter()
                .map(|request| call(&state.handlers, &headers, &query, &auth, request, true));
            let mut retry_after = None;
            let answers: Vec<_> = futures::future::join_all(calls)
                .await
                .into_iter()
                .filter_map(|outcome| match outcome {
                    Outcome::Answer(answer) => Some(answer),
                    Outcome::Failed {
                        answer,
                        retry_after: after,
                    } => {
                        retry_after = retry_after.max(after);
                        Some(answer)
                    }
                    Outcome::Silent | Outcome::Stream { .. } => None,
                })
                .collect();
            if answers.is_empty() {
                StatusCode::NO_CONTENT.into_response()
            } else {
                with_retry_after(answer(answers), retry_after)
            }
        }
        request => {
            let tenant = request
                .get("params")
                .and_then(|p| p.get("tenant"))
                .and_then(Value::as_str)
                .map(str::to_owned);
            let auth = match state.handlers.caller(&headers, tenant, true) {
                Ok(auth) => auth,
                Err(denied) => return *denied,
            };
            match call(&state.handlers, &headers, &query, &auth, request, false).await {
                Outcome::Silent => StatusCode::NO_CONTENT.into_response(),
                Outcome::Answer(body) => answer(body),
                Outcome::Failed {
                    answer: body,
                    retry_after,
                } => with_retry_after(answer(body), retry_after),
                Outcome::Stream {
                    id,
                    protocol,
                    events,
                } => sse(events.map(move |item| sse_json(&stream_envelope(&id, protocol, item)))),
            }
        }
    }
}

async fn rest_binding(
    State(state): State<Arc<ServerState>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let request = rest::RestRequest {
        method,
        path: uri.path().to_owned(),
        query: query.map(|Query(q)| q),
        headers,
        body,
    };
    rest::handle(&state.handlers, request).await
}

#[cfg(all(test, feature = "grpc"))]
mod grpc_interface_tests {
    use super::grpc_interface;

    #[test]
    fn only_an_agent_at_the_root_lists_grpc_and_tls_keeps_its_scheme() {
        let url = |base: &str| grpc_interface(base).map(|i| i.url);
        assert_eq!(
            url("http://127.0.0.1:8080").as_deref(),
            Some("127.0.0.1:8080")
        );
        assert_eq!(
            url("https://agents.example.com").as_deref(),
            Some("https://agents.example.com")
        );
        assert_eq!(url("http://127.0.0.1:8080/agents/beta"), None);
        assert_eq!(url("https://example.com/a2a"), None);
    }
}
