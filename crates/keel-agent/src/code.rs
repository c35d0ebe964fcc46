//! Code execution as the engine sees it (decision 11): [`ThreadState::run_code`]
//! (crate::ThreadState::run_code) starts model-written code through the agent's
//! [`CodeRunner`] and hands back a [`CodeRun`] handle. The engine knows no sandbox: the `keel`
//! facade's `sandbox` feature provides a runner over `keel-sandbox`, and the model-facing
//! `run_code` tool is built on this handle.

use async_trait::async_trait;
use keel_core::AgentResult;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// What to run.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CodeRequest {
    /// The module's source.
    pub source: String,
    /// `typescript` (the default) or `javascript`.
    pub language: Option<String>,
    /// The module's file name, for error positions.
    pub filename: Option<String>,
    /// The memory limit, when not the runner's default.
    pub memory_limit_bytes: Option<usize>,
}

/// Starts code runs. Implementations must not block: [`CodeRunner::start`] returns at once.
pub trait CodeRunner: Send + Sync {
    /// Start running `request`.
    fn start(&self, request: CodeRequest) -> AgentResult<Box<dyn CodeRun>>;
}

/// A code run in progress.
#[async_trait]
pub trait CodeRun: Send + Sync {
    /// The settled result: `{status: success|error|terminated|memory|link_error, result,
    /// error, console}`.
    async fn result(&self) -> Value;
    /// Stop the run; it settles as `terminated`. Idempotent.
    fn terminate(&self, reason: Option<&str>);
}
