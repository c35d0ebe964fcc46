//! Streams: `SubscribeToTask` params and the `StreamResponse` events of a stream.

use keel_core::{AgentError, AgentResult, TaskId};
use serde_json::Value;

use super::codec::{bad_answer, decode, non_empty, params_object, to_json};
use super::task::{
    artifact_from_wire, artifact_to_wire, message_from_wire, message_to_wire, status_from_wire,
    status_to_wire, task_from_wire, task_to_wire,
};
use crate::stream::StreamEvent;

/// Decode `SubscribeToTask` params: the task id.
pub(crate) fn decode_subscribe(params: Value) -> AgentResult<TaskId> {
    let request: a2a::SubscribeToTaskRequest = decode(params_object(params)?)?;
    Ok(non_empty(request.id, "id", "must not be empty")?.into())
}

/// `SubscribeToTask` params.
pub(crate) fn encode_subscribe(task_id: &TaskId) -> Value {
    to_json(&a2a::SubscribeToTaskRequest {
        id: task_id.to_string(),
        tenant: None,
    })
}

/// A stream event as a `StreamResponse` (`{"task": ..}`, `{"statusUpdate": ..}`, ...).
pub(crate) fn encode_stream_event(event: &StreamEvent) -> Value {
    let response = match event {
        StreamEvent::Task(task) => a2a::StreamResponse::Task(task_to_wire(task)),
        StreamEvent::Message(message) => a2a::StreamResponse::Message(message_to_wire(message)),
        StreamEvent::StatusUpdate {
            task_id,
            thread_id,
            status,
        } => a2a::StreamResponse::StatusUpdate(a2a::TaskStatusUpdateEvent {
            task_id: task_id.to_string(),
            context_id: thread_id.to_string(),
            status: status_to_wire(status),
            metadata: None,
        }),
        StreamEvent::ArtifactUpdate {
            task_id,
            thread_id,
            artifact,
            append,
            last_chunk,
        } => a2a::StreamResponse::ArtifactUpdate(a2a::TaskArtifactUpdateEvent {
            task_id: task_id.to_string(),
            context_id: thread_id.to_string(),
            artifact: artifact_to_wire(artifact),
            append: append.then_some(true),
            last_chunk: last_chunk.then_some(true),
            metadata: None,
        }),
    };
    to_json(&response)
}

/// A `StreamResponse` as a Keel stream event.
pub(crate) fn decode_stream_event(value: Value) -> AgentResult<StreamEvent> {
    let response: a2a::StreamResponse =
        serde_json::from_value(value).map_err(|e| bad_answer("stream event", e))?;
    let bad = |e: AgentError| bad_answer("stream event", e);
    Ok(match response {
        a2a::StreamResponse::Task(task) => {
            StreamEvent::Task(Box::new(task_from_wire(task).map_err(bad)?))
        }
        a2a::StreamResponse::Message(message) => StreamEvent::Message(Box::new(
            message_from_wire(message, "message").map_err(bad)?,
        )),
        a2a::StreamResponse::StatusUpdate(update) => StreamEvent::StatusUpdate {
            task_id: update.task_id.into(),
            thread_id: update.context_id.into(),
            status: status_from_wire(update.status, "statusUpdate.status").map_err(bad)?,
        },
        a2a::StreamResponse::ArtifactUpdate(update) => StreamEvent::ArtifactUpdate {
            task_id: update.task_id.into(),
            thread_id: update.context_id.into(),
            artifact: artifact_from_wire(update.artifact, "artifactUpdate.artifact")
                .map_err(bad)?,
            append: update.append.unwrap_or(false),
            last_chunk: update.last_chunk.unwrap_or(false),
        },
    })
}
