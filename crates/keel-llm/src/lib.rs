//! Keel's model interface: the [`Llm`] trait, the provider-neutral [`LlmMessage`], and
//! [`MockLlm`], a deterministic offline model for tests, examples and the demo agent.
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

mod message;
mod mock;

pub use message::{LlmMessage, LlmRole, ToolCall, ToolSpec};
pub use mock::{MockLlm, MockResponse};

use async_trait::async_trait;
use keel_core::AgentResult;
use serde::{Deserialize, Serialize};

/// Token usage reported (or estimated) for one model call.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Tokens sent to the model.
    pub input_tokens: u64,
    /// Tokens the model produced.
    pub output_tokens: u64,
}

/// One completion request: the conversation so far and the tools the model may call.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LlmRequest {
    /// The conversation, system prompt first.
    pub messages: Vec<LlmMessage>,
    /// Tools offered to the model.
    #[serde(default)]
    pub tools: Vec<ToolSpec>,
}

impl LlmRequest {
    /// A request with these messages and no tools.
    pub fn new(messages: Vec<LlmMessage>) -> Self {
        Self {
            messages,
            tools: Vec::new(),
        }
    }

    /// Offer tools to the model.
    #[must_use]
    pub fn with_tools(mut self, tools: Vec<ToolSpec>) -> Self {
        self.tools = tools;
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
}

/// A language model. Implementations must be cheap to share (`Arc<dyn Llm>`).
#[async_trait]
pub trait Llm: Send + Sync {
    /// The model's name, for reports and errors.
    fn model_name(&self) -> &str;

    /// Complete the conversation once.
    async fn complete(&self, request: LlmRequest) -> AgentResult<LlmResponse>;
}

/// A rough token estimate (about four characters per token), used where a provider gives no
/// usage figures.
pub fn estimate_tokens(text: &str) -> u64 {
    (text.chars().count() as u64).div_ceil(4)
}
