//! [`Services`]: the plain bundle of services that implements [`Runtime`].

use std::sync::Arc;

use keel_llm::Llm;

use crate::{
    AsyncCallStore, AuthService, ChangeFeed, InMemoryAsyncCallStore, InMemoryMemoryService,
    InMemoryRunStore, InMemoryTaskManager, InMemoryThreadStore, InMemoryThreadTimers, KvLimits,
    LoggingService, MemoryService, RunStore, Runtime, StaticAuthService, StepStore, TaskManager,
    ThreadStore, ThreadTimers, TracingLoggingService, Validated,
};

/// Every service an agent run needs, as plain fields: a [`Runtime`] without any logic of its
/// own. Build one with [`Services::in_memory`] or a store crate's constructor
/// (`SqliteStore::services`, `RedisStore::services`), which put the thread store and timers
/// behind [`Validated`]'s input checks, then replace single services with the
/// `with_*` builders, or assign a field to share a service another runtime already holds.
///
/// ```
/// use std::sync::Arc;
/// use keel_llm::MockLlm;
/// use keel_runtime::{AuthContext, Runtime, Services, StaticAuthService};
/// let services = Services::in_memory(Arc::new(MockLlm::new()))
///     .with_auth(StaticAuthService::new(AuthContext::new("acme", "ops")));
/// assert_eq!(services.auth_service().auth_context().app_name, "acme");
/// // A second runtime over the same stores, with its own default model.
/// let mut other = Services::of(&services);
/// other.llm = Arc::new(MockLlm::new());
/// assert!(Arc::ptr_eq(&other.tasks, &services.tasks));
/// ```
#[derive(Clone)]
pub struct Services {
    /// Authentication and tenancy.
    pub auth: Arc<dyn AuthService>,
    /// Tasks and their event logs.
    pub tasks: Arc<dyn TaskManager>,
    /// Tenant-namespaced key-value memory.
    pub memory: Arc<dyn MemoryService>,
    /// Structured logging.
    pub logging: Arc<dyn LoggingService>,
    /// The model used by agents that do not bring their own.
    pub llm: Arc<dyn Llm>,
    /// Thread history, queues, key-value stores, the subagent registry and leases.
    pub threads: Arc<dyn ThreadStore>,
    /// Task snapshots and run reports.
    pub runs: Arc<dyn RunStore>,
    /// One-round-trip step writes, when the backend offers them.
    pub steps: Option<Arc<dyn StepStore>>,
    /// Durable thread timers, when the backend keeps them.
    pub timers: Option<Arc<dyn ThreadTimers>>,
    /// Pending asynchronous tool calls.
    pub async_calls: Arc<dyn AsyncCallStore>,
    /// The store's announcements of its commits, when it makes them.
    pub changes: Option<Arc<dyn ChangeFeed>>,
}

impl Services {
    /// Services that all live in process memory (nothing survives a restart), a static
    /// tenant, `tracing` logs and `llm` as the default model.
    pub fn in_memory(llm: Arc<dyn Llm>) -> Self {
        Self {
            auth: Arc::new(StaticAuthService::default()),
            tasks: Arc::new(InMemoryTaskManager::new()),
            memory: Arc::new(InMemoryMemoryService::new()),
            logging: Arc::new(TracingLoggingService),
            llm,
            threads: Arc::new(Validated::new(
                InMemoryThreadStore::new(),
                KvLimits::DEFAULT,
            )),
            runs: Arc::new(InMemoryRunStore::new()),
            steps: None,
            timers: Some(Arc::new(Validated::new(
                InMemoryThreadTimers::new(),
                KvLimits::DEFAULT,
            ))),
            async_calls: Arc::new(InMemoryAsyncCallStore::new()),
            changes: None,
        }
    }

    /// Services whose stores are all `store` (a backend that implements every store trait,
    /// cheap to clone), its thread store and timers behind [`Validated`] with the backend's
    /// key-value caps `kv_limits`, a static tenant, `tracing` logs and `llm` as the default
    /// model. A backend with one-round-trip step writes adds them with
    /// [`Services::with_steps`].
    pub fn from_store<S>(store: S, kv_limits: KvLimits, llm: Arc<dyn Llm>) -> Self
    where
        S: TaskManager
            + MemoryService
            + ThreadStore
            + RunStore
            + ThreadTimers
            + AsyncCallStore
            + Clone
            + 'static,
    {
        Self {
            auth: Arc::new(StaticAuthService::default()),
            tasks: Arc::new(store.clone()),
            memory: Arc::new(store.clone()),
            logging: Arc::new(TracingLoggingService),
            llm,
            threads: Arc::new(Validated::new(store.clone(), kv_limits)),
            runs: Arc::new(store.clone()),
            steps: None,
            timers: Some(Arc::new(Validated::new(store.clone(), kv_limits))),
            async_calls: Arc::new(store),
            changes: None,
        }
    }

    /// The services `runtime` hands out, as a bundle whose fields can then be replaced.
    pub fn of(runtime: &dyn Runtime) -> Self {
        Self {
            auth: runtime.auth_service(),
            tasks: runtime.task_manager(),
            memory: runtime.memory_service(),
            logging: runtime.logging_service(),
            llm: runtime.default_llm(),
            threads: runtime.thread_store(),
            runs: runtime.run_store(),
            steps: runtime.step_store(),
            timers: runtime.thread_timers(),
            async_calls: runtime.async_call_store(),
            changes: runtime.change_feed(),
        }
    }
}

/// The `with_*` builders of [`Services`]: each replaces one field with the given service,
/// held as the field holds it (`Arc<dyn _>`, or `Some` of one for the optional services).
macro_rules! with_service {
    ($($(#[doc = $doc:literal])+ $name:ident($field:ident: $service:ident);)*) => {
        impl Services {
            $(
                $(#[doc = $doc])+
                #[must_use]
                pub fn $name(mut self, service: impl $service + 'static) -> Self {
                    let service: Arc<dyn $service> = Arc::new(service);
                    self.$field = service.into();
                    self
                }
            )*
        }
    };
}

with_service! {
    /// Replace the auth service.
    with_auth(auth: AuthService);
    /// Replace the task manager.
    with_tasks(tasks: TaskManager);
    /// Replace the memory service.
    with_memory(memory: MemoryService);
    /// Replace the logging service.
    with_logging(logging: LoggingService);
    /// Replace the default model.
    with_llm(llm: Llm);
    /// Replace the thread store (as given: wrap a backend in [`Validated`] for the input
    /// checks).
    with_threads(threads: ThreadStore);
    /// Replace the run store.
    with_runs(runs: RunStore);
    /// Write each persist point of a step through the given step store (one round trip on
    /// backends that offer it).
    with_steps(steps: StepStore);
    /// Replace the thread timers (scheduled effects).
    with_timers(timers: ThreadTimers);
    /// Replace the store of pending asynchronous tool calls.
    with_async_calls(async_calls: AsyncCallStore);
    /// Wake the engine on the given store's announcements of its commits.
    with_changes(changes: ChangeFeed);
}

impl Runtime for Services {
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
        self.timers.clone()
    }
    fn async_call_store(&self) -> Arc<dyn AsyncCallStore> {
        self.async_calls.clone()
    }
    fn change_feed(&self) -> Option<Arc<dyn ChangeFeed>> {
        self.changes.clone()
    }
}
