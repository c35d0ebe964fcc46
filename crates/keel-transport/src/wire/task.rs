//! Roles, task states, messages, artifacts and tasks; Keel's extras travel in `metadata`:
//! a message's and an artifact's under `keel.` keys, a task's in one `keel` object
//! (`task_meta`).

use chrono::{DateTime, Utc};
use keel_core::{AgentResult, Artifact, Message, Role, Task, TaskState, TaskStatus};
use serde_json::Value;

use super::codec::{each_from_wire, invalid, keel_metadata, take, to_json, wire_metadata};
use super::parts::{part_to_wire, parts_from_wire};
use super::task_meta::{metadata_from_wire, metadata_to_wire};

const TIMESTAMP_KEY: &str = "keel.timestamp";
const KIND_KEY: &str = "keel.kind";
const URI_KEY: &str = "keel.uri";
const ACTION_ID_KEY: &str = "keel.actionId";
const MEDIA_TYPE_KEY: &str = "keel.mediaType";
/// The engine's mark on a message it took as an approval decision (its value: the request
/// id), and the mark's wire name, camelCase like the other `keel.` keys.
const DECISION_MARK: (&str, &str) = ("keel.approval_decision", "keel.approvalDecision");

fn role_to_wire(role: Role) -> a2a::Role {
    match role {
        Role::User => a2a::Role::User,
        Role::Agent => a2a::Role::Agent,
    }
}

fn role_from_wire(role: a2a::Role, field: &str) -> AgentResult<Role> {
    match role {
        a2a::Role::User => Ok(Role::User),
        a2a::Role::Agent => Ok(Role::Agent),
        a2a::Role::Unspecified => Err(invalid(
            format!("{field}.role"),
            "must be ROLE_USER or ROLE_AGENT",
        )),
    }
}

pub(super) fn state_to_wire(state: TaskState) -> a2a::TaskState {
    match state {
        TaskState::Unspecified => a2a::TaskState::Unspecified,
        TaskState::Submitted => a2a::TaskState::Submitted,
        TaskState::Working => a2a::TaskState::Working,
        TaskState::InputRequired => a2a::TaskState::InputRequired,
        TaskState::AuthRequired => a2a::TaskState::AuthRequired,
        TaskState::Completed => a2a::TaskState::Completed,
        TaskState::Failed => a2a::TaskState::Failed,
        TaskState::Canceled => a2a::TaskState::Canceled,
        TaskState::Rejected => a2a::TaskState::Rejected,
    }
}

pub(super) fn state_from_wire(state: a2a::TaskState) -> TaskState {
    match state {
        a2a::TaskState::Unspecified => TaskState::Unspecified,
        a2a::TaskState::Submitted => TaskState::Submitted,
        a2a::TaskState::Working => TaskState::Working,
        a2a::TaskState::InputRequired => TaskState::InputRequired,
        a2a::TaskState::AuthRequired => TaskState::AuthRequired,
        a2a::TaskState::Completed => TaskState::Completed,
        a2a::TaskState::Failed => TaskState::Failed,
        a2a::TaskState::Canceled => TaskState::Canceled,
        a2a::TaskState::Rejected => TaskState::Rejected,
    }
}

/// The wire name of a state (`TASK_STATE_COMPLETED`).
pub(crate) fn state_name(state: TaskState) -> String {
    match to_json(&state_to_wire(state)) {
        Value::String(name) => name,
        _ => String::new(),
    }
}

/// The state a wire name (`TASK_STATE_COMPLETED`) stands for.
pub(crate) fn state_from_name(name: &str) -> Option<TaskState> {
    serde_json::from_value::<a2a::TaskState>(Value::String(name.to_owned()))
        .ok()
        .map(state_from_wire)
}

pub(super) fn message_to_wire(message: &Message) -> a2a::Message {
    let mut metadata = message.metadata.clone();
    metadata.insert(TIMESTAMP_KEY.into(), to_json(&message.timestamp));
    if let Some(mark) = metadata.remove(DECISION_MARK.0) {
        metadata.insert(DECISION_MARK.1.into(), mark);
    }
    a2a::Message {
        message_id: message.message_id.to_string(),
        context_id: message.thread_id.as_ref().map(ToString::to_string),
        task_id: message.task_id.as_ref().map(ToString::to_string),
        role: role_to_wire(message.role),
        parts: message.parts.iter().map(part_to_wire).collect(),
        metadata: wire_metadata(metadata),
        extensions: None,
        reference_task_ids: (!message.reference_task_ids.is_empty()).then(|| {
            message
                .reference_task_ids
                .iter()
                .map(ToString::to_string)
                .collect()
        }),
    }
}

pub(super) fn message_from_wire(message: a2a::Message, field: &str) -> AgentResult<Message> {
    if message.message_id.is_empty() {
        return Err(invalid(format!("{field}.messageId"), "must not be empty"));
    }
    let role = role_from_wire(message.role, field)?;
    let parts = parts_from_wire(message.parts, field)?;
    let mut metadata = keel_metadata(message.metadata);
    let timestamp = take::<DateTime<Utc>>(&mut metadata, TIMESTAMP_KEY).unwrap_or_else(Utc::now);
    if let Some(mark) = metadata.remove(DECISION_MARK.1) {
        metadata.insert(DECISION_MARK.0.into(), mark);
    }
    Ok(Message {
        message_id: message.message_id.into(),
        role,
        parts,
        task_id: message.task_id.filter(|id| !id.is_empty()).map(Into::into),
        thread_id: message
            .context_id
            .filter(|id| !id.is_empty())
            .map(Into::into),
        reference_task_ids: message
            .reference_task_ids
            .unwrap_or_default()
            .into_iter()
            .map(Into::into)
            .collect(),
        metadata,
        timestamp,
    })
}

pub(super) fn artifact_to_wire(artifact: &Artifact) -> a2a::Artifact {
    let mut metadata = artifact.metadata.clone();
    if artifact.kind != Artifact::default().kind {
        metadata.insert(KIND_KEY.into(), Value::String(artifact.kind.clone()));
    }
    if let Some(uri) = &artifact.uri {
        metadata.insert(URI_KEY.into(), Value::String(uri.clone()));
    }
    if let Some(action_id) = &artifact.action_id {
        metadata.insert(ACTION_ID_KEY.into(), Value::String(action_id.to_string()));
    }
    if let Some(media_type) = &artifact.media_type {
        metadata.insert(MEDIA_TYPE_KEY.into(), Value::String(media_type.clone()));
    }
    metadata.insert(TIMESTAMP_KEY.into(), to_json(&artifact.timestamp));
    a2a::Artifact {
        artifact_id: artifact.id.to_string(),
        name: artifact.name.clone(),
        description: artifact.description.clone(),
        parts: artifact.parts.iter().map(part_to_wire).collect(),
        metadata: wire_metadata(metadata),
        extensions: None,
    }
}

pub(super) fn artifact_from_wire(artifact: a2a::Artifact, field: &str) -> AgentResult<Artifact> {
    let mut metadata = keel_metadata(artifact.metadata);
    Ok(Artifact {
        id: artifact.artifact_id.into(),
        kind: take(&mut metadata, KIND_KEY).unwrap_or_else(|| Artifact::default().kind),
        name: artifact.name,
        description: artifact.description,
        uri: take(&mut metadata, URI_KEY),
        media_type: take(&mut metadata, MEDIA_TYPE_KEY),
        action_id: take::<String>(&mut metadata, ACTION_ID_KEY).map(Into::into),
        parts: parts_from_wire(artifact.parts, field)?,
        timestamp: take(&mut metadata, TIMESTAMP_KEY).unwrap_or_else(Utc::now),
        metadata,
    })
}

pub(super) fn task_to_wire(task: &Task) -> a2a::Task {
    let metadata = metadata_to_wire(task);
    a2a::Task {
        id: task.id.to_string(),
        context_id: task.thread_id.to_string(),
        status: status_to_wire(task.status()),
        artifacts: (!task.artifacts.is_empty())
            .then(|| task.artifacts.iter().map(artifact_to_wire).collect()),
        history: (!task.history.is_empty())
            .then(|| task.history.iter().map(message_to_wire).collect()),
        metadata: wire_metadata(metadata),
    }
}

pub(super) fn status_to_wire(status: &TaskStatus) -> a2a::TaskStatus {
    a2a::TaskStatus {
        state: state_to_wire(status.state),
        message: status.message.as_ref().map(message_to_wire),
        timestamp: Some(status.timestamp),
    }
}

pub(super) fn status_from_wire(status: a2a::TaskStatus, field: &str) -> AgentResult<TaskStatus> {
    Ok(TaskStatus {
        state: state_from_wire(status.state),
        message: status
            .message
            .map(|m| message_from_wire(m, &format!("{field}.message")))
            .transpose()?,
        timestamp: status.timestamp.unwrap_or_else(Utc::now),
    })
}

pub(super) fn task_from_wire(task: a2a::Task) -> AgentResult<Task> {
    let status = status_from_wire(task.status, "task.status")?;
    let mut out = Task::from_parts(task.id.into(), task.context_id.into(), status);
    out.history = each_from_wire(
        task.history.unwrap_or_default(),
        "task.history",
        message_from_wire,
    )?;
    out.artifacts = each_from_wire(
        task.artifacts.unwrap_or_default(),
        "task.artifacts",
        artifact_from_wire,
    )?;
    let metadata = metadata_from_wire(keel_metadata(task.metadata));
    out.state_history = metadata.state_history;
    if let Some(created_at) = metadata.created_at {
        out.created_at = created_at;
    }
    out.metadata = metadata.metadata;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::fixtures::{as_sent, full_artifact, full_message, tasks, through_wire_json};
    use crate::wire::{encode_send_message_result, encode_task};
    use keel_core::AgentError;
    use serde_json::json;

    #[test]
    fn message_round_trips_through_the_wire() {
        for message in [Message::agent("plain"), full_message()] {
            let wire = through_wire_json(message_to_wire(&message));
            assert_eq!(message_from_wire(wire, "message").unwrap(), message);
        }
    }

    #[test]
    fn an_approval_decisions_mark_is_camel_case_on_the_wire_and_reads_back() {
        let mut message = Message::user("approve");
        message
            .metadata
            .insert(DECISION_MARK.0.into(), json!("req-1"));
        let wire = to_json(&message_to_wire(&message));
        assert_eq!(wire["metadata"]["keel.approvalDecision"], "req-1");
        assert!(wire["metadata"].get(DECISION_MARK.0).is_none(), "{wire}");
        let back = message_from_wire(through_wire_json(message_to_wire(&message)), "m").unwrap();
        assert_eq!(back, message);
    }

    #[test]
    fn roles_are_role_user_and_role_agent_on_the_wire() {
        let wire = to_json(&message_to_wire(&Message::user("x")));
        assert_eq!(wire["role"], "ROLE_USER");
        let wire = to_json(&message_to_wire(&Message::agent("x")));
        assert_eq!(wire["role"], "ROLE_AGENT");
    }

    #[test]
    fn unspecified_role_is_invalid_input() {
        let wire: a2a::Message = serde_json::from_value(
            json!({"messageId": "m", "role": "ROLE_UNSPECIFIED", "parts": [{"text": "x"}]}),
        )
        .unwrap();
        let err = message_from_wire(wire, "message").unwrap_err();
        assert!(
            matches!(&err, AgentError::InvalidInput { field, .. } if field == "message.role"),
            "{err:?}"
        );
    }

    #[test]
    fn artifact_round_trips_through_the_wire() {
        for artifact in [Artifact::text("42"), full_artifact()] {
            let wire = through_wire_json(artifact_to_wire(&artifact));
            assert_eq!(artifact_from_wire(wire, "artifact").unwrap(), artifact);
        }
        let wire = to_json(&artifact_to_wire(&full_artifact()));
        assert_eq!(wire["metadata"]["keel.kind"], "diagnostic");
        assert_eq!(wire["metadata"]["keel.actionId"], "a-1");
    }

    #[test]
    fn task_round_trips_through_the_wire() {
        for task in tasks() {
            let wire = through_wire_json(task_to_wire(&task));
            assert_eq!(task_from_wire(wire).unwrap(), as_sent(task));
        }
    }

    #[test]
    fn task_extras_travel_in_metadata() {
        let tasks = tasks();
        let tree =
            |text: crate::jsonrpc::Encoded| -> Value { serde_json::from_str(text.get()).unwrap() };
        let wire = tree(encode_task(&tasks[1]));
        assert_eq!(wire["status"]["state"], "TASK_STATE_COMPLETED");
        assert_eq!(wire["contextId"], tasks[1].thread_id.as_str());
        assert!(wire["metadata"].get("run_context").is_none(), "{wire}");
        assert!(wire["metadata"]["keel"]["runId"].is_string(), "{wire}");
        assert_eq!(
            wire["metadata"]["keel"]["stateHistory"][1]["newState"],
            "TASK_STATE_COMPLETED"
        );
        assert_eq!(wire["metadata"]["k"], json!([1, 2]));
        let wire = tree(encode_task(&tasks[2]));
        assert_eq!(wire["metadata"]["keel"]["cancelReason"], "user asked");
        let wire = tree(encode_send_message_result(&tasks[0]));
        assert_eq!(wire["task"]["status"]["state"], "TASK_STATE_SUBMITTED");
    }

    #[test]
    fn every_task_state_round_trips_by_wire_name() {
        for state in TaskState::ALL {
            let name = state_name(state);
            assert!(name.starts_with("TASK_STATE_"), "{name}");
            assert_eq!(state_from_name(&name), Some(state));
        }
        assert_eq!(
            state_name(TaskState::InputRequired),
            "TASK_STATE_INPUT_REQUIRED"
        );
    }
}
