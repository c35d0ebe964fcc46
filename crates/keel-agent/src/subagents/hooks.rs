//! Subagents at the executor's fixed points: register the parent on its kinds' executors,
//! start their effect schedulers, start the `immediate` kinds, deliver a background child's
//! result, and terminate a terminated thread's children.

use std::sync::Weak;

use async_trait::async_trait;
use keel_core::{AgentResult, Task, ThreadId};
use keel_llm::LlmMessage;
use keel_runtime::{AuthContext, LogLevel};

use super::delivery::{child_task_rested, link_parent, terminate_children};
use super::spec::Specs;
use super::tools::activate_immediate;
use crate::effects::EffectConfig;
use crate::hooks::RunHooks;
use crate::thread_state::ThreadHost;
use crate::tool::ToolContext;

/// The subagent kinds of one agent, as the executor's hooks.
pub(crate) struct SubagentHooks {
    specs: Specs,
}

impl SubagentHooks {
    /// The hooks of an agent offering the kinds `specs` (maybe none: any agent may run as
    /// someone's child).
    pub(crate) fn new(specs: Specs) -> Self {
        Self { specs }
    }
}

#[async_trait]
impl RunHooks for SubagentHooks {
    fn attached(&self, host: Weak<dyn ThreadHost>) {
        link_parent(&self.specs, &host);
    }

    fn effects_started(&self, host: &dyn ThreadHost, config: EffectConfig) {
        // A subagent kind is another agent whose timers (its effects, the wakes of its
        // threads) only its own scheduler claims.
        for spec in self.specs.iter() {
            if let Err(err) = spec.child().start_effects_with(config) {
                host.log(
                    LogLevel::Warn,
                    &format!(
                        "cannot start the effect scheduler of the subagent kind `{}`: {err}",
                        spec.name()
                    ),
                );
            }
        }
    }

    async fn before_first_step(
        &self,
        ctx: &ToolContext,
        history: &[LlmMessage],
    ) -> AgentResult<()> {
        activate_immediate(&self.specs, ctx, history).await
    }

    async fn on_rest(&self, host: &dyn ThreadHost, auth: &AuthContext, task: &Task) {
        child_task_rested(host, &self.specs, auth, task).await;
    }

    async fn on_terminate(
        &self,
        host: &dyn ThreadHost,
        auth: &AuthContext,
        thread_id: &ThreadId,
    ) -> AgentResult<()> {
        // A terminated parent terminates its children (best effort).
        if !self.specs.is_empty() {
            let children = host
                .runtime()
                .thread_store()
                .children(auth, thread_id)
                .await?;
            terminate_children(host, &self.specs, auth, children).await;
        }
        Ok(())
    }
}
