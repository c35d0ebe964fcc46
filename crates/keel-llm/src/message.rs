//! Provider-neutral conversation messages, tool declarations and tool calls.

use chrono::{DateTime, Utc};
use keel_core::Metadata;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Who speaks in a model conversation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LlmRole {
    /// Instructions.
    System,
    /// The user.
    User,
    /// The model.
    Assistant,
    /// A tool's result.
    Tool,
}

/// A tool offered to a model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolSpec {
    /// The tool's name.
    pub name: String,
    /// What it does, for the model.
    pub description: String,
    /// JSON schema of its arguments.
    pub parameters: Value,
}

/// A tool call requested by a model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    /// Correlates the call with its result.
    pub id: String,
    /// The tool to run.
    pub name: String,
    /// Its arguments.
    pub arguments: Value,
}

impl ToolCall {
    /// A call with a fresh id.
    pub fn new(name: impl Into<String>, arguments: Value) -> Self {
        Self {
            id: format!("call_{}", uuid::Uuid::now_v7().simple()),
            name: name.into(),
            arguments,
        }
    }
}

/// One message of a model conversation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LlmMessage {
    /// The message's id.
    pub id: String,
    /// Who speaks.
    pub role: LlmRole,
    /// The text.
    pub content: String,
    /// Speaker name, when a provider wants one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Tool calls requested by an assistant message.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// For a tool message: the call it answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// For a tool message: the tool's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_name: Option<String>,
    /// Application metadata.
    #[serde(default, skip_serializing_if = "Metadata::is_empty")]
    pub metadata: Metadata,
    /// When it was created.
    pub created_at: DateTime<Utc>,
}

impl LlmMessage {
    /// A message with a role and text.
    pub fn new(role: LlmRole, content: impl Into<String>) -> Self {
        Self {
            id: uuid::Uuid::now_v7().to_string(),
            role,
            content: content.into(),
            name: None,
            tool_calls: Vec::new(),
            tool_call_id: None,
            tool_name: None,
            metadata: Metadata::new(),
            created_at: Utc::now(),
        }
    }

    /// A system message.
    pub fn system(content: impl Into<String>) -> Self {
        Self::new(LlmRole::System, content)
    }

    /// A user message.
    pub fn user(content: impl Into<String>) -> Self {
        Self::new(LlmRole::User, content)
    }

    /// An assistant message, possibly with tool calls.
    pub fn assistant(content: impl Into<String>, tool_calls: Vec<ToolCall>) -> Self {
        let mut message = Self::new(LlmRole::Assistant, content);
        message.tool_calls = tool_calls;
        message
    }

    /// A tool result answering `call`.
    pub fn tool_result(call: &ToolCall, content: impl Into<String>) -> Self {
        let mut message = Self::new(LlmRole::Tool, content);
        message.tool_call_id = Some(call.id.clone());
        message.tool_name = Some(call.name.clone());
        message
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip() {
        let call = ToolCall::new("add", serde_json::json!({"a": 1}));
        for msg in [
            LlmMessage::system("be brief"),
            LlmMessage::user("hi"),
            LlmMessage::assistant("", vec![call.clone()]),
            LlmMessage::tool_result(&call, "2"),
        ] {
            let back: LlmMessage =
                serde_json::from_value(serde_json::to_value(&msg).unwrap()).unwrap();
            assert_eq!(back, msg);
        }
    }
}
