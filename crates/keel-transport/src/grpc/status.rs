//! A2A errors as gRPC statuses: the code A2A v1.0 assigns (section 5.4, the same
//! `google.rpc.Code` the HTTP+JSON binding names in its error bodies), the message, and the
//! `google.rpc.ErrorInfo` (reason, domain, metadata) in the status details, with a
//! `google.rpc.RetryInfo` for the errors that say when to try again.

use std::collections::HashMap;
use std::time::Duration;

use serde_json::Value;
use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};

use crate::jsonrpc::{reason, rest_status, RpcError, ERROR_DOMAIN};

/// The gRPC code of a `google.rpc.Code` name.
fn code(name: &str) -> Code {
    match name {
        "INVALID_ARGUMENT" => Code::InvalidArgument,
        "NOT_FOUND" => Code::NotFound,
        "FAILED_PRECONDITION" => Code::FailedPrecondition,
        "UNIMPLEMENTED" => Code::Unimplemented,
        "UNAVAILABLE" => Code::Unavailable,
        "RESOURCE_EXHAUSTED" => Code::ResourceExhausted,
        "ABORTED" => Code::Aborted,
        "UNAUTHENTICATED" => Code::Unauthenticated,
        _ => Code::Internal,
    }
}

/// The status that answers `error`.
pub(crate) fn status(error: &RpcError) -> Status {
    let (_, name) = rest_status(error.code);
    let metadata: HashMap<String, String> = error
        .metadata
        .iter()
        .map(|(key, value)| {
            let value = match value {
                Value::String(text) => text.clone(),
                other => other.to_string(),
            };
            (key.clone(), value)
        })
        .collect();
    let mut details = ErrorDetails::with_error_info(reason(error.code), ERROR_DOMAIN, metadata);
    if let Some(seconds) = error.retry_after_seconds() {
        details.set_retry_info(Some(Duration::from_secs(seconds)));
    }
    Status::with_error_details(code(name), error.message.clone(), details)
}

/// tonic's message for a request message over the size limit (it answers OUT_OF_RANGE).
const TOO_LARGE: &str = "Error, decoded message length too large";
/// prost's message for bytes that are not the request message, or nest too deep (tonic
/// answers INTERNAL).
const UNDECODABLE: &str = "failed to decode Protobuf message";

/// A response of the generated service with the request's faults named as the caller's:
/// tonic answers an undecodable or too deeply nested request message with INTERNAL and an
/// oversized one with OUT_OF_RANGE, before any handler runs. The caller sent a bad request:
/// INVALID_ARGUMENT, and RESOURCE_EXHAUSTED for a message over the limit (as gRPC's own
/// servers answer it), so that a client does not retry a request that can never succeed as
/// if the server had failed.
pub(crate) fn request_status<B>(mut response: axum::http::Response<B>) -> axum::http::Response<B> {
    let headers = response.headers();
    let Some(message) = headers
        .get("grpc-message")
        .and_then(|value| value.to_str().ok())
        .map(|value| percent_encoding::percent_decode_str(value).decode_utf8_lossy())
    else {
        return response;
    };
    let code = match headers.get("grpc-status").map(|value| value.as_bytes()) {
        Some(b"13") if message.starts_with(UNDECODABLE) => Code::InvalidArgument,
        Some(b"11") if message.starts_with(TOO_LARGE) => Code::ResourceExhausted,
        _ => return response,
    };
    response
        .headers_mut()
        .insert("grpc-status", axum::http::HeaderValue::from(code as i32));
    response
}

/// The status for a request without acceptable credentials.
pub(crate) fn unauthenticated(reason: &str) -> Status {
    Status::unauthenticated(format!("authentication required: {reason}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::jsonrpc::{
        INTERNAL_ERROR, INVALID_PARAMS, OVERLOADED, TASK_NOT_CANCELABLE, TASK_NOT_FOUND,
        UNSUPPORTED_OPERATION, VERSION_NOT_SUPPORTED,
    };

    #[test]
    fn a2a_errors_take_the_codes_the_spec_assigns() {
        for (error, expected) in [
            (TASK_NOT_FOUND, Code::NotFound),
            (TASK_NOT_CANCELABLE, Code::FailedPrecondition),
            (UNSUPPORTED_OPERATION, Code::FailedPrecondition),
            (VERSION_NOT_SUPPORTED, Code::FailedPrecondition),
            (INVALID_PARAMS, Code::InvalidArgument),
            (OVERLOADED, Code::ResourceExhausted),
            (INTERNAL_ERROR, Code::Internal),
        ] {
            assert_eq!(
                status(&RpcError::new(error, "m")).code(),
                expected,
                "{error}"
            );
        }
    }

    #[test]
    fn the_details_carry_error_info_and_retry_info() {
        let error = RpcError::new(OVERLOADED, "busy")
            .with("limit", "requests")
            .with("retryAfterSeconds", "3");
        let status = status(&error);
        assert_eq!(status.message(), "busy");
        let details = status.get_error_details();
        let info = details.error_info().unwrap();
        assert_eq!(info.reason, "RESOURCE_EXHAUSTED");
        assert_eq!(info.domain, ERROR_DOMAIN);
        assert_eq!(info.metadata["limit"], "requests");
        assert_eq!(
            details.retry_info().unwrap().retry_delay,
            Some(Duration::from_secs(3))
        );
    }
}
