//! Real model providers over HTTP, each behind its Cargo feature: an OpenAI-compatible chat
//! completions client (`openai`), Anthropic Messages (`anthropic`) and Google Gemini
//! (`gemini`). They share one builder ([`ProviderBuilder`]), one request/response skeleton
//! (`wire`: each provider maps only its own request, answer, stream events and error codes)
//! and one HTTP layer: configurable timeouts, retries with exponential backoff and jitter
//! that honour `Retry-After`, typed [`LlmError`](crate::LlmError)s, and incremental SSE
//! decoding.
//!
//! **Invariant:** an API key never reaches a log, a `Debug` print or an error message.

mod assembler;
mod attachments;
mod builder;
mod http;
#[cfg(any(feature = "anthropic", feature = "gemini"))]
mod turns;
mod wire;

#[cfg(feature = "anthropic")]
mod anthropic;
#[cfg(feature = "gemini")]
mod gemini;
#[cfg(feature = "openai")]
mod openai;

#[cfg(feature = "anthropic")]
pub use anthropic::{AnthropicBuilder, AnthropicLlm};
pub use builder::ProviderBuilder;
#[cfg(feature = "gemini")]
pub use gemini::{GeminiBuilder, GeminiLlm};
pub use http::HttpOptions;
#[cfg(feature = "openai")]
pub use openai::{OpenAiBuilder, OpenAiLlm};
