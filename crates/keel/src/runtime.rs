//! [`DefaultRuntime`]: the service hub with Keel's built-in services, and [`StoreConfig`],
//! which chooses where it keeps its data.

use std::path::PathBuf;
use std::sync::Arc;

use keel_core::{AgentError, AgentResult};
use keel_llm::{Llm, MockLlm};
use keel_runtime::{
    AsyncCallStore, AuthService, LoggingService, MemoryService, RunStore, Runtime, Services,
    StepStore, TaskManager, ThreadStore, ThreadTimers,
};

/// Where a [`DefaultRuntime`] keeps tasks, threads, memory and run records.
///
/// ```
/// use keel::StoreConfig;
/// assert_eq!(StoreConfig::parse("memory")?, StoreConfig::Memory);
/// assert_eq!(StoreConfig::parse("sqlite:./keel.db")?, StoreConfig::Sqlite("./keel.db".into()));
/// assert!(StoreConfig::parse("postgres://x").is_err());
/// # Ok::<(), keel::core::AgentError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoreConfig {
    /// In process memory: nothing survives a restart.
    Memory,
    /// A SQLite file (feature `sqlite`, on by default).
    Sqlite(PathBuf),
    /// A Redis server shared by several processes (feature `redis`), with a key prefix.
    Redis {
        /// `redis://[:password@]host:port[/db]`.
        url: String,
        /// Prefix of every key (`keel:` by default).
        prefix: String,
    },
}

impl StoreConfig {
    /// The default store of `keel serve`: SQLite at `./keel.db`.
    pub fn default_sqlite() -> Self {
        StoreConfig::Sqlite(PathBuf::from("./keel.db"))
    }

    /// Parse `memory`, `sqlite:PATH` or `redis://…` / `rediss://…`.
    pub fn parse(spec: &str) -> AgentResult<Self> {
        if spec == "memory" {
            Ok(StoreConfig::Memory)
        } else if let Some(path) = spec.strip_prefix("sqlite:") {
            if path.is_empty() {
                return Err(AgentError::invalid_input(
                    "store",
                    "`sqlite:` needs a path, e.g. sqlite:./keel.db",
                ));
            }
            Ok(StoreConfig::Sqlite(PathBuf::from(path)))
        } else if spec.starts_with("redis://") || spec.starts_with("rediss://") {
            Ok(StoreConfig::Redis {
                url: spec.to_owned(),
                prefix: "keel:".into(),
            })
        } else {
            Err(AgentError::invalid_input(
                "store",
                format!("`{spec}` is not a store; use memory, sqlite:PATH or redis://HOST:PORT"),
            ))
        }
    }
}

/// The out-of-the-box [`Runtime`]: a static tenant, the stores chosen by [`StoreConfig`],
/// `tracing` logs, and a default model.
///
/// ```
/// use keel::prelude::*;
/// let runtime = DefaultRuntime::builder()
///     .llm(MockLlm::new())
///     .auth(keel::services::StaticAuthService::new(AuthContext::new("acme", "ops")))
///     .build_in_memory();
/// assert_eq!(runtime.auth_service().auth_context().app_name, "acme");
/// ```
#[derive(Clone)]
pub struct DefaultRuntime {
    services: Services,
}

impl DefaultRuntime {
    /// In-memory services with `llm` as the default model.
    pub fn new(llm: impl Llm + 'static) -> Self {
        Self::builder().llm(llm).build_in_memory()
    }

    /// In-memory services with the offline [`MockLlm`]: no API key, no network, no files.
    pub fn offline() -> Self {
        Self::builder().build_in_memory()
    }

    /// Choose the services one by one.
    pub fn builder() -> DefaultRuntimeBuilder {
        DefaultRuntimeBuilder {
            llm: None,
            auth: None,
            store: StoreConfig::Memory,
        }
    }
}

impl Runtime for DefaultRuntime {
    fn auth_service(&self) -> Arc<dyn AuthService> {
        self.services.auth_service()
    }
    fn task_manager(&self) -> Arc<dyn TaskManager> {
        self.services.task_manager()
    }
    fn memory_service(&self) -> Arc<dyn MemoryService> {
        self.services.memory_service()
    }
    fn logging_service(&self) -> Arc<dyn LoggingService> {
        self.services.logging_service()
    }
    fn default_llm(&self) -> Arc<dyn Llm> {
        self.services.default_llm()
    }
    fn thread_store(&self) -> Arc<dyn ThreadStore> {
        self.services.thread_store()
    }
    fn run_store(&self) -> Arc<dyn RunStore> {
        self.services.run_store()
    }
    fn step_store(&self) -> Option<Arc<dyn StepStore>> {
        self.services.step_store()
    }
    fn thread_timers(&self) -> Option<Arc<dyn ThreadTimers>> {
        self.services.thread_timers()
    }
    fn async_call_store(&self) -> Arc<dyn AsyncCallStore> {
        self.services.async_call_store()
    }
}

/// Builds a [`DefaultRuntime`].
#[must_use]
pub struct DefaultRuntimeBuilder {
    llm: Option<Arc<dyn Llm>>,
    auth: Option<Arc<dyn AuthService>>,
    store: StoreConfig,
}

impl DefaultRuntimeBuilder {
    /// The default model (the offline [`MockLlm`] when not set).
    pub fn llm(mut self, llm: impl Llm + 'static) -> Self {
        self.llm = Some(Arc::new(llm));
        self
    }

    /// The default model, shared.
    pub fn llm_shared(mut self, llm: Arc<dyn Llm>) -> Self {
        self.llm = Some(llm);
        self
    }

    /// Who the callers are: a [`StaticAuthService`](keel_runtime::StaticAuthService) (one tenant for everyone, the default)
    /// or an [`ApiKeyAuthService`](keel_runtime::ApiKeyAuthService) mapping keys to tenants.
    pub fn auth(mut self, auth: impl AuthService + 'static) -> Self {
        self.auth = Some(Arc::new(auth));
        self
    }

    /// Where data is kept (in memory unless set).
    pub fn store(mut self, store: StoreConfig) -> Self {
        self.store = store;
        self
    }

    /// The default model, or the offline one.
    fn take_llm(&mut self) -> Arc<dyn Llm> {
        self.llm.take().unwrap_or_else(|| Arc::new(MockLlm::new()))
    }

    /// `services` with the chosen auth service, if one was chosen.
    fn finish(mut self, mut services: Services) -> DefaultRuntime {
        if let Some(auth) = self.auth.take() {
            services.auth = auth;
        }
        DefaultRuntime { services }
    }

    /// The runtime with in-memory stores, whatever [`DefaultRuntimeBuilder::store`] says.
    pub fn build_in_memory(mut self) -> DefaultRuntime {
        let services = Services::in_memory(self.take_llm());
        self.finish(services)
    }

    /// Open the configured store and build the runtime. A store whose Cargo feature is off,
    /// or that cannot be opened, is an error that says which.
    pub async fn build(mut self) -> AgentResult<DefaultRuntime> {
        let llm = self.take_llm();
        let services = match self.store.clone() {
            StoreConfig::Memory => Services::in_memory(llm),
            #[cfg(feature = "sqlite")]
            StoreConfig::Sqlite(path) => {
                tokio::task::spawn_blocking(move || keel_store_sqlite::SqliteStore::open(path))
                    .await
                    .map_err(AgentError::internal)??
                    .services(llm)
            }
            #[cfg(feature = "redis")]
            StoreConfig::Redis { url, prefix } => keel_store_redis::RedisStore::connect(&url)
                .await?
                .with_prefix(prefix)
                .services(llm),
            #[allow(unreachable_patterns)] // reachable exactly when a store feature is off
            other => {
                return Err(AgentError::Unsupported {
                    what: format!(
                    "store {other:?}: this build of Keel lacks its Cargo feature (sqlite / redis)"
                ),
                })
            }
        };
        Ok(self.finish(services))
    }
}

#[cfg(all(test, feature = "sqlite"))]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread")]
    async fn a_sqlite_runtime_hands_out_a_step_store() {
        let dir = tempfile::tempdir().unwrap();
        let runtime = DefaultRuntime::builder()
            .store(StoreConfig::Sqlite(dir.path().join("keel.db")))
            .build()
            .await
            .unwrap();
        assert!(
            runtime.step_store().is_some(),
            "the engine writes each persist point in one SQLite job"
        );
    }
}
