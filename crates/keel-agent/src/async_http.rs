//! [`AsyncHttpTool`]: an asynchronous tool whose endpoint is reached over HTTP.

use std::time::Duration;

use async_trait::async_trait;
use keel_core::{AgentError, AgentResult};
use serde_json::Value;

use crate::async_tools::{AsyncDispatch, AsyncInvocation, InvocationSender};
use crate::tool::{Tool, ToolContext};

/// An asynchronous tool served over HTTP: each call is POSTed as an [`AsyncInvocation`] to
/// `endpoint` (by the executor's [`InvocationSender`], keel-transport's `HttpCallbacks`),
/// which must answer 2xx at once and call back later.
///
/// ```
/// use keel_agent::AsyncHttpTool;
/// let tool = AsyncHttpTool::new(
///     "render_video",
///     "Render a video; the result arrives later.",
///     serde_json::json!({"type": "object", "properties": {"script": {"type": "string"}}}),
///     "http://127.0.0.1:9000/invoke",
/// );
/// # let _ = tool;
/// ```
pub struct AsyncHttpTool {
    name: String,
    description: String,
    parameters: Value,
    endpoint: String,
    timeout: Option<Duration>,
}

impl AsyncHttpTool {
    /// A tool named `name` whose calls are POSTed to `endpoint`.
    pub fn new(
        name: impl Into<String>,
        description: impl Into<String>,
        parameters: Value,
        endpoint: impl Into<String>,
    ) -> Self {
        Self {
            name: name.into(),
            description: description.into(),
            parameters,
            endpoint: endpoint.into(),
            timeout: None,
        }
    }

    /// How long to wait for the callback before the call ends as a tool error.
    #[must_use]
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }
}

#[async_trait]
impl Tool for AsyncHttpTool {
    crate::tool::described_by_fields!();
    async fn call(&self, _args: Value, _ctx: &ToolContext) -> AgentResult<Value> {
        Err(AgentError::Unsupported {
            what: format!(
                "`{}` is asynchronous and answers only inside a model's step",
                self.name
            ),
        })
    }
    fn asynchronous(&self) -> Option<&dyn AsyncDispatch> {
        Some(self)
    }
}

#[async_trait]
impl AsyncDispatch for AsyncHttpTool {
    async fn dispatch(
        &self,
        invocation: &AsyncInvocation,
        sender: &dyn InvocationSender,
    ) -> AgentResult<()> {
        sender
            .send(&self.endpoint, invocation)
            .await
            .map_err(|message| AgentError::ToolFailed {
                tool: self.name.clone(),
                message,
            })
    }
    fn timeout(&self) -> Option<Duration> {
        self.timeout
    }
}
