//! Tools: named, described, schema-checked operations a model (or a caller) can invoke.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use async_trait::async_trait;
use keel_core::{AgentResult, RunContext, TaskId, ThreadId};
use keel_runtime::{AuthContext, Runtime};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

/// What a tool sees of the run that calls it.
#[derive(Clone)]
pub struct ToolContext {
    /// The tenant.
    pub auth: AuthContext,
    /// The run.
    pub run: RunContext,
    /// The task being worked on.
    pub task_id: TaskId,
    /// Its thread.
    pub thread_id: ThreadId,
    /// Fires when the run is canceled; long-running tools should stop when it does.
    pub cancel: CancellationToken,
    /// The service hub.
    pub runtime: Arc<dyn Runtime>,
}

/// A tool. Its arguments are checked against [`Tool::parameters`] before [`Tool::call`] runs.
#[async_trait]
pub trait Tool: Send + Sync {
    /// The name the model calls it by.
    fn name(&self) -> &str;
    /// What it does, for the model.
    fn description(&self) -> &str;
    /// JSON schema of its arguments.
    fn parameters(&self) -> Value;
    /// Run it. An error becomes a tool result the model sees.
    async fn call(&self, args: Value, ctx: &ToolContext) -> AgentResult<Value>;
}

type ToolFuture = Pin<Box<dyn Future<Output = AgentResult<Value>> + Send>>;
type ToolFn = dyn Fn(Value, ToolContext) -> ToolFuture + Send + Sync;

/// A [`Tool`] made from a closure.
///
/// ```
/// use keel_agent::FnTool;
/// let add = FnTool::new(
///     "add",
///     "Add two numbers",
///     serde_json::json!({
///         "type": "object",
///         "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
///         "required": ["a", "b"]
///     }),
///     |args, _ctx| async move {
///         Ok(serde_json::json!(args["a"].as_f64().unwrap_or(0.0) + args["b"].as_f64().unwrap_or(0.0)))
///     },
/// );
/// # let _ = add;
/// ```
pub struct FnTool {
    name: String,
    description: String,
    parameters: Value,
    run: Box<ToolFn>,
}

impl FnTool {
    /// A tool named `name` that runs `run`.
    pub fn new<F, Fut>(
        name: impl Into<String>,
        description: impl Into<String>,
        parameters: Value,
        run: F,
    ) -> Self
    where
        F: Fn(Value, ToolContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = AgentResult<Value>> + Send + 'static,
    {
        Self {
            name: name.into(),
            description: description.into(),
            parameters,
            run: Box::new(move |args, ctx| Box::pin(run(args, ctx))),
        }
    }
}

#[async_trait]
impl Tool for FnTool {
    fn name(&self) -> &str {
        &self.name
    }
    fn description(&self) -> &str {
        &self.description
    }
    fn parameters(&self) -> Value {
        self.parameters.clone()
    }
    async fn call(&self, args: Value, ctx: &ToolContext) -> AgentResult<Value> {
        (self.run)(args, ctx.clone()).await
    }
}
