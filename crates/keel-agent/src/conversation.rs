//! Turning a task's durable history into the model's conversation, so a run can always be
//! rebuilt from what was persisted.

use keel_core::{Message, PartContent, Role};
use keel_llm::{LlmMessage, ToolCall};
use serde_json::Value;

/// The model conversation for `history`, after the system prompt.
pub(crate) fn llm_messages(instructions: &str, history: &[Message]) -> Vec<LlmMessage> {
    let mut out = Vec::with_capacity(history.len() + 1);
    if !instructions.is_empty() {
        out.push(LlmMessage::system(instructions));
    }
    for message in history {
        let mut text = Vec::new();
        let mut calls = Vec::new();
        let mut results = Vec::new();
        for part in &message.parts {
            match &part.content {
                PartContent::Text { text: t } => text.push(t.clone()),
                PartContent::ToolCall {
                    call_id,
                    tool_name,
                    args,
                } => calls.push(ToolCall {
                    id: call_id.clone(),
                    name: tool_name.clone(),
                    arguments: args.clone(),
                }),
                PartContent::ToolOutput {
                    call_id,
                    tool_name,
                    output,
                    ..
                } => {
                    let call = ToolCall {
                        id: call_id.clone(),
                        name: tool_name.clone(),
                        arguments: Value::Null,
                    };
                    results.push(LlmMessage::tool_result(&call, render(output)));
                }
                PartContent::Data { data } => text.push(render(data)),
                PartContent::Json { content } => text.push(render(content)),
                PartContent::File { file } => text.push(format!(
                    "[file {}]",
                    file.name
                        .as_deref()
                        .or(file.uri.as_deref())
                        .unwrap_or("unnamed")
                )),
                PartContent::Infer {
                    prompt: Some(prompt),
                    ..
                } => text.push(prompt.clone()),
                PartContent::Error { message, .. } => text.push(format!("error: {message}")),
                other => text.push(serde_json::to_string(other).unwrap_or_default()),
            }
        }
        let text = text.join("\n");
        match message.role {
            Role::User => out.push(LlmMessage::user(text)),
            Role::Agent => {
                if !calls.is_empty() || !text.is_empty() {
                    out.push(LlmMessage::assistant(text, calls));
                }
            }
        }
        out.extend(results);
    }
    out
}

/// A JSON value as the model sees it: strings bare, everything else as JSON.
pub(crate) fn render(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use keel_core::Part;
    use keel_llm::LlmRole;
    use serde_json::json;

    #[test]
    fn tool_calls_and_outputs_become_assistant_and_tool_turns() {
        let history = vec![
            Message::user("add 1 and 2"),
            Message::new(
                Role::Agent,
                vec![Part::tool_call("c1", "add", json!({"a": 1, "b": 2}))],
            ),
            Message::new(
                Role::Agent,
                vec![Part::tool_output("c1", "add", json!(3), false)],
            ),
            Message::agent("3"),
        ];
        let msgs = llm_messages("be brief", &history);
        let roles: Vec<_> = msgs.iter().map(|m| m.role).collect();
        assert_eq!(
            roles,
            [
                LlmRole::System,
                LlmRole::User,
                LlmRole::Assistant,
                LlmRole::Tool,
                LlmRole::Assistant
            ]
        );
        assert_eq!(msgs[2].tool_calls[0].id, "c1");
        assert_eq!(msgs[3].tool_call_id.as_deref(), Some("c1"));
        assert_eq!(msgs[3].content, "3");
    }
}
