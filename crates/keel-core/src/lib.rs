//! Keel's vocabulary: tasks and their lifecycle, messages and parts, agent cards, the run
//! context and budgets, the shared value types of policy and events, and the one error type.
//!
//! Everything here is a plain value. This crate does no I/O, never spawns and knows no
//! transport or storage, so it builds and tests without an async runtime. Its serde form is
//! Keel's own stable JSON (what stores, events and run reports persist); the A2A wire form
//! lives in `keel-transport`.
//!
//! ```
//! use keel_core::{Message, Task, TaskState};
//!
//! let mut task = Task::create(Message::user("What is the weather?"));
//! task.complete("Sunny.")?;
//! assert_eq!(task.state(), TaskState::Completed);
//! // submitted -> working -> completed, both changes recorded.
//! assert_eq!(task.state_history.len(), 2);
//! # Ok::<(), keel_core::AgentError>(())
//! ```

mod artifact;
mod card;
mod context;
pub mod conversation;
mod error;
mod error_source;
mod event;
mod ids;
mod maybe_send;
mod message;
mod mime;
mod part;
pub mod stored;
mod task;
mod trace;
mod values;

pub use artifact::Artifact;
pub use card::{
    AgentCapabilities, AgentCard, AgentRole, AgentSkill, SecurityScheme, TransportKind,
};
pub use context::{RunBudget, RunContext, RUN_CONTEXT_KEY};
pub use error::{AgentError, AgentResult, ErrorKind, LlmErrorKind};
pub use error_source::ErrorSource;
pub use event::TaskEvent;
pub use ids::{ActionId, ArtifactId, MessageId, RunId, TaskId, ThreadId, TraceId};
pub use maybe_send::{MaybeSend, MaybeSync};
pub use message::{Message, Role, StatusKind, STATUS_KIND_KEY};
pub use mime::MimeType;
pub use part::{FileContent, Part, PartContent, RouteDecision};
pub use task::{StateTransition, Task, TaskItem, TaskState, TaskStatus};
pub use trace::{SpanId, TraceParent, W3cTraceId};
pub use values::{
    ApprovalDecision, ApprovalOutcome, ApprovalRequest, BudgetLimit, BudgetUsage, ContextItem,
    ContextManifest, ModelPrice, RunAction,
};

/// A JSON object: the shape of every `metadata` field in Keel.
pub type Metadata = serde_json::Map<String, serde_json::Value>;
