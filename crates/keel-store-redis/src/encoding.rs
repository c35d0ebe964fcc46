//! Records as Keel's versioned stored JSON ([`keel_core::stored`]) in Redis strings, and the
//! reverse with errors that name the key that held bad data.

use keel_core::AgentResult;
use serde::{de::DeserializeOwned, Serialize};

/// `value` as stored-JSON text.
pub(crate) fn encode<T: Serialize>(value: &T) -> AgentResult<String> {
    keel_runtime::encode_record(value)
}

/// Decode the stored-JSON text found at `key`. Anything else is
/// [`AgentError::Storage`](keel_core::AgentError::Storage) naming the key.
pub(crate) fn decode<T: DeserializeOwned>(key: &str, text: &str) -> AgentResult<T> {
    keel_runtime::decode_record("redis", &reading(key), text)
}

/// What a decode error says the store was doing when it read `key`, so an operator can find
/// the key.
pub(crate) fn reading(key: &str) -> String {
    format!("reading key `{key}`")
}

/// A Redis score for a time: microseconds since the epoch. Exact in an `f64` until the year
/// 2255, and fine enough that records a few microseconds apart keep their order.
pub(crate) fn micros(at: chrono::DateTime<chrono::Utc>) -> i64 {
    at.timestamp_micros()
}

#[cfg(test)]
mod tests {
    use super::*;
    use keel_core::{AgentError, Message};

    #[test]
    fn round_trip_and_garbage_is_storage_naming_the_key() {
        let text = encode(&Message::user("hi")).unwrap();
        let back: Message = decode("k", &text).unwrap();
        assert_eq!(back.text(), "hi");
        let err = decode::<Message>("the-key", "garbage").unwrap_err();
        assert!(matches!(err, AgentError::Storage { .. }) && err.to_string().contains("the-key"));
        let err = decode::<Message>("k2", r#"{"format":1,"data":{"x":1}}"#).unwrap_err();
        assert!(matches!(err, AgentError::Storage { .. }) && err.to_string().contains("k2"));
    }
}
