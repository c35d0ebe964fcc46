//! The HTTP+JSON (REST) binding of A2A v1.0: the routes of the proto's `google.api.http`
//! options, each also under a `/{tenant}/` prefix, onto the same handlers as JSON-RPC.
//!
//! | route | operation |
//! |---|---|
//! | `POST /message:send` | SendMessage |
//! | `POST /message:stream` | SendStreamingMessage (SSE) |
//! | `GET /tasks/{id}` (`?historyLength=`) | GetTask |
//! | `GET /tasks` (`?contextId=&status=&pageSize=&pageToken=&historyLength=&statusTimestampAfter=&includeArtifacts=`) | ListTasks |
//! | `POST /tasks/{id}:cancel` | CancelTask |
//! | `GET /tasks/{id}:subscribe` (the proto), also `POST` (the SDKs) | SubscribeToTask (SSE) |
//! | `POST`/`GET /tasks/{id}/pushNotificationConfigs`, `GET`/`DELETE /tasks/{id}/pushNotificationConfigs/{configId}` | push config operations |
//! | `GET /extendedAgentCard` | GetExtendedAgentCard |
//!
//! Request bodies are `application/a2a+json` or `application/json` (a body without a content
//! type is read as JSON); query parameters use the camelCase JSON names (snake_case is
//! accepted), states by their enum names (`TASK_STATE_WORKING`) or short forms (`working`).
//! Answers are the response message's JSON (`application/a2a+json` when the request names that
//! type in `Content-Type` or `Accept`, else `application/json`); streams are SSE whose `data:` is a
//! `StreamResponse`. Errors are `google.rpc.Status` JSON (AIP-193,
//! [`RpcError::to_rest_json`]) with the HTTP status of [`rest_status`]; an error after a
//! stream has started is an SSE event named `error` carrying the same object. The tenant is
//! routed and passed to the runtime's auth service as a hint beside the request's credentials;
//! the auth service alone decides whose data the request sees. This binding speaks A2A 1.0 only: an
//! `A2A-Version: 0.3` request is VersionNotSupported, and so is a request without
//! `A2A-Version` (A2A 0.3 by v1.0.1, 3.6.2).

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures::StreamExt;
use percent_encoding::percent_decode_str;
use serde_json::{Map, Value};
use tracing::Instrument;

use crate::handlers::{Handlers, Operation, Reply};
use crate::jsonrpc::{rest_status, RpcError, INVALID_PARAMS, METHOD_NOT_FOUND, PARSE_ERROR};
use crate::sse::{sse, sse_json};
use crate::version::{requested_version, v1_only, Version};
use crate::wire::lower_camel;

/// A request that reached the REST binding.
pub(crate) struct RestRequest {
    pub method: Method,
    pub path: String,
    pub query: Result<Vec<(String, String)>, QueryRejection>,
    pub headers: HeaderMap,
    pub body: Result<Bytes, BytesRejection>,
}

/// Where a path leads.
#[derive(Debug, PartialEq, Eq)]
struct Route {
    operation: Operation,
    task_id: Option<String>,
    /// A push notification config's id.
    config_id: Option<String>,
    tenant: Option<String>,
}

/// The route of `method path`, trying the path without and then with a tenant prefix.
fn route(method: &Method, path: &str) -> Option<Route> {
    let segments: Vec<String> = path
        .trim_start_matches('/')
        .trim_end_matches('/')
        .split('/')
        .map(percent_decode)
        .collect();
    let segments: Vec<&str> = segments.iter().map(String::as_str).collect();
    if let Some((operation, task_id)) = route_segments(method, &segments) {
        return Some(Route {
            operation,
            task_id,
            config_id: config_id(&segments),
            tenant: None,
        });
    }
    match segments.split_first() {
        Some((tenant, rest)) if !tenant.is_empty() && !rest.is_empty() => {
            let (operation, task_id) = route_segments(method, rest)?;
            Some(Route {
                operation,
                task_id,
                config_id: config_id(rest),
                tenant: Some((*tenant).to_owned()),
            })
        }
        _ => None,
    }
}

/// The config id of `tasks/{id}/pushNotificationConfigs/{configId}`.
fn config_id(segments: &[&str]) -> Option<String> {
    match segments {
        ["tasks", _, "pushNotificationConfigs", config] => Some((*config).to_owned()),
        _ => None,
    }
}

fn route_segments(method: &Method, segments: &[&str]) -> Option<(Operation, Option<String>)> {
    let get = method == Method::GET;
    let post = method == Method::POST;
    let task = |id: &str| (!id.is_empty()).then(|| id.to_owned());
    Some(match segments {
        ["message:send"] if post => (Operation::SendMessage, None),
        ["message:stream"] if post => (Operation::SendStreamingMessage, None),
        ["tasks"] if get => (Operation::ListTasks, None),
        ["extendedAgentCard"] if get => (Operation::GetExtendedAgentCard, None),
        ["tasks", id_verb] => match id_verb.rsplit_once(':') {
            Some((id, "cancel")) if post => (Operation::CancelTask, Some(task(id)?)),
            Some((id, "subscribe")) if get || post => (Operation::SubscribeToTask, Some(task(id)?)),
            None if get => (Operation::GetTask, Some(task(id_verb)?)),
            _ => return None,
        },
        ["tasks", id, "pushNotificationConfigs"] if post => {
            (Operation::CreatePushConfig, Some(task(id)?))
        }
        ["tasks", id, "pushNotificationConfigs"] if get => {
            (Operation::ListPushConfigs, Some(task(id)?))
        }
        ["tasks", id, "pushNotificationConfigs", _] if get => {
            (Operation::GetPushConfig, Some(task(id)?))
        }
        ["tasks", id, "pushNotificationConfigs", _] if method == Method::DELETE => {
            (Operation::DeletePushConfig, Some(task(id)?))
        }
        _ => return None,
    })
}

fn percent_decode(segment: &str) -> String {
    percent_decode_str(segment).decode_utf8_lossy().into_owned()
}

fn invalid(field: &str, reason: impl std::fmt::Display) -> RpcError {
    RpcError::new(INVALID_PARAMS, format!("invalid {field}: {reason}"))
        .with("field", field)
        .with("description", reason.to_string())
}

/// A state given as `working` or `input-required`, as its enum name.
fn state_name(value: &str) -> String {
    if value.starts_with("TASK_STATE_") {
        value.to_owned()
    } else {
        format!(
            "TASK_STATE_{}",
            value.to_ascii_uppercase().replace('-', "_")
        )
    }
}

/// Query parameters as request JSON, typed by field.
fn query_params(query: &[(String, String)]) -> Result<Map<String, Value>, RpcError> {
    let mut params = Map::new();
    for (key, value) in query {
        let key = lower_camel(key);
        let value = match key.as_str() {
            "historyLength" | "pageSize" => Value::Number(
                value
                    .parse::<i64>()
                    .map_err(|_| invalid(&key, "must be an integer"))?
                    .into(),
            ),
            "includeArtifacts" => match value.as_str() {
                "true" | "1" => Value::Bool(true),
                "false" | "0" => Value::Bool(false),
                _ => return Err(invalid(&key, "must be true or false")),
            },
            "status" => Value::String(state_name(value)),
            "A2A-Version" | "a2a-version" => continue,
            _ => Value::String(value.clone()),
        };
        params.insert(key, value);
    }
    Ok(params)
}

/// The JSON body of a POST, as request JSON.
fn body_params(
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Map<String, Value>, RpcError> {
    let body = body.map_err(|rejection| {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            invalid("body", "request body too large")
        } else {
            invalid("body", "request body could not be read")
        }
    })?;
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(Map::new());
    }
    crate::jsonrpc::require_json_body(headers)?;
    match serde_json::from_slice::<Value>(&body) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err(invalid("body", "must be a JSON object")),
        Err(err) => Err(RpcError::new(PARSE_ERROR, format!("parse error: {err}"))),
    }
}

/// The HTTP+JSON answer to an error: its status, `Retry-After` when the error says when to
/// try again, and the `google.rpc.Status` body.
pub(crate) fn error_response(error: &RpcError) -> Response {
    let (status, _) = rest_status(error.code);
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut response = (status, Json(error.to_rest_json())).into_response();
    if let Some(seconds) = error.retry_after_seconds() {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, seconds.into());
    }
    response
}

/// A2A's media type for its JSON (v1.0.1, 11.1).
const A2A_JSON: &str = "application/a2a+json";

/// Answer one REST request. A JSON answer is `application/a2a+json` when the request asked
/// for it (its `Content-Type` or `Accept` names it), as A2A v1.0.1, 11.1 says, and plain
/// `application/json` otherwise, which every JSON client reads.
pub(crate) async fn handle(handlers: &Handlers, request: RestRequest) -> Response {
    let a2a_json = [header::CONTENT_TYPE, header::ACCEPT].iter().any(|name| {
        request
            .headers
            .get_all(name)
            .iter()
            .filter_map(|value| value.to_str().ok())
            .flat_map(|value| value.split(','))
            .any(|media| {
                media
                    .split(';')
                    .next()
                    .is_some_and(|essence| essence.trim().eq_ignore_ascii_case(A2A_JSON))
            })
    });
    let mut response = match answer(handlers, request).await {
        Ok(response) => response,
        Err(error) => error_response(&error),
    };
    let is_json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|value| value.as_bytes() == b"application/json");
    if a2a_json && is_json {
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            axum::http::HeaderValue::from_static(A2A_JSON),
        );
    }
    response
}

async fn answer(handlers: &Handlers, request: RestRequest) -> Result<Response, RpcError> {
    let query = request
        .query
        .map_err(|rejection| invalid("query", rejection))?;
    // A path that names no operation is not found whatever version the request names.
    let Some(route) = route(&request.method, &request.path) else {
        return Err(RpcError::new(
            METHOD_NOT_FOUND,
            format!("no A2A operation at {} {}", request.method, request.path),
        ));
    };
    match requested_version(&request.headers, &query)? {
        Some(Version::V1) => {}
        Some(Version::V03) => return Err(v1_only("HTTP+JSON", true)),
        None => return Err(v1_only("HTTP+JSON", false)),
    }
    let mut params = match route.operation {
        Operation::SendMessage
        | Operation::SendStreamingMessage
        | Operation::CancelTask
        | Operation::CreatePushConfig => body_params(&request.headers, request.body)?,
        _ => query_params(&query)?,
    };
    let auth = match handlers.caller(&request.headers, route.tenant.clone(), false) {
        Ok(auth) => auth,
        Err(denied) => return Ok(*denied),
    };
    match route.operation {
        // The push config messages name the task `taskId` and the config `id`.
        Operation::CreatePushConfig
        | Operation::GetPushConfig
        | Operation::ListPushConfigs
        | Operation::DeletePushConfig => {
            if let Some(task_id) = route.task_id {
                params.insert("taskId".into(), Value::String(task_id));
            }
            if let Some(config_id) = route.config_id {
                params.insert("id".into(), Value::String(config_id));
            }
        }
        _ => {
            if let Some(task_id) = route.task_id {
                params.insert("id".into(), Value::String(task_id));
            }
        }
    }
    if let Some(tenant) = route.tenant {
        params.insert("tenant".into(), Value::String(tenant));
    }
    let span = tracing::info_span!("a2a.request", binding = "rest", operation = ?route.operation, path = %request.path);
    let reply = handlers
        .handle(&auth, route.operation, Value::Object(params))
        .instrument(span)
        .await?;
    Ok(match reply {
        Reply::Unary(result) => (StatusCode::OK, Json(result)).into_response(),
        Reply::Stream(events) => sse(events.map(|item| match item {
            Ok(event) => sse_json(&event),
            Err(error) => sse_json(&error.to_rest_json()).event("error"),
        })),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(method: Method, path: &str) -> Option<(Operation, Option<String>, Option<String>)> {
        route(&method, path).map(|r| (r.operation, r.task_id, r.tenant))
    }

    #[test]
    fn proto_routes_match_with_and_without_a_tenant() {
        use Operation::*;
        for (tenant, prefix) in [(None, ""), (Some("acme".to_owned()), "/acme")] {
            let t = |id: &str| Some(id.to_owned());
            let cases = [
                (Method::POST, "/message:send", SendMessage, None),
                (Method::POST, "/message:stream", SendStreamingMessage, None),
                (Method::GET, "/tasks", ListTasks, None),
                (Method::GET, "/tasks/t-1", GetTask, t("t-1")),
                (Method::POST, "/tasks/t-1:cancel", CancelTask, t("t-1")),
                (
                    Method::GET,
                    "/tasks/t-1:subscribe",
                    SubscribeToTask,
                    t("t-1"),
                ),
                (
                    Method::POST,
                    "/tasks/t-1:subscribe",
                    SubscribeToTask,
                    t("t-1"),
                ),
                (
                    Method::GET,
                    "/extendedAgentCard",
                    GetExtendedAgentCard,
                    None,
                ),
                (
                    Method::POST,
                    "/tasks/t-1/pushNotificationConfigs",
                    CreatePushConfig,
                    t("t-1"),
                ),
                (
                    Method::GET,
                    "/tasks/t-1/pushNotificationConfigs",
                    ListPushConfigs,
                    t("t-1"),
                ),
                (
                    Method::GET,
                    "/tasks/t-1/pushNotificationConfigs/c",
                    GetPushConfig,
                    t("t-1"),
                ),
                (
                    Method::DELETE,
                    "/tasks/t-1/pushNotificationConfigs/c",
                    DeletePushConfig,
                    t("t-1"),
                ),
            ];
            for (method, path, operation, task) in cases {
                let path = format!("{prefix}{path}");
                assert_eq!(
                    op(method.clone(), &path),
                    Some((operation, task, tenant.clone())),
                    "{method} {path}"
                );
            }
        }
    }

    #[test]
    fn wrong_verbs_and_unknown_paths_do_not_route() {
        assert_eq!(op(Method::GET, "/message:send"), None);
        assert_eq!(op(Method::POST, "/tasks/t-1"), None);
        assert_eq!(op(Method::GET, "/tasks/t-1:cancel"), None);
        assert_eq!(op(Method::GET, "/nothing/here/at/all"), None);
        assert_eq!(op(Method::GET, "/tasks/:cancel"), None);
    }

    #[test]
    fn query_parameters_are_typed_and_camel_cased() {
        let query = vec![
            ("context_id".to_owned(), "c".to_owned()),
            ("pageSize".to_owned(), "5".to_owned()),
            ("includeArtifacts".to_owned(), "true".to_owned()),
            ("status".to_owned(), "input-required".to_owned()),
        ];
        let params = Value::Object(query_params(&query).unwrap());
        assert_eq!(
            params,
            serde_json::json!({"contextId": "c", "pageSize": 5, "includeArtifacts": true, "status": "TASK_STATE_INPUT_REQUIRED"})
        );
        let bad = vec![("historyLength".to_owned(), "x".to_owned())];
        assert_eq!(query_params(&bad).unwrap_err().code, INVALID_PARAMS);
        assert_eq!(percent_decode("a%2Fb%zz"), "a/b%zz");
    }
}
