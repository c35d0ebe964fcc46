//! [`ConversationHistory`]: a thread's model conversation, system prompt first, with the
//! low-level edits (set the system prompt, append, truncate, replace) that compaction and the
//! engine build on.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use crate::{estimate_message_tokens, LlmMessage, LlmRole, ToolCall};

/// A provider-neutral conversation. When a system prompt is set it sits at index 0.
///
/// It serialises as the plain list of its messages, so persisting and restoring it is a
/// serde round trip.
///
/// ```
/// use keel_llm::ConversationHistory;
/// let mut history = ConversationHistory::new(Some("be brief"));
/// history.add_user("hi");
/// history.add_assistant("hello");
/// history.set_system("be very brief");
/// assert_eq!(history.system_prompt(), Some("be very brief"));
/// assert_eq!(history.len(), 3);
/// let restored = ConversationHistory::from_list(history.to_list());
/// assert_eq!(restored, history);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ConversationHistory {
    // A deque because the system prompt is replaced and inserted at the front.
    messages: VecDeque<LlmMessage>,
}

impl ConversationHistory {
    /// A history, starting with `system_prompt` when given.
    pub fn new(system_prompt: Option<&str>) -> Self {
        let mut history = Self::default();
        if let Some(prompt) = system_prompt {
            history.messages.push_back(LlmMessage::system(prompt));
        }
        history
    }

    /// Restore a history from its messages (as [`ConversationHistory::to_list`] gave them).
    pub fn from_list(messages: Vec<LlmMessage>) -> Self {
        Self {
            messages: messages.into(),
        }
    }

    /// The messages, oldest first, for persistence or a model request.
    pub fn to_list(&self) -> Vec<LlmMessage> {
        self.messages.iter().cloned().collect()
    }

    /// Replace every message, keeping this history object (compaction uses it).
    pub fn replace(&mut self, messages: impl IntoIterator<Item = LlmMessage>) {
        self.messages = messages.into_iter().collect();
    }

    /// The messages, oldest first.
    pub fn messages(&self) -> impl ExactSizeIterator<Item = &LlmMessage> + '_ {
        self.messages.iter()
    }

    /// How many messages there are, the system prompt included.
    pub fn len(&self) -> usize {
        self.messages.len()
    }

    /// Whether there are no messages at all.
    pub fn is_empty(&self) -> bool {
        self.messages.is_empty()
    }

    /// The system prompt at index 0, if there is one.
    pub fn system_prompt(&self) -> Option<&str> {
        self.messages
            .front()
            .filter(|m| m.role == LlmRole::System)
            .map(|m| m.content.as_str())
    }

    /// Whether index 0 holds a system prompt.
    pub(crate) fn has_system_prompt(&self) -> bool {
        self.system_prompt().is_some()
    }

    /// Set the system prompt at index 0, keeping every later message.
    pub fn set_system(&mut self, system_prompt: impl Into<String>) {
        match self.messages.front_mut() {
            Some(first) if first.role == LlmRole::System => first.content = system_prompt.into(),
            _ => self.messages.push_front(LlmMessage::system(system_prompt)),
        }
    }

    /// Drop every message and start again from `system_prompt`.
    pub fn reset_to_system(&mut self, system_prompt: impl Into<String>) {
        self.messages.clear();
        self.messages.push_back(LlmMessage::system(system_prompt));
    }

    /// Append a message.
    pub fn push(&mut self, message: LlmMessage) {
        self.messages.push_back(message);
    }

    /// Append a user message.
    pub fn add_user(&mut self, content: impl Into<String>) {
        self.push(LlmMessage::user(content));
    }

    /// Append an assistant message without tool calls.
    pub fn add_assistant(&mut self, content: impl Into<String>) {
        self.push(LlmMessage::assistant(content, Vec::new()));
    }

    /// Append an assistant message that requests tool calls.
    pub fn add_assistant_tool_calls(&mut self, content: impl Into<String>, calls: Vec<ToolCall>) {
        self.push(LlmMessage::assistant(content, calls));
    }

    /// Append a system message (after the conversation so far, not at index 0).
    pub fn add_system(&mut self, content: impl Into<String>) {
        self.push(LlmMessage::system(content));
    }

    /// Append the result of `call`.
    pub fn add_tool_result(&mut self, call: &ToolCall, content: impl Into<String>) {
        self.push(LlmMessage::tool_result(call, content));
    }

    /// Estimated tokens of the whole history.
    pub fn estimated_tokens(&self) -> u64 {
        self.messages.iter().map(estimate_message_tokens).sum()
    }

    /// Keep at most `max_messages` messages: the system prompt and the most recent others.
    ///
    /// The system prompt is always kept (even when `max_messages` is 0). Tool results whose
    /// call was cut off are dropped too, because providers reject a tool result without its
    /// call. For budgets, summaries and a structured report, use
    /// [`compact_history`](crate::compact_history).
    pub fn truncate(&mut self, max_messages: usize) {
        let pinned = usize::from(self.has_system_prompt());
        let keep = max_messages.saturating_sub(pinned);
        let others = self.messages.len() - pinned;
        if others <= keep {
            return;
        }
        let drop = others - keep;
        self.messages.drain(pinned..pinned + drop);
        while self
            .messages
            .get(pinned)
            .is_some_and(|m| m.role == LlmRole::Tool)
        {
            self.messages.remove(pinned);
        }
    }
}

impl From<Vec<LlmMessage>> for ConversationHistory {
    fn from(messages: Vec<LlmMessage>) -> Self {
        Self::from_list(messages)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn contents(history: &ConversationHistory) -> Vec<&str> {
        history.messages().map(|m| m.content.as_str()).collect()
    }

    #[test]
    fn set_system_replaces_or_inserts_at_index_zero() {
        let mut history = ConversationHistory::new(None);
        history.add_user("hi");
        history.set_system("rules");
        assert_eq!(contents(&history), ["rules", "hi"]);
        history.set_system("new rules");
        assert_eq!(contents(&history), ["new rules", "hi"]);
        history.reset_to_system("fresh");
        assert_eq!(contents(&history), ["fresh"]);
    }

    #[test]
    fn add_system_appends_rather_than_replacing_the_prompt() {
        let mut history = ConversationHistory::new(Some("rules"));
        history.add_user("hi");
        history.add_system("note");
        assert_eq!(contents(&history), ["rules", "hi", "note"]);
        assert_eq!(history.system_prompt(), Some("rules"));
    }

    #[test]
    fn truncate_keeps_the_system_prompt_and_the_newest_messages() {
        let mut history = ConversationHistory::new(Some("rules"));
        for i in 0..5 {
            history.add_user(format!("u{i}"));
        }
        history.truncate(3);
        assert_eq!(contents(&history), ["rules", "u3", "u4"]);
        history.truncate(0);
        assert_eq!(contents(&history), ["rules"]);
    }

    /// A history that asked the time and holds the clock tool's call and result.
    fn asked_the_clock() -> ConversationHistory {
        let call = ToolCall::new("clock", json!({}));
        let mut history = ConversationHistory::new(Some("rules"));
        history.add_user("time?");
        history.add_assistant_tool_calls("", vec![call.clone()]);
        history.add_tool_result(&call, "12:00");
        history
    }

    #[test]
    fn truncate_drops_tool_results_whose_call_was_cut() {
        let mut history = asked_the_clock();
        history.add_assistant("it is noon");
        history.truncate(3);
        assert_eq!(contents(&history), ["rules", "it is noon"]);
    }

    #[test]
    fn serde_round_trip_is_the_message_list() {
        let history = asked_the_clock();
        let json = serde_json::to_value(&history).unwrap();
        assert!(json.is_array());
        let back: ConversationHistory = serde_json::from_value(json).unwrap();
        assert_eq!(back, history);
        let mut other = ConversationHistory::default();
        other.replace(history.to_list());
        assert_eq!(other, history);
    }
}
