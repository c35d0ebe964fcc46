//! The executor's public API for what agents add to it: scheduled effects (`effects`) and
//! the completion of scoped-variable requests (`subagents`).

use std::collections::HashMap;
use std::sync::Arc;

use chrono::{DateTime, Utc};
#[cfg(doc)]
use keel_core::AgentError;
use keel_core::{AgentResult, ThreadId};
use keel_runtime::{AuthContext, ChildThread, TimerRecord};
use serde_json::Value;

use super::state::AgentExecutor;
use crate::effects::{self, EffectConfig};
use crate::subagents::{self, PendingVariables};
use crate::thread_state::ThreadHost;
#[cfg(doc)]
use crate::ThreadState;

impl AgentExecutor {
    /// Schedule effect `name` on a thread at `at`; the library form of
    /// [`ThreadState::schedule_effect_at`].
    pub async fn schedule_effect(
        &self,
        auth: &AuthContext,
        thread_id: &ThreadId,
        name: &str,
        payload: Value,
        at: DateTime<Utc>,
    ) -> AgentResult<TimerRecord> {
        self.thread(auth, thread_id.clone())
            .schedule_effect_at(name, payload, at)
            .await
    }

    /// Cancel a scheduled effect of a thread; see [`ThreadState::cancel_effect`].
    pub async fn cancel_effect(
        &self,
        auth: &AuthContext,
        thread_id: &ThreadId,
        timer_id: &str,
    ) -> AgentResult<bool> {
        self.thread(auth, thread_id.clone())
            .cancel_effect(timer_id)
            .await
    }

    /// Start this executor's effect scheduler (once; later calls do nothing), and those of
    /// its subagent kinds' executors. It fires the due timers this agent owns (by card name)
    /// in every tenant of the runtime's store, and the wakes of its threads; other agents'
    /// timers are left to their own schedulers. It stops on [`AgentExecutor::shutdown`] or
    /// when the executor is dropped. A runtime without thread timers is
    /// [`AgentError::Unsupported`].
    pub fn start_effects(&self) -> AgentResult<()> {
        self.start_effects_with(EffectConfig::default())
    }

    /// [`AgentExecutor::start_effects`] with explicit tuning. A claim TTL outside
    /// 1 ms ..= 24 h or a zero recheck is [`AgentError::InvalidInput`].
    pub fn start_effects_with(&self, config: EffectConfig) -> AgentResult<()> {
        let host: Arc<dyn ThreadHost> = self.inner.clone();
        if effects::start_scheduler(&host, config)? {
            self.inner
                .agent
                .hooks
                .effects_started(host.as_ref(), config);
        }
        Ok(())
    }

    /// The pending scoped-variable request `request_id` of `parent_thread_id` (§7.5): which
    /// variables a deferred subagent still needs. `None` when there is no such request (or it
    /// was completed).
    pub async fn pending_variables(
        &self,
        auth: &AuthContext,
        parent_thread_id: &ThreadId,
        request_id: &str,
    ) -> AgentResult<Option<PendingVariables>> {
        subagents::pending_variables(&self.thread(auth, parent_thread_id.clone()), request_id).await
    }

    /// Complete a scoped-variable request (§7.5): store the values (sealed, in the new child's
    /// thread) and start the deferred subagent at once, in the background; its result reaches
    /// the parent thread as a queued message (auto communication). Answers the new child, or
    /// `None` when there is no such request. A missing or empty value is
    /// [`AgentError::InvalidInput`] naming the variables, and nothing changes.
    pub async fn provide_variables(
        &self,
        auth: &AuthContext,
        parent_thread_id: &ThreadId,
        request_id: &str,
        values: &HashMap<String, String>,
    ) -> AgentResult<Option<ChildThread>> {
        subagents::provide_variables(
            self.thread(auth, parent_thread_id.clone()),
            &self.inner.agent.subagents,
            request_id,
            values,
        )
        .await
    }
}
