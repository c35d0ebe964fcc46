//! Keel's service hub: the [`Runtime`] trait through which the engine reaches every service
//! (auth and tenancy, tasks and their event logs, memory, logging, the default model), the
//! store traits, and their in-memory implementations.
//!
//! Every store method takes an [`AuthContext`]: data is namespaced by tenant, so one tenant
//! can never read, list or overwrite another's records, whatever ids it sends.
//!
//! ```
//! use std::sync::Arc;
//! use keel_core::{Message, Task};
//! use keel_llm::MockLlm;
//! use keel_runtime::{InMemoryRuntime, Runtime};
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), keel_core::AgentError> {
//! let runtime = InMemoryRuntime::new(Arc::new(MockLlm::new()));
//! let auth = runtime.auth_service().auth_context();
//! let task = Task::create(Message::user("hi"));
//! runtime.task_manager().save_task(&auth, &task).await?;
//! assert!(runtime.task_manager().get_task(&auth, &task.id).await?.is_some());
//! # Ok(())
//! # }
//! ```

mod async_calls;
mod auth;
mod lease;
mod logging;
mod memory;
mod run_store;
mod scoped;
mod step;
mod task_manager;
#[cfg(feature = "testing")]
pub mod testing;
mod thread;
mod thread_memory;
mod timers;

use std::sync::Arc;

pub use async_calls::{AsyncCall, AsyncCallState, AsyncCallStore, InMemoryAsyncCallStore};
pub use auth::{ApiKeyAuthService, AuthContext, AuthService, Credentials, StaticAuthService};
use keel_llm::Llm;
pub use lease::{Lease, ThreadLeases};
pub use logging::{LogLevel, LoggingService, TracingLoggingService};
pub use memory::{InMemoryMemoryService, MemoryService};
pub use run_store::{InMemoryRunStore, RunQuery, RunRecord, RunStore, TaskRecord};
pub use step::StepStore;
pub use task_manager::{
    load_task_with_history, InMemoryTaskManager, ListTasksFilter, Page, TaskManager,
};
pub use thread::check_ttl as check_lease_ttl;
pub use thread::{
    ChildThread, HistoryEntry, KvLimits, QueuedItem, SubagentRegistry, ThreadHistory, ThreadKv,
    ThreadQueue, ThreadStore,
};
pub use thread_memory::InMemoryThreadStore;
pub use timers::{
    claim_expiry as timer_claim_expiry, new_timer_id, timer_claimable_by, ClaimedTimer,
    InMemoryThreadTimers, ThreadTimers, TimerRecord,
};

/// The service hub: everything an agent run needs from its environment. Implement it to run
/// Keel's engine on your own infrastructure; the engine never reaches storage another way.
pub trait Runtime: Send + Sync {
    /// Authentication and tenancy.
    fn auth_service(&self) -> Arc<dyn AuthService>;
    /// Tasks and their event logs.
    fn task_manager(&self) -> Arc<dyn TaskManager>;
    /// Tenant-namespaced key-value memory.
    fn memory_service(&self) -> Arc<dyn MemoryService>;
    /// Structured logging.
    fn logging_service(&self) -> Arc<dyn LoggingService>;
    /// The model used by agents that do not bring their own.
    fn default_llm(&self) -> Arc<dyn Llm>;
    /// Thread history, queues, key-value stores, the subagent registry and leases.
    fn thread_store(&self) -> Arc<dyn ThreadStore>;
    /// Task snapshots and run reports.
    fn run_store(&self) -> Arc<dyn RunStore>;
    /// A store that writes one persist point of a step (history and task log) in one round
    /// trip, when the backend offers one; `None` makes the engine write them separately.
    fn step_store(&self) -> Option<Arc<dyn StepStore>> {
        None
    }
    /// Durable thread timers (scheduled effects); `None` when this runtime keeps none, and
    /// scheduling an effect is then [`keel_core::AgentError::Unsupported`].
    fn thread_timers(&self) -> Option<Arc<dyn ThreadTimers>> {
        None
    }
    /// Pending asynchronous tool calls, found by id alone when their callback arrives.
    fn async_call_store(&self) -> Arc<dyn AsyncCallStore>;
}

/// A [`Runtime`] whose services all live in process memory. Nothing survives a restart.
#[derive(Clone)]
pub struct InMemoryRuntime {
    auth: Arc<dyn AuthService>,
    tasks: Arc<dyn TaskManager>,
    memory: Arc<dyn MemoryService>,
    logging: Arc<dyn LoggingService>,
    llm: Arc<dyn Llm>,
    threads: Arc<dyn ThreadStore>,
    runs: Arc<dyn RunStore>,
    steps: Option<Arc<dyn StepStore>>,
    timers: Arc<dyn ThreadTimers>,
    async_calls: Arc<dyn AsyncCallStore>,
}

impl InMemoryRuntime {
    /// In-memory services, a static tenant and `llm` as the default model.
    pub fn new(llm: Arc<dyn Llm>) -> Self {
        Self {
            auth: Arc::new(StaticAuthService::default()),
            tasks: Arc::new(InMemoryTaskManager::new()),
            memory: Arc::new(InMemoryMemoryService::new()),
            logging: Arc::new(TracingLoggingService),
            llm,
            threads: Arc::new(InMemoryThreadStore::new()),
            runs: Arc::new(InMemoryRunStore::new()),
            steps: None,
            timers: Arc::new(InMemoryThreadTimers::new()),
            async_calls: Arc::new(InMemoryAsyncCallStore::new()),
        }
    }

    /// Replace the auth service.
    #[must_use]
    pub fn with_auth_service(mut self, auth: impl AuthService + 'static) -> Self {
        self.auth = Arc::new(auth);
        self
    }

    /// Replace the auth service, shared.
    #[must_use]
    pub fn with_auth_service_shared(mut self, auth: Arc<dyn AuthService>) -> Self {
        self.auth = auth;
        self
    }

    /// Replace the task manager.
    #[must_use]
    pub fn with_task_manager(mut self, tasks: Arc<dyn TaskManager>) -> Self {
        self.tasks = tasks;
        self
    }

    /// Replace the thread store.
    #[must_use]
    pub fn with_thread_store(mut self, threads: Arc<dyn ThreadStore>) -> Self {
        self.threads = threads;
        self
    }

    /// Write each persist point of a step through `steps` (one round trip on backends that
    /// offer it).
    #[must_use]
    pub fn with_step_store(mut self, steps: Arc<dyn StepStore>) -> Self {
        self.steps = Some(steps);
        self
    }

    /// Replace the thread timers (scheduled effects).
    #[must_use]
    pub fn with_thread_timers(mut self, timers: Arc<dyn ThreadTimers>) -> Self {
        self.timers = timers;
        self
    }

    /// Replace the run store.
    #[must_use]
    pub fn with_run_store(mut self, runs: Arc<dyn RunStore>) -> Self {
        self.runs = runs;
        self
    }

    /// Replace the store of pending asynchronous tool calls.
    #[must_use]
    pub fn with_async_call_store(mut self, calls: Arc<dyn AsyncCallStore>) -> Self {
        self.async_calls = calls;
        self
    }

    /// Replace the memory service.
    #[must_use]
    pub fn with_memory_service(mut self, memory: Arc<dyn MemoryService>) -> Self {
        self.memory = memory;
        self
    }
}

impl Runtime for InMemoryRuntime {
    fn auth_service(&self) -> Arc<dyn AuthService> {
        self.auth.clone()
    }
    fn task_manager(&self) -> Arc<dyn TaskManager> {
        self.tasks.clone()
    }
    fn memory_service(&self) -> Arc<dyn MemoryService> {
        self.memory.clone()
    }
    fn logging_service(&self) -> Arc<dyn LoggingService> {
        self.logging.clone()
    }
    fn default_llm(&self) -> Arc<dyn Llm> {
        self.llm.clone()
    }
    fn thread_store(&self) -> Arc<dyn ThreadStore> {
        self.threads.clone()
    }
    fn run_store(&self) -> Arc<dyn RunStore> {
        self.runs.clone()
    }
    fn step_store(&self) -> Option<Arc<dyn StepStore>> {
        self.steps.clone()
    }
    fn thread_timers(&self) -> Option<Arc<dyn ThreadTimers>> {
        Some(self.timers.clone())
    }
    fn async_call_store(&self) -> Arc<dyn AsyncCallStore> {
        self.async_calls.clone()
    }
}
