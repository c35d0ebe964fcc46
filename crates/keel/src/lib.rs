//! Keel: an agent runtime framework. This facade crate is what applications depend on: it
//! re-exports the layers below, provides [`DefaultRuntime`] (the service hub with Keel's
//! built-in stores and model), the [`demo`] agent served by `keel serve`, and a [`prelude`].
//!
//! ```
//! use keel::prelude::*;
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), AgentError> {
//! let runtime = std::sync::Arc::new(DefaultRuntime::offline());
//! let auth = runtime.auth_service().auth_context();
//! let executor = AgentExecutor::new(keel::demo::agent()?, runtime);
//! let task = executor.send_message(&auth, Message::user("hello"), SendOptions::default()).await?;
//! assert_eq!(task.state(), TaskState::Completed);
//! # Ok(())
//! # }
//! ```

#[cfg(feature = "sandbox")]
pub mod code;
pub mod config;
pub mod conformance;
pub mod delegation;
pub mod demo;
pub mod ephemeral;
pub mod http_tool;
mod runtime;

pub use config::Config;
pub use keel_agent as agent;
/// The web console: its embedded page and routes (feature `console`).
#[cfg(feature = "console")]
pub use keel_console as console;
pub use keel_core as core;
pub use keel_events as events;
pub use keel_llm as llm;
pub use keel_mcp as mcp;
pub use keel_policy as policy;
pub use keel_runtime as services;
/// Sandboxed code execution (feature `sandbox`).
#[cfg(feature = "sandbox")]
pub use keel_sandbox as sandbox;
/// The PostgreSQL store (feature `postgres`).
#[cfg(feature = "postgres")]
pub use keel_store_postgres as postgres;
/// The Redis store (feature `redis`).
#[cfg(feature = "redis")]
pub use keel_store_redis as redis;
/// The SQLite store (feature `sqlite`).
#[cfg(feature = "sqlite")]
pub use keel_store_sqlite as sqlite;
#[cfg(feature = "otel")]
pub use keel_telemetry as telemetry;
pub use keel_transport as transport;
pub use runtime::{DefaultRuntime, DefaultRuntimeBuilder, StoreConfig};

/// The names most applications need, in one import.
pub mod prelude {
    pub use crate::{DefaultRuntime, StoreConfig};
    pub use keel_agent::{Agent, AgentExecutor, FnTool, SendOptions, Tool, ToolContext};
    pub use keel_core::{
        AgentCard, AgentError, AgentResult, AgentSkill, Artifact, Message, Part, RunBudget,
        RunContext, Task, TaskId, TaskState, ThreadId,
    };
    pub use keel_llm::{Llm, MockLlm};
    pub use keel_runtime::{AuthContext, Runtime};
}
