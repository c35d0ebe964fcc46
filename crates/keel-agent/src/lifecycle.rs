//! Lifecycle hooks for application code: what an agent's owner may run before and after
//! each step, model call and tool call of a thread (seed 003: "tools, hooks, endpoints").

use std::sync::Arc;

use async_trait::async_trait;
use keel_llm::{LlmRequest, LlmResponse, ToolCall};
use serde_json::Value;

use crate::ToolContext;

/// What a [`LifecycleHooks::before_tool_call`] decides about a tool call.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum ToolVerdict {
    /// Let the call go on to policy and the tool.
    #[default]
    Run,
    /// Do not run it: the model sees an error result `vetoed: {reason}`, as it would a
    /// policy denial, and the step goes on.
    Veto(String),
}

/// Application code called at fixed points of a run's step loop, registered with
/// [`AgentBuilder::hooks`](crate::AgentBuilder::hooks). Every method does nothing by default.
///
/// Hooks observe; the one that may change the run is
/// [`before_tool_call`](LifecycleHooks::before_tool_call), which may veto a call. They run
/// in the run's own task, in the order they were registered, and the run waits for each:
/// a slow hook slows the run. The points, in order within a step: `before_step`,
/// `before_model_call`, `after_model_call` (once the response is persisted), then for each
/// of the model's tool calls `before_tool_call` and `after_tool_call` (once the result is
/// known, before it is persisted), and `after_step` once the step's stop rules were
/// evaluated. A step that ends early (canceled, a budget limit, a model error, a call that
/// waits for an approval or a callback) does not reach its later points. The built-in
/// lifecycle tools (`session_stop`, `session_fail`, `ask_human`) are the engine's own and
/// pass no tool hooks.
///
/// ```
/// use std::sync::atomic::{AtomicU32, Ordering};
/// use keel_agent::{Agent, LifecycleHooks, ToolContext, ToolVerdict};
/// use keel_core::AgentCard;
/// use keel_llm::ToolCall;
///
/// #[derive(Default)]
/// struct NoDeletes(AtomicU32);
///
/// #[async_trait::async_trait]
/// impl LifecycleHooks for NoDeletes {
///     async fn before_step(&self, _ctx: &ToolContext, _step: u32) {
///         self.0.fetch_add(1, Ordering::Relaxed);
///     }
///     async fn before_tool_call(&self, _ctx: &ToolContext, call: &ToolCall) -> ToolVerdict {
///         if call.name.starts_with("delete") {
///             ToolVerdict::Veto("deleting is not allowed here".into())
///         } else {
///             ToolVerdict::Run
///         }
///     }
/// }
///
/// let agent = Agent::builder(AgentCard::new("a", "hooked", "http://127.0.0.1:0"))
///     .hooks(NoDeletes::default())
///     .build()
///     .unwrap();
/// # let _ = agent;
/// ```
#[async_trait]
pub trait LifecycleHooks: Send + Sync {
    /// Step `step` (counted from 1 across the task's runs) is about to start.
    async fn before_step(&self, _ctx: &ToolContext, _step: u32) {}

    /// The model is about to be called with `request`.
    async fn before_model_call(&self, _ctx: &ToolContext, _step: u32, _request: &LlmRequest) {}

    /// The model answered `response`, which is persisted in the thread history.
    async fn after_model_call(&self, _ctx: &ToolContext, _step: u32, _response: &LlmResponse) {}

    /// The model asked for `call`, not yet checked against the tool's schema nor judged by
    /// policy. Answer [`ToolVerdict::Veto`] to refuse it.
    async fn before_tool_call(&self, _ctx: &ToolContext, _call: &ToolCall) -> ToolVerdict {
        ToolVerdict::Run
    }

    /// `call` gave `output` (`is_error` for a failure, a denial or a veto).
    async fn after_tool_call(
        &self,
        _ctx: &ToolContext,
        _call: &ToolCall,
        _output: &Value,
        _is_error: bool,
    ) {
    }

    /// Step `step` ran its tool calls and evaluated its stop rules.
    async fn after_step(&self, _ctx: &ToolContext, _step: u32) {}
}

/// The hooks an agent registered, called in registration order.
#[derive(Clone, Default)]
pub(crate) struct HookList(pub(crate) Vec<Arc<dyn LifecycleHooks>>);

impl HookList {
    pub(crate) async fn before_step(&self, ctx: &ToolContext, step: u32) {
        for hook in &self.0 {
            hook.before_step(ctx, step).await;
        }
    }

    pub(crate) async fn before_model_call(
        &self,
        ctx: &ToolContext,
        step: u32,
        request: &LlmRequest,
    ) {
        for hook in &self.0 {
            hook.before_model_call(ctx, step, request).await;
        }
    }

    pub(crate) async fn after_model_call(
        &self,
        ctx: &ToolContext,
        step: u32,
        response: &LlmResponse,
    ) {
        for hook in &self.0 {
            hook.after_model_call(ctx, step, response).await;
        }
    }

    /// The first veto wins; later hooks are not asked.
    pub(crate) async fn before_tool_call(&self, ctx: &ToolContext, call: &ToolCall) -> ToolVerdict {
        for hook in &self.0 {
            if let ToolVerdict::Veto(reason) = hook.before_tool_call(ctx, call).await {
                return ToolVerdict::Veto(reason);
            }
        }
        ToolVerdict::Run
    }

    pub(crate) async fn after_tool_call(
        &self,
        ctx: &ToolContext,
        call: &ToolCall,
        output: &Value,
        is_error: bool,
    ) {
        for hook in &self.0 {
            hook.after_tool_call(ctx, call, output, is_error).await;
        }
    }

    pub(crate) async fn after_step(&self, ctx: &ToolContext, step: u32) {
        for hook in &self.0 {
            hook.after_step(ctx, step).await;
        }
    }
}
