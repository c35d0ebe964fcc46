//! Messages: one unit of communication between a user and an agent.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use serde_json::Value;

use crate::{MessageId, Metadata, Part, TaskId, ThreadId};

/// Who sent a message. Over A2A these are `ROLE_USER` and `ROLE_AGENT`; system and tool
/// turns are model-side (`LlmMessage`) and never travel as messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// A human or a calling application.
    User,
    /// The agent.
    Agent,
}

/// A message: a role, one or more parts, and the ids that place it.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    /// The message's id.
    pub message_id: MessageId,
    /// Who sent it.
    pub role: Role,
    /// Its content.
    pub parts: Vec<Part>,
    /// The task it belongs to, once known.
    pub task_id: Option<TaskId>,
    /// The thread it belongs to, once known.
    #[serde(alias = "session_id")]
    pub thread_id: Option<ThreadId>,
    /// Ids of other tasks this message refers to.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reference_task_ids: Vec<TaskId>,
    /// Application metadata.
    #[serde(default, skip_serializing_if = "Metadata::is_empty")]
    pub metadata: Metadata,
    /// When it was created.
    pub timestamp: DateTime<Utc>,
}

/// The metadata key that marks a message the engine synthesized to report a status.
pub const STATUS_KIND_KEY: &str = "status_kind";

/// What a synthesized status message reports (seed 003 §12's lifecycle markers).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum StatusKind {
    /// A subagent's task completed; its result was queued on the parent.
    SubagentReturn,
    /// A subagent's task failed, was canceled or rejected.
    SubagentFailure,
    /// A subagent stopped to wait for input.
    SubagentStatus,
    /// A subagent escalated to its parent (`ThreadState::notify_parent`).
    SubagentMessage,
    /// A run was aborted (canceled) before it ended.
    ExecutionAbort,
    /// A run ended because its thread was terminated.
    Termination,
    /// An asynchronous tool reported progress before its result.
    ToolProgress,
    /// The server is shutting down while the task is unfinished: the task goes on in another
    /// process (a replica, or the server restarted). Ends a stream, and is never stored.
    ServerGoingAway,
}

impl StatusKind {
    /// The name stored in `metadata.status_kind`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::SubagentReturn => "subagent_return",
            Self::SubagentFailure => "subagent_failure",
            Self::SubagentStatus => "subagent_status",
            Self::SubagentMessage => "subagent_message",
            Self::ExecutionAbort => "execution_abort",
            Self::Termination => "termination",
            Self::ToolProgress => "tool_progress",
            Self::ServerGoingAway => "server_going_away",
        }
    }

    /// The kind a stored name stands for; `None` for a name this version does not know.
    pub fn parse(name: &str) -> Option<Self> {
        [
            Self::SubagentReturn,
            Self::SubagentFailure,
            Self::SubagentStatus,
            Self::SubagentMessage,
            Self::ExecutionAbort,
            Self::Termination,
            Self::ToolProgress,
            Self::ServerGoingAway,
        ]
        .into_iter()
        .find(|kind| kind.as_str() == name)
    }
}

impl Message {
    /// A message with the given role and parts.
    pub fn new(role: Role, parts: Vec<Part>) -> Self {
        Self {
            message_id: MessageId::new(),
            role,
            parts,
            task_id: None,
            thread_id: None,
            reference_task_ids: Vec::new(),
            metadata: Metadata::new(),
            timestamp: Utc::now(),
        }
    }

    /// A user message with one text part.
    ///
    /// ```
    /// let msg = keel_core::Message::user("What's the weather?");
    /// assert_eq!(msg.text(), "What's the weather?");
    /// ```
    pub fn user(text: impl Into<String>) -> Self {
        Self::new(Role::User, vec![Part::text(text)])
    }

    /// An agent message with one text part.
    pub fn agent(text: impl Into<String>) -> Self {
        Self::new(Role::Agent, vec![Part::text(text)])
    }

    /// A model's answer with one text part. A2A knows only `user` and `agent` roles, so a
    /// model assistant speaking for the agent is an agent message (decision 2).
    ///
    /// ```
    /// let msg = keel_core::Message::assistant("It's sunny.");
    /// assert_eq!(msg.role, keel_core::Role::Agent);
    /// ```
    pub fn assistant(text: impl Into<String>) -> Self {
        Self::agent(text)
    }

    /// A user message with one `infer` part asking for a model inference of `prompt`: the
    /// engine answers it with one model call and no tools (see `keel-agent`).
    ///
    /// ```
    /// use keel_core::{Message, PartContent};
    /// let msg = Message::infer("Who are you?");
    /// assert!(matches!(&msg.parts[0].content, PartContent::Infer { prompt: Some(p), .. } if p == "Who are you?"));
    /// ```
    pub fn infer(prompt: impl Into<String>) -> Self {
        Self::new(Role::User, vec![Part::infer(prompt)])
    }

    /// A user message with one `infer` part carrying every optional field of the seed's
    /// `Message.infer(...)`, and the message `metadata`.
    pub fn infer_with(
        prompt: Option<String>,
        user: Option<String>,
        output_schema: Option<Value>,
        metadata: Metadata,
    ) -> Self {
        let mut message = Self::new(
            Role::User,
            vec![Part::infer_with(prompt, user, output_schema)],
        );
        message.metadata = metadata;
        message
    }

    /// Add a text part.
    #[must_use]
    pub fn with_text(mut self, text: impl Into<String>) -> Self {
        self.parts.push(Part::text(text));
        self
    }

    /// Add any part.
    #[must_use]
    pub fn with_part(mut self, part: Part) -> Self {
        self.parts.push(part);
        self
    }

    /// Place the message in a thread.
    #[must_use]
    pub fn in_thread(mut self, thread_id: impl Into<ThreadId>) -> Self {
        self.thread_id = Some(thread_id.into());
        self
    }

    /// Mark the message as one the engine synthesized to report a status, under
    /// `metadata.status_kind` (seed 003 §12), so clients can group such messages.
    ///
    /// ```
    /// use keel_core::{Message, StatusKind};
    /// let msg = Message::user("[subagent scout] completed: done")
    ///     .with_status_kind(StatusKind::SubagentReturn);
    /// assert_eq!(msg.status_kind(), Some(StatusKind::SubagentReturn));
    /// assert_eq!(msg.metadata["status_kind"], "subagent_return");
    /// ```
    #[must_use]
    pub fn with_status_kind(mut self, kind: StatusKind) -> Self {
        self.metadata
            .insert(STATUS_KIND_KEY.into(), kind.as_str().into());
        self
    }

    /// The status kind of a message the engine synthesized, if this is one.
    pub fn status_kind(&self) -> Option<StatusKind> {
        self.metadata
            .get(STATUS_KIND_KEY)
            .and_then(serde_json::Value::as_str)
            .and_then(StatusKind::parse)
    }

    /// The text of all text parts, joined by newlines.
    pub fn text(&self) -> String {
        self.parts
            .iter()
            .filter_map(Part::as_text)
            .collect::<Vec<_>>()
            .join("\n")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_round_trips_with_every_part_kind() {
        let msg = Message::user("hi")
            .with_part(Part::json(serde_json::json!({"a": 1})))
            .with_part(Part::tool_call(
                "c1",
                "get_weather",
                serde_json::json!({"city": "Athens"}),
            ))
            .in_thread("th-1");
        let json = serde_json::to_value(&msg).unwrap();
        assert_eq!(json["role"], "user");
        let back: Message = serde_json::from_value(json).unwrap();
        assert_eq!(back, msg);
    }

    #[test]
    fn text_joins_text_parts_only() {
        let msg = Message::agent("a")
            .with_part(Part::json(serde_json::json!(1)))
            .with_text("b");
        assert_eq!(msg.text(), "a\nb");
    }
}
