//! Subagents as their parent's run sees them: created, messaged, waiting for scoped
//! variables, reporting a status, and returned or failed.

use keel_core::{TaskId, TaskState, ThreadId};
use serde::{Deserialize, Serialize};

use crate::{EventType, RunEvent, RunEventBuilder};

impl EventType {
    /// A subagent (a child thread) was created.
    pub const SUBAGENT_CREATED: EventType = EventType::known("subagent.created");
    /// A subagent was sent another message.
    pub const SUBAGENT_MESSAGED: EventType = EventType::known("subagent.messaged");
    /// A subagent's task completed; its result went to the parent.
    pub const SUBAGENT_RETURNED: EventType = EventType::known("subagent.returned");
    /// A subagent's task ended in another state than completed.
    pub const SUBAGENT_FAILED: EventType = EventType::known("subagent.failed");
    /// A subagent reported its status to its parent.
    pub const SUBAGENT_STATUS: EventType = EventType::known("subagent.status");
    /// A subagent waits for scoped variables before it can start.
    pub const SUBAGENT_BOOTSTRAP_REQUIRED: EventType =
        EventType::known("subagent.bootstrap_required");
}

/// `subagent.created`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SubagentCreatedPayload {
    /// The subagent kind.
    pub subagent: String,
    /// The instance's name.
    pub name: String,
    /// The child thread.
    pub child_thread_id: ThreadId,
    /// The agent that runs it.
    pub agent: String,
    /// The URIs of the files its first message carries.
    pub attachments: Vec<String>,
    /// Whether the parent waits for its result.
    pub wait: bool,
}

/// `subagent.messaged`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SubagentMessagedPayload {
    /// The subagent kind.
    pub subagent: String,
    /// The instance's name.
    pub name: String,
    /// The child thread.
    pub child_thread_id: ThreadId,
    /// The URIs of the files the message carries.
    pub attachments: Vec<String>,
}

/// A file a subagent's result refers to, as the parent received it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SubagentFile {
    /// Where it can be fetched.
    pub uri: Option<String>,
    /// The file name.
    pub name: Option<String>,
    /// Its MIME type.
    pub media_type: Option<String>,
}

/// `subagent.returned` and `subagent.failed`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SubagentEndedPayload {
    /// The subagent kind.
    pub subagent: String,
    /// The instance's name.
    pub name: String,
    /// The child thread.
    pub child_thread_id: ThreadId,
    /// The child's task.
    pub task_id: TaskId,
    /// The state it ended in.
    pub state: TaskState,
    /// Its answer's text, as the parent receives it.
    pub result: String,
    /// The files of its result, copied to the parent.
    pub attachments: Vec<SubagentFile>,
}

/// `subagent.status`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SubagentStatusPayload {
    /// The child thread reporting.
    pub child_thread_id: ThreadId,
    /// Its parent thread.
    pub parent_thread_id: ThreadId,
    /// The status it reported.
    pub status: String,
}

/// Where the scoped variables a subagent waits for are read and provided.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScopedVariablesRoute {
    /// The request to read them (`GET /threads/...`).
    pub get: String,
    /// The request to provide them (`POST /threads/...`).
    pub post: String,
}

/// `subagent.bootstrap_required`: the same object the model receives as the tool's error.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SubagentBootstrapPayload {
    /// Always `scoped_variables_missing`.
    pub error: String,
    /// The subagent kind.
    pub subagent: String,
    /// The instance's name.
    pub name: String,
    /// The pending request.
    pub request_id: String,
    /// The variables still missing.
    pub missing: Vec<String>,
    /// How to complete the request.
    pub complete: ScopedVariablesRoute,
    /// What happens once it is complete.
    pub note: String,
}

impl RunEvent {
    /// `subagent.created`.
    pub fn subagent_created(payload: SubagentCreatedPayload) -> RunEventBuilder {
        RunEvent::builder(
            EventType::SUBAGENT_CREATED,
            format!("subagent `{}` created", payload.name),
        )
        .payload_from(payload)
    }

    /// `subagent.messaged`.
    pub fn subagent_messaged(payload: SubagentMessagedPayload) -> RunEventBuilder {
        RunEvent::builder(
            EventType::SUBAGENT_MESSAGED,
            format!("subagent `{}` messaged", payload.name),
        )
        .payload_from(payload)
    }

    /// `subagent.returned` when the child's task completed, `subagent.failed` otherwise.
    pub fn subagent_ended(payload: SubagentEndedPayload) -> RunEventBuilder {
        let event_type = if payload.state == TaskState::Completed {
            EventType::SUBAGENT_RETURNED
        } else {
            EventType::SUBAGENT_FAILED
        };
        RunEvent::builder(
            event_type,
            format!("subagent `{}` ended {}", payload.name, payload.state),
        )
        .payload_from(payload)
    }

    /// `subagent.status`.
    pub fn subagent_status(payload: SubagentStatusPayload) -> RunEventBuilder {
        RunEvent::builder(
            EventType::SUBAGENT_STATUS,
            format!("subagent status: {}", payload.status),
        )
        .payload_from(payload)
    }

    /// `subagent.bootstrap_required`.
    pub fn subagent_bootstrap_required(payload: SubagentBootstrapPayload) -> RunEventBuilder {
        RunEvent::builder(
            EventType::SUBAGENT_BOOTSTRAP_REQUIRED,
            format!("subagent `{}` waits for scoped variables", payload.name),
        )
        .payload_from(payload)
    }
}
