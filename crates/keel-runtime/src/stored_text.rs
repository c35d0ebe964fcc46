//! Keel's records as the text a store keeps: the versioned stored-JSON envelope
//! ([`keel_core::stored`]) written as a string, and read back with an error that says which
//! backend held bad data and where, so an operator can find it.

use keel_core::{stored, AgentError, AgentResult};
use serde::{de::DeserializeOwned, Serialize};

/// `record` (a task snapshot, an event, a message, ...) as stored-JSON text.
pub fn encode_record<T: Serialize>(record: &T) -> AgentResult<String> {
    serde_json::to_string(&stored::encode(record)?).map_err(AgentError::internal)
}

/// Decode stored-JSON `text` that `backend` read while doing `operation` (which names where
/// the text was, e.g. ``reading key `k` `` or `reading stored task t-1`). Text that is not
/// JSON, or not an envelope Keel can read, is [`AgentError::Storage`] naming both.
///
/// ```
/// use keel_core::{AgentError, Message};
/// use keel_runtime::{decode_record, encode_record};
/// let text = encode_record(&Message::user("hi")).unwrap();
/// let back: Message = decode_record("sqlite", "reading stored message 1", &text).unwrap();
/// assert_eq!(back.text(), "hi");
/// let err = decode_record::<Message>("redis", "reading key `k`", "garbage").unwrap_err();
/// assert!(matches!(err, AgentError::Storage { backend: "redis", .. }));
/// ```
pub fn decode_record<T: DeserializeOwned>(
    backend: &'static str,
    operation: &str,
    text: &str,
) -> AgentResult<T> {
    let value: serde_json::Value = serde_json::from_str(text).map_err(|e| {
        AgentError::storage_source(
            backend,
            format!("{operation}, which does not hold Keel's stored JSON"),
            e,
        )
    })?;
    stored::decode(value).map_err(|e| match e {
        AgentError::Storage { source, .. } => AgentError::Storage {
            backend,
            operation: operation.to_owned(),
            source,
        },
        other => other,
    })
}
