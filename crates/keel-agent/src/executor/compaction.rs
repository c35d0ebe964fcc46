//! History compaction on a thread: the operator's [`AgentExecutor::compact_thread`] and the
//! engine's automatic compaction when a model call's context would not fit the model's
//! window. Both append one compaction checkpoint to the thread's log (decision 124): the log
//! stays append-only, and the model sees the compacted history from then on, across restarts.

use std::sync::Arc;

use keel_core::{AgentError, AgentResult, ContextManifest, ThreadId};
use keel_events::payload::ContextCompactedPayload;
use keel_events::{RunEvent, RunEventBuilder};
use keel_llm::{
    compact_history, compacted_view, compaction_checkpoint, CompactionStrategy,
    ConversationHistory, HistoryCompactionRequest, HistoryCompactionResult, Llm, LlmMessage,
    ModelProfile,
};
use keel_runtime::AuthContext;
use serde::{Deserialize, Serialize};

use super::run::RunLoop;
use super::state::*;

/// Automatic compaction: before a model call whose estimated context (system prompt,
/// history, tools) exceeds `trigger_ratio` of the model's context window, the thread's
/// history is compacted toward `target_ratio` of the window, the compaction is persisted,
/// and a `context.compacted` event reports the estimates before and after.
///
/// ```
/// use keel_agent::{Agent, AutoCompaction};
/// use keel_core::AgentCard;
/// use keel_llm::CompactionStrategy;
/// let agent = Agent::builder(AgentCard::new("a", "long talks", "http://127.0.0.1:0"))
///     .compaction(AutoCompaction::new(CompactionStrategy::Summary).with_context_window(32_000))
///     .build()
///     .unwrap();
/// assert_eq!(agent.compaction().unwrap().context_window, Some(32_000));
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct AutoCompaction {
    /// How to compact.
    pub strategy: CompactionStrategy,
    /// Compact when the estimate exceeds this fraction of the window (1.0: only when it
    /// would not fit at all).
    pub trigger_ratio: f64,
    /// The fraction of the window the compacted context aims for (`tokens` and `summary`
    /// keep the newest messages within it).
    pub target_ratio: f64,
    /// Most history messages `recent` keeps.
    pub max_messages: usize,
    /// Newest messages `summary` keeps verbatim.
    pub preserve_recent: usize,
    /// Longest summary, in tokens.
    pub summary_max_tokens: u64,
    /// The window to keep within; the model profile's `context_window` when unset. With
    /// neither, nothing is compacted automatically.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub context_window: Option<u64>,
}

impl Default for AutoCompaction {
    fn default() -> Self {
        let request = HistoryCompactionRequest::default();
        Self {
            strategy: CompactionStrategy::Tokens,
            trigger_ratio: 1.0,
            target_ratio: 0.5,
            max_messages: request.max_messages,
            preserve_recent: request.preserve_recent,
            summary_max_tokens: request.summary_max_tokens,
            context_window: None,
        }
    }
}

impl AutoCompaction {
    /// Automatic compaction with this strategy and the default thresholds.
    pub fn new(strategy: CompactionStrategy) -> Self {
        Self {
            strategy,
            ..Self::default()
        }
    }

    /// Keep within this window instead of the model profile's.
    #[must_use]
    pub fn with_context_window(mut self, tokens: u64) -> Self {
        self.context_window = Some(tokens);
        self
    }

    /// Compact when the estimate exceeds this fraction of the window.
    #[must_use]
    pub fn with_trigger_ratio(mut self, ratio: f64) -> Self {
        self.trigger_ratio = ratio;
        self
    }

    /// Aim for this fraction of the window.
    #[must_use]
    pub fn with_target_ratio(mut self, ratio: f64) -> Self {
        self.target_ratio = ratio;
        self
    }

    fn window(&self, profile: &ModelProfile) -> Option<u64> {
        self.context_window.or(profile.context_window)
    }

    fn request(&self, window: u64, thread_id: &ThreadId) -> HistoryCompactionRequest {
        HistoryCompactionRequest {
            strategy: self.strategy,
            max_messages: self.max_messages,
            max_tokens: (window as f64 * self.target_ratio) as u64,
            preserve_recent: self.preserve_recent,
            summary_max_tokens: self.summary_max_tokens,
            thread_id: Some(thread_id.clone()),
            metadata: None,
        }
    }
}

impl AgentExecutor {
    /// Compact a thread's history as `request` says, and persist the result: the model sees
    /// the compacted history at the thread's next step, in this process or any other, after
    /// a restart too. Tool calls stay with their results and the newest turn is kept
    /// ([`compact_history`]); `summary` asks the agent's model for the summary.
    ///
    /// The thread must be idle: while a run holds it this is [`AgentError::Overloaded`]
    /// (retry after the lease time-to-live). A history already within the limits is left as
    /// it is and the result says nothing was removed.
    pub async fn compact_thread(
        &self,
        auth: &AuthContext,
        thread_id: &ThreadId,
        request: &HistoryCompactionRequest,
    ) -> AgentResult<HistoryCompactionResult> {
        let inner = &self.inner;
        let store = inner.runtime.thread_store();
        let holder = format!("{}:compaction", inner.config.holder);
        let lease = store
            .acquire_lease(auth, thread_id, &holder, inner.config.lease_ttl)
            .await?
            .ok_or_else(|| AgentError::Overloaded {
                limit: "flows on a thread at once (a run holds it)".into(),
                max: 1,
                retry_after: inner.config.lease_ttl,
            })?;
        let compacted = async {
            // What the model sees starts at the newest checkpoint: read back to it only.
            let log = super::context::history_window(store.as_ref(), auth, thread_id, None).await?;
            let llm = inner.model();
            let mut request = request.clone();
            request.thread_id = Some(thread_id.clone());
            let (result, checkpoint) =
                compaction_of(&log, inner.agent.instructions(), llm.as_ref(), &request).await?;
            if let Some(checkpoint) = checkpoint {
                store.append_history(auth, &lease, &[checkpoint]).await?;
            }
            Ok::<_, AgentError>(result)
        }
        .await;
        let released = store.release_lease(auth, &lease).await;
        let result = compacted?;
        released?;
        Ok(result)
    }
}

impl Inner {
    /// The agent's model, or the runtime's default.
    pub(super) fn model(&self) -> Arc<dyn Llm> {
        self.agent
            .llm()
            .cloned()
            .unwrap_or_else(|| self.runtime.default_llm())
    }
}

impl RunLoop<'_> {
    /// Automatic compaction: when the agent asks for it and `manifest` exceeds its
    /// threshold, compact the run's history (the thread's log), append the checkpoint under
    /// the lease and return what was done; `None` when nothing was compacted.
    pub(super) async fn compact_when_over(
        &mut self,
        manifest: &ContextManifest,
        system: &str,
        llm: &dyn Llm,
    ) -> AgentResult<Option<(HistoryCompactionResult, u64)>> {
        let Some(auto) = self.inner.agent.compaction() else {
            return Ok(None);
        };
        let Some(window) = auto.window(&llm.profile()) else {
            return Ok(None);
        };
        if (manifest.total_estimated_tokens as f64) <= window as f64 * auto.trigger_ratio {
            return Ok(None);
        }
        let request = auto.request(window, &self.flow.thread_id);
        let (result, checkpoint) = compaction_of(&self.history, system, llm, &request).await?;
        let Some(checkpoint) = checkpoint else {
            return Ok(None);
        };
        self.append(vec![checkpoint]).await?;
        Ok(Some((result, window)))
    }
}

/// The `context.compacted` event of an automatic compaction: the whole request's estimate
/// before and after.
pub(super) fn compacted_event(
    result: &HistoryCompactionResult,
    window: u64,
    before_tokens: u64,
    after_tokens: u64,
) -> RunEventBuilder {
    RunEvent::context_compacted(ContextCompactedPayload {
        strategy: serde_json::to_value(result.strategy)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default(),
        before_tokens,
        after_tokens,
        before_messages: result.before_messages,
        after_messages: result.after_messages,
        context_window: Some(window),
        summary_created: result.summary_created,
    })
}

/// Compact what the model sees of `log` (its [`compacted_view`]), the system prompt pinned
/// in front so that it counts toward the budgets and is never removed. Returns the result
/// and, when something was removed, the checkpoint to append.
async fn compaction_of(
    log: &[LlmMessage],
    system: &str,
    llm: &dyn Llm,
    request: &HistoryCompactionRequest,
) -> AgentResult<(HistoryCompactionResult, Option<LlmMessage>)> {
    let pinned = !system.is_empty();
    let mut history = ConversationHistory::new(pinned.then_some(system));
    let mut messages = history.to_list();
    messages.extend(compacted_view(log).iter().cloned());
    history.replace(messages);
    let result = compact_history(llm, &mut history, request).await?;
    if result.removed_messages == 0 && !result.summary_created {
        return Ok((result, None));
    }
    let mut compacted = history.to_list();
    if pinned {
        compacted.remove(0);
    }
    Ok((result, Some(compaction_checkpoint(&result, compacted))))
}
