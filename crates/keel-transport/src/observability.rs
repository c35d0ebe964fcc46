//! What a server tells its operator about each HTTP request: a count and a latency histogram
//! by route and status (through the `metrics` macros, which cost nothing until the process
//! installs a recorder) and one `info` log line (target `keel::http`) with the method,
//! route, status, duration, tenant and task id. Also the optional `/metrics` route that
//! renders the recorder the process installed (docs/observability.md).

use std::sync::{Arc, Mutex};
use std::time::Instant;

use axum::extract::Request;
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use keel_core::TraceParent;
use keel_runtime::AuthContext;
use serde_json::Value;

/// HTTP requests answered, by `method`, `route` and `status`.
pub const HTTP_REQUESTS: &str = "keel_http_requests_total";
/// How long requests took until their response's head, by `method` and `route`.
pub const HTTP_REQUEST_SECONDS: &str = "keel_http_request_duration_seconds";
/// Push notifications that ended, by `outcome`: `delivered`, or `failed` (every attempt
/// failed or the webhook refused it).
pub const PUSH_DELIVERIES: &str = "keel_push_deliveries_total";
/// Server-Sent Events streams open now (`message:stream`, `tasks/resubscribe`, ...).
pub const SSE_SUBSCRIBERS: &str = "keel_sse_subscribers";

/// A push notification ended, `delivered` or not.
pub(crate) fn push_delivered(delivered: bool) {
    if keel_agent::meter::enabled() {
        let outcome = if delivered { "delivered" } else { "failed" };
        metrics::counter!(PUSH_DELIVERIES, "outcome" => outcome).increment(1);
    }
}

/// An open SSE stream, counted in [`SSE_SUBSCRIBERS`] until it is dropped (its client went
/// away or it ended).
pub(crate) struct SseSubscriber(bool);

impl SseSubscriber {
    /// A stream opens.
    pub(crate) fn open() -> Self {
        let counted = keel_agent::meter::enabled();
        if counted {
            metrics::gauge!(SSE_SUBSCRIBERS).increment(1.0);
        }
        Self(counted)
    }
}

impl Drop for SseSubscriber {
    fn drop(&mut self) {
        if self.0 {
            metrics::gauge!(SSE_SUBSCRIBERS).decrement(1.0);
        }
    }
}

/// The path the metrics route is served at.
pub const METRICS_PATH: &str = "/metrics";

/// The `/metrics` route: `render` writes the process's metrics in the Prometheus text
/// format (the process installed the recorder; this crate only calls the `metrics` macros).
#[derive(Clone)]
pub struct MetricsRoute {
    render: Arc<dyn Fn() -> String + Send + Sync>,
    bearer: Option<Arc<str>>,
}

impl MetricsRoute {
    /// Serve what `render` writes.
    pub fn new(render: impl Fn() -> String + Send + Sync + 'static) -> Self {
        Self {
            render: Arc::new(render),
            bearer: None,
        }
    }

    /// Answer only requests that carry `Authorization: Bearer {token}` (others get 401).
    #[must_use]
    pub fn with_bearer_token(mut self, token: impl Into<String>) -> Self {
        self.bearer = Some(Arc::from(token.into()));
        self
    }

    fn router(self) -> Router {
        Router::new().route(
            METRICS_PATH,
            get(move |headers: HeaderMap| async move { self.answer(&headers) }),
        )
    }

    fn answer(&self, headers: &HeaderMap) -> Response {
        if let Some(expected) = &self.bearer {
            let given = headers
                .get(header::AUTHORIZATION)
                .and_then(|value| value.to_str().ok())
                .and_then(|value| value.strip_prefix("Bearer "));
            if !given.is_some_and(|given| same_secret(given.as_bytes(), expected.as_bytes())) {
                return (
                    StatusCode::UNAUTHORIZED,
                    [(header::WWW_AUTHENTICATE, "Bearer")],
                    "a bearer token is required for the metrics",
                )
                    .into_response();
            }
        }
        (
            [(
                header::CONTENT_TYPE,
                "text/plain; version=0.0.4; charset=utf-8",
            )],
            (self.render)(),
        )
            .into_response()
    }
}

impl std::fmt::Debug for MetricsRoute {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The token is a secret: only whether there is one.
        f.debug_struct("MetricsRoute")
            .field("bearer", &self.bearer.is_some())
            .finish_non_exhaustive()
    }
}

/// Whether two secrets are equal, in a time that depends only on their lengths (a caller
/// cannot find the token a byte at a time by timing the answers).
fn same_secret(given: &[u8], expected: &[u8]) -> bool {
    given.len() == expected.len()
        && given
            .iter()
            .zip(expected)
            .fold(0u8, |diff, (a, b)| diff | (a ^ b))
            == 0
}

/// What the handlers learn about a request as it runs, for its log line.
#[derive(Default)]
struct Facts {
    tenant: Option<String>,
    task_id: Option<String>,
    operation: Option<String>,
    /// The caller's W3C trace (`traceparent`, `tracestate`), when it sent a valid one.
    caller_trace: Option<(TraceParent, Option<String>)>,
}

tokio::task_local! {
    /// The facts of the request being handled (handlers run inside the request's future).
    static FACTS: Arc<Mutex<Facts>>;
}

fn note(change: impl FnOnce(&mut Facts)) {
    // Outside a request (a handler called directly, as tests do) there is nothing to note.
    let _ = FACTS.try_with(|facts| change(&mut facts.lock().unwrap_or_else(|p| p.into_inner())));
}

/// The trace the caller of the request being handled sent (its `traceparent` and
/// `tracestate` headers, gRPC metadata included: they are HTTP/2 headers), if any: the run a
/// new task starts joins it.
pub(crate) fn caller_trace() -> Option<(TraceParent, Option<String>)> {
    FACTS
        .try_with(|facts| {
            facts
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .caller_trace
                .clone()
        })
        .ok()
        .flatten()
}

/// The request was authenticated as `auth`.
pub(crate) fn note_tenant(auth: &AuthContext) {
    note(|facts| facts.tenant = Some(format!("{}/{}", auth.app_name, auth.user_name)));
}

/// A JSON-RPC call of `method` with `params`: the operation, and the task it names if any.
pub(crate) fn note_call(method: &str, params: &Value) {
    let task_id = task_named(params);
    note(|facts| {
        facts.operation = Some(method.to_owned());
        facts.task_id = task_id.map(str::to_owned);
    });
}

/// The task a JSON-RPC call's params name: `id` (GetTask, CancelTask), `taskId`, or the
/// message's `taskId` (`task_id` as proto3 JSON also allows). The fields are looked up
/// directly: a JSON pointer splits and unescapes its path, allocating, on every request.
fn task_named(params: &Value) -> Option<&str> {
    let message = params.get("message");
    [
        params.get("id"),
        params.get("taskId"),
        message.and_then(|m| m.get("taskId")),
        message.and_then(|m| m.get("task_id")),
    ]
    .into_iter()
    .find_map(|field| field.and_then(Value::as_str))
}

/// `router` with every request counted, timed and logged, and `/metrics` when `metrics` is
/// given.
pub(crate) fn observed(router: Router, metrics: Option<&MetricsRoute>) -> Router {
    let router = match metrics {
        Some(route) => route.clone().router().merge(router),
        None => router,
    };
    router.layer(axum::middleware::from_fn(observe))
}

async fn observe(request: Request, next: Next) -> Response {
    let started = Instant::now();
    let method = request.method().clone();
    let path = request.uri().path().to_owned();
    // An invalid `traceparent` is ignored, as W3C Trace Context says: the run starts a trace.
    let caller_trace = caller_trace_of(request.headers());
    let facts = Arc::new(Mutex::new(Facts {
        task_id: task_in_path(&path).map(str::to_owned),
        caller_trace,
        ..Facts::default()
    }));
    let response = FACTS.scope(facts.clone(), next.run(request)).await;
    let elapsed = started.elapsed();
    let status = response.status();
    let route = route_of(&path, status);
    // Labels are built only for a recorder the process installed (`keel serve --metrics`):
    // without one, `metrics` drops them after they cost a request a handful of strings.
    if keel_agent::meter::enabled() {
        metrics::counter!(
            HTTP_REQUESTS,
            "method" => method.to_string(),
            "route" => route.clone(),
            "status" => status.as_str().to_owned()
        )
        .increment(1);
        metrics::histogram!(HTTP_REQUEST_SECONDS, "method" => method.to_string(), "route" => route.clone())
            .record(elapsed.as_secs_f64());
    }
    let facts = facts.lock().unwrap_or_else(|p| p.into_inner());
    // One line per request: the path asked (a 404's route is only `unmatched`), and the
    // duration to the microsecond (a float's last digits are noise to a reader).
    tracing::info!(
        target: "keel::http",
        method = %method,
        path = %path,
        route = %route,
        status = status.as_u16(),
        duration_ms = (elapsed.as_secs_f64() * 1_000_000.0).round() / 1000.0,
        operation = facts.operation.as_deref(),
        tenant = facts.tenant.as_deref(),
        task_id = facts.task_id.as_deref(),
        "request"
    );
    response
}

/// The W3C trace a request's headers carry, if its `traceparent` is valid.
fn caller_trace_of(headers: &HeaderMap) -> Option<(TraceParent, Option<String>)> {
    let read = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let parent = TraceParent::parse(read(TraceParent::HEADER)?)?;
    Some((parent, read(TraceParent::STATE_HEADER).map(str::to_owned)))
}

/// The route label of a request: its path with each segment that looks like an id (it has a
/// digit, or is long) written `{id}`, so that the label's values stay few; a path that found
/// nothing is `unmatched` (arbitrary paths must not make new series).
fn route_of(path: &str, status: StatusCode) -> String {
    if status == StatusCode::NOT_FOUND || status == StatusCode::METHOD_NOT_ALLOWED {
        return "unmatched".to_owned();
    }
    if path == "/" {
        // JSON-RPC, every call of it: no segment to look at.
        return path.to_owned();
    }
    let segments: Vec<String> = path
        .split('/')
        .map(|segment| {
            // `/tasks/{id}:cancel`: the id goes, the verb stays.
            let (name, verb) = match segment.split_once(':') {
                Some((name, verb)) => (name, Some(verb)),
                None => (segment, None),
            };
            let name = if name.len() > 24 || name.bytes().any(|b| b.is_ascii_digit()) {
                "{id}"
            } else {
                name
            };
            match verb {
                Some(verb) => format!("{name}:{verb}"),
                None => name.to_owned(),
            }
        })
        .collect();
    segments.join("/")
}

/// The task a REST path names (`…/tasks/{id}…`).
fn task_in_path(path: &str) -> Option<&str> {
    let (_, rest) = path.split_once("/tasks/")?;
    let id = rest.split(['/', ':']).next()?;
    (!id.is_empty()).then_some(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_leave_the_route_label_and_unmatched_paths_share_one() {
        let ok = StatusCode::OK;
        assert_eq!(
            route_of("/tasks/0193a2b4-7c1d-7e2f-8a9b-0c1d2e3f4a5b:cancel", ok),
            "/tasks/{id}:cancel"
        );
        assert_eq!(
            route_of("/agents/support/message:send", ok),
            "/agents/support/message:send"
        );
        assert_eq!(route_of("/", ok), "/");
        assert_eq!(
            route_of("/anything/at/all", StatusCode::NOT_FOUND),
            "unmatched"
        );
    }

    #[test]
    fn a_rest_path_names_its_task() {
        assert_eq!(task_in_path("/tasks/t-1:cancel"), Some("t-1"));
        assert_eq!(
            task_in_path("/agents/a/tasks/t-2/pushNotificationConfigs"),
            Some("t-2")
        );
        assert_eq!(task_in_path("/message:send"), None);
    }

    #[test]
    fn a_call_names_its_task_by_id_task_id_or_its_message() {
        use serde_json::json;
        assert_eq!(task_named(&json!({"id": "t-1"})), Some("t-1"));
        assert_eq!(task_named(&json!({"taskId": "t-2"})), Some("t-2"));
        assert_eq!(
            task_named(&json!({"message": {"taskId": "t-3", "messageId": "m"}})),
            Some("t-3")
        );
        assert_eq!(
            task_named(&json!({"message": {"task_id": "t-4"}})),
            Some("t-4")
        );
        assert_eq!(
            task_named(&json!({"id": "t-5", "taskId": "t-6"})),
            Some("t-5")
        );
        assert_eq!(task_named(&json!({"message": {"messageId": "m"}})), None);
        assert_eq!(task_named(&json!({"id": 7})), None);
        assert_eq!(task_named(&json!(["t-8"])), None);
    }

    #[test]
    fn secrets_compare_whole() {
        assert!(same_secret(b"token", b"token"));
        assert!(!same_secret(b"token", b"tokem"));
        assert!(!same_secret(b"tok", b"token"));
    }
}
