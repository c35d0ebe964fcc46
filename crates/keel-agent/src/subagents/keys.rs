//! The names subagents use: built-in tool names, registry and store keys.

use keel_core::ThreadId;

/// The name of the built-in tool that creates a subagent.
pub const SUBAGENT_CREATE_TOOL: &str = "subagent_create";
/// The name of the built-in tool that messages an existing (resumable) subagent.
pub const SUBAGENT_MESSAGE_TOOL: &str = "subagent_message";
/// The name of [`SessionStatusTool`](crate::SessionStatusTool).
pub const SESSION_STATUS_TOOL: &str = "session_status";

/// Registry metadata key: the spec a child was created from.
pub(super) const META_SPEC: &str = "subagent";
/// Registry metadata key: the parent's agent (card name), whose scheduler wakes the parent
/// thread when a result is queued on it from another process.
pub(super) const META_PARENT_AGENT: &str = "parent_agent";
/// Registry metadata key: how the child talks back to its parent.
pub(super) const META_COMMUNICATION: &str = "parent_communication";
/// Child thread key-value store: sealed scoped variables, one key each.
pub(super) const SCOPED_PREFIX: &str = "keel:scoped:";
/// How long a completion of scoped variables holds its request against concurrent ones.
pub(super) const VARIABLES_CLAIM_TTL: std::time::Duration = std::time::Duration::from_secs(300);
/// Parent thread key-value store: pending scoped-variable requests, one key each.
pub(super) const PENDING_PREFIX: &str = "keel:variables:";
/// Parent thread key-value store: set once the immediate kinds were started.
pub(super) const IMMEDIATE_KEY: &str = "keel:immediate_activated";
/// Run-context metadata of a child task the parent does not wait for: where its result
/// goes. It travels in the child task's own snapshot, so the child's completion path can
/// deliver the result whichever process finishes it.
pub(super) const META_DELIVERY: &str = "keel.subagent_delivery";

pub(crate) fn scoped_context(thread: &ThreadId, var: &str) -> String {
    format!("{thread}/{var}")
}

/// The child thread's key of the sealed scoped variable `var`.
pub(crate) fn scoped_key(var: &str) -> String {
    format!("{SCOPED_PREFIX}{var}")
}
