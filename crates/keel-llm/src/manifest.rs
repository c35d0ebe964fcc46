//! Context manifests: an estimate, per section, of what is about to enter a model, prepared
//! before every call so budgets can be checked before tokens are spent.

use std::sync::Arc;

use keel_core::{ContextItem, ContextManifest, RunContext, RunId, ThreadId};

use crate::{estimate_tokens, LlmMessage, LlmRequest, LlmRole, ModelProfile, ToolSpec};

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
    estimate_turn_tokens(&message.content, &message.tool_calls)
}

/// Estimated tokens of a text and the tool calls beside it (a message, or a model's answer).
pub(crate) fn estimate_turn_tokens(content: &str, tool_calls: &[crate::ToolCall]) -> u64 {
    let calls: u64 = tool_calls
        .iter()
        .map(|call| estimate_tokens(&call.name) + estimate_json_tokens(&call.arguments))
        .sum();
    estimate_tokens(content) + calls
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
    prepare_manifest_reusing(request, profile, ids, &mut ManifestEstimates::default())
}

/// The estimates [`prepare_manifest_reusing`] keeps between the requests of one
/// conversation: each message's (known by its id and position) and the tool specs'. A
/// request that repeats the previous one's messages and tools and adds a few is estimated
/// for what it adds, not for the whole conversation again.
#[derive(Debug, Clone, Default)]
pub struct ManifestEstimates {
    /// Per message of the last request: its id and estimate.
    messages: Vec<(String, u64)>,
    /// The last request's tool specs and their estimate.
    tools: Option<(Arc<Vec<ToolSpec>>, u64)>,
}

impl ManifestEstimates {
    fn message(&mut self, index: usize, message: &LlmMessage) -> u64 {
        if let Some((id, tokens)) = self.messages.get(index) {
            if *id == message.id {
                return *tokens;
            }
            self.messages.truncate(index);
        }
        let tokens = estimate_message_tokens(message);
        self.messages.push((message.id.clone(), tokens));
        tokens
    }

    fn tools(&mut self, tools: &Arc<Vec<ToolSpec>>) -> u64 {
        if tools.is_empty() {
            return 0;
        }
        match &self.tools {
            // The same shared specs, or equal ones.
            Some((known, tokens)) if Arc::ptr_eq(known, tools) || known == tools => *tokens,
            _ => {
                // The specs serialise infallibly (strings and JSON values only); an empty
                // estimate would only under-count, never fail the call.
                let tokens = estimate_json_tokens(tools.as_slice());
                self.tools = Some((Arc::clone(tools), tokens));
                tokens
            }
        }
    }
}

/// [`prepare_manifest`] for one request of a conversation whose earlier requests were
/// estimated into `estimates`: a message with the id and position it had there, and the
/// same tool specs, are not estimated again. The manifest is the one `prepare_manifest`
/// prepares.
///
/// ```
/// use keel_llm::{prepare_manifest, prepare_manifest_reusing, LlmMessage, LlmRequest, ManifestEstimates, ManifestIds, ModelProfile};
/// let profile = ModelProfile::new("mock", "mock");
/// let mut estimates = ManifestEstimates::default();
/// let mut messages = vec![LlmMessage::user("first question")];
/// for answer in ["an answer", "another"] {
///     let request = LlmRequest::new(messages.clone());
///     let reused = prepare_manifest_reusing(&request, &profile, ManifestIds::default(), &mut estimates);
///     assert_eq!(reused, prepare_manifest(&request, &profile, ManifestIds::default()));
///     messages.push(LlmMessage::assistant(answer, vec![]));
///     messages.push(LlmMessage::user("and then?"));
/// }
/// ```
pub fn prepare_manifest_reusing(
    request: &LlmRequest,
    profile: &ModelProfile,
    ids: ManifestIds,
    estimates: &mut ManifestEstimates,
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
        let tokens = estimates.message(index, message);
        if index < leading_system {
            system_tokens += tokens;
        } else if Some(index) == last_user {
            user_tokens += tokens;
        } else {
            history_tokens += tokens;
        }
    }
    estimates.messages.truncate(messages.len());
    let mut tool_prompt_tokens = estimates.tools(&request.tools);
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
    fn reused_estimates_follow_the_messages_by_id_and_position() {
        let profile = ModelProfile::new("mock", "mock");
        let ids = ManifestIds::default;
        let mut estimates = ManifestEstimates::default();
        let spec = |name: &str, parameters| ToolSpec {
            name: name.into(),
            description: format!("the {name} tool"),
            parameters,
        };
        let tool = spec("echo", json!({"type": "object"}));
        let mut messages = vec![
            LlmMessage::system("be brief"),
            LlmMessage::user("hello there"),
        ];
        let request = LlmRequest::new(messages.clone()).with_tools(vec![tool.clone()]);
        let first = prepare_manifest_reusing(&request, &profile, ids(), &mut estimates);
        assert_eq!(first, prepare_manifest(&request, &profile, ids()));

        // A message known by its id and position is not estimated again (here its text
        // changed under the same id, which the engine never does, to show the reuse).
        messages[1].content = "a much longer greeting than before".into();
        let request = LlmRequest::new(messages.clone()).with_tools(vec![tool.clone()]);
        let reused = prepare_manifest_reusing(&request, &profile, ids(), &mut estimates);
        assert_eq!(reused.user_tokens, first.user_tokens);

        // A new system prompt (a new message) and other tools are estimated afresh, and a
        // shorter conversation drops what it no longer has.
        messages[0] = LlmMessage::system("be very brief, and polite, and precise");
        messages[1] = LlmMessage::user("hi");
        let other = spec(
            "lookup",
            json!({"type": "object", "properties": {"word": {"type": "string"}}}),
        );
        for request in [
            LlmRequest::new(messages.clone()).with_tools(vec![other.clone()]),
            LlmRequest::new(messages[..1].to_vec()),
            LlmRequest::new(messages.clone()).with_tools(vec![tool, other]),
        ] {
            let reused = prepare_manifest_reusing(&request, &profile, ids(), &mut estimates);
            assert_eq!(reused, prepare_manifest(&request, &profile, ids()));
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
