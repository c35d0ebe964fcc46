//! Provider-neutral conversation messages, tool declarations and tool calls, defined in
//! `keel_core::conversation` (so stores need not depend on this crate) and re-exported here
//! under their old paths.

// The providers read attachments with them.
#[cfg(any(feature = "openai", feature = "anthropic", feature = "gemini"))]
pub(crate) use keel_core::conversation::{is_image, media_type_of};
pub use keel_core::conversation::{LlmMessage, LlmRole, ToolCall, ToolSpec};
