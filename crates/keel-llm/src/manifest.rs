//! Context manifests: an estimate, per section, of what is about to enter a model, prepared
//! before every call so budgets can be checked before tokens are spent.

use keel_core::{ContextItem, ContextManifest, RunContext, RunId, ThreadId};

use crate::{estimate_tokens, LlmMessage, LlmRequest, LlmRole, ModelProfile};

/// The correlation ids a manifest carries.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ManifestIds {
    /// The run.
    pub run_id: Option<RunId>,
    /// The thread.
    pub thread_id: Option<ThreadId>,
    /// The agent.
    pub agent_name: Option<String>,
}

impl ManifestIds {
    /// The ids of a run context, with the agent's name.
    pub fn from_run_context(context: &RunContext, agent_name: Option<&str>) -> Self {
        Self {
            run_id: Some(context.run_id.clone()),
            thread_id: context.thread_id.clone(),
            agent_name: agent_name.map(str::to_owned),
        }
    }
}

/// Estimated tokens of one message: its text plus the names and arguments of its tool calls.
pub fn estimate_message_tokens(message: &LlmMessage) -> u64 {
    let calls: u64 = message
        .tool_calls
        .iter()
        .map(|call| estimate_tokens(&call.name) + estimate_json_tokens(&call.arguments))
        .sum();
    estimate_tokens(&message.content) + calls
}

/// [`estimate_tokens`] of `value`'s compact JSON, counted as it is written rather than from a
/// copy of the text: a step estimates every message of the history and the tool specs, and
/// writing each out only to count it was most of preparing a manifest. A value that does not
/// serialize counts as nothing.
fn estimate_json_tokens<T: serde::Serialize + ?Sized>(value: &T) -> u64 {
    /// Counts the characters written: every byte that does not continue a UTF-8 sequence.
    struct Chars(u64);
    impl std::io::Write for Chars {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0 += bytes.iter().filter(|b| (**b & 0xC0) != 0x80).count() as u64;
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut chars = Chars(0);
    match serde_json::to_writer(&mut chars, value) {
        Ok(()) => chars.0.div_ceil(4),
        Err(_) => 0,
    }
}

/// Prepare the [`ContextManifest`] of `request` for the model described by `profile`.
///
/// Sections: `system` is the leading system messages (the instructions); `tools` is the JSON
/// of the offered tool specs and any output schema; `user` is the last user message;
/// `history` is everything else.
///
/// ```
/// use keel_llm::{prepare_manifest, LlmMessage, LlmRequest, ManifestIds, ModelProfile};
/// let request = LlmRequest::new(vec![
///     LlmMessage::system("be brief"),
///     LlmMessage::user("earlier"),
///     LlmMessage::assistant("ok", vec![]),
///     LlmMessage::user("now"),
/// ]);
/// let profile = ModelProfile::new("mock", "mock").with_context_window(8192);
/// let manifest = prepare_manifest(&request, &profile, ManifestIds::default());
/// assert_eq!(manifest.user_tokens, 1);
/// assert_eq!(manifest.context_window, Some(8192));
/// assert_eq!(
///     manifest.total_estimated_tokens,
///     manifest.system_tokens + manifest.tool_prompt_tokens + manifest.history_tokens + manifest.user_tokens
/// );
/// ```
pub fn prepare_manifest(
    request: &LlmRequest,
    profile: &ModelProfile,
    ids: ManifestIds,
) -> ContextManifest {
    let messages = &request.messages;
    let leading_system = messages
        .iter()
        .take_while(|m| m.role == LlmRole::System)
        .count();
    let last_user = messages.iter().rposition(|m| m.role == LlmRole::User);

    let mut system_tokens = 0;
    let mut history_tokens = 0;
    let mut user_tokens = 0;
    for (index, message) in messages.iter().enumerate() {
        let tokens = estimate_message_tokens(message);
        if index < leading_system {
            system_tokens += tokens;
        } else if Some(index) == last_user {
            user_tokens += tokens;
        } else {
            history_tokens += tokens;
        }
    }
    let mut tool_prompt_tokens = if request.tools.is_empty() {
        0
    } else {
        // The specs serialise infallibly (strings and JSON values only); an empty estimate
        // would only under-count, never fail the call.
        estimate_json_tokens(&request.tools)
    };
    if let Some(schema) = &request.output_schema {
        tool_prompt_tokens += estimate_json_tokens(schema);
    }

    let total = system_tokens + tool_prompt_tokens + history_tokens + user_tokens;
    let item = |section: &str, tokens| ContextItem {
        section: section.into(),
        tokens,
    };
    ContextManifest {
        run_id: ids.run_id,
        thread_id: ids.thread_id,
        agent_name: ids.agent_name,
        provider: Some(profile.provider.clone()),
        model: Some(profile.model.clone()),
        system_tokens,
        tool_prompt_tokens,
        history_tokens,
        user_tokens,
        total_estimated_tokens: total,
        context_window: profile.context_window,
        context_items: vec![
            item("system", system_tokens),
            item("tools", tool_prompt_tokens),
            item("history", history_tokens),
            item("user", user_tokens),
        ],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ToolCall, ToolSpec};
    use serde_json::json;

    #[test]
    fn json_is_counted_as_its_text_would_be() {
        for value in [
            json!({}),
            json!({"q": "weather in Paris", "n": [1, 2.5, null, true]}),
            json!({"ключ": "日本語のテキスト", "emoji": "🦀🦀", "esc": "a\"b\\c\n"}),
        ] {
            assert_eq!(
                estimate_json_tokens(&value),
                estimate_tokens(&value.to_string()),
                "{value}"
            );
        }
    }

    #[test]
    fn sections_split_system_tools_history_and_the_last_user_message() {
        let call = ToolCall::new("lookup", json!({"q": "weather in Paris"}));
        let request = LlmRequest::new(vec![
            LlmMessage::system("You are a helpful assistant."), // 28 chars -> 7
            LlmMessage::user("first question"),                 // 14 -> 4
            LlmMessage::assistant("", vec![call.clone()]),
            LlmMessage::tool_result(&call, "sunny"), // 5 -> 2
            LlmMessage::user("and tomorrow?"),       // 13 -> 4
        ])
        .with_tools(vec![ToolSpec {
            name: "lookup".into(),
            description: "Look something up".into(),
            parameters: json!({"type": "object"}),
        }]);
        let ids = ManifestIds {
            run_id: Some(RunId::from("run-1")),
            thread_id: Some(ThreadId::from("thread-1")),
            agent_name: Some("helper".into()),
        };
        let profile = ModelProfile::new("openai", "gpt-4o").with_context_window(128_000);
        let m = prepare_manifest(&request, &profile, ids);
        assert_eq!(m.system_tokens, 7);
        assert_eq!(m.user_tokens, 4);
        let call_tokens = estimate_tokens("lookup") + estimate_tokens(&call.arguments.to_string());
        assert_eq!(m.history_tokens, 4 + call_tokens + 2);
        assert!(m.tool_prompt_tokens > 0);
        assert_eq!(
            m.total_estimated_tokens,
            m.system_tokens + m.tool_prompt_tokens + m.history_tokens + m.user_tokens
        );
        assert_eq!(m.context_window, Some(128_000));
        assert_eq!(m.provider.as_deref(), Some("openai"));
        assert_eq!(m.thread_id, Some(ThreadId::from("thread-1")));
        let sections: Vec<&str> = m.context_items.iter().map(|i| i.section.as_str()).collect();
        assert_eq!(sections, ["system", "tools", "history", "user"]);
    }

    #[test]
    fn an_empty_request_is_all_zero() {
        let m = prepare_manifest(
            &LlmRequest::default(),
            &ModelProfile::new("mock", "mock"),
            ManifestIds::default(),
        );
        assert_eq!(m.total_estimated_tokens, 0);
        assert_eq!(m.context_window, None);
    }
}
