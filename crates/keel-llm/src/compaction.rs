//! History compaction: shrink a [`ConversationHistory`] by message count, by token budget, or
//! by asking the model to summarise what is removed, and report what changed.
//!
//! **Invariant:** compaction never separates an assistant message that requests tool calls
//! from the tool results that answer it, and always keeps the system prompt and the newest
//! turn; providers reject a tool result without its call.

use std::fmt::Write as _;

use keel_core::{AgentResult, Metadata, ThreadId};
use serde::{Deserialize, Serialize};
use serde_json::json;
use tracing::Instrument;

use crate::{
    estimate_message_tokens, ConversationHistory, Llm, LlmError, LlmErrorKind, LlmMessage,
    LlmRequest, LlmRole,
};

/// How [`compact_history`] shrinks a history.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CompactionStrategy {
    /// Keep the newest messages within `max_messages`.
    #[default]
    Recent,
    /// Keep the newest messages within `max_tokens`.
    Tokens,
    /// When over either limit, replace all but the `preserve_recent` newest messages with a
    /// summary written by the model.
    Summary,
}

/// What compaction to run. Transport-neutral: not a task part, never shown to the model.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct HistoryCompactionRequest {
    /// The strategy.
    pub strategy: CompactionStrategy,
    /// Most messages to keep, the system prompt included (`recent`; `summary` trigger).
    pub max_messages: usize,
    /// Most estimated tokens to keep, the system prompt included (`tokens`; `summary`
    /// trigger).
    pub max_tokens: u64,
    /// Newest messages `summary` keeps verbatim.
    pub preserve_recent: usize,
    /// Longest summary, in tokens.
    pub summary_max_tokens: u64,
    /// The thread whose history this is; `session_id` is read as an alias.
    #[serde(alias = "session_id")]
    pub thread_id: Option<ThreadId>,
    /// Application metadata.
    pub metadata: Option<Metadata>,
}

impl Default for HistoryCompactionRequest {
    fn default() -> Self {
        Self {
            strategy: CompactionStrategy::Recent,
            max_messages: 20,
            max_tokens: 4000,
            preserve_recent: 6,
            summary_max_tokens: 512,
            thread_id: None,
            metadata: None,
        }
    }
}

impl HistoryCompactionRequest {
    /// A request with this strategy and the default limits.
    pub fn new(strategy: CompactionStrategy) -> Self {
        Self {
            strategy,
            ..Self::default()
        }
    }
}

/// What a compaction did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct HistoryCompactionResult {
    /// The strategy that ran.
    pub strategy: CompactionStrategy,
    /// Messages before.
    pub before_messages: usize,
    /// Messages after (a summary counts as one).
    pub after_messages: usize,
    /// Messages of the original history that were dropped.
    pub removed_messages: usize,
    /// Estimated tokens before.
    pub before_tokens: u64,
    /// Estimated tokens after.
    pub after_tokens: u64,
    /// Whether a summary message was inserted.
    #[serde(default)]
    pub summary_created: bool,
}

/// The metadata key and value that mark a summary message inserted by compaction.
pub(crate) const SUMMARY_MARKER: (&str, &str) = ("keel.kind", "history_summary");

/// Compact `history` in place as `request` says, using `llm` to write summaries.
///
/// `recent` and `tokens` never call the model. A history already within its limits is left
/// as it is.
///
/// ```
/// use keel_llm::{compact_history, CompactionStrategy, ConversationHistory, HistoryCompactionRequest, MockLlm};
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), keel_core::AgentError> {
/// let mut history = ConversationHistory::new(Some("rules"));
/// for i in 0..10 {
///     history.add_user(format!("question {i}"));
///     history.add_assistant(format!("answer {i}"));
/// }
/// let request = HistoryCompactionRequest { max_messages: 5, ..HistoryCompactionRequest::new(CompactionStrategy::Recent) };
/// let result = compact_history(&MockLlm::new(), &mut history, &request).await?;
/// assert_eq!((result.before_messages, result.after_messages, result.removed_messages), (21, 5, 16));
/// assert_eq!(history.system_prompt(), Some("rules"));
/// # Ok(())
/// # }
/// ```
pub async fn compact_history(
    llm: &dyn Llm,
    history: &mut ConversationHistory,
    request: &HistoryCompactionRequest,
) -> AgentResult<HistoryCompactionResult> {
    let span = tracing::info_span!(
        "llm.compact_history",
        strategy = ?request.strategy,
        thread_id = request.thread_id.as_ref().map(|t| t.as_str()),
        model = llm.model_name(),
    );
    compact(llm, history, request).instrument(span).await
}

async fn compact(
    llm: &dyn Llm,
    history: &mut ConversationHistory,
    request: &HistoryCompactionRequest,
) -> AgentResult<HistoryCompactionResult> {
    let before_messages = history.len();
    let before_tokens = history.estimated_tokens();
    let messages = history.to_list();
    let pinned = usize::from(history.has_system_prompt());
    let pinned_tokens: u64 = messages[..pinned].iter().map(estimate_message_tokens).sum();
    let units = units(&messages[pinned..]);

    // `keep_from` is the index (into messages[pinned..]) of the oldest message kept.
    let (keep_from, summarise) = match request.strategy {
        CompactionStrategy::Recent => {
            let budget = request.max_messages.saturating_sub(pinned);
            (keep_newest(&units, |count, _| count <= budget), false)
        }
        CompactionStrategy::Tokens => {
            let budget = request.max_tokens.saturating_sub(pinned_tokens);
            (keep_newest(&units, |_, tokens| tokens <= budget), false)
        }
        CompactionStrategy::Summary => {
            let over = before_messages > request.max_messages || before_tokens > request.max_tokens;
            if over {
                let keep = request.preserve_recent;
                let from = if keep == 0 {
                    messages.len() - pinned
                } else {
                    keep_newest(&units, |count, _| count <= keep)
                };
                (from, true)
            } else {
                (0, false)
            }
        }
    };

    let removed = &messages[pinned..pinned + keep_from];
    let mut summary_created = false;
    if !removed.is_empty() {
        let mut compacted: Vec<LlmMessage> = messages[..pinned].to_vec();
        if summarise {
            let summary = summarise_messages(llm, removed, request.summary_max_tokens).await?;
            let mut message =
                LlmMessage::system(format!("Summary of the earlier conversation:\n{summary}"));
            message
                .metadata
                .insert(SUMMARY_MARKER.0.into(), json!(SUMMARY_MARKER.1));
            compacted.push(message);
            summary_created = true;
        }
        compacted.extend_from_slice(&messages[pinned + keep_from..]);
        history.replace(compacted);
    }

    let result = HistoryCompactionResult {
        strategy: request.strategy,
        before_messages,
        after_messages: history.len(),
        removed_messages: removed.len(),
        before_tokens,
        after_tokens: history.estimated_tokens(),
        summary_created,
    };
    tracing::debug!(?result, "history compacted");
    Ok(result)
}

/// The metadata key of a compaction checkpoint in a thread's history: the
/// [`HistoryCompactionResult`] and, under `history`, the compacted messages.
pub const CHECKPOINT_KEY: &str = "keel.compaction";

/// A compaction checkpoint: the history entry that records, durably and in one append, that
/// everything before it is replaced by `compacted` (decision 124). Appending it leaves the
/// thread's log append-only; [`compacted_view`] reads the history the model then sees. Its
/// content is the summary when one was written (a reader of the raw log sees that text), or
/// a note saying how much was removed.
///
/// ```
/// use keel_llm::{compacted_view, compaction_checkpoint, CompactionStrategy, HistoryCompactionResult, LlmMessage};
/// let old = vec![LlmMessage::user("a"), LlmMessage::assistant("b", vec![]), LlmMessage::user("c")];
/// let result = HistoryCompactionResult { strategy: CompactionStrategy::Recent, before_messages: 3,
///     after_messages: 1, removed_messages: 2, before_tokens: 12, after_tokens: 4, summary_created: false };
/// let mut log = old.clone();
/// log.push(compaction_checkpoint(&result, vec![old[2].clone()]));
/// log.push(LlmMessage::assistant("d", vec![]));
/// let view: Vec<_> = compacted_view(&log).iter().map(|m| m.content.clone()).collect();
/// assert_eq!(view, ["c", "d"]);
/// ```
pub fn compaction_checkpoint(
    result: &HistoryCompactionResult,
    compacted: Vec<LlmMessage>,
) -> LlmMessage {
    let summary = compacted
        .iter()
        .find(|m| is_summary(m))
        .map(|m| m.content.clone());
    let content = summary.unwrap_or_else(|| {
        format!(
            "History compacted: {} earlier messages removed.",
            result.removed_messages
        )
    });
    let mut record = serde_json::to_value(result).unwrap_or_else(|_| json!({}));
    record["history"] = serde_json::to_value(&compacted).unwrap_or_else(|_| json!([]));
    let mut message = LlmMessage::system(content);
    message.metadata.insert(CHECKPOINT_KEY.into(), record);
    message
}

/// Whether `message` is a compaction checkpoint ([`compaction_checkpoint`]).
pub fn is_compaction_checkpoint(message: &LlmMessage) -> bool {
    message.metadata.contains_key(CHECKPOINT_KEY)
}

/// The compacted messages a checkpoint holds; `None` for any other message or a
/// checkpoint that cannot be read.
pub fn checkpoint_history(message: &LlmMessage) -> Option<Vec<LlmMessage>> {
    let history = message.metadata.get(CHECKPOINT_KEY)?.get("history")?;
    serde_json::from_value(history.clone()).ok()
}

/// The history a model sees of a thread's log: after the newest readable compaction
/// checkpoint, its compacted messages then every entry appended after it; without one, the
/// log as it is. Borrowed when there is no checkpoint.
pub fn compacted_view(log: &[LlmMessage]) -> std::borrow::Cow<'_, [LlmMessage]> {
    for (index, entry) in log.iter().enumerate().rev() {
        if let Some(mut history) = checkpoint_history(entry) {
            history.extend_from_slice(&log[index + 1..]);
            return std::borrow::Cow::Owned(history);
        }
    }
    std::borrow::Cow::Borrowed(log)
}

fn is_summary(message: &LlmMessage) -> bool {
    message.metadata.get(SUMMARY_MARKER.0) == Some(&json!(SUMMARY_MARKER.1))
}

/// Split messages into units that must stay together: an assistant message requesting tool
/// calls with the tool results that follow it; every other message alone. Returns each
/// unit's (start index, message count, tokens).
fn units(messages: &[LlmMessage]) -> Vec<(usize, usize, u64)> {
    let mut units: Vec<(usize, usize, u64)> = Vec::new();
    for (index, message) in messages.iter().enumerate() {
        let tokens = estimate_message_tokens(message);
        let joins_previous = message.role == LlmRole::Tool
            && index > 0
            && units.last().is_some_and(|&(start, _, _)| {
                messages[start].role == LlmRole::Assistant && !messages[start].tool_calls.is_empty()
            });
        match units.last_mut() {
            Some(unit) if joins_previous => {
                unit.1 += 1;
                unit.2 += tokens;
            }
            _ => units.push((index, 1, tokens)),
        }
    }
    units
}

/// Walk units from the newest, keeping whole units while `fits(count, tokens)` holds for the
/// running totals; the newest unit is always kept. Returns the index of the oldest kept
/// message, or the length when there are no units.
fn keep_newest(units: &[(usize, usize, u64)], fits: impl Fn(usize, u64) -> bool) -> usize {
    let mut count = 0;
    let mut tokens = 0;
    let mut from = units.last().map_or(0, |&(start, len, _)| start + len);
    for (i, &(start, len, unit_tokens)) in units.iter().enumerate().rev() {
        let newest = i + 1 == units.len();
        if !newest && !fits(count + len, tokens + unit_tokens) {
            break;
        }
        count += len;
        tokens += unit_tokens;
        from = start;
    }
    from
}

async fn summarise_messages(
    llm: &dyn Llm,
    removed: &[LlmMessage],
    max_tokens: u64,
) -> AgentResult<String> {
    let mut transcript = String::new();
    for message in removed {
        // Writing to a String cannot fail.
        let _ = match message.role {
            LlmRole::System => writeln!(transcript, "[system] {}", message.content),
            LlmRole::User => writeln!(transcript, "[user] {}", message.content),
            LlmRole::Assistant => {
                if !message.content.is_empty() {
                    let _ = writeln!(transcript, "[assistant] {}", message.content);
                }
                for call in &message.tool_calls {
                    let _ = writeln!(
                        transcript,
                        "[assistant called tool {}] {}",
                        call.name, call.arguments
                    );
                }
                Ok(())
            }
            LlmRole::Tool => writeln!(
                transcript,
                "[tool {} returned] {}",
                message.tool_name.as_deref().unwrap_or("tool"),
                message.content
            ),
        };
    }
    let request = LlmRequest::new(vec![
        LlmMessage::system(format!(
            "Summarize the following conversation for your own later reference. Keep facts, \
             decisions, names, numbers and open questions; drop pleasantries. Answer with the \
             summary only, in at most {max_tokens} tokens."
        )),
        LlmMessage::user(transcript),
    ])
    .with_max_output_tokens(max_tokens);
    let response = llm.complete(request).await?;
    match response.content.map(|c| c.trim().to_owned()) {
        Some(summary) if !summary.is_empty() => Ok(summary),
        _ => Err(LlmError::new(
            LlmErrorKind::BadResponse,
            llm.model_name(),
            "the model returned no summary",
        )
        .into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{MockLlm, MockResponse, ToolCall};

    fn long_history() -> ConversationHistory {
        let mut history = ConversationHistory::new(Some("rules"));
        for i in 0..4 {
            history.add_user(format!("question {i}"));
            let call = ToolCall::new("lookup", json!({"i": i}));
            history.add_assistant_tool_calls("", vec![call.clone()]);
            history.add_tool_result(&call, format!("result {i}"));
            history.add_assistant(format!("answer {i}"));
        }
        history
    }

    /// Every tool result in `history` follows its call.
    fn pairs_intact(history: &ConversationHistory) -> bool {
        let messages = history.to_list();
        messages.iter().enumerate().all(|(i, m)| {
            m.role != LlmRole::Tool
                || messages[..i].iter().rev().any(|prev| {
                    prev.tool_calls
                        .iter()
                        .any(|c| Some(&c.id) == m.tool_call_id.as_ref())
                })
        })
    }

    /// Compacts [`long_history`] with `llm` and `request`, which must succeed: the common
    /// first step of the strategy tests.
    async fn compact_long_history(
        llm: &MockLlm,
        request: HistoryCompactionRequest,
    ) -> (ConversationHistory, HistoryCompactionResult) {
        let mut history = long_history();
        let result = compact_history(llm, &mut history, &request).await.unwrap();
        (history, result)
    }

    #[tokio::test]
    async fn recent_keeps_the_newest_messages_without_splitting_tool_pairs() {
        // 1 system + 16 others. A budget of 5 messages: 4 others fit only if the cut does
        // not land between a call and its result.
        let request = HistoryCompactionRequest {
            max_messages: 5,
            ..HistoryCompactionRequest::new(CompactionStrategy::Recent)
        };
        let (history, result) = compact_long_history(&MockLlm::new(), request).await;
        assert_eq!(result.before_messages, 17);
        assert!(result.after_messages <= 5);
        assert_eq!(
            result.removed_messages,
            result.before_messages - result.after_messages
        );
        assert_eq!(history.system_prompt(), Some("rules"));
        assert!(pairs_intact(&history));
        assert_eq!(
            history.to_list().last().unwrap().content,
            "answer 3",
            "the newest turn is kept"
        );
        assert!(!result.summary_created);
        assert!(result.after_tokens < result.before_tokens);
    }

    #[tokio::test]
    async fn tokens_keeps_within_the_budget_including_the_system_prompt() {
        let request = HistoryCompactionRequest {
            max_tokens: 20,
            ..HistoryCompactionRequest::new(CompactionStrategy::Tokens)
        };
        let (history, result) = compact_long_history(&MockLlm::new(), request).await;
        assert!(result.after_tokens <= 20, "{result:?}");
        assert!(result.removed_messages > 0);
        assert!(pairs_intact(&history));
        assert_eq!(history.system_prompt(), Some("rules"));
    }

    #[tokio::test]
    async fn summary_replaces_old_messages_with_the_models_summary() {
        let llm = MockLlm::scripted(vec![MockResponse::Text(
            "The user asked four questions.".into(),
        )]);
        let request = HistoryCompactionRequest {
            max_messages: 10,
            preserve_recent: 3,
            ..HistoryCompactionRequest::new(CompactionStrategy::Summary)
        };
        let (history, result) = compact_long_history(&llm, request).await;
        assert!(result.summary_created);
        let messages = history.to_list();
        assert_eq!(messages[0].content, "rules");
        assert_eq!(messages[1].role, LlmRole::System);
        assert!(messages[1]
            .content
            .contains("The user asked four questions."));
        assert_eq!(
            messages[1].metadata.get(SUMMARY_MARKER.0),
            Some(&json!(SUMMARY_MARKER.1))
        );
        // The 3 newest messages are one call, its result and the answer: kept whole.
        assert_eq!(messages.len(), 2 + 3);
        assert_eq!(result.removed_messages, 13);
        assert!(pairs_intact(&history));
        // The model saw the removed messages, tool calls included, and a length limit.
        let asked = &llm.requests()[0];
        assert!(asked.messages[1].content.contains("question 0"));
        assert!(asked.messages[1]
            .content
            .contains("[assistant called tool lookup]"));
        assert_eq!(asked.max_output_tokens, Some(512));
    }

    #[tokio::test]
    async fn a_history_within_its_limits_is_left_alone() {
        let llm = MockLlm::scripted(vec![]);
        let mut history = long_history();
        let before = history.clone();
        for strategy in [
            CompactionStrategy::Recent,
            CompactionStrategy::Tokens,
            CompactionStrategy::Summary,
        ] {
            let request = HistoryCompactionRequest {
                max_messages: 100,
                max_tokens: 10_000,
                ..HistoryCompactionRequest::new(strategy)
            };
            let result = compact_history(&llm, &mut history, &request).await.unwrap();
            assert_eq!(result.removed_messages, 0);
            assert_eq!(history, before);
        }
        assert!(llm.requests().is_empty(), "no summary was requested");
    }

    #[tokio::test]
    async fn a_failed_summary_leaves_the_history_unchanged() {
        let llm = MockLlm::scripted(vec![MockResponse::Error("down".into())]);
        let mut history = long_history();
        let before = history.clone();
        let request = HistoryCompactionRequest {
            max_messages: 4,
            ..HistoryCompactionRequest::new(CompactionStrategy::Summary)
        };
        assert!(compact_history(&llm, &mut history, &request).await.is_err());
        assert_eq!(history, before);
    }

    #[test]
    fn request_reads_session_id_as_thread_id_and_fills_defaults() {
        let request: HistoryCompactionRequest =
            serde_json::from_value(json!({"strategy": "summary", "session_id": "t-1"})).unwrap();
        assert_eq!(request.strategy, CompactionStrategy::Summary);
        assert_eq!(request.thread_id, Some(ThreadId::from("t-1")));
        assert_eq!(request.max_messages, 20);
        assert_eq!(request.preserve_recent, 6);
        let result = HistoryCompactionResult {
            strategy: CompactionStrategy::Tokens,
            before_messages: 3,
            after_messages: 2,
            removed_messages: 1,
            before_tokens: 30,
            after_tokens: 20,
            summary_created: false,
        };
        let json = serde_json::to_value(result).unwrap();
        assert_eq!(json["strategy"], "tokens");
        assert_eq!(
            serde_json::from_value::<HistoryCompactionResult>(json).unwrap(),
            result
        );
    }
}
