//! JSON-RPC 2.0 as A2A uses it: the error codes, the one mapping between Keel errors and codes
//! (both directions), and the response envelope.
//!
//! | Keel error ([`ErrorKind`]) | code |
//! |---|---|
//! | `NotFound` (`TaskNotFound`) | [`TASK_NOT_FOUND`] -32001 |
//! | `NotCancelable` (`TaskNotCancelable`) | [`TASK_NOT_CANCELABLE`] -32002 |
//! | `InvalidInput` | [`INVALID_PARAMS`] -32602 |
//! | `InvalidTransition` | [`INVALID_PARAMS`] -32602 (see [`error_code`]) |
//! | `Unsupported` | [`UNSUPPORTED_OPERATION`] -32004 |
//! | `Unavailable` (`StoreUnavailable`) | [`STORE_UNAVAILABLE`] -32050 (HTTP+JSON: 503; both with `Retry-After`) |
//! | `Overloaded` | [`OVERLOADED`] -32051 (HTTP+JSON: 429; both with `Retry-After`) |
//! | `CancelPending` | [`CANCEL_PENDING`] -32052 (HTTP+JSON: 409) |
//! | `ThreadNotFound` | [`THREAD_NOT_FOUND`] -32053 (HTTP+JSON: 404) |
//! | anything else | [`INTERNAL_ERROR`] -32603, message `internal error` |
//!
//! Every error object carries `data`: an array with one `google.rpc.ErrorInfo` (`@type`,
//! `reason`, `domain`, and string `metadata` such as `taskId`, `state` or `field`).

use keel_core::{AgentError, ErrorKind, TaskId, TaskState};
use serde::Serialize;
use serde_json::value::RawValue;
use serde_json::{json, Map, Value};

use crate::wire;

/// Keel: no thread with this id (A2A `contextId`) for the caller; the `ErrorInfo` metadata
/// names it (`contextId`). Its own code rather than -32001, which A2A reserves for a task, so
/// that a peer never reads a missing thread as a missing task.
pub const THREAD_NOT_FOUND: i32 = -32053;
/// Invalid JSON was received.
pub const PARSE_ERROR: i32 = -32700;
/// The JSON sent is not a valid request object.
pub const INVALID_REQUEST: i32 = -32600;
/// The method does not exist.
pub const METHOD_NOT_FOUND: i32 = -32601;
/// Invalid method parameters.
pub const INVALID_PARAMS: i32 = -32602;
/// An internal error; the message never carries internals.
pub const INTERNAL_ERROR: i32 = -32603;
/// A2A: no task with this id.
pub const TASK_NOT_FOUND: i32 = -32001;
/// A2A: the task is terminal and cannot be canceled.
pub const TASK_NOT_CANCELABLE: i32 = -32002;
/// A2A: push notifications are not offered.
pub const PUSH_NOTIFICATION_NOT_SUPPORTED: i32 = -32003;
/// A2A: the operation is not offered.
pub const UNSUPPORTED_OPERATION: i32 = -32004;
/// A2A: a media type in the request is not supported.
pub const CONTENT_TYPE_NOT_SUPPORTED: i32 = -32005;
/// A2A: no extended agent card is configured.
pub const EXTENDED_CARD_NOT_CONFIGURED: i32 = -32007;
/// A2A: the `A2A-Version` the client asked for is not spoken here.
pub const VERSION_NOT_SUPPORTED: i32 = -32009;

/// Keel: a store cannot be reached for now; the request may be repeated later. Nothing was
/// done, unless the `ErrorInfo` metadata names a `taskId`: a SendMessage whose task was (or
/// may have been) created, which a repeat with the same `messageId` answers with. A2A has no such code; JSON-RPC leaves -32000 to -32099 to servers, and
/// Keel's codes sit above A2A's -32001 to -32009.
pub const STORE_UNAVAILABLE: i32 = -32050;
/// Keel: a limit that protects the server refused the request; the `ErrorInfo` metadata
/// names the limit (`limit`, `max`) and when to try again (`retryAfterSeconds`).
pub const OVERLOADED: i32 = -32051;
/// Keel: a cancel was recorded but the task's run has not stopped yet (its process holds the
/// thread, or died and its lease has not lapsed); asking again later answers the canceled
/// task.
pub const CANCEL_PENDING: i32 = -32052;

/// The `@type` of the `google.rpc.ErrorInfo` entries in `error.data`.
pub const ERROR_INFO_TYPE: &str = "type.googleapis.com/google.rpc.ErrorInfo";
/// The `domain` of A2A's `ErrorInfo` entries.
pub const ERROR_DOMAIN: &str = "a2a-protocol.org";

/// The JSON-RPC error code for a Keel error. This is the one place the mapping lives.
///
/// `InvalidTransition` maps to invalid params (-32602), not internal error: the engine lets it
/// reach a caller only when the request asks for a lifecycle change that the task's current
/// state forbids (the state may have moved since the caller last looked). That is a request
/// that is invalid *now*; repeating it will not help, which -32603 would wrongly suggest, and
/// A2A has no conflict code besides -32002, which is specific to cancellation.
///
/// ```
/// use keel_core::AgentError;
/// use keel_transport::jsonrpc::{error_code, TASK_NOT_FOUND};
/// let err = AgentError::TaskNotFound { task_id: "t-1".into() };
/// assert_eq!(error_code(&err), TASK_NOT_FOUND);
/// ```
pub fn error_code(err: &AgentError) -> i32 {
    match err {
        AgentError::CancelPending { .. } => return CANCEL_PENDING,
        AgentError::ThreadNotFound { .. } => return THREAD_NOT_FOUND,
        // A server this one could not reach is this server's business: its caller learns
        // nothing of the URLs behind it (they stay in the log).
        AgentError::Unreachable { .. } => return INTERNAL_ERROR,
        _ => {}
    }
    match err.kind() {
        ErrorKind::NotFound => TASK_NOT_FOUND,
        ErrorKind::NotCancelable => TASK_NOT_CANCELABLE,
        ErrorKind::InvalidInput | ErrorKind::InvalidTransition => INVALID_PARAMS,
        // A terminated thread refuses new work: the operation is not available on it.
        ErrorKind::Unsupported | ErrorKind::Terminated => UNSUPPORTED_OPERATION,
        ErrorKind::Unavailable => STORE_UNAVAILABLE,
        ErrorKind::Overloaded => OVERLOADED,
        _ => INTERNAL_ERROR,
    }
}

/// The `ErrorInfo.reason` for a code (A2A's names).
pub(crate) fn reason(code: i32) -> &'static str {
    match code {
        PARSE_ERROR => "PARSE_ERROR",
        INVALID_REQUEST => "INVALID_REQUEST",
        METHOD_NOT_FOUND => "METHOD_NOT_FOUND",
        INVALID_PARAMS => "INVALID_PARAMS",
        TASK_NOT_FOUND => "TASK_NOT_FOUND",
        TASK_NOT_CANCELABLE => "TASK_NOT_CANCELABLE",
        PUSH_NOTIFICATION_NOT_SUPPORTED => "PUSH_NOTIFICATION_NOT_SUPPORTED",
        UNSUPPORTED_OPERATION => "UNSUPPORTED_OPERATION",
        CONTENT_TYPE_NOT_SUPPORTED => "CONTENT_TYPE_NOT_SUPPORTED",
        EXTENDED_CARD_NOT_CONFIGURED => "EXTENDED_AGENT_CARD_NOT_CONFIGURED",
        VERSION_NOT_SUPPORTED => "VERSION_NOT_SUPPORTED",
        STORE_UNAVAILABLE => "UNAVAILABLE",
        OVERLOADED => "RESOURCE_EXHAUSTED",
        CANCEL_PENDING => "ABORTED",
        THREAD_NOT_FOUND => "THREAD_NOT_FOUND",
        _ => "INTERNAL_ERROR",
    }
}

/// The code of an `ErrorInfo.reason` (A2A's names), for errors that arrive without a code
/// (the HTTP+JSON binding).
pub(crate) fn code_from_reason(reason: &str) -> Option<i32> {
    [
        PARSE_ERROR,
        INVALID_REQUEST,
        METHOD_NOT_FOUND,
        INVALID_PARAMS,
        INTERNAL_ERROR,
        TASK_NOT_FOUND,
        TASK_NOT_CANCELABLE,
        PUSH_NOTIFICATION_NOT_SUPPORTED,
        UNSUPPORTED_OPERATION,
        CONTENT_TYPE_NOT_SUPPORTED,
        EXTENDED_CARD_NOT_CONFIGURED,
        VERSION_NOT_SUPPORTED,
        STORE_UNAVAILABLE,
        OVERLOADED,
        CANCEL_PENDING,
        THREAD_NOT_FOUND,
    ]
    .into_iter()
    .find(|code| self::reason(*code) == reason)
}

/// Refuse a request body whose `Content-Type` is not JSON (`application/json` or
/// `application/a2a+json`, any parameters) with [`CONTENT_TYPE_NOT_SUPPORTED`] (HTTP+JSON:
/// 400, A2A v1.0.1, 5.4; JSON-RPC answers it with HTTP 415). A request without the header is
/// read as JSON. Both bindings check bodies through this.
pub(crate) fn require_json_body(headers: &axum::http::HeaderMap) -> Result<(), RpcError> {
    let Some(content_type) = headers.get(axum::http::header::CONTENT_TYPE) else {
        return Ok(());
    };
    let essence = content_type
        .to_str()
        .unwrap_or("")
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    if essence == "application/json" || essence == "application/a2a+json" {
        return Ok(());
    }
    Err(RpcError::new(
        CONTENT_TYPE_NOT_SUPPORTED,
        format!("content type `{essence}` is not supported; send application/a2a+json or application/json"),
    ))
}

/// An A2A error to answer with: its JSON-RPC code, message and `ErrorInfo` metadata. The
/// JSON-RPC binding sends [`RpcError::to_json`], the HTTP+JSON binding
/// [`RpcError::to_rest_json`] with the status of [`rest_status`].
#[derive(Debug, Clone, PartialEq)]
pub struct RpcError {
    /// The JSON-RPC error code.
    pub code: i32,
    /// The human-readable message.
    pub message: String,
    /// `ErrorInfo.metadata`: string values only, as `google.rpc.ErrorInfo` requires.
    pub metadata: Map<String, Value>,
}

impl RpcError {
    /// An error with this code and message (every word longer than [`MAX_ECHOED_CHARS`]
    /// cut short, see [`bounded`]).
    pub fn new(code: i32, message: impl Into<String>) -> Self {
        Self {
            code,
            message: bounded(message.into()),
            metadata: Map::new(),
        }
    }

    /// Add a string entry to the `ErrorInfo` metadata (cut short as the message is).
    #[must_use]
    pub fn with(mut self, key: &str, value: impl Into<String>) -> Self {
        self.metadata
            .insert(key.into(), Value::String(bounded(value.into())));
        self
    }

    /// The JSON-RPC error for a Keel error. Internal errors are logged here and answered
    /// without their details.
    pub fn from_agent_error(err: &AgentError) -> Self {
        let code = error_code(err);
        if code == INTERNAL_ERROR {
            tracing::error!(error = %err, "request failed with an internal error");
            return Self::new(code, "internal error");
        }
        let rpc = Self::new(code, err.to_string());
        match err {
            AgentError::TaskNotFound { task_id } | AgentError::CancelPending { task_id } => {
                rpc.with("taskId", task_id.as_str())
            }
            AgentError::ThreadNotFound { thread_id } => rpc.with("contextId", thread_id.as_str()),
            AgentError::TaskNotCancelable { task_id, state } => rpc
                .with("taskId", task_id.as_str())
                .with("state", wire::state_name(*state)),
            AgentError::InvalidInput { field, reason } => rpc
                .with("field", field.as_str())
                .with("description", reason.as_str()),
            AgentError::InvalidTransition { from, to } => rpc
                .with("from", wire::state_name(*from))
                .with("to", wire::state_name(*to)),
            // Where the store lives and why it failed stay in the server's log.
            AgentError::StoreUnavailable { backend, .. } => {
                tracing::warn!(error = %err, "request failed: the store is unavailable");
                RpcError::new(
                    code,
                    format!("store unavailable: the {backend} store cannot be reached; nothing was done, try again later"),
                )
                .with("backend", *backend)
                .with("retryAfterSeconds", STORE_RETRY_AFTER_SECONDS.to_string())
            }
            AgentError::Overloaded {
                limit,
                max,
                retry_after,
            } => rpc
                .with("limit", limit.as_str())
                .with("max", max.to_string())
                .with(
                    "retryAfterSeconds",
                    retry_after_seconds(*retry_after).to_string(),
                ),
            _ => rpc,
        }
    }

    /// How long the caller should wait before trying again (`Retry-After`), for the errors
    /// that say so.
    pub fn retry_after_seconds(&self) -> Option<u64> {
        match self.code {
            STORE_UNAVAILABLE | OVERLOADED => self
                .metadata
                .get("retryAfterSeconds")
                .and_then(Value::as_str)
                .and_then(|s| s.parse().ok()),
            _ => None,
        }
    }

    /// The error object, with `data` = `[ErrorInfo]`.
    pub fn to_json(&self) -> Value {
        let mut info = json!({
            "@type": ERROR_INFO_TYPE,
            "reason": reason(self.code),
            "domain": ERROR_DOMAIN,
        });
        if !self.metadata.is_empty() {
            info["metadata"] = Value::Object(self.metadata.clone());
        }
        json!({"code": self.code, "message": self.message, "data": [info]})
    }
}

/// The most characters of one word (a run without spaces: an id, a value quoted back) that an
/// error echoes.
pub const MAX_ECHOED_CHARS: usize = 128;

/// `text` with every word longer than [`MAX_ECHOED_CHARS`] cut to that many characters and
/// `…`: errors echo what the caller sent (a task id, a message id, a value), and a 1 MB id must
/// not make a 2 MB error, nor gRPC trailers larger than a client accepts. Words are cut rather
/// than the whole text, so that what the error says around the id survives.
pub fn bounded(text: String) -> String {
    if text.len() <= MAX_ECHOED_CHARS
        || !text
            .split(' ')
            .any(|word| word.chars().nth(MAX_ECHOED_CHARS).is_some())
    {
        return text;
    }
    let words: Vec<String> = text
        .split(' ')
        .map(|word| match word.char_indices().nth(MAX_ECHOED_CHARS) {
            Some((cut, _)) => format!("{}…", &word[..cut]),
            None => word.to_owned(),
        })
        .collect();
    words.join(" ")
}

/// How long a caller is asked to wait after a store was found unavailable.
const STORE_RETRY_AFTER_SECONDS: u64 = 1;

/// A delay in whole seconds for `Retry-After`, at least one.
fn retry_after_seconds(delay: std::time::Duration) -> u64 {
    delay.as_secs().max(1)
}

/// The HTTP status and `google.rpc.Code` name of an A2A error code on the HTTP+JSON binding
/// (A2A v1.0.1, section 5.4; the JSON-RPC standard errors as `google.rpc` maps them). The
/// name's own HTTP mapping is the status, so a body's `status` agrees with its code.
///
/// ```
/// use keel_transport::jsonrpc::{rest_status, TASK_NOT_CANCELABLE, TASK_NOT_FOUND};
/// assert_eq!(rest_status(TASK_NOT_FOUND), (404, "NOT_FOUND"));
/// assert_eq!(rest_status(TASK_NOT_CANCELABLE), (400, "FAILED_PRECONDITION"));
/// ```
pub fn rest_status(code: i32) -> (u16, &'static str) {
    match code {
        TASK_NOT_FOUND | THREAD_NOT_FOUND => (404, "NOT_FOUND"),
        // A2A v1.0.1, 5.4: the state of the task or of the server does not allow the call.
        TASK_NOT_CANCELABLE
        | PUSH_NOTIFICATION_NOT_SUPPORTED
        | UNSUPPORTED_OPERATION
        | VERSION_NOT_SUPPORTED
        | EXTENDED_CARD_NOT_CONFIGURED => (400, "FAILED_PRECONDITION"),
        CONTENT_TYPE_NOT_SUPPORTED => (400, "INVALID_ARGUMENT"),
        PARSE_ERROR | INVALID_REQUEST | INVALID_PARAMS => (400, "INVALID_ARGUMENT"),
        METHOD_NOT_FOUND => (404, "NOT_FOUND"),
        STORE_UNAVAILABLE => (503, "UNAVAILABLE"),
        OVERLOADED => (429, "RESOURCE_EXHAUSTED"),
        CANCEL_PENDING => (409, "ABORTED"),
        _ => (500, "INTERNAL"),
    }
}

impl RpcError {
    /// The HTTP+JSON error body (AIP-193, `google.rpc.Status` in JSON):
    /// `{"error": {"code": <HTTP status>, "status": "NOT_FOUND", "message": .., "details": [ErrorInfo]}}`.
    pub fn to_rest_json(&self) -> Value {
        let (http, status) = rest_status(self.code);
        let rpc = self.to_json();
        json!({"error": {
            "code": http,
            "status": status,
            "message": self.message,
            "details": rpc["data"],
        }})
    }
}

/// A success response.
pub(crate) fn success(id: Value, result: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "result": result})
}

/// JSON text written once: a unary answer goes from its typed form (an `a2a` struct) straight
/// to text and into the response object. Through a `Value` it was built as a tree, written,
/// and the tree dropped: about a third of a GetTask's CPU.
pub(crate) type Encoded = Box<RawValue>;

/// The JSON text of `value`.
pub(crate) fn encode<T: Serialize + ?Sized>(value: &T) -> Encoded {
    // Keel's models, a2a-lf's types and `Value`s serialize without failing (string keys, no
    // non-finite floats); `null` is the impossible fallback.
    serde_json::value::to_raw_value(value).unwrap_or_else(|_| RawValue::NULL.to_owned())
}

/// A success response around a result already written.
pub(crate) fn success_encoded(id: &Value, result: &RawValue) -> Encoded {
    #[derive(Serialize)]
    struct Success<'a> {
        jsonrpc: &'static str,
        id: &'a Value,
        result: &'a RawValue,
    }
    encode(&Success {
        jsonrpc: "2.0",
        id,
        result,
    })
}

/// An error response.
pub(crate) fn failure(id: Value, error: &RpcError) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "error": error.to_json()})
}

/// The Keel error for a JSON-RPC error object received from a remote agent. `task_id` is the
/// task the call was about, used when the error does not name one.
///
/// -32002 carries no state in A2A; a Keel server adds it to `ErrorInfo.metadata.state`, and
/// without it the state is [`TaskState::Unspecified`] (meaning "unknown").
pub(crate) fn agent_error_from_rpc(error: &Value, task_id: Option<&TaskId>) -> AgentError {
    let code = error.get("code").and_then(Value::as_i64).unwrap_or(0);
    let message = error
        .get("message")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_owned();
    let info = error
        .get("data")
        .and_then(Value::as_array)
        .and_then(|data| {
            data.iter()
                .find(|d| d.get("@type").and_then(Value::as_str) == Some(ERROR_INFO_TYPE))
        })
        .and_then(|d| d.get("metadata"))
        .and_then(Value::as_object);
    let meta = |key: &str| {
        info.and_then(|m| m.get(key))
            .and_then(Value::as_str)
            .map(str::to_owned)
    };
    let task = || {
        meta("taskId")
            .map(TaskId::from)
            .or_else(|| task_id.cloned())
            .unwrap_or_else(|| TaskId::from(""))
    };
    match i32::try_from(code).unwrap_or(INTERNAL_ERROR) {
        TASK_NOT_FOUND => AgentError::TaskNotFound { task_id: task() },
        CANCEL_PENDING => AgentError::CancelPending { task_id: task() },
        THREAD_NOT_FOUND => AgentError::ThreadNotFound {
            thread_id: meta("contextId").unwrap_or_default().into(),
        },
        TASK_NOT_CANCELABLE => AgentError::TaskNotCancelable {
            task_id: task(),
            state: meta("state")
                .and_then(|s| wire::state_from_name(&s))
                .unwrap_or(TaskState::Unspecified),
        },
        INVALID_PARAMS => AgentError::InvalidInput {
            field: meta("field").unwrap_or_else(|| "params".into()),
            reason: meta("description").unwrap_or(message),
        },
        UNSUPPORTED_OPERATION
        | PUSH_NOTIFICATION_NOT_SUPPORTED
        | METHOD_NOT_FOUND
        | EXTENDED_CARD_NOT_CONFIGURED
        | CONTENT_TYPE_NOT_SUPPORTED
        | VERSION_NOT_SUPPORTED => AgentError::Unsupported {
            what: format!("{message} ({code})"),
        },
        STORE_UNAVAILABLE => AgentError::StoreUnavailable {
            backend: match meta("backend").as_deref() {
                Some("redis") => "redis",
                Some("sqlite") => "sqlite",
                _ => "",
            },
            operation: String::new(),
            source: keel_core::ErrorSource::message(format!(
                "the remote agent answered: {message}"
            )),
        },
        OVERLOADED => AgentError::Overloaded {
            limit: meta("limit").unwrap_or(message),
            max: meta("max").and_then(|m| m.parse().ok()).unwrap_or(0),
            retry_after: std::time::Duration::from_secs(
                meta("retryAfterSeconds")
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(1),
            ),
        },
        _ => AgentError::internal(format!("the remote agent answered error {code}: {message}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn every_error() -> Vec<(AgentError, i32)> {
        vec![
            (
                AgentError::TaskNotFound {
                    task_id: "t".into(),
                },
                TASK_NOT_FOUND,
            ),
            (
                AgentError::TaskNotCancelable {
                    task_id: "t".into(),
                    state: TaskState::Completed,
                },
                TASK_NOT_CANCELABLE,
            ),
            (AgentError::invalid_input("message", "bad"), INVALID_PARAMS),
            (
                AgentError::InvalidTransition {
                    from: TaskState::Completed,
                    to: TaskState::Working,
                },
                INVALID_PARAMS,
            ),
            (
                AgentError::Unsupported {
                    what: "streaming".into(),
                },
                UNSUPPORTED_OPERATION,
            ),
            (
                AgentError::internal("db password is hunter2"),
                INTERNAL_ERROR,
            ),
            (AgentError::storage("disk full at /var/x"), INTERNAL_ERROR),
            (AgentError::llm("m", "key sk-123 rejected"), INTERNAL_ERROR),
            (
                AgentError::ToolFailed {
                    tool: "t".into(),
                    message: "x".into(),
                },
                INTERNAL_ERROR,
            ),
            (AgentError::Canceled { reason: "x".into() }, INTERNAL_ERROR),
            (
                AgentError::Overloaded {
                    limit: "batch requests".into(),
                    max: 100,
                    retry_after: std::time::Duration::from_secs(2),
                },
                OVERLOADED,
            ),
            (
                AgentError::store_unavailable(
                    "redis",
                    "get task at redis://:hunter2@db.internal",
                    std::io::Error::other("connection refused"),
                ),
                STORE_UNAVAILABLE,
            ),
            (
                AgentError::CancelPending {
                    task_id: "t-3".into(),
                },
                CANCEL_PENDING,
            ),
            (AgentError::session_not_found("th-1"), THREAD_NOT_FOUND),
            (
                AgentError::Unreachable {
                    url: "http://10.0.0.7/var/x".into(),
                    cause: "connection refused".into(),
                },
                INTERNAL_ERROR,
            ),
            (
                AgentError::BudgetExceeded {
                    limit: "max_steps".into(),
                    used: 1,
                    max: 1,
                },
                INTERNAL_ERROR,
            ),
        ]
    }

    #[test]
    fn every_error_kind_maps_to_its_code() {
        for (err, code) in every_error() {
            assert_eq!(error_code(&err), code, "{err:?}");
            assert_eq!(RpcError::from_agent_error(&err).code, code);
        }
    }

    #[test]
    fn internal_errors_do_not_leak_details() {
        for (err, code) in every_error() {
            if code == INTERNAL_ERROR {
                let body = RpcError::from_agent_error(&err).to_json().to_string();
                assert!(
                    !body.contains("hunter2")
                        && !body.contains("sk-123")
                        && !body.contains("/var/x"),
                    "{body}"
                );
            }
        }
    }

    #[test]
    fn error_data_is_an_array_of_typed_objects() {
        for (err, _) in every_error() {
            let json = RpcError::from_agent_error(&err).to_json();
            let data = json["data"].as_array().unwrap();
            assert!(!data.is_empty());
            for entry in data {
                assert_eq!(entry["@type"], ERROR_INFO_TYPE);
                for value in entry["metadata"].as_object().into_iter().flatten() {
                    assert!(value.1.is_string(), "ErrorInfo metadata values are strings");
                }
            }
        }
    }

    #[test]
    fn domain_errors_come_back_as_the_same_keel_errors() {
        for (err, code) in every_error() {
            if code == INTERNAL_ERROR {
                continue;
            }
            let json = RpcError::from_agent_error(&err).to_json();
            let back = agent_error_from_rpc(&json, None);
            match (&err, &back) {
                (AgentError::Unsupported { .. }, AgentError::Unsupported { .. }) => {}
                (AgentError::InvalidTransition { .. }, AgentError::InvalidInput { .. }) => {}
                (
                    AgentError::StoreUnavailable { backend, .. },
                    AgentError::StoreUnavailable { backend: back, .. },
                ) => assert_eq!(backend, back),
                _ => assert_eq!(back, err),
            }
        }
    }

    #[test]
    fn an_unavailable_store_is_a_clear_error_that_names_no_address() {
        let err = AgentError::store_unavailable(
            "redis",
            "get task at redis://:hunter2@db.internal",
            std::io::Error::other("connection refused"),
        );
        let rpc = RpcError::from_agent_error(&err);
        assert_eq!(rpc.code, STORE_UNAVAILABLE);
        assert!(
            rpc.message.starts_with("store unavailable"),
            "{}",
            rpc.message
        );
        assert_eq!(rpc.retry_after_seconds(), Some(1));
        let body = rpc.to_json().to_string();
        assert!(
            !body.contains("hunter2") && !body.contains("db.internal"),
            "{body}"
        );
        assert_eq!(rpc.to_json()["data"][0]["reason"], "UNAVAILABLE");
        assert_eq!(rest_status(rpc.code), (503, "UNAVAILABLE"));
        assert_eq!(rest_status(OVERLOADED), (429, "RESOURCE_EXHAUSTED"));
        assert_eq!(rest_status(CANCEL_PENDING), (409, "ABORTED"));
    }

    #[test]
    fn a_missing_thread_is_its_own_not_found_naming_the_context() {
        let rpc = RpcError::from_agent_error(&AgentError::ThreadNotFound {
            thread_id: "th-9".into(),
        });
        assert_eq!(rpc.code, THREAD_NOT_FOUND);
        assert_ne!(
            rpc.code, TASK_NOT_FOUND,
            "a peer must not read it as a missing task"
        );
        let json = rpc.to_json();
        assert_eq!(json["data"][0]["reason"], "THREAD_NOT_FOUND");
        assert_eq!(json["data"][0]["metadata"]["contextId"], "th-9");
        assert_eq!(rest_status(rpc.code), (404, "NOT_FOUND"));
        assert_eq!(code_from_reason("THREAD_NOT_FOUND"), Some(THREAD_NOT_FOUND));
    }

    #[test]
    fn not_cancelable_without_state_reports_unspecified() {
        let err = agent_error_from_rpc(
            &json!({"code": -32002, "message": "nope"}),
            Some(&TaskId::from("t9")),
        );
        assert_eq!(
            err,
            AgentError::TaskNotCancelable {
                task_id: "t9".into(),
                state: TaskState::Unspecified
            }
        );
    }
}
