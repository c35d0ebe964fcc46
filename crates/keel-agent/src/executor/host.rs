//! The executor as the narrow handles see it: [`ThreadHost`] for thread handles, effects and
//! subagents, and [`ChildExecutor`] for the subagent kinds an [`AgentExecutor`] runs.

use std::any::Any;
use std::sync::{Arc, Weak};
use std::time::Duration;

use async_trait::async_trait;
use keel_core::{AgentCard, AgentResult, Message, Task, TaskId, ThreadId};
use keel_events::EventSink;
use keel_runtime::{AuthContext, ChildThread, QueuedItem, Runtime};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::config::SendOptions;
use super::state::{AgentExecutor, Inner};
use crate::code::CodeRunner;
use crate::effects::EffectConfig;
use crate::environment::Environment;
use crate::subagents::{ChildExecutor, SubagentSpec};
use crate::thread_state::{EffectFn, ThreadHost, ThreadState};
use crate::work::{EffectScheduler, QueuedWork};

#[async_trait]
impl ThreadHost for Inner {
    fn task_changed(&self) {
        self.notices.task_changed();
    }

    fn runtime(&self) -> &Arc<dyn Runtime> {
        &self.runtime
    }

    fn agent_name(&self) -> &str {
        &self.agent.card().name
    }

    fn environment(&self) -> &Environment {
        self.agent.environment()
    }

    fn code_runner(&self) -> Option<&Arc<dyn CodeRunner>> {
        self.agent.code_runner()
    }

    fn effect_handler(&self, name: &str) -> Option<EffectFn> {
        self.agent.effects.get(name).cloned()
    }

    fn effect_scheduler(&self) -> &EffectScheduler {
        &self.effects
    }

    fn sinks(&self) -> Vec<Arc<dyn EventSink>> {
        self.notices.sinks()
    }

    fn lease_ttl(&self) -> Duration {
        self.config.lease_ttl
    }

    fn shutting_down(&self) -> &CancellationToken {
        &self.driver.shutting_down
    }

    fn tracker(&self) -> &TaskTracker {
        &self.driver.tracker
    }

    fn shared(&self) -> Option<Arc<dyn ThreadHost>> {
        self.me.upgrade().map(|me| me as Arc<dyn ThreadHost>)
    }

    fn schedule(&self, auth: &AuthContext, thread_id: &ThreadId) {
        Inner::schedule(self, auth, thread_id);
    }

    async fn enqueue(
        &self,
        auth: &AuthContext,
        thread_id: &ThreadId,
        work: QueuedWork,
    ) -> AgentResult<()> {
        Inner::enqueue(self, auth, thread_id, work).await
    }

    fn cancel_thread_runs(&self, auth: &AuthContext, thread_id: &ThreadId, reason: &str) {
        Inner::cancel_thread_runs(self, auth, thread_id, reason);
    }

    async fn guard_queued(&self, auth: &AuthContext, thread_id: &ThreadId) {
        crate::effects::guard_queued(self, auth, thread_id).await;
    }

    async fn terminate_children(
        &self,
        auth: &AuthContext,
        thread_id: &ThreadId,
    ) -> AgentResult<()> {
        self.agent.hooks.on_terminate(self, auth, thread_id).await
    }

    async fn queue_on_parent(
        &self,
        auth: &AuthContext,
        child: &ChildThread,
        message: Message,
    ) -> AgentResult<QueuedItem> {
        crate::subagents::queue_on_parent(self, auth, child, message).await
    }

    fn local_parent(&self, kind: &str) -> Option<Arc<dyn ThreadHost>> {
        self.parents
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter(|(name, _)| name == kind)
            .find_map(|(_, parent)| parent.upgrade())
    }
}

#[async_trait]
impl ChildExecutor for AgentExecutor {
    fn agent_card(&self) -> &AgentCard {
        self.agent().card()
    }

    fn thread(&self, auth: &AuthContext, thread_id: ThreadId) -> ThreadState {
        AgentExecutor::thread(self, auth, thread_id)
    }

    async fn send_message(
        &self,
        auth: &AuthContext,
        message: Message,
        options: SendOptions,
    ) -> AgentResult<Task> {
        AgentExecutor::send_message(self, auth, message, options).await
    }

    async fn wait_for_rest(&self, auth: &AuthContext, task_id: &TaskId) -> AgentResult<Task> {
        AgentExecutor::wait_for_rest(self, auth, task_id).await
    }

    async fn cancel_task(
        &self,
        auth: &AuthContext,
        task_id: &TaskId,
        reason: Option<String>,
    ) -> AgentResult<Task> {
        AgentExecutor::cancel_task(self, auth, task_id, reason).await
    }

    fn start_effects_with(&self, config: EffectConfig) -> AgentResult<()> {
        AgentExecutor::start_effects_with(self, config)
    }

    fn add_parent(&self, kind: &str, parent: Weak<dyn ThreadHost>) {
        let mut parents = self
            .inner
            .parents
            .write()
            .unwrap_or_else(|p| p.into_inner());
        parents.retain(|(_, p)| p.strong_count() > 0);
        parents.push((kind.to_owned(), parent));
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl SubagentSpec {
    /// A subagent kind named `name`, run by `executor` (which should share the parent's
    /// runtime, so that the registry and both threads live in the same store).
    pub fn new(name: impl Into<String>, executor: AgentExecutor) -> Self {
        Self::with_executor(name.into(), Arc::new(executor))
    }

    /// The child's executor.
    pub fn executor(&self) -> &AgentExecutor {
        self.child()
            .as_any()
            .downcast_ref()
            .expect("a subagent kind is made from an AgentExecutor (SubagentSpec::new)")
    }
}
