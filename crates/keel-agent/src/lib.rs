//! Keel's execution engine: [`Agent`]s built from a card, instructions, a model and
//! [`Tool`]s, and the [`AgentExecutor`] that runs them on tasks.
//!
//! A run moves its task to working, calls the model, executes the returned tool calls in
//! order (a failing tool becomes a tool result the model sees, never a crash), calls the model
//! again with the results, and stops on a final answer or the step limit. Every message and
//! tool result is appended to the task's durable event log before the run continues, and the
//! engine reaches storage only through the [`Runtime`](keel_runtime::Runtime) traits.
//!
//! ```
//! use std::sync::Arc;
//! use keel_agent::{Agent, AgentExecutor, SendOptions};
//! use keel_core::{AgentCard, Message, TaskState};
//! use keel_llm::MockLlm;
//! use keel_runtime::{Runtime, Services};
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), keel_core::AgentError> {
//! let agent = Agent::builder(AgentCard::new("echo", "Echoes", "http://127.0.0.1:0"))
//!     .instructions("Repeat what the user says.")
//!     .build()?;
//! let runtime = Arc::new(Services::in_memory(Arc::new(MockLlm::new())));
//! let auth = runtime.auth_service().auth_context();
//! let executor = AgentExecutor::new(agent, runtime);
//! let task = executor.send_message(&auth, Message::user("hi"), SendOptions::default()).await?;
//! assert_eq!(task.state(), TaskState::Completed);
//! assert_eq!(task.status().message.as_ref().unwrap().text(), "You said: hi");
//! # Ok(())
//! # }
//! ```

mod agent;
mod approval_part;
mod async_http;
mod async_tools;
mod attachments;
mod code;
mod effects;
mod environment;
mod executor;
mod hooks;
mod infer;
mod lifecycle;
pub mod meter;
mod negotiator;
mod observe;
pub mod reads;
pub mod replay;
mod rest;
mod subagents;
mod task_meta;
mod thread_state;
mod tool;
mod tool_source;
mod work;

pub use agent::{
    Agent, AgentBuilder, StopRules, ASK_HUMAN_TOOL, SESSION_FAIL_TOOL, SESSION_STOP_TOOL,
};
pub use approval_part::{approval_part, APPROVAL_PART_KEY};
pub use async_http::AsyncHttpTool;
pub use async_tools::{
    AcceptedCallback, AsyncDispatch, AsyncInvocation, CallbackAddress, CallbackDispatcher,
    CallbackError, InvocationSender, CALLBACK_SECRET_HEADER,
};
pub use attachments::{attachment_uri, ATTACHMENT_URI_SCHEME};
pub use code::{CodeRequest, CodeRun, CodeRunner};
pub use effects::{EffectConfig, EFFECT_CLAIM_TTL, EFFECT_RECHECK};
pub use environment::{Environment, SECRETS_KEY_VAR};
pub use executor::{
    AgentExecutor, AutoCompaction, ExecutorConfig, HandedOn, SendOptions, SendOutcome,
    DEFAULT_DRAIN_TIMEOUT, MESSAGE_ID_META,
};
pub use infer::Inference;
pub use lifecycle::{LifecycleHooks, ToolVerdict};
pub use negotiator::{AcceptAll, LlmNegotiator, Negotiation, Negotiator};
pub use rest::TaskRest;
pub use subagents::{
    ImmediateEnv, ParentCommunication, PendingVariables, SessionStatusTool, SubagentSpec,
    SESSION_STATUS_TOOL, SUBAGENT_CREATE_TOOL, SUBAGENT_MESSAGE_TOOL,
};
pub use thread_state::{ThreadState, RESERVED_KEY_PREFIX, TERMINATED_AT_KEY};
pub use tool::{ArtifactChunk, FnTool, PromptTool, Tool, ToolContext};
pub use tool_source::ToolSource;
