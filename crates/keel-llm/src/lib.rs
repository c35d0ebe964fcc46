//! Keel's model interface: the [`Llm`] trait, the provider-neutral [`LlmMessage`],
//! [`ConversationHistory`] with its compaction, [`ContextManifest`](keel_core::ContextManifest)
//! preparation, and [`MockLlm`], a deterministic offline model for tests, examples and the demo
//! agent. Real providers (OpenAI-compatible, Anthropic, Gemini) sit behind the `openai`,
//! `anthropic` and `gemini` features (`providers` enables all three).
//!
//! ```
//! use keel_llm::{Llm, LlmMessage, LlmRequest, MockLlm};
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), keel_core::AgentError> {
//! let llm = MockLlm::new();
//! let response = llm.complete(LlmRequest::new(vec![LlmMessage::user("hello")])).await?;
//! assert_eq!(response.content.as_deref(), Some("You said: hello"));
//! # Ok(())
//! # }
//! ```
//!
//! **Architecture invariant:** only the provider modules know a provider's wire format; the
//! rest of Keel sees [`LlmRequest`], [`LlmResponse`] and [`LlmStreamEvent`] alone.

mod compaction;
mod error;
mod history;
mod manifest;
mod message;
mod mock;
mod profile;
#[cfg(any(feature = "openai", feature = "anthropic", feature = "gemini"))]
pub mod providers;
mod spec;
mod stream;

pub use compaction::{
    checkpoint_history, compact_history, compacted_view, compaction_checkpoint,
    is_compaction_checkpoint, CompactionStrategy, HistoryCompactionRequest,
    HistoryCompactionResult, CHECKPOINT_KEY,
};
pub use error::{LlmError, LlmErrorKind};
pub use history::ConversationHistory;
pub use manifest::{
    estimate_message_tokens, prepare_manifest, prepare_manifest_reusing, ManifestEstimates,
    ManifestIds,
};
pub use message::{LlmMessage, LlmRole, ToolCall, ToolSpec};
pub use mock::{MockLlm, MockResponse};
pub use profile::ModelProfile;
pub use spec::{llm_from_spec, llm_from_spec_with_key};
pub use stream::{collect_stream, LlmStream, LlmStreamEvent};

use std::sync::Arc;

use async_trait::async_trait;
use keel_core::AgentResult;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Token usage reported (or estimated) for one model call.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Tokens sent to the model.
    pub input_tokens: u64,
    /// Tokens the model produced.
    pub output_tokens: u64,
}

/// One completion request: the conversation so far and the tools the model may call.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LlmRequest {
    /// The conversation, system prompt first. Shared rather than owned: the thread engine
    /// keeps the model's view of a thread from one step to the next and hands each request
    /// the same messages, so a step adds its new messages instead of copying the whole
    /// history (a provider only reads them; `Arc::make_mut` gives a private copy to change).
    pub messages: Arc<Vec<LlmMessage>>,
    /// Tools offered to the model, shared as the messages are: an agent offers the same
    /// specs at every step.
    #[serde(default)]
    pub tools: Arc<Vec<ToolSpec>>,
    /// A JSON schema the text answer must match (structured output), where the provider
    /// offers it.
    pub output_schema: Option<Value>,
    /// The most tokens the model may produce; providers that require a figure fall back to
    /// the model profile's `max_output_tokens`.
    pub max_output_tokens: Option<u64>,
    /// Sampling temperature; the provider's default when absent.
    pub temperature: Option<f64>,
}

impl LlmRequest {
    /// A request with these messages and no tools: a `Vec<LlmMessage>`, or messages
    /// already shared (`Arc<Vec<LlmMessage>>`).
    pub fn new(messages: impl Into<Arc<Vec<LlmMessage>>>) -> Self {
        Self {
            messages: messages.into(),
            ..Self::default()
        }
    }

    /// Offer tools to the model: a `Vec<ToolSpec>`, or specs already shared.
    #[must_use]
    pub fn with_tools(mut self, tools: impl Into<Arc<Vec<ToolSpec>>>) -> Self {
        self.tools = tools.into();
        self
    }

    /// Ask for a text answer matching this JSON schema.
    ///
    /// ```
    /// use keel_llm::{LlmMessage, LlmRequest};
    /// let schema = serde_json::json!({"type": "object", "properties": {"city": {"type": "string"}}});
    /// let request = LlmRequest::new(vec![LlmMessage::user("where?")]).with_output_schema(schema);
    /// assert!(request.output_schema.is_some());
    /// ```
    #[must_use]
    pub fn with_output_schema(mut self, schema: Value) -> Self {
        self.output_schema = Some(schema);
        self
    }

    /// Cap the answer's length in tokens.
    #[must_use]
    pub fn with_max_output_tokens(mut self, max: u64) -> Self {
        self.max_output_tokens = Some(max);
        self
    }

    /// Set the sampling temperature.
    #[must_use]
    pub fn with_temperature(mut self, temperature: f64) -> Self {
        self.temperature = Some(temperature);
        self
    }
}

/// What a model answered: text, tool calls, or both, with usage.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LlmResponse {
    /// The text answer, if any.
    #[serde(default)]
    pub content: Option<String>,
    /// Tools the model wants run, in order.
    #[serde(default)]
    pub tool_calls: Vec<ToolCall>,
    /// Token usage.
    #[serde(default)]
    pub usage: Usage,
}

impl LlmResponse {
    /// A text-only answer.
    pub fn text(content: impl Into<String>) -> Self {
        Self {
            content: Some(content.into()),
            ..Self::default()
        }
    }

    /// Whether the model is done (asked for no tools).
    pub fn is_final(&self) -> bool {
        self.tool_calls.is_empty()
    }

    /// The output tokens to count against a budget: the provider's figure, or, when it
    /// reported none for an answer that has text or tool calls, a local estimate of that
    /// answer ([`estimate_tokens`] of its text plus its calls' names and arguments). A
    /// provider that omits usage must not make `max_output_tokens` unenforceable.
    ///
    /// ```
    /// use keel_llm::{LlmResponse, Usage};
    /// let unreported = LlmResponse::text("a".repeat(400));
    /// assert_eq!(unreported.output_tokens(), 100);
    /// let reported = LlmResponse { usage: Usage { input_tokens: 0, output_tokens: 7 }, ..unreported };
    /// assert_eq!(reported.output_tokens(), 7);
    /// ```
    pub fn output_tokens(&self) -> u64 {
        if self.usage.output_tokens > 0 {
            return self.usage.output_tokens;
        }
        manifest::estimate_turn_tokens(
            self.content.as_deref().unwrap_or_default(),
            &self.tool_calls,
        )
    }
}

/// A language model. Implementations must be cheap to share (`Arc<dyn Llm>`).
#[async_trait]
pub trait Llm: Send + Sync {
    /// The model's name, for reports and errors.
    fn model_name(&self) -> &str;

    /// Complete the conversation once.
    async fn complete(&self, request: LlmRequest) -> AgentResult<LlmResponse>;

    /// Complete the conversation once, as a stream of [`LlmStreamEvent`]s ending in
    /// [`LlmStreamEvent::Done`] (or an error).
    ///
    /// The default calls [`Llm::complete`] and replays its answer as events, so every model
    /// can be streamed; providers override it to stream for real.
    ///
    /// ```
    /// use keel_llm::{collect_stream, Llm, LlmMessage, LlmRequest, MockLlm};
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), keel_core::AgentError> {
    /// let llm = MockLlm::new();
    /// let response = collect_stream(llm.stream(LlmRequest::new(vec![LlmMessage::user("hi")]))).await?;
    /// assert_eq!(response.content.as_deref(), Some("You said: hi"));
    /// # Ok(())
    /// # }
    /// ```
    fn stream(&self, request: LlmRequest) -> LlmStream<'_> {
        stream::replay_completion(self.complete(request))
    }

    /// What is known about the model: provider, context window, capabilities.
    fn profile(&self) -> ModelProfile {
        ModelProfile::new("unknown", self.model_name())
    }
}

/// A rough token estimate (about four characters per token), used where a provider gives no
/// usage figures.
pub fn estimate_tokens(text: &str) -> u64 {
    (text.chars().count() as u64).div_ceil(4)
}
