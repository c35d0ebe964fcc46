//! What the wire mappings share: metadata in and out of A2A's form, JSON values, params
//! objects, and the errors for bad input (ours to report) and bad answers (a remote agent's).

use std::collections::HashMap;

use keel_core::{AgentError, AgentResult, Metadata};
use serde_json::{Map, Value};

pub(super) type WireMetadata = HashMap<String, Value>;

pub(super) fn wire_metadata(metadata: Metadata) -> Option<WireMetadata> {
    (!metadata.is_empty()).then(|| metadata.into_iter().collect())
}

pub(super) fn keel_metadata(metadata: Option<WireMetadata>) -> Metadata {
    metadata.unwrap_or_default().into_iter().collect()
}

pub(super) fn to_json<T: serde::Serialize>(value: &T) -> Value {
    // Keel's models and a2a-lf's types serialize to JSON without failing (string keys, no
    // non-finite floats are produced by Keel); `Null` is the impossible fallback.
    serde_json::to_value(value).unwrap_or(Value::Null)
}

/// Remove `key` and decode it; a value that does not decode stays in the metadata.
pub(super) fn take<T: serde::de::DeserializeOwned>(
    metadata: &mut Metadata,
    key: &str,
) -> Option<T> {
    let value = metadata.get(key)?.clone();
    let decoded = serde_json::from_value(value).ok()?;
    metadata.remove(key);
    Some(decoded)
}

pub(super) fn invalid(field: impl Into<String>, reason: impl std::fmt::Display) -> AgentError {
    AgentError::invalid_input(field, reason.to_string())
}

pub(super) fn params_object(params: Value) -> AgentResult<Value> {
    match params {
        Value::Object(_) => Ok(params),
        Value::Null => Ok(Value::Object(Map::new())),
        _ => Err(invalid("params", "must be an object")),
    }
}

pub(super) fn history_length(value: Option<i32>, field: &str) -> AgentResult<Option<usize>> {
    value
        .map(|n| usize::try_from(n).map_err(|_| invalid(field, "must not be negative")))
        .transpose()
}

pub(super) fn decode<T: serde::de::DeserializeOwned>(params: Value) -> AgentResult<T> {
    serde_json::from_value(params).map_err(|e| invalid("params", e))
}

pub(super) fn bad_answer(what: &str, err: impl std::fmt::Display) -> AgentError {
    AgentError::internal(format!("the remote agent sent an invalid {what}: {err}"))
}
