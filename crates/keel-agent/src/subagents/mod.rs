//! Subagents (Standard Agents §7–§8): child agents that run on child threads of their own,
//! linked to the parent thread in the store's [`SubagentRegistry`](keel_runtime::SubagentRegistry).
//!
//! A [`SubagentSpec`] registered on the parent's builder gives the parent's model the built-in
//! tools `subagent_create` and (when a spec is resumable) `subagent_message`. A call creates
//! (or reuses) a child thread, registers it as a [`ChildThread`], and sends the message to the
//! child's own [`AgentExecutor`] on the same runtime with a child [`RunContext`] (new run id,
//! `parent_run_id`, `agent_chain` extended, same trace, permissions and budget).
//!
//! The child's result is delivered to the parent exactly once:
//! - by default (`wait` true) the call blocks and the child's answer (or failure) is the tool
//!   result the parent's model sees;
//! - with `wait: false` the call returns at once, and when the child's task ends a message
//!   carrying the child's name and a result summary is queued on the parent thread — with
//!   [`ParentCommunication::Auto`] only; with [`ParentCommunication::Explicit`] nothing is
//!   queued and the child uses [`ThreadState::notify_parent`](crate::ThreadState::notify_parent).
//!
//! Files cross thread boundaries by copy (§8.1–§8.2): attachments named in the parent's call
//! (`initAttachmentsProperty`) are copied into the child's attachment store and the child's
//! message refers to the copies; attachments the child's result refers to are copied back
//! into the parent's store and the result rewritten to refer to those.
//!
//! A kind may be `optional` (it exists only when an environment flag is on), `immediate` (it
//! is created before the parent's first model step, recursively) and may need *scoped
//! variables*: values from the parent's environment handed to the child sealed at rest and
//! never shown to a model. When one is missing, `subagent_create` answers a structured
//! bootstrap error and keeps a pending request that
//! [`AgentExecutor::provide_variables`] completes (§7.5).
//!
//! Every step leaves a marker in the parent run's event stream: `subagent.created`,
//! `subagent.messaged`, `subagent.returned`, `subagent.failed`,
//! `subagent.bootstrap_required`; a child reporting progress with [`SessionStatusTool`] emits
//! `subagent.status` in its own run.
//!
//! Non-resumable children are terminated once they delivered. Canceling the parent's run while
//! it waits cancels the child's task; terminating the parent thread terminates its children.

mod delivery;
mod hooks;
pub(crate) mod keys;
mod scoped;
mod spec;
mod tools;

pub(crate) use delivery::queue_on_parent;
pub(crate) use hooks::SubagentHooks;
pub use keys::{SESSION_STATUS_TOOL, SUBAGENT_CREATE_TOOL, SUBAGENT_MESSAGE_TOOL};
pub use scoped::PendingVariables;
pub(crate) use scoped::{pending_variables, provide_variables};
pub(crate) use spec::{enabled_specs, ChildExecutor, Specs};
pub use spec::{ImmediateEnv, ParentCommunication, SubagentSpec};
pub(crate) use tools::builtin_tools;
pub use tools::SessionStatusTool;
