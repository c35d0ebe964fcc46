//! Protobuf messages to and from A2A v1.0 JSON, by the proto's own JSON mapping: a message is
//! re-read as its `a2a_pb::protojson` twin (the same proto compiled with pbjson's serde) and
//! written as JSON, or the other way round. So gRPC requests reach the handlers in exactly the
//! JSON the other bindings send, and the `wire` module stays the one place that maps A2A onto
//! Keel's models.

use a2a_pb::{proto, protojson};
use prost::Message;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

use crate::jsonrpc::{RpcError, INTERNAL_ERROR, INVALID_PARAMS};

/// A generated message of [`proto`] that has A2A's JSON form: its twin in
/// `a2a_pb::protojson` (the same proto, compiled with the proto JSON mapping). Implemented for
/// the request and response messages of the A2A service.
pub trait ProtoJson: Message + Default + Sized {
    /// The same message from `a2a_pb::protojson`.
    #[doc(hidden)]
    type Json: Message + Default + Serialize + DeserializeOwned;
}

macro_rules! proto_json {
    ($($name:ident),* $(,)?) => {
        $(impl ProtoJson for proto::$name {
            type Json = protojson::$name;
        })*
    };
}

proto_json!(
    SendMessageRequest,
    SendMessageResponse,
    GetTaskRequest,
    ListTasksRequest,
    ListTasksResponse,
    CancelTaskRequest,
    SubscribeToTaskRequest,
    TaskPushNotificationConfig,
    GetTaskPushNotificationConfigRequest,
    ListTaskPushNotificationConfigsRequest,
    ListTaskPushNotificationConfigsResponse,
    DeleteTaskPushNotificationConfigRequest,
    GetExtendedAgentCardRequest,
    AgentCard,
    Task,
    Message,
    StreamResponse,
);

/// A message in A2A's JSON (the proto JSON mapping: camelCase names, enums by name), as the
/// JSON-RPC and HTTP+JSON bindings carry it. Fails for a message with no JSON form (an enum
/// number the proto does not define).
///
/// ```
/// use keel_transport::grpc::{proto, to_json};
/// let request = proto::GetTaskRequest { id: "t-1".into(), history_length: Some(2), ..Default::default() };
/// assert_eq!(to_json(&request).unwrap(), serde_json::json!({"id": "t-1", "historyLength": 2}));
/// ```
pub fn to_json<M: ProtoJson>(message: &M) -> serde_json::Result<Value> {
    let twin =
        M::Json::decode(message.encode_to_vec().as_slice()).map_err(serde::ser::Error::custom)?;
    serde_json::to_value(twin)
}

/// The message that A2A's JSON `json` stands for (unknown fields are ignored, unknown enum
/// names refused).
pub fn from_json<M: ProtoJson>(json: &str) -> serde_json::Result<M> {
    let twin: M::Json = serde_json::from_str(json)?;
    M::decode(twin.encode_to_vec().as_slice()).map_err(serde::de::Error::custom)
}

/// A request message as its A2A v1.0 JSON params: invalid params when it has no JSON form.
pub(crate) fn request_json<M: ProtoJson>(message: &M) -> Result<Value, RpcError> {
    to_json(message).map_err(|err| RpcError::new(INVALID_PARAMS, format!("invalid request: {err}")))
}

/// An answer in A2A v1.0 JSON as its protobuf message. The handlers wrote that JSON, so a
/// failure here is the server's own fault: an internal error, logged.
pub(crate) fn answer_message<M: ProtoJson>(json: &str) -> Result<M, RpcError> {
    from_json(json).map_err(|err| {
        tracing::error!(error = %err, "an answer has no protobuf form");
        RpcError::new(INTERNAL_ERROR, "internal error")
    })
}

/// One stream event (a v1.0 `StreamResponse` in JSON) as its protobuf message.
pub(crate) fn stream_message(event: &Value) -> Result<proto::StreamResponse, RpcError> {
    answer_message(&event.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_request_reads_as_the_json_the_other_bindings_send() {
        let request = proto::GetTaskRequest {
            tenant: String::new(),
            id: "t-1".into(),
            history_length: Some(2),
        };
        assert_eq!(
            request_json(&request).unwrap(),
            json!({"id": "t-1", "historyLength": 2})
        );
    }

    #[test]
    fn an_answer_in_json_becomes_its_message() {
        let task: proto::Task = answer_message(
            &json!({"id": "t", "contextId": "c", "status": {"state": "TASK_STATE_COMPLETED", "timestamp": "2026-01-02T03:04:05Z"}, "metadata": {"k": [1, "two"]}})
                .to_string(),
        )
        .unwrap();
        assert_eq!(task.id, "t");
        assert_eq!(
            task.status.unwrap().state,
            proto::TaskState::Completed as i32
        );
        assert!(task.metadata.unwrap().fields.contains_key("k"));
        let broken = answer_message::<proto::Task>("{\"status\": {\"state\": \"NO_SUCH\"}}");
        assert_eq!(broken.unwrap_err().code, INTERNAL_ERROR);
    }

    #[test]
    fn an_undefined_enum_number_is_invalid_params() {
        let request = proto::ListTasksRequest {
            status: 99,
            ..Default::default()
        };
        assert_eq!(request_json(&request).unwrap_err().code, INVALID_PARAMS);
    }
}
