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

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::payload::tests::assert_event;

    #[test]
    fn subagent_created() {
        let payload = SubagentCreatedPayload {
            subagent: "researcher".into(),
            name: "r-1".into(),
            child_thread_id: ThreadId::from("th-2"),
            agent: "research".into(),
            attachments: vec!["keel://files/a".into()],
            wait: true,
        };
        assert_event(
            RunEvent::subagent_created(payload.clone()),
            "subagent.created",
            "subagent `r-1` created",
            json!({"subagent": "researcher", "name": "r-1", "child_thread_id": "th-2",
                   "agent": "research", "attachments": ["keel://files/a"], "wait": true}),
            &payload,
        );
    }

    #[test]
    fn subagent_messaged() {
        let payload = SubagentMessagedPayload {
            subagent: "researcher".into(),
            name: "r-1".into(),
            child_thread_id: ThreadId::from("th-2"),
            attachments: vec![],
        };
        assert_event(
            RunEvent::subagent_messaged(payload.clone()),
            "subagent.messaged",
            "subagent `r-1` messaged",
            json!({"subagent": "researcher", "name": "r-1", "child_thread_id": "th-2",
                   "attachments": []}),
            &payload,
        );
    }

    fn ended(state: TaskState) -> SubagentEndedPayload {
        SubagentEndedPayload {
            subagent: "researcher".into(),
            name: "r-1".into(),
            child_thread_id: ThreadId::from("th-2"),
            task_id: TaskId::from("task-2"),
            state,
            result: "found it".into(),
            attachments: vec![SubagentFile {
                uri: Some("keel://files/b".into()),
                name: Some("b.txt".into()),
                media_type: None,
            }],
        }
    }

    fn ended_json(state: &str) -> serde_json::Value {
        json!({"subagent": "researcher", "name": "r-1", "child_thread_id": "th-2",
               "task_id": "task-2", "state": state, "result": "found it",
               "attachments": [{"uri": "keel://files/b", "name": "b.txt", "media_type": null}]})
    }

    #[test]
    fn subagent_returned() {
        let payload = ended(TaskState::Completed);
        assert_event(
            RunEvent::subagent_ended(payload.clone()),
            "subagent.returned",
            "subagent `r-1` ended completed",
            ended_json("completed"),
            &payload,
        );
    }

    #[test]
    fn subagent_failed() {
        let payload = ended(TaskState::InputRequired);
        assert_event(
            RunEvent::subagent_ended(payload.clone()),
            "subagent.failed",
            "subagent `r-1` ended input-required",
            ended_json("input-required"),
            &payload,
        );
    }

    #[test]
    fn subagent_status() {
        let payload = SubagentStatusPayload {
            child_thread_id: ThreadId::from("th-2"),
            parent_thread_id: ThreadId::from("th-1"),
            status: "busy".into(),
        };
        assert_event(
            RunEvent::subagent_status(payload.clone()),
            "subagent.status",
            "subagent status: busy",
            json!({"child_thread_id": "th-2", "parent_thread_id": "th-1", "status": "busy"}),
            &payload,
        );
    }

    #[test]
    fn subagent_bootstrap_required() {
        let payload = SubagentBootstrapPayload {
            error: "scoped_variables_missing".into(),
            subagent: "researcher".into(),
            name: "r-1".into(),
            request_id: "req-1".into(),
            missing: vec!["API_TOKEN".into()],
            complete: ScopedVariablesRoute {
                get: "GET /threads/th-1/variables/req-1".into(),
                post: "POST /threads/th-1/variables/req-1".into(),
            },
            note: "the subagent starts as soon as the missing variables are provided".into(),
        };
        assert_event(
            RunEvent::subagent_bootstrap_required(payload.clone()),
            "subagent.bootstrap_required",
            "subagent `r-1` waits for scoped variables",
            json!({"error": "scoped_variables_missing", "subagent": "researcher",
                   "name": "r-1", "request_id": "req-1", "missing": ["API_TOKEN"],
                   "complete": {"get": "GET /threads/th-1/variables/req-1",
                                "post": "POST /threads/th-1/variables/req-1"},
                   "note": "the subagent starts as soon as the missing variables are provided"}),
            &payload,
        );
    }
}
