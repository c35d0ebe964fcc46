//! The A2A v1.0 wire mapping: the only module that names `a2a-lf` types.
//!
//! Everything else in the crate speaks Keel's models (`keel-core`) and plain JSON values; this
//! module converts between them and the protobuf-JSON shapes of A2A v1.0 (camelCase fields,
//! `ROLE_USER`, `TASK_STATE_COMPLETED`).
//!
//! Keel fields that A2A lacks travel in A2A's own slots (brief, decision 2), under keys with the
//! reserved `keel.` prefix:
//!
//! | Keel | on the wire |
//! |---|---|
//! | typed part (`tool_call`, `tool_output`, `infer`, `infer_output`, `error`, `status`, `route`, `decision`) | data part: `data` = the part's fields (Keel JSON), `metadata["keel.partType"]` = the type |
//! | `json` part | data part: `data` = the document, `metadata["keel.partType"] = "json"` |
//! | file part that A2A cannot hold (both or neither of `uri`/`bytes`, non-canonical base64) | data part with `keel.partType = "file"` |
//! | `Message.timestamp`, `Artifact.timestamp` | `metadata["keel.timestamp"]` |
//! | a message's approval-decision mark, `keel.approval_decision` | `metadata["keel.approvalDecision"]` |
//! | `Artifact.kind` (when not `result`), `uri`, `action_id`, `media_type` | `metadata["keel.kind"]`, `["keel.uri"]`, `["keel.actionId"]`, `["keel.mediaType"]` |
//! | `Task.state_history`, `Task.created_at`, and Keel's keys in `Task.metadata` (`run_context`, `stop_reason`, `pending_approval`, `cancel_reason`, `error`, ...) | one object `metadata["keel"]` ([`KEEL_METADATA_KEY`]) in camelCase, states by wire name (`task_meta`); the caller's own keys beside it, as they are; the engine's bookkeeping (`agent`, `skill`, `awaiting_tool_call`, `approval_decision`) stays inside (decision 253) |
//! | card role, tags, transport, capability flags, skill schemas | params of the [`KEEL_CARD_EXTENSION_URI`] extension in `capabilities.extensions` |
//! | approval decisions by message | declared by the [`KEEL_APPROVAL_EXTENSION_URI`] extension in `capabilities.extensions` |
//!
//! Decoding removes the `keel.` keys (and the task's `keel` object) it understands and leaves
//! everything else in `metadata`.
//!
//! By concern: `parts`, `task` (roles, states, messages, artifacts, tasks), `task_meta` (a
//! task's metadata: `metadata_to_wire` / `metadata_from_wire`), `card`, `requests`
//! (the params and results of the task operations), `push` (push notification configs) and
//! `stream` (stream events); `codec` holds what they share.

mod card;
mod codec;
#[cfg(test)]
mod fixtures;
mod parts;
mod push;
mod requests;
mod stream;
mod task;
/// Keel's task metadata on the wire, one function pair every binding shares.
pub(crate) mod task_meta;

pub(crate) use card::{
    decode_card, encode_card_with, Binding, Endpoints, Interface, JSONRPC_BINDING,
};
pub use card::{KEEL_APPROVAL_EXTENSION_URI, KEEL_CARD_EXTENSION_URI};
pub(crate) use codec::lower_camel;
pub(crate) use push::{
    decode_create_push_config, decode_list_push_configs, decode_push_config_ref,
    encode_list_push_configs, encode_push_config,
};
pub(crate) use requests::{
    decode_cancel_task, decode_get_task, decode_list_tasks, decode_list_tasks_result,
    decode_send_message, decode_send_message_result, decode_task, encode_cancel_task,
    encode_get_task, encode_list_tasks, encode_list_tasks_result, encode_send_message,
    encode_send_message_reply, encode_send_message_result, encode_task, SendMessageCall,
};
pub(crate) use stream::{
    decode_stream_event, decode_subscribe, encode_stream_event, encode_subscribe,
};
pub(crate) use task::{state_from_name, state_name};
pub use task_meta::KEEL_METADATA_KEY;

/// A task as the A2A v1.0 `Task` object a server sends (`id`, `contextId`, `status.state`
/// as `TASK_STATE_*`): for tools that print what the protocol names.
pub fn task_json(task: &keel_core::Task) -> serde_json::Value {
    codec::to_json(&task::task_to_wire(task))
}

/// A stream event as the A2A v1.0 `StreamResponse` a server sends (`{"statusUpdate": ..}`).
pub fn stream_event_json(event: &crate::StreamEvent) -> serde_json::Value {
    encode_stream_event(event)
}

/// The A2A protocol version this mapping speaks.
pub(crate) const PROTOCOL_VERSION: &str = "1.0";

#[cfg(test)]
mod tests {
    #[test]
    fn our_error_codes_are_a2a_error_codes() {
        use crate::jsonrpc::*;
        use a2a::error_code as a2a_code;
        assert_eq!(PARSE_ERROR, a2a_code::PARSE_ERROR);
        assert_eq!(INVALID_REQUEST, a2a_code::INVALID_REQUEST);
        assert_eq!(METHOD_NOT_FOUND, a2a_code::METHOD_NOT_FOUND);
        assert_eq!(INVALID_PARAMS, a2a_code::INVALID_PARAMS);
        assert_eq!(INTERNAL_ERROR, a2a_code::INTERNAL_ERROR);
        assert_eq!(TASK_NOT_FOUND, a2a_code::TASK_NOT_FOUND);
        assert_eq!(TASK_NOT_CANCELABLE, a2a_code::TASK_NOT_CANCELABLE);
        assert_eq!(
            PUSH_NOTIFICATION_NOT_SUPPORTED,
            a2a_code::PUSH_NOTIFICATION_NOT_SUPPORTED
        );
        assert_eq!(UNSUPPORTED_OPERATION, a2a_code::UNSUPPORTED_OPERATION);
        assert_eq!(
            EXTENDED_CARD_NOT_CONFIGURED,
            a2a_code::EXTENDED_CARD_NOT_CONFIGURED
        );
        assert_eq!(VERSION_NOT_SUPPORTED, a2a_code::VERSION_NOT_SUPPORTED);
        assert_eq!(ERROR_INFO_TYPE, a2a::ERROR_INFO_TYPE);
        assert_eq!(ERROR_DOMAIN, a2a::PROTOCOL_DOMAIN);
        assert_eq!(crate::version::VERSION_HEADER, a2a::SVC_PARAM_VERSION);
    }
}
