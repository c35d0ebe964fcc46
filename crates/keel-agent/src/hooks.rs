//! The points of a thread's life where the executor calls what an agent adds to it
//! (subagents), so that the executor does not need to know what runs there.

use std::sync::Weak;

use async_trait::async_trait;
use keel_core::{AgentResult, Task, ThreadId};
use keel_llm::LlmMessage;
use keel_runtime::AuthContext;

use crate::effects::EffectConfig;
use crate::thread_state::ThreadHost;
use crate::tool::ToolContext;

/// What the executor calls at fixed points; every method does nothing by default.
#[async_trait]
pub(crate) trait RunHooks: Send + Sync {
    /// An executor was made for the agent; `host` is its handle.
    fn attached(&self, _host: Weak<dyn ThreadHost>) {}

    /// The effect scheduler of the executor `host` was started with `config`.
    fn effects_started(&self, _host: &dyn ThreadHost, _config: EffectConfig) {}

    /// Before a run's first model step, once the task's input is in the thread history.
    async fn before_first_step(
        &self,
        _ctx: &ToolContext,
        _history: &[LlmMessage],
    ) -> AgentResult<()> {
        Ok(())
    }

    /// A task of the executor came to rest (ended, or waits), its final state not yet
    /// persisted. Failures are the hook's to report: the task is persisted regardless.
    async fn on_rest(&self, _host: &dyn ThreadHost, _auth: &AuthContext, _task: &Task) {}

    /// A thread of the executor was terminated.
    async fn on_terminate(
        &self,
        _host: &dyn ThreadHost,
        _auth: &AuthContext,
        _thread_id: &ThreadId,
    ) -> AgentResult<()> {
        Ok(())
    }
}
