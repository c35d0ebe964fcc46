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

/// A request's params as an object, with every field named by its JSON name: protobuf JSON
/// parsers accept a field's proto name (`task_id`) as well as its JSON name (`taskId`), and
/// so does Keel (see [`json_field_names`]).
pub(super) fn params_object(params: Value) -> AgentResult<Value> {
    match params {
        Value::Object(_) => {
            let mut params = params;
            json_field_names(&mut params);
            Ok(params)
        }
        Value::Null => Ok(Value::Object(Map::new())),
        _ => Err(invalid("params", "must be an object")),
    }
}

/// Fields whose values are free-form JSON (`google.protobuf.Struct` / `Value` in a2a.proto):
/// their keys are the caller's own and are left as sent.
const FREE_FORM_FIELDS: [&str; 4] = ["metadata", "data", "params", "header"];

/// Rename proto field names (`snake_case`) to JSON names (`lowerCamelCase`) throughout a
/// request, except inside free-form values. Where both names are sent, the JSON name wins.
/// Requests that use JSON names only (all of A2A's own clients) are walked, not copied.
fn json_field_names(value: &mut Value) {
    match value {
        Value::Object(map) => {
            if map.keys().any(|key| key.contains('_')) {
                let proto_named: Vec<String> =
                    map.keys().filter(|k| k.contains('_')).cloned().collect();
                for proto in proto_named {
                    let json = lower_camel(&proto);
                    if let Some(field) = map.remove(&proto) {
                        map.entry(json).or_insert(field);
                    }
                }
            }
            for (key, field) in map.iter_mut() {
                if !FREE_FORM_FIELDS.contains(&key.as_str()) {
                    json_field_names(field);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(json_field_names),
        _ => {}
    }
}

/// `task_id` → `taskId`, as protobuf derives a field's JSON name (and as the HTTP+JSON
/// binding reads a query parameter given in snake_case).
pub(crate) fn lower_camel(proto: &str) -> String {
    let mut json = String::with_capacity(proto.len());
    let mut upper = false;
    for c in proto.chars() {
        if c == '_' {
            upper = true;
        } else if upper {
            json.extend(c.to_uppercase());
            upper = false;
        } else {
            json.push(c);
        }
    }
    json
}

/// The value of the field `field` when it is not empty; else `invalid(field, reason)`.
pub(super) fn non_empty(value: String, field: &str, reason: &str) -> AgentResult<String> {
    if value.is_empty() {
        return Err(invalid(field, reason));
    }
    Ok(value)
}

/// Each of `items` read by `from_wire`, which names the one at index `i` `{field}[i]` in
/// its errors.
pub(super) fn each_from_wire<W, T>(
    items: Vec<W>,
    field: &str,
    from_wire: impl Fn(W, &str) -> AgentResult<T>,
) -> AgentResult<Vec<T>> {
    items
        .into_iter()
        .enumerate()
        .map(|(i, item)| from_wire(item, &format!("{field}[{i}]")))
        .collect()
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn proto_field_names_become_json_names_except_in_free_form_values() {
        let params = params_object(json!({
            "task_id": "t-1",
            "push_notification_config": {"url": "https://example.com/h", "id": "c"},
            "message": {
                "message_id": "m-1",
                "parts": [{"data": {"my_key": 1}, "media_type": "application/json"}],
                "metadata": {"client_key": true}
            },
            "taskId": "the JSON name wins",
            "history_length": 3
        }))
        .unwrap();
        assert_eq!(
            params,
            json!({
                "taskId": "the JSON name wins",
                "pushNotificationConfig": {"url": "https://example.com/h", "id": "c"},
                "message": {
                    "messageId": "m-1",
                    "parts": [{"data": {"my_key": 1}, "mediaType": "application/json"}],
                    "metadata": {"client_key": true}
                },
                "historyLength": 3
            })
        );
    }
}
