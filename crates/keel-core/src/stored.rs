//! Keel's versioned stored-JSON envelope: what stores write so that data written by one
//! version of Keel can be recognised, migrated or refused with a clear error by another.
//!
//! ```
//! use keel_core::{stored, Message};
//! let json = stored::encode(&Message::user("hi"))?;
//! assert_eq!(json["format"], stored::FORMAT_VERSION);
//! let back: Message = stored::decode(json)?;
//! assert_eq!(back.text(), "hi");
//! # Ok::<(), keel_core::AgentError>(())
//! ```

use serde::{de::DeserializeOwned, Serialize};
use serde_json::{json, Map, Value};

use crate::{AgentError, AgentResult};

/// The current version of Keel's stored JSON. Version 2 (decision 269): an entry of a task's
/// log may leave out the task and thread ids its log already holds
/// (`keel_runtime::encode_task_event`). Version 3: a run record leaves out the ids its report
/// names (decision 271, `keel_runtime::RecordText`), and a task snapshot the state and time of
/// its status that its last transition says (decision 274). Version 4: a task snapshot's status
/// message names the artifact whose parts it repeats (decision 282). Every other record reads
/// the same in 1 to 4, so a store written by an earlier Keel is read as it is, and an earlier
/// Keel refuses a newer record by its version rather than misread it.
pub const FORMAT_VERSION: u64 = 4;

/// Wrap a value as `{"format": FORMAT_VERSION, "data": ...}`.
pub fn encode<T: Serialize>(value: &T) -> AgentResult<Value> {
    let data = serde_json::to_value(value).map_err(AgentError::internal)?;
    Ok(json!({ "format": FORMAT_VERSION, "data": data }))
}

/// Unwrap and decode a stored value. A missing or newer format, or data of the wrong shape,
/// is [`AgentError::Storage`] saying which.
pub fn decode<T: DeserializeOwned>(stored: Value) -> AgentResult<T> {
    let Value::Object(mut map) = stored else {
        return Err(AgentError::storage("stored record is not a JSON object"));
    };
    let format = map
        .get("format")
        .and_then(Value::as_u64)
        .ok_or_else(|| AgentError::storage("stored record has no `format` version"))?;
    if format > FORMAT_VERSION {
        return Err(AgentError::storage(format!(
            "stored record has format {format}, newer than this Keel understands ({FORMAT_VERSION})"
        )));
    }
    let data = map.remove("data").unwrap_or(Value::Null);
    serde_json::from_value(data)
        .map_err(|e| AgentError::storage(format!("stored record is malformed: {e}")))
}

/// Leave out of `holder` (an object of a record's stored JSON) each of `ids` (key and value)
/// whose value is the one given, because the record says it elsewhere; write `null` for one
/// it does not name, since a missing one reads back as the given one ([`fill_in_ids`]).
pub fn leave_out_ids(holder: &mut Map<String, Value>, ids: &[(&str, Option<&str>)]) {
    leave_out_given(holder, ids, |own, id| own.as_str() == Some(*id));
}

/// The reverse of [`leave_out_ids`]: a missing id is the given one (when it is known), and a
/// `null` one none (left out again, as the value was written: some holders are kept as JSON).
pub fn fill_in_ids(holder: &mut Map<String, Value>, ids: &[(&str, Option<&str>)]) {
    fill_in_given(holder, ids, |id| Value::String((*id).to_owned()));
}

/// [`leave_out_ids`] for a value of any kind that the record gives elsewhere: each field of
/// `given` whose value in `holder` is the `same` as the given one is left out, and one
/// `holder` does not have is written `null`.
pub fn leave_out_given<T>(
    holder: &mut Map<String, Value>,
    given: &[(&str, Option<T>)],
    same: impl Fn(&Value, &T) -> bool,
) {
    for (key, value) in given {
        match holder.get(*key) {
            Some(own) if value.as_ref().is_some_and(|value| same(own, value)) => {
                holder.remove(*key);
            }
            // Said even where no value is given: a reader may know one the writer did not
            // (a task log's thread), and a missing field reads back as the reader's.
            None => {
                holder.insert((*key).to_owned(), Value::Null);
            }
            Some(_) => {}
        }
    }
}

/// The reverse of [`leave_out_given`]: a missing field is the given value (as JSON, by
/// `value`), and a `null` one is left out.
pub fn fill_in_given<T>(
    holder: &mut Map<String, Value>,
    given: &[(&str, Option<T>)],
    value: impl Fn(&T) -> Value,
) {
    for (key, given) in given {
        match (holder.get(*key), given) {
            (Some(Value::Null), _) => {
                holder.remove(*key);
            }
            (None, Some(given)) => {
                holder.insert((*key).to_owned(), value(given));
            }
            _ => {}
        }
    }
}

/// JSON text that is known to be well-formed: written by serializing a value, or checked
/// by parsing. A store can keep it as given, with no second parse to check it.
///
/// ```
/// use keel_core::stored::JsonText;
/// let text = JsonText::of(&serde_json::json!({"a": 1}))?;
/// assert_eq!(text.as_str(), r#"{"a":1}"#);
/// assert!(JsonText::parse("{not json").is_err());
/// # Ok::<(), keel_core::AgentError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JsonText(String);

impl JsonText {
    /// `value` serialized (compact).
    pub fn of<T: Serialize + ?Sized>(value: &T) -> AgentResult<JsonText> {
        serde_json::to_string(value)
            .map(JsonText)
            .map_err(AgentError::internal)
    }

    /// [`of`](Self::of) into a buffer of `capacity` bytes: for large values whose size the
    /// caller can guess, which spares growing the buffer (and copying it) as it fills.
    pub fn of_sized<T: Serialize + ?Sized>(value: &T, capacity: usize) -> AgentResult<JsonText> {
        let mut bytes = Vec::with_capacity(capacity);
        serde_json::to_writer(&mut bytes, value).map_err(AgentError::internal)?;
        String::from_utf8(bytes)
            .map(JsonText)
            .map_err(AgentError::internal)
    }

    /// `text`, once it has parsed as JSON; otherwise [`AgentError::InvalidInput`] saying where
    /// it stops being JSON.
    pub fn parse(text: impl Into<String>) -> AgentResult<JsonText> {
        let text = text.into();
        serde_json::from_str::<serde::de::IgnoredAny>(&text)
            .map_err(|e| AgentError::invalid_input("json", format!("is not JSON: {e}")))?;
        Ok(JsonText(text))
    }

    /// The text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The text, owned.
    pub fn into_string(self) -> String {
        self.0
    }

    /// The JSON value the text holds.
    pub fn to_value(&self) -> AgentResult<Value> {
        serde_json::from_str(&self.0).map_err(AgentError::internal)
    }
}

impl std::fmt::Display for JsonText {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Task;

    #[test]
    fn newer_format_is_refused_with_a_clear_error() {
        let err = decode::<Task>(json!({"format": 99, "data": {}})).unwrap_err();
        assert!(err.to_string().contains("newer"));
    }

    #[test]
    fn malformed_data_is_a_storage_error() {
        let err = decode::<Task>(json!({"format": 1, "data": {"id": 3}})).unwrap_err();
        assert!(matches!(err, AgentError::Storage { .. }));
    }
}
