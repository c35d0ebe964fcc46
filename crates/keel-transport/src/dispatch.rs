//! One JSON-RPC request of the A2A server, over HTTP (`POST /`) or a WebSocket frame: its
//! envelope checked, its protocol picked (v1.0, or v0.3 through `compat_v03`), and the
//! operation run through the handlers.

use axum::http::HeaderMap;
use keel_runtime::AuthContext;
use serde_json::Value;
use tracing::Instrument;

use crate::compat_v03;
use crate::handlers::{Handlers, Operation, Reply, ReplyStream};
use crate::jsonrpc::{
    self, encode, Encoded, RpcError, INTERNAL_ERROR, INVALID_REQUEST, METHOD_NOT_FOUND,
    UNSUPPORTED_OPERATION, VERSION_NOT_SUPPORTED,
};
use crate::version::{requested_version, Version};

/// One item of a JSON-RPC stream as the response object that carries it (request `id`).
pub(crate) fn stream_envelope(
    id: &Value,
    protocol: Version,
    item: Result<Value, RpcError>,
) -> Value {
    match item {
        Ok(event) => {
            let event = match protocol {
                Version::V1 => event,
                Version::V03 => compat_v03::stream_event_from_v1(event),
            };
            jsonrpc::success(id.clone(), event)
        }
        Err(error) => jsonrpc::failure(id.clone(), &error),
    }
}

/// What one JSON-RPC request comes to.
pub(crate) enum Outcome {
    /// A notification: no answer.
    Silent,
    /// A response object, as JSON text.
    Answer(Encoded),
    /// An error response object, as JSON text, and when to try again (seconds) when the error
    /// says so: HTTP answers it with `Retry-After`, as the other bindings do.
    Failed {
        answer: Encoded,
        retry_after: Option<u64>,
    },
    /// A stream of results for request `id`.
    Stream {
        id: Value,
        protocol: Version,
        events: ReplyStream,
    },
}

/// Decode, run and answer one JSON-RPC request. In a batch, streaming methods are answered
/// UnsupportedOperation without running: a batch answers with one JSON array, which has no
/// room for a stream.
pub(crate) async fn call(
    handlers: &Handlers,
    headers: &HeaderMap,
    query: &[(String, String)],
    auth: &AuthContext,
    request: Value,
    in_batch: bool,
) -> Outcome {
    let failure = |id: Value, error: RpcError| Outcome::Failed {
        answer: encode(&jsonrpc::failure(id, &error)),
        retry_after: error.retry_after_seconds(),
    };
    let Value::Object(mut request) = request else {
        return failure(
            Value::Null,
            RpcError::new(INVALID_REQUEST, "a request must be a JSON object"),
        );
    };

    // A request without `id` is a notification: processed, answered with nothing.
    let id = match request.remove("id") {
        None => None,
        Some(id @ (Value::String(_) | Value::Number(_) | Value::Null)) => Some(id),
        Some(_) => {
            return failure(
                Value::Null,
                RpcError::new(INVALID_REQUEST, "id must be a string, a number or null"),
            )
        }
    };
    let reply_id = id.clone().unwrap_or(Value::Null);
    if request.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return failure(
            reply_id,
            RpcError::new(INVALID_REQUEST, "jsonrpc must be \"2.0\""),
        );
    }
    let Some(Value::String(method)) = request.remove("method") else {
        return failure(
            reply_id,
            RpcError::new(INVALID_REQUEST, "method must be a string"),
        );
    };
    let version = match requested_version(headers, query) {
        Ok(version) => version,
        Err(error) => return failure(reply_id, error),
    };
    let v03 = || compat_v03::operation(&method).map(|op| (op, Version::V03));
    let v1 = || Operation::from_method(&method).map(|op| (op, Version::V1));
    let resolved = match version {
        Some(Version::V1) => v1(),
        Some(Version::V03) => v03(),
        // A request without a version is A2A 0.3 (the spec says so): a v1.0 method name without
        // `A2A-Version: 1.0` is a version this request did not name, not a v1.0 call.
        None => match (v03(), v1()) {
            (Some(resolved), _) => Some(resolved),
            (None, Some(_)) => {
                return failure(
                    reply_id,
                    RpcError::new(
                        VERSION_NOT_SUPPORTED,
                        format!("{method} is an A2A 1.0 method, and a request that names no A2A-Version (or an empty one) is A2A 0.3; send `A2A-Version: 1.0`"),
                    )
                    .with("supportedVersions", "1.0, 0.3"),
                )
            }
            (None, None) => None,
        },
    };
    let Some((operation, protocol)) = resolved else {
        return failure(
            reply_id,
            RpcError::new(METHOD_NOT_FOUND, format!("method not found: {method}")),
        );
    };
    if in_batch && operation.is_streaming() {
        return match id {
            None => Outcome::Silent,
            Some(id) => failure(
                id,
                RpcError::new(
                    UNSUPPORTED_OPERATION,
                    format!("{method} streams its answer and cannot be part of a batch"),
                ),
            ),
        };
    }
    let params = request.remove("params").unwrap_or(Value::Null);
    crate::observability::note_call(&method, &params);
    let params = match protocol {
        Version::V1 => Ok(params),
        Version::V03 => compat_v03::params_to_v1(operation, params),
    };

    let span =
        tracing::info_span!("a2a.request", binding = "jsonrpc", method = %method, id = %reply_id);
    let outcome = match params {
        Ok(params) => {
            handlers
                .handle(auth, operation, params)
                .instrument(span)
                .await
        }
        Err(error) => Err(error),
    };
    let Some(id) = id else {
        return Outcome::Silent;
    };
    match outcome {
        Err(error) => failure(id, error),
        Ok(Reply::Unary(result)) => {
            let result = match protocol {
                Version::V1 => result,
                // The older protocol's rewrite works on a tree; only its callers pay for one.
                Version::V03 => match serde_json::from_str(result.get()) {
                    Ok(v1) => encode(&compat_v03::result_from_v1(operation, v1)),
                    Err(_) => return failure(id, RpcError::new(INTERNAL_ERROR, "internal error")),
                },
            };
            Outcome::Answer(jsonrpc::success_encoded(&id, &result))
        }
        Ok(Reply::Stream(events)) => Outcome::Stream {
            id,
            protocol,
            events,
        },
    }
}
