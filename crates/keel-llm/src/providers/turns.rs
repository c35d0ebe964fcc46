//! A conversation as the APIs whose roles alternate want it (Anthropic Messages, Gemini):
//! instructions apart from the turns, tool results in user turns, and consecutive turns of
//! one role merged. Each provider gives only how it writes one piece ([`TurnFormat`]).

use serde_json::{json, Value};

use super::attachments::{text_with_attachments, user_parts, Attachment};
use crate::{LlmMessage, LlmRole, ToolCall};

/// How one API writes each piece of a turn.
pub(crate) struct TurnFormat {
    /// The model's role (`assistant`, `model`).
    pub(crate) model_role: &'static str,
    /// The field of a turn holding its pieces (`content`, `parts`).
    pub(crate) pieces: &'static str,
    /// The image formats the API accepts.
    pub(crate) image_formats: &'static [&'static str],
    /// One piece of text or one attachment.
    pub(crate) part: fn(Attachment<'_>) -> Value,
    /// A tool call the model made.
    pub(crate) tool_call: fn(&ToolCall) -> Value,
    /// A tool's result, which travels in a user turn: its pieces (with the images it
    /// carries, for an API that takes them there).
    pub(crate) tool_result: fn(&LlmMessage) -> Vec<Value>,
}

/// The system messages' texts, in order, for APIs that take instructions apart from the
/// turns (a compaction summary or a late note joins them where it stands).
pub(crate) fn system_texts(messages: &[LlmMessage]) -> Vec<String> {
    messages
        .iter()
        .filter(|m| m.role == LlmRole::System)
        .map(text_with_attachments)
        .filter(|text| !text.is_empty())
        .collect()
}

/// The non-system messages as turns: a user turn's attachments before its text (the order
/// the providers' guides advise for images), the model's text before its tool calls, empty
/// turns dropped, and consecutive turns of one role merged (all of a step's tool results
/// travel in the one user turn after it).
pub(crate) fn turns(messages: &[LlmMessage], format: &TurnFormat) -> Vec<Value> {
    let mut turns: Vec<(&'static str, Vec<Value>)> = Vec::new();
    for message in messages {
        let (role, pieces) = match message.role {
            LlmRole::System => continue,
            LlmRole::User => (
                "user",
                user_parts(message, format.image_formats, format.part),
            ),
            LlmRole::Assistant => {
                let text = text_with_attachments(message);
                let text = (!text.is_empty()).then(|| (format.part)(Attachment::Text(text)));
                let calls = message.tool_calls.iter().map(format.tool_call);
                (format.model_role, text.into_iter().chain(calls).collect())
            }
            LlmRole::Tool => ("user", (format.tool_result)(message)),
        };
        if pieces.is_empty() {
            continue;
        }
        match turns.last_mut() {
            Some((last_role, last_pieces)) if *last_role == role => last_pieces.extend(pieces),
            _ => turns.push((role, pieces)),
        }
    }
    turns
        .into_iter()
        .map(|(role, pieces)| json!({"role": role, format.pieces: pieces}))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const FORMAT: TurnFormat = TurnFormat {
        model_role: "model",
        pieces: "parts",
        image_formats: &[],
        part: |attachment| match attachment {
            Attachment::Text(text) => json!(text),
            _ => json!("file"),
        },
        tool_call: |call| json!(call.name),
        tool_result: |message| vec![json!(message.content)],
    };

    #[test]
    fn consecutive_turns_of_one_role_merge_and_system_and_empty_turns_drop() {
        let call = ToolCall::new("look", json!({}));
        let messages = [
            LlmMessage::system("rules"),
            LlmMessage::user("hi"),
            LlmMessage::assistant("", vec![call.clone()]),
            LlmMessage::tool_result(&call, "seen"),
            LlmMessage::user("and?"),
            LlmMessage::assistant("", vec![]),
        ];
        assert_eq!(
            turns(&messages, &FORMAT),
            [
                json!({"role": "user", "parts": ["hi"]}),
                json!({"role": "model", "parts": ["look"]}),
                json!({"role": "user", "parts": ["seen", "and?"]}),
            ]
        );
        assert_eq!(system_texts(&messages), ["rules"]);
    }
}
